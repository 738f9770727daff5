"""What the manifest and deterministic mode cost.

1. Manifest collection, in this process, after torch is imported (as inside ``train``): the
   first call and the median/max of warm calls, with the share of each collector.
2. ``repro.deterministic=true`` vs false: the same small CPU training through ``train()``,
   interleaved (off, on, off, ...) after one warm-up run, so machine-load drift hits both
   alike; printed: median training wall time of each and their ratio.

    python benchmarks/manifest_cost.py                  # 20 warm calls; 2048 steps x 5 reps
    python benchmarks/manifest_cost.py --steps 8192 --reps 9
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def timed(func: Callable[[], Any]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def collection_cost(calls: int) -> dict[str, float]:
    """First and warm collection times, and each collector's warm median (seconds)."""
    import torch  # noqa: F401  (train() has it loaded before the manifest is collected)
    from workbench import paths
    from workbench.tracking import manifest

    first = timed(manifest.collect_manifest)
    warm = [timed(manifest.collect_manifest) for _ in range(calls)]
    parts = {
        "packages": manifest.installed_versions,
        "os": manifest.collect_os,
        "hardware": manifest.collect_hardware,
        "cuda": lambda: manifest.collect_cuda([]),
        "git": lambda: manifest.collect_git(paths.project_root()),
        "run": lambda: manifest.collect_run(None),
    }
    result = {"first_s": first, "warm_median_s": statistics.median(warm), "warm_max_s": max(warm)}
    for name, func in parts.items():
        result[f"{name}_s"] = statistics.median(timed(func) for _ in range(max(3, calls // 4)))
    return result


def train_wall_s(deterministic: bool, args: argparse.Namespace) -> float:
    """One training in this process; its measured training wall time (around ``learn``)."""
    from workbench.training import load_config, train

    cfg = load_config([
        "env=halfcheetah", f"env.num_envs={args.num_envs}", f"algo.n_steps={args.n_steps}",
        f"total_timesteps={args.steps}", "eval.final_episodes=0", "device=cpu",
        f"torch_threads={args.threads}", "console.progress_bar=false",
        "console.iteration_lines=false", "tracking.system_metrics=false",
        f"repro.deterministic={str(deterministic).lower()}",
    ])
    with contextlib.redirect_stdout(io.StringIO()):  # the header and summary table
        return train(cfg).wall_time_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="warm manifest collections")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the learner")
    args = parser.parse_args()

    cost = collection_cost(args.calls)
    print("manifest collection (torch already imported):")
    print(f"  first call {cost['first_s'] * 1000:.0f} ms; warm median "
          f"{cost['warm_median_s'] * 1000:.0f} ms, max {cost['warm_max_s'] * 1000:.0f} ms "
          f"over {args.calls} calls")
    parts = {k[:-2]: v for k, v in cost.items() if k.endswith("_s") and "warm" not in k
             and k != "first_s"}
    print("  by collector (warm median): " + ", ".join(
        f"{name} {seconds * 1000:.1f} ms" for name, seconds in parts.items()))

    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
    os.environ["WORKBENCH_EXPERIMENTS"] = str(tmp)
    train_wall_s(False, args)  # warm-up: imports, MuJoCo model compilation, store creation
    walls: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.reps):
        for deterministic in (False, True):
            walls[deterministic].append(train_wall_s(deterministic, args))
        print(f"rep {rep + 1}/{args.reps}: off {walls[False][-1]:.2f}s, "
              f"on {walls[True][-1]:.2f}s", flush=True)
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    ratios = [b / a for a, b in zip(walls[False], walls[True], strict=True)]
    print(f"\nrepro.deterministic on CPU: HalfCheetah-v5, {args.num_envs} envs, n_steps "
          f"{args.n_steps}, {args.steps} steps, {args.threads} torch thread(s), {args.reps} "
          "interleaved repetitions")
    print(f"  training wall time (median): off {off:.2f}s, on {on:.2f}s; ratio on/off "
          f"{statistics.median(ratios):.3f} (per rep: {', '.join(f'{r:.3f}' for r in ratios)})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "manifest_cost.json"
    out.write_text(json.dumps({"args": vars(args), "collection": cost,
                               "deterministic_wall_s": {"off": walls[False], "on": walls[True]}},
                              indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
