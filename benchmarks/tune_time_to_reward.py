"""Tuning for time to reward: a ``workbench tune`` study, then its best trial side by side.

1. A study through the real command (``workbench tune``, papermill trials, MLflow, Optuna's
   SQLite storage, all in a temporary experiments folder): ``tune.objective=time_to_target``
   on one task with a fixed total budget (``--trials`` x ``--trial-budget-s`` training
   seconds on ``--workers`` workers), TPE and the median pruner.
2. The best trial's values (the ``experiment=tuned/<study>`` file it wrote, as overrides)
   re-run on ``--seeds`` next to the shipped defaults (``env=<task>``) and rl-baselines3-zoo
   itself (``time_to_reward.py``'s ``zoo``), through ``benchmarks/time_to_reward.py``'s protocol
   (interleaved seeds, fresh process per run, training seconds only, evaluations every
   10000 steps x 5 episodes), with ``--rerun-budget-s`` per run.

    python benchmarks/tune_time_to_reward.py --task hopper --target 400 --trials 8 \\
        --trial-budget-s 100 --workers 1 --rerun-budget-s 150 --seeds 0 1 2   # the defaults
    python benchmarks/tune_time_to_reward.py --task hopper --target 1500 --trials 40 \\
        --trial-budget-s 120 --workers 2      # a larger budget, for a machine of its own
    python benchmarks/tune_time_to_reward.py --task swimmer --target 282 --trials 30 \\
        --trial-budget-s 120 --workers 2 --search ppo_suite --trial-seeds 0 1 2 \\
        --seeds 20 21 22 --write-tuning \\
        --study-override tune.eval_every_steps=20480 tune.recheck_top=1
        # the suite's per-task values (docs/benchmarks.md); the overrides: fewer evaluations

With ``--trial-seeds`` each trial trains on those seeds (``tune.seeds``: pruning between
seeds, the best trials re-checked against the defaults on fresh seeds, a verdict; see
docs/tuning.md). ``--write-tuning`` then writes the chosen trial as the task's per-task values,
``conf/tuning/ppo_<task>.yaml``, with the study, the command and the verdict in its header
(review it with ``git diff`` before committing).

Prints the study's table, then the time-to-reward table and the tuned/defaults and
tuned/zoo ratios; writes ``benchmarks/results/tune_time_to_reward.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import time_to_reward  # noqa: E402


def study_command(args: argparse.Namespace, study: str) -> list[str]:
    """The ``workbench tune`` arguments of the study (after ``python -m workbench``)."""
    seeds = [f"tune.seeds=[{','.join(map(str, args.trial_seeds))}]"] if args.trial_seeds else []
    return [
        "tune", "--n-trials", str(args.trials),
        f"env={args.task}", f"search={args.search}", "tune.objective=time_to_target",
        f"tune.target={args.target:g}", f"tune.budget_s={args.trial_budget_s:g}",
        f"tune.workers={args.workers}", f"tune.study={study}", f"tune.seed={args.sampler_seed}",
        f"tune.startup_trials={args.startup_trials}", *seeds, "total_timesteps=5000000",
        "tracking.system_metrics=false", "console.iteration_lines=false", *args.study_override,
    ]


def run_study(args: argparse.Namespace, experiments: Path) -> tuple[str, Path, str]:
    """``workbench tune`` in a fresh experiments folder; returns study, best config, output."""
    study = f"bench-{args.task}-ttr"
    command = [sys.executable, "-m", "workbench", *study_command(args, study)]
    env = {**os.environ, "WORKBENCH_EXPERIMENTS": str(experiments),
           "MLFLOW_TRACKING_URI": f"sqlite:///{experiments / 'mlflow.db'}"}
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        # each trial trains once per seed; a study over seeds re-checks its best on fresh ones
        trainings = (args.trials + (3 if args.trial_seeds else 0)) * max(1, len(args.trial_seeds))
        out, err = proc.communicate(timeout=trainings * (args.trial_budget_s + 600))
    except BaseException:  # Ctrl-C, timeout: the study stops its kernels and marks its runs
        proc.send_signal(signal.SIGTERM)  # SIGINT may be ignored (a background job)
        proc.communicate(timeout=120)
        raise
    print(out[out.find("Study "):], flush=True)
    print(f"study wall time: {time.perf_counter() - started:.0f} s", flush=True)
    if proc.returncode not in (0, 1):
        sys.exit(f"workbench tune failed ({proc.returncode}): {err[-3000:]}")
    return study, experiments / "conf" / "experiment" / "tuned" / f"{study}.yaml", out


def tuned_overrides(path: Path) -> str:
    """The best-config file as time_to_reward contestant overrides (``a=1,b=[2,3]``)."""
    from workbench.config.compose import hydra_value

    body = yaml.safe_load(path.read_text())
    items = ["algo=ppo_sb3"]
    for section in ("env", "algo"):
        flat = flatten(body[section], f"{section}.")
        items += [f"{k}={hydra_value(v)}" for k, v in flat.items()]
    return ",".join(items)


def tuning_text(args: argparse.Namespace, study: str, best_text: str) -> str:
    """``conf/tuning/ppo_<task>.yaml``: the chosen trial's env and algo values, and a header
    with the study, the command that ran it and the tuned preset's provenance (objective,
    sampled values, the verdict of the re-check on fresh seeds)."""
    body = yaml.safe_load(best_text)
    provenance = [line for line in best_text.splitlines() if line.startswith("#   ")]
    command = " ".join(["workbench", *study_command(args, study)])
    lines = [
        "# @package _global_",
        f"# PPO's per-task values for {time_to_reward.ENV_IDS[args.task]}, applied on top of "
        "conf/algo/ppo.yaml whenever",
        f"# algo=ppo and env={args.task} (config.yaml: `optional tuning: ${{algo}}_${{env}}`); "
        "explicit overrides",
        "# still win, `~tuning` composes without this file, presets never get it.",
        f"# Found by study {study}, written by benchmarks/tune_time_to_reward.py --write-tuning:",
        f"#   {command}",
        *provenance,
        f"# The figures: docs/benchmarks/{args.task}.md",
    ]
    values = {"env": body["env"], "algo": {k: v for k, v in body["algo"].items()
                                             if k != "name"}}
    return "\n".join(lines) + "\n" + yaml.safe_dump(values, sort_keys=False)


def flatten(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="hopper", choices=sorted(time_to_reward.ENV_IDS))
    parser.add_argument("--target", type=float, default=400.0)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--trial-budget-s", type=float, default=100.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--startup-trials", type=int, default=3)
    parser.add_argument("--sampler-seed", type=int, default=0)
    parser.add_argument("--rerun-budget-s", type=float, default=150.0)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                        help="seeds of the side-by-side re-run")
    parser.add_argument("--search", default="ppo", help="a conf/search option (ppo_suite: the "
                                                        "MuJoCo suite's wider space)")
    parser.add_argument("--trial-seeds", nargs="+", type=int, default=[],
                        help="seeds every trial trains on (tune.seeds); none: one seed")
    parser.add_argument("--study-override", nargs="+", default=[], metavar="OVERRIDE",
                        help="more overrides of the study, e.g. tune.eval_every_steps=20480 "
                             "tune.recheck_top=1")
    parser.add_argument("--rerun-only", nargs="+", default=["workbench", "zoo", "tuned"],
                        choices=["workbench", "zoo", "tuned"], metavar="CONTESTANT",
                        help="the re-run's contestants (default all three; drop `workbench`, "
                             "the shipped defaults, where they are measured already)")
    parser.add_argument("--write-tuning", action="store_true",
                        help="write the chosen trial as conf/tuning/ppo_<task>.yaml")
    args = parser.parse_args(argv)
    if "tuned" not in args.rerun_only:
        parser.error("--rerun-only: keep `tuned`, the study's chosen trial, in the re-run")
    if args.write_tuning and len(args.trial_seeds) < 2:
        parser.error("--write-tuning needs --trial-seeds with 2 or more seeds: per-task "
                     "values are written only with a verdict on fresh seeds")
    return args


def main() -> None:
    args = parse_args()
    print(f"tune time to reward: {args.task} to {args.target:g}, {args.trials} trials x "
          f"{args.trial_budget_s:g} s on {args.workers} workers; re-runs {args.seeds} x "
          f"{args.rerun_budget_s:g} s; {harness.load_line()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="wb-tune-bench-") as tmp:
        study, best_path, output = run_study(args, Path(tmp) / "experiments")
        if not best_path.exists():
            sys.exit("the study completed no trial: no best config to re-run")
        best_text = best_path.read_text()
        tuned = tuned_overrides(best_path)
    print(best_text, flush=True)
    data = time_to_reward.main([
        "--tasks", args.task, "--seeds", *map(str, args.seeds), "--thresholds",
        str(args.target), "--budget-s", str(args.rerun_budget_s),
        "--contestant", f"tuned={tuned}", "--only", *args.rerun_only])
    medians = data["summary"][args.task]["median_s"]
    for base in [c for c in ("workbench", "zoo") if c in args.rerun_only]:
        t, b = medians["tuned"][0], medians[base][0]
        shown = f"{t / b:.2f}" if b != float("inf") and t != float("inf") else (
            f"< {t / args.rerun_budget_s:.2f} ({base} not reached)" if t != float("inf")
            else "n/a (tuned not reached)")
        print(f"  tuned / {base} time ratio to {args.target:g}: {shown}")
    if args.write_tuning:  # after the re-run: its workbench column is the defaults before
        tuning = ROOT / "conf" / "tuning" / f"ppo_{args.task}.yaml"
        tuning.write_text(tuning_text(args, study, best_text))
        print(f"wrote {tuning.relative_to(ROOT)}: review it (git diff) before committing",
              flush=True)
    path = harness.write_results("tune_time_to_reward", {
        "args": vars(args), "study": study, "study_output": output, "best_config": best_text,
        "time_to_reward": data})
    print(f"results: {path}  ({harness.load_line()})")


if __name__ == "__main__":
    main()
