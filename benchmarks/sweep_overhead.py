"""Sweep overhead: per-point fixed cost and sweep efficiency of ``workbench sweep``.

Runs a real 2x2 sweep (num_envs x n_steps, HalfCheetah, ``--steps`` per point, aimed at
~30 s of training each) with 2 workers into a temporary store, then reads what every point
recorded and prints:

- per point: fixed cost before training (point start -> its MLflow run exists: kernel start,
  imports, config composition), training time (``summary/wall_time_s``: ``model.learn``),
  the rest (environments, final evaluation, model upload, kernel shutdown), point wall time;
- sweep efficiency = sum(point training times) / (sweep wall time x workers), both over the
  sweep proper (store ready -> last point done) and over the whole command (process wall,
  driver start-up included). Target: >= 0.85 on 2 cores.

Timings depend on machine load; the load average before and after is printed with them.

    python benchmarks/sweep_overhead.py                  # 30k steps per point
    python benchmarks/sweep_overhead.py --steps 20000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_sweep(args: argparse.Namespace, experiments: Path) -> float:
    """The sweep as a user runs it (a fresh process); returns its wall time."""
    command = [
        sys.executable, "-m", "workbench", "sweep", f"env={args.env}",
        f"sweep.num_envs={args.num_envs}", f"sweep.n_steps={args.n_steps}",
        f"sweep.workers={args.workers}", f"total_timesteps={args.steps}",
        "eval.final_episodes=2", "tracking.system_metrics=false",
    ]
    env = {**os.environ, "WORKBENCH_EXPERIMENTS": str(experiments),
           "MLFLOW_TRACKING_URI": f"sqlite:///{experiments / 'mlflow.db'}"}
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall


def sweep_records(experiments: Path) -> tuple[list[dict[str, float]], float]:
    """Each point's record (sweep_results.json) and the sweep's own wall time (parent run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{experiments / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("workbench")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`sweep.role` = 'parent'")
    path = client.download_artifacts(parent.info.run_id, "sweep_results.json",
                                     tempfile.mkdtemp())
    points = json.loads(Path(path).read_text())["points"]
    return points, parent.data.metrics["sweep/wall_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="halfcheetah")
    parser.add_argument("--num-envs", default="[1,2]")
    parser.add_argument("--n-steps", default="[512,1024]")
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    load_before = os.getloadavg()
    experiments = Path(tempfile.mkdtemp(prefix="wb-sweep-bench-")) / "experiments"
    process_wall = run_sweep(args, experiments)
    points, sweep_wall = sweep_records(experiments)
    load_after = os.getloadavg()

    print(f"{'point':<26} {'fixed s':>8} {'train s':>8} {'rest s':>7} {'wall s':>7}")
    for p in points:
        rest = p["wall_s"] - p["setup_s"] - p["train_s"]
        print(f"{p['point']:<26} {p['setup_s']:8.1f} {p['train_s']:8.1f} {rest:7.1f} "
              f"{p['wall_s']:7.1f}")
    train = sum(p["train_s"] for p in points)
    print(f"\nfixed cost per point (kernel start + imports + compose): median "
          f"{statistics.median(p['setup_s'] for p in points):.1f} s")
    print(f"mean training time per point: {train / len(points):.1f} s")
    print(f"sweep efficiency = sum(train) / (sweep wall x workers) = {train:.1f} / "
          f"({sweep_wall:.1f} x {args.workers}) = {train / (sweep_wall * args.workers):.3f}"
          "  (target >= 0.85)")
    print(f"  with the command's start-up: {train:.1f} / ({process_wall:.1f} x {args.workers})"
          f" = {train / (process_wall * args.workers):.3f}")
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} "
          f"on {os.cpu_count()} logical CPUs")


if __name__ == "__main__":
    main()
