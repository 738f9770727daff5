"""What rollout videos cost: seconds per rendered frame and per run at the default settings.

Renders HalfCheetah-v5 off-screen in an evaluation env exactly as a run does (``video.*``
defaults: 1 episode, at most 500 steps, 320x240, shadows off; MUJOCO_GL as the run chooses
it), driven by a PPO policy's deterministic ``predict``. Printed:

1. the OpenGL context (first frame) and the median per-frame render time, with shadows and
   reflections off (the default) and on (``video.shadows=true``, ``video=hd``'s choice);
2. one run's video at the defaults: playing + rendering, encoding the MP4 and the GIF, total
   seconds (what ``video/render_seconds`` reports) and seconds per frame.

    python benchmarks/video_cost.py                   # 200 timed frames per setting
    python benchmarks/video_cost.py --frames 500 --width 640 --height 480
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def frame_times(shadows: bool, args: argparse.Namespace) -> dict[str, float]:
    """Context creation and per-frame render seconds for one scene setting."""
    from workbench.config import load_config
    from workbench.envs import video
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_eval_env

    cfg = load_config(["env=halfcheetah", f"video.width={args.width}",
                       f"video.height={args.height}", f"video.shadows={str(shadows).lower()}"])
    settings = video.VideoSettings.from_config(cfg.video)
    venv = make_eval_env(EnvSpec.from_config(cfg), video=settings)
    try:
        env = video.rendering_env(venv)
        source = video.FrameSource(env, settings)
        venv.reset()
        started = time.perf_counter()
        source.frame()  # makes the OpenGL context
        context = time.perf_counter() - started
        times = []
        for _ in range(args.frames):
            venv.step([venv.action_space.sample()])
            started = time.perf_counter()
            source.frame()
            times.append(time.perf_counter() - started)
    finally:
        venv.close()
    return {"context_s": context, "frame_median_s": statistics.median(times),
            "frame_p90_s": sorted(times)[int(0.9 * len(times))]}


def run_video(args: argparse.Namespace) -> dict[str, float]:
    """One run's final video at the defaults (an untrained policy: the same render work)."""
    from stable_baselines3 import PPO
    from workbench.config import load_config
    from workbench.envs import video
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_eval_env

    cfg = load_config(["env=halfcheetah", f"video.width={args.width}",
                       f"video.height={args.height}"])
    settings = video.VideoSettings.from_config(cfg.video)
    venv = make_eval_env(EnvSpec.from_config(cfg), video=settings)
    model = PPO("MlpPolicy", venv, device="cpu", seed=0)
    try:
        recording = video.record_vec(
            venv, lambda obs: model.predict(obs, deterministic=True)[0], settings)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            files = video.write_video(recording, Path(tmp), "replay")
            encode = time.perf_counter() - started
            sizes = (files.video.stat().st_size, files.preview.stat().st_size)
    finally:
        venv.close()
    total = recording.seconds + encode
    return {"frames": len(recording.frames), "play_render_s": recording.seconds,
            "encode_s": encode, "total_s": total, "per_frame_s": total / len(recording.frames),
            "mp4_bytes": sizes[0], "gif_bytes": sizes[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200, help="timed frames per setting")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    args = parser.parse_args()
    from workbench.envs.robots.rendering import prefer_offscreen_backend

    prefer_offscreen_backend()
    print(f"MUJOCO_GL={os.environ.get('MUJOCO_GL')}, HalfCheetah-v5 at {args.width}x"
          f"{args.height}, {args.frames} timed frames per setting")
    frames = {}
    for shadows in (False, True):
        frames[shadows] = t = frame_times(shadows, args)
        print(f"  shadows {'on ' if shadows else 'off'}: context {t['context_s']:.2f} s; per "
              f"frame median {t['frame_median_s'] * 1000:.1f} ms, p90 "
              f"{t['frame_p90_s'] * 1000:.1f} ms", flush=True)
    ratio = frames[True]["frame_median_s"] / frames[False]["frame_median_s"]
    print(f"  shadows on / off per frame: {ratio:.1f}x")
    run = run_video(args)
    print(f"one run's final video at the defaults ({run['frames']} frames): play + render "
          f"{run['play_render_s']:.2f} s, encode MP4 + GIF {run['encode_s']:.2f} s, total "
          f"{run['total_s']:.2f} s = {run['per_frame_s'] * 1000:.1f} ms per frame; files "
          f"{run['mp4_bytes'] / 1024:.0f} KiB MP4, {run['gif_bytes'] / 1024:.0f} KiB GIF")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "video_cost.json"
    out.write_text(json.dumps({"args": vars(args), "frames": {"off": frames[False],
                                                              "on": frames[True]},
                               "run": run}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
