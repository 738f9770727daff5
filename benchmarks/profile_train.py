"""Where a training's time goes: cProfile of ``workbench.training.train`` grouped by component.

Groups (by the code that spends the time, self time): the PPO update's autograd backward and
optimizer step, the network forward passes (rollout and update), environment stepping
(MuJoCo/EnvPool/gymnasium), SB3's own Python (rollout buffer, GAE, loop), VecNormalize,
tracking (MLflow, console) and the rest. The profile file (``.prof``, for snakeviz or
``python -m pstats``) and the grouped table land in the results folder.

    python benchmarks/profile_train.py                       # the default HalfCheetah config
    python benchmarks/profile_train.py --steps 30000 -- experiment=zoo_halfcheetah
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

# (group, substrings of "file:function" that belong to it), first match wins.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("update: backward", ("run_backward", "autograd/__init__", "_engine_run_backward")),
    ("update: optimizer", ("torch/optim/",)),
    ("network forward", ("torch/nn/modules", "torch/nn/functional", "distributions/")),
    ("env stepping", ("envpool", "mujoco", "gymnasium/", "dummy_vec_env", "subproc_vec_env",
                      "workbench/envpool_vec", "common/monitor")),
    ("VecNormalize", ("vec_normalize", "running_mean_std")),
    ("SB3 buffers and loop", ("stable_baselines3/common/buffers",
                              "stable_baselines3/common/on_policy_algorithm",
                              "stable_baselines3/ppo/ppo", "stable_baselines3/common/policies",
                              "stable_baselines3/common/distributions")),
    ("tracking and console", ("mlflow", "workbench/tracking", "workbench/console",
                              "workbench/callbacks", "sqlalchemy", "tqdm")),
    ("torch other", ("torch/",)),
]


def group_of(filename: str, function: str) -> str:
    key = f"{filename}:{function}"
    for name, needles in GROUPS:
        if any(n in key for n in needles):
            return name
    return "other"


def grouped(stats: pstats.Stats) -> dict[str, float]:
    """Self time per group (seconds)."""
    totals: dict[str, float] = {}
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = group_of(filename, function)
        totals[name] = totals.get(name, 0.0) + tottime
    return totals


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--name", default="profile_default")
    parser.add_argument("overrides", nargs="*", help="workbench overrides (default: none)")
    args = parser.parse_args(argv)
    from workbench.training import load_config, train

    store = Path(tempfile.mkdtemp(prefix="wb-profile-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    os.environ["WORKBENCH_EXPERIMENTS"] = str(store)
    cfg = load_config([*args.overrides, f"total_timesteps={args.steps}",
                       "eval.final_episodes=0", "console.progress_bar=false",
                       "console.iteration_lines=false"])
    print(f"profiling {args.steps} steps of {args.overrides or 'the default config'}; "
          f"{harness.load_line()}", flush=True)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    train(cfg)
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    totals = grouped(stats)
    total = sum(totals.values())
    harness.print_table(f"Self time by component ({wall:.1f} s wall, {args.steps} steps)",
                        ["component", "seconds", "share"],
                        [[k, v, v / total] for k, v in sorted(totals.items(),
                                                              key=lambda kv: -kv[1])])
    print(f"\nTop {args.top} functions by self time:")
    stats.sort_stats("tottime").print_stats(args.top)
    folder = harness.results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stats.dump_stats(str(folder / f"{args.name}.prof"))
    data = {"overrides": args.overrides, "steps": args.steps, "wall_s": wall,
            "self_time_s": totals}
    path = harness.write_results(args.name, data)
    print(f"results: {path} (+ {args.name}.prof)")
    return data


if __name__ == "__main__":
    main()
