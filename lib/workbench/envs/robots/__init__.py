"""The workbench's own robots, registered with gymnasium on import.

``workbench.envs`` imports this package, so every process that builds environments through
the workbench knows these ids. Subprocess workers (``SubprocVecEnv`` starts them with
forkserver, importing nothing of ours) get them through gymnasium's ``"module:id"`` form,
which imports the module before looking the id up: :func:`importable_id`.
"""

from __future__ import annotations

import gymnasium

MINI_DUCK_ID = "Workbench/MiniDuck-v0"
MINI_DUCK_WALK_ID = "Workbench/MiniDuckWalk-v0"

# id -> (entry point, time limit in steps)
ROBOTS: dict[str, tuple[str, int]] = {
    MINI_DUCK_ID: ("workbench.envs.robots.duck:MiniDuckEnv", 1000),
    MINI_DUCK_WALK_ID: ("workbench.envs.robots.duck_walk:MiniDuckWalkEnv", 500),  # 10 s
}


def register_robots() -> None:
    """Register every robot id with gymnasium (idempotent)."""
    for env_id, (entry_point, max_steps) in ROBOTS.items():
        if env_id not in gymnasium.envs.registry:
            gymnasium.register(env_id, entry_point=entry_point, max_episode_steps=max_steps)


def importable_id(env_id: str) -> str:
    """``env_id`` in a form ``gymnasium.make`` resolves in a fresh process too."""
    return f"{__name__}:{env_id}" if env_id in ROBOTS else env_id


register_robots()
