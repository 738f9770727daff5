"""``make bench``: the whole benchmark suite, then one summary of the ratios against targets.

Runs, each in its own process and printing its own tables:

1. ``physics.py``: ``C_phys`` per MuJoCo task and ``R_env`` per backend and num_envs;
2. ``train_throughput.py``: ``R_train`` (workbench / bare SB3 steps/s), rollout/update split,
   peak RSS per run and per worker;
3. ``tracking_overhead.py``: workbench vs a bare SB3 script, wall-time ratio;
4. ``time_to_reward.py``: default configs vs SB3 defaults vs rl-baselines3-zoo, side by side.

Results land as JSON in ``benchmarks/results/`` (git-ignored; ``WORKBENCH_BENCH_RESULTS``
moves them), this summary in ``bench.json``. Absolute numbers move with machine load (the
load average is printed and stored next to every table); the ratios are measured side by
side, interleaved, and survive it.

    make bench                      # full suite (hours on 2 cores: docs/benchmarks.md)
    make bench ARGS=--quick         # smoke version, ~3.5 minutes on an idle 2-core machine
    python benchmarks/bench.py --only physics train
    python benchmarks/bench.py --device cuda    # GPU server: the update runs on the GPU
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

HERE = Path(__file__).resolve().parent
PARTS = ("physics", "train", "tracking", "reward")


def commands(quick: bool, device: str) -> dict[str, list[str]]:
    """The command of each part; quick mode shrinks every one of them."""
    flag = ["--quick"] if quick else []
    tracking = ["--steps", "4096", "--reps", "1", "--num-envs", "4"] if quick else []
    return {
        "physics": [str(HERE / "physics.py"), *flag],
        "train": [str(HERE / "train_throughput.py"), *flag, "--device", device],
        "tracking": [str(HERE / "tracking_overhead.py"), *tracking],
        "reward": [str(HERE / "time_to_reward.py"), *flag, "--device", device],
    }


def run_part(name: str, command: list[str]) -> float:
    """Run one benchmark script with live output; its wall time. A failure stops the suite."""
    print(f"\n=== {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    code = subprocess.call([sys.executable, *command], cwd=harness.ROOT)
    if code != 0:
        raise SystemExit(f"bench: {name} failed with exit code {code}")
    return time.perf_counter() - started


def read(name: str) -> dict[str, Any]:
    path = harness.results_dir() / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def summary_rows(parts: list[str]) -> list[list[Any]]:
    """(measure, value, target, met) for every part that ran."""
    rows: list[list[Any]] = []
    if "physics" in parts:
        physics = read("physics")
        rows.append(["best R_env at 16 envs (" + physics["env_id"] + ")",
                     physics["best_r_env_at_max_envs"], ">= 0.5",
                     physics["best_r_env_at_max_envs"] >= 0.5])
    if "train" in parts:
        lowest = read("train_throughput")["summary"]["lowest_r_train"]
        rows.append(["lowest R_train", lowest, ">= 0.98", lowest >= 0.98])
    if "tracking" in parts:
        ratio = read("tracking_overhead")["ratio"]
        rows.append(["tracking overhead (workbench/bare wall time)", ratio, "<= 1.03",
                     ratio <= 1.03])
    if "reward" in parts:
        for task, values in read("time_to_reward")["summary"].items():
            for base, ratios in values["ratios"].items():
                bounds = values["ratio_upper_bounds"][base]
                # the target: <= 0.25 x the zoo's time (docs/benchmarks.md)
                limit = 0.25 if base == "workbench/zoo" else 1.0
                for threshold, ratio, bound in zip(values["thresholds"], ratios, bounds,
                                                   strict=True):
                    label = f"{task} time to {threshold:g}, {base}"
                    if not math.isfinite(ratio) and math.isfinite(bound):
                        label += " (upper bound: baseline not reached)"
                    value = ratio if math.isfinite(ratio) else bound
                    met: Any = value <= limit if math.isfinite(value) else "n/a"
                    rows.append([label, value, f"<= {limit:g}", met])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke version (a few minutes)")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto (training parts)")
    args = parser.parse_args(argv)
    parts = args.only or list(PARTS)
    load_before = harness.machine()["load_average"]
    print(f"bench ({'quick' if args.quick else 'full'}): {harness.load_line()}", flush=True)
    started = time.perf_counter()
    durations = {name: run_part(name, command)
                 for name, command in commands(args.quick, args.device).items() if name in parts}
    rows = summary_rows(parts)
    harness.print_table("Summary: measured ratios against the targets of docs/benchmarks.md",
                        ["measure", "value", "target", "met"], rows)
    total = time.perf_counter() - started
    print(f"  total {total:.0f} s; {harness.load_line()} (at start: "
          f"{', '.join(str(x) for x in load_before)})")
    path = harness.write_results("bench", {
        "quick": args.quick, "parts": parts, "durations_s": durations, "total_s": total,
        "load_average_at_start": load_before,
        "summary": [dict(zip(["measure", "value", "target", "met"], row, strict=True))
                    for row in rows]})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
