"""Final return at 1M steps of the default configuration, next to the zoo's published one.

Time to reward (``time_to_reward.py``) stops each run at its last threshold; this trains the
default configuration (``workbench train env=<task>`` as shipped) for the full budget of
environment steps, one fresh process per seed, and prints the final deterministic evaluation
(``eval.final_episodes`` episodes) per seed and its mean +- std over seeds next to the figure
rl-baselines3-zoo publishes for its tuned PPO at 1M steps (HalfCheetah 5819 +- 664, Hopper
2410 +- 10).

Returns do not depend on wall time, so seeds may run side by side (``--parallel``); the
printed wall times then say nothing about speed.

    python benchmarks/final_return.py                          # HalfCheetah, 1M steps, 3 seeds
    python benchmarks/final_return.py --parallel 3             # all seeds at once
    python benchmarks/final_return.py --steps 20000 --seeds 0  # smoke test
    python benchmarks/final_return.py --task hopper --steps 20000 --label sac \\
        experiment=zoo_sac_hopper                              # another configuration
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from workbench.review.references import PUBLISHED_PPO, PUBLISHED_PPO_STD

# rl-baselines3-zoo's published PPO result at 1M steps (mean +- std over its evaluation);
# docs/benchmarks.md holds the default configuration to "not below" it.
PUBLISHED = {task: (PUBLISHED_PPO[task], std) for task, std in PUBLISHED_PPO_STD.items()}


def command(task: str, steps: int, seed: int, episodes: int, overrides: list[str]) -> list[str]:
    """The training of one seed, exactly as a user would type it (plus quiet console)."""
    return [sys.executable, "-m", "workbench", "train", f"env={task}",
            f"total_timesteps={steps}", f"seed={seed}", f"eval.final_episodes={episodes}",
            "console.progress_bar=false", "console.iteration_lines=false", *overrides]


def run_seeds(args: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    """Train every seed, ``args.parallel`` at a time; the MLflow run id of each."""
    pending = list(args.seeds)
    running: dict[int, tuple[subprocess.Popen[str], float]] = {}
    done: list[dict[str, Any]] = []
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            cmd = command(args.task, args.steps, seed, args.episodes, args.overrides)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env, cwd=harness.ROOT)
            running[seed] = (proc, time.perf_counter())
            print(f"  seed {seed}: started ({harness.load_line()})", flush=True)
        for seed, (proc, started) in list(running.items()):
            if proc.poll() is None:
                continue
            out, err = proc.communicate()
            del running[seed]
            if proc.returncode != 0:
                tail = "\n".join(err.strip().splitlines()[-5:])
                raise SystemExit(f"final_return: seed {seed} failed ({proc.returncode}):\n{tail}")
            done.append({"seed": seed, "run_id": out.strip().splitlines()[-1],
                         "process_s": time.perf_counter() - started})
            print(f"  seed {seed}: done in {done[-1]['process_s']:.0f} s", flush=True)
        time.sleep(0.5)
    return sorted(done, key=lambda r: r["seed"])


def read_summary(runs: list[dict[str, Any]], uri: str) -> None:
    """Add each run's final evaluation and training figures from its MLflow run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for run in runs:
        data = client.get_run(run["run_id"]).data
        run["final_return"] = data.metrics["summary/eval_mean_reward"]
        run["final_return_std"] = data.metrics["summary/eval_std_reward"]
        run["train_s"] = data.metrics["summary/wall_time_s"]
        run["vec_env"] = data.params.get("derived.vec_env", "?")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="halfcheetah", help="a conf/env option")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=10, help="final evaluation episodes")
    parser.add_argument("--parallel", type=int, default=1, help="seeds trained at once")
    parser.add_argument("--label", default="",
                        help="names the configuration in the results file "
                             "(final_return_<task>_<label>.json) and the table")
    parser.add_argument("overrides", nargs="*", help="extra workbench overrides (default: none)")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel {args.parallel}: must be at least 1")

    store = Path(tempfile.mkdtemp(prefix="wb-final-"))
    uri = f"sqlite:///{store / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(store)}
    from workbench.sweeps.store import prepare_store

    # Created, migrated and switched to write-ahead logging once, before the seeds fan out.
    prepare_store(uri, "workbench")
    print(f"final return: {args.task}, {args.steps} steps, seeds {args.seeds}, "
          f"{args.parallel} at a time; {harness.load_line()}", flush=True)
    runs = run_seeds(args, env)
    read_summary(runs, uri)

    harness.print_table(
        f"Final deterministic return ({args.episodes} episodes) after {args.steps} steps, "
        f"{args.label or 'workbench defaults'}",
        ["seed", "final return", "std over episodes", "training s", "vec_env"],
        [[r["seed"], r["final_return"], r["final_return_std"], r["train_s"], r["vec_env"]]
         for r in runs])
    returns = [r["final_return"] for r in runs]
    mean = statistics.fmean(returns)
    spread = statistics.stdev(returns) if len(returns) > 1 else float("nan")
    line = f"  mean over {len(returns)} seeds: {mean:.0f} +- {spread:.0f}"
    published = PUBLISHED.get(args.task)
    if published is not None:
        line += (f"; rl-baselines3-zoo publishes {published[0]:.0f} +- {published[1]:.0f} for "
                 f"its tuned PPO at 1M steps (the defaults' target: not below it)")
    print(line)
    data = {"args": vars(args), "runs": runs, "mean": mean, "std_over_seeds": spread,
            "published": published}
    name = f"final_return_{args.task}" + (f"_{args.label}" if args.label else "")
    path = harness.write_results(name, data)
    print(f"results: {path}")
    return data


if __name__ == "__main__":
    main()
