"""The walking duck in one picture: where a run's policy puts it, a ghost every second.

Two fixed cameras over two 10-s episodes of the run's final policy, deterministic, with the
preset's one-step action delay (``workbench.deploy.walking``): commanded 0.2 m/s forward, seen
from the side, and commanded a 0.5 rad/s left turn at 0.1 m/s, seen from above. Each second's
pose is drawn over the empty scene, the earlier ones fainter, so the strip shows the distance
covered, the arc of the turn and the stance of the gait.

    python benchmarks/duck_walk_figure.py --run RUN_ID docs/images/duck_walk.png

The run is read from the configured store (``MLFLOW_TRACKING_URI``), as by
``benchmarks/duck_walk.py``, which measures what the picture shows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from duck_walk import SPEED, TURN, TURN_SPEED  # the commands the figures measure

EVERY_S, SECONDS = 1.0, 10.0
WIDTH, HEIGHT = 640, 240


def poses(run_id: str) -> tuple[Any, dict[str, list[np.ndarray]]]:
    """The MuJoCo model and, per view, the policy's ``qpos`` every ``EVERY_S`` seconds."""
    from workbench.deploy import evaluation, export
    from workbench.deploy.walking import command_episodes, fixed_command

    found: dict[str, list[np.ndarray]] = {}
    scene: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        policy = evaluation.policy_of_run(export.open_store(), run_id, Path(work))
        for view, command in (("side", fixed_command(SPEED, 0.0)),
                              ("top", fixed_command(TURN_SPEED, TURN))):
            states: list[np.ndarray] = []

            def keep(env: Any, states: list[np.ndarray] = states) -> None:
                scene.update(model=env.model, dt=float(env.dt))
                states.append(env.data.qpos.copy())

            command_episodes(policy.actor, policy.config, command, count=1, seed=100,
                             max_steps=10_000, watch=keep)
            stride = max(1, round(EVERY_S / scene["dt"]))
            found[view] = states[:round(SECONDS / scene["dt"]) + 1:stride]
    return scene["model"], found


def camera(view: str, states: list[np.ndarray]) -> Any:
    """A fixed camera that frames every pose of ``states``: from the side or from above."""
    import mujoco

    xy = np.array([s[:2] for s in states])
    low, high = xy.min(axis=0) - 0.2, xy.max(axis=0) + 0.2
    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.lookat[:] = [*(low + high) / 2, 0.1]
    # MuJoCo's 45-degree field of view sees ~2.2 x the distance across a 640 x 240 frame
    span = max(high[0] - low[0], (high[1] - low[1]) * WIDTH / HEIGHT)
    cam.distance = span / 2.2 + 0.3
    cam.azimuth, cam.elevation = (90.0, -15.0) if view == "side" else (90.0, -80.0)
    return cam


def ghosts(model: Any, view: str, states: list[np.ndarray]) -> np.ndarray:
    """Every pose of ``states`` drawn over the empty scene, the earliest faintest."""
    import mujoco

    renderer = mujoco.Renderer(model, HEIGHT, WIDTH)
    data, cam = mujoco.MjData(model), camera(view, states)

    def frame(qpos: np.ndarray) -> np.ndarray:
        data.qpos[:] = qpos
        mujoco.mj_forward(model, data)
        renderer.update_scene(data, camera=cam)
        return renderer.render().astype(np.float32)

    away = states[0].copy()
    away[0] += 1000.0  # the duck far out of view: the empty scene
    background = frame(away)
    out = background.copy()
    for k, qpos in enumerate(states):
        shot = frame(qpos)
        duck = np.abs(shot - background).max(axis=-1) > 12
        alpha = 0.45 + 0.55 * k / max(1, len(states) - 1)
        out[duck] = alpha * shot[duck] + (1 - alpha) * out[duck]
    renderer.close()
    return out.astype(np.uint8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a run of the configured store")
    parser.add_argument("path", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    from workbench.envs.robots import rendering

    rendering.prefer_offscreen_backend()  # before MuJoCo's first OpenGL context
    from PIL import Image, ImageDraw

    model, found = poses(args.run)
    labels = {"side": f"commanded {SPEED} m/s forward, from the side",
              "top": f"commanded a {TURN} rad/s left turn at {TURN_SPEED} m/s, from above"}
    panels = []
    for view, states in found.items():
        panel = Image.fromarray(ghosts(model, view, states))
        ImageDraw.Draw(panel).text(
            (8, 6), f"{labels[view]}; a pose each {EVERY_S:g} s for {SECONDS:g} s",
            fill=(255, 255, 255))
        panels.append(panel)
    out = Image.new("RGB", (WIDTH, HEIGHT * len(panels)))
    for k, panel in enumerate(panels):
        out.paste(panel, (0, HEIGHT * k))
    args.path.parent.mkdir(parents=True, exist_ok=True)
    out.save(args.path, optimize=True)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
