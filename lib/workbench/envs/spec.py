"""``EnvSpec``: the plain values that say how to build a run's environments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.config import RandomizationConfig, WorkbenchConfig


@dataclass(frozen=True)
class EnvSpec:
    """Plain values describing how to build the training environments."""

    env_id: str
    num_envs: int
    vec_env: str = "dummy"  # dummy | subproc | envpool | batched | auto
    seed: int = 0
    max_episode_steps: int | None = None
    kwargs: dict[str, Any] | None = None
    normalize: bool = False
    norm_obs: bool = True
    norm_reward: bool = True
    norm_gamma: float = 0.99
    clip_obs: float = 10.0
    randomization: RandomizationConfig | None = None  # training envs' domain randomization
    num_threads: int | None = None  # batched/envpool threads; None: the core budget

    def threads(self, budget: int) -> int:
        """Threads for the batched and envpool backends: ``num_threads`` or ``budget``, at
        most one per env copy."""
        return max(1, min(self.num_threads or budget, self.num_envs))

    @classmethod
    def from_config(cls, cfg: WorkbenchConfig) -> EnvSpec:
        """The environment values of a validated config (``env.*`` and ``seed``)."""
        e = cfg.env
        return cls(
            env_id=e.id,
            num_envs=e.num_envs,
            vec_env=str(e.vec_env),
            seed=cfg.seed,
            max_episode_steps=e.max_episode_steps,
            kwargs=dict(e.kwargs),
            normalize=e.normalize,
            norm_obs=e.norm_obs,
            norm_reward=e.norm_reward,
            norm_gamma=e.norm_gamma,
            clip_obs=e.clip_obs,
            randomization=e.randomization,
            num_threads=e.num_threads,
        )

    def env_kwargs(self) -> dict[str, Any]:
        """``gymnasium.make`` keyword arguments: ``env.kwargs`` plus the time limit."""
        kwargs = dict(self.kwargs or {})
        if self.max_episode_steps is not None:
            kwargs["max_episode_steps"] = self.max_episode_steps
        return kwargs
