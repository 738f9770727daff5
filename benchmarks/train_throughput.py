"""R_train: the workbench's own overhead on PPO training throughput, per configuration/backend.

For each configuration and backend, two fresh processes per repetition, interleaved, in
alternating order (bare first in odd repetitions, workbench first in even ones):

- ``bare``: the same SB3 ``PPO`` object the workbench builds
  (``workbench.training.model.build_model`` over ``workbench.envs.vector.make_envs``:
  SB3's ``make_vec_env`` or the EnvPool adapter, plus
  ``VecNormalize`` when configured), same torch threads, ``model.learn`` and nothing else;
- ``workbench``: ``python -m workbench train`` with the same overrides: MLflow tracking, system
  metrics sampler, callbacks, console lines and progress bar included.

``R_train`` = workbench steps/s / bare steps/s (median over repetitions of the per-pair
ratio; target >= 0.98). Printed per run: steps/s, the rollout/update split of the training
time, the learner's peak RSS and the largest worker's (``subproc``).

    python benchmarks/train_throughput.py                    # full: 3 configs x 3 backends
    python benchmarks/train_throughput.py --quick
    python benchmarks/train_throughput.py --concurrent --configs default --reps 4
                                          # both sides at once, one core each (less drift)
    python benchmarks/train_throughput.py --pin 0 --configs default --backends envpool
                                          # one after the other on one core (the quietest)
    python benchmarks/train_throughput.py --device cuda       # GPU servers: update share on GPU
    python benchmarks/train_throughput.py --pin 0 --configs default --backends envpool \
        --tracking-uri http://127.0.0.1:5000  # a tracking server (on another core) as the store
    python benchmarks/train_throughput.py --pin 0 --configs hopper --config hopper=env=hopper \
        --backends envpool                    # another task as shipped (its tuning file)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from workbench.envs.cores import auto_torch_threads
from workbench.envs.vector import make_envs

# name -> workbench overrides. "default" is conf/ as shipped; "sb3-b64" is SB3's PPO defaults
# with 8 envs and 256-step rollouts.
CONFIGS: dict[str, list[str]] = {
    "default": ["env=halfcheetah"],
    "default-1thread": ["env=halfcheetah", "torch_threads=1"],
    "sb3-b64": ["env=halfcheetah", "algo=ppo_sb3", "env.num_envs=8", "algo.n_steps=256",
                "env.normalize=false"],
}


# --------------------------------------------------------------------------- children


def bare_child(overrides: list[str], steps: int, go_file: str | None = None) -> None:
    """SB3 PPO built exactly as the workbench builds it, learning with no extras."""
    import torch
    from workbench.envs import calibration
    from workbench.envs.spec import EnvSpec
    from workbench.training import load_config
    from workbench.training.model import build_model

    cfg = load_config([*overrides, f"total_timesteps={steps}"])
    choice = calibration.choose_vec_env(EnvSpec.from_config(cfg))
    threads = cfg.torch_threads or auto_torch_threads(cfg.env.num_envs, choice.name)
    torch.set_num_threads(threads)
    venv = make_envs(calibration.resolve_spec(EnvSpec.from_config(cfg)))
    model = build_model(cfg, venv)

    timer = harness.phase_timer()
    harness.wait_for_go(go_file)  # --concurrent: learn together with the workbench side
    started = time.perf_counter()
    model.learn(steps, callback=timer)
    train_s = time.perf_counter() - started
    venv.close()
    print(json.dumps({"train_s": train_s, "rollout_s": timer.spans["rollout_s"],
                      "steps": model.num_timesteps, "threads": threads,
                      "vec_env": choice.name}))


def workbench_result(run_id: str, uri: str) -> dict[str, Any]:
    """Training time and split as the workbench recorded them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    rollout = sum(m.value for m in client.get_metric_history(run_id, "time/rollout_s"))
    return {"train_s": run.data.metrics["summary/wall_time_s"], "rollout_s": rollout,
            "steps": int(run.data.params["total_timesteps"]),
            "threads": int(run.data.params["derived.torch_threads"]),
            "vec_env": run.data.params["derived.vec_env"]}


# --------------------------------------------------------------------------- parent


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="wb-throughput-"))
    uri = args.tracking_uri or f"sqlite:///{tmp / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(tmp)}
    rows: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for name in args.configs:
            for backend in args.backends:
                overrides = [*CONFIGS[name], f"env.vec_env={backend}", f"device={args.device}"]
                # alternating order or both at once: drift favours neither side
                measured = harness.run_pair(commands(overrides, args.steps), env, rep,
                                            args.concurrent, timeout_s=3600, pin=args.pin)
                pair = {kind: {"config": name, "backend": backend, "kind": kind, "rep": rep,
                               **result_of(kind, proc, uri)} for kind, proc in measured.items()}
                rows.extend(pair.values())
                ratio = pair["workbench"]["steps_per_s"] / pair["bare"]["steps_per_s"]
                pair["workbench"]["r_train"] = ratio
                print(f"rep {rep + 1}/{args.reps} {name:<16} {backend:<8} bare "
                      f"{pair['bare']['steps_per_s']:.0f} steps/s, workbench "
                      f"{pair['workbench']['steps_per_s']:.0f} steps/s, R_train {ratio:.3f} "
                      f"({harness.load_line()})", flush=True)
    return rows


def commands(overrides: list[str], steps: int) -> dict[str, list[str]]:
    """The bare child and ``workbench train`` for one configuration."""
    return {
        "bare": [sys.executable, __file__, "--bare", json.dumps(overrides), f"--steps={steps}"],
        "workbench": [sys.executable, "-m", "workbench", "train", *overrides,
                      f"total_timesteps={steps}", "eval.final_episodes=0"],
    }


def result_of(kind: str, proc: dict[str, Any], uri: str) -> dict[str, Any]:
    """One measured run: what it printed or recorded, with steps/s and the update share."""
    stdout = str(proc.pop("stdout"))
    if kind == "bare":
        result = harness.last_json(stdout)
    else:
        result = workbench_result(stdout.strip().splitlines()[-1], uri)
    return {**result, **proc, "steps_per_s": result["steps"] / result["train_s"],
            "update_share": 1.0 - result["rollout_s"] / result["train_s"]}


def summarize(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    table, summary = [], {}
    for name in args.configs:
        for backend in args.backends:
            mine = [r for r in rows if r["config"] == name and r["backend"] == backend]
            bare = [r for r in mine if r["kind"] == "bare"]
            wb = [r for r in mine if r["kind"] == "workbench"]
            r_train = harness.median([r["r_train"] for r in wb])
            summary[f"{name}/{backend}"] = {"r_train": r_train, "vec_env": wb[0]["vec_env"]}
            for kind, runs in (("bare", bare), ("workbench", wb)):
                table.append([name, backend, kind, runs[0]["threads"],
                              harness.median([r["steps_per_s"] for r in runs]),
                              harness.median([r["update_share"] for r in runs]),
                              harness.median([r["peak_rss_mb"] for r in runs]),
                              harness.median([r["worker_peak_rss_mb"] for r in runs]),
                              r_train if kind == "workbench" else float("nan")])
    harness.print_table(
        f"R_train = workbench steps/s / bare SB3 steps/s ({args.steps} steps, medians of "
        f"{args.reps} {method(args)}, "
        f"device {args.device})",
        ["config", "backend", "kind", "threads", "steps/s", "update share", "peak RSS MiB",
         "worker RSS MiB", "R_train"], table)
    worst = min(v["r_train"] for v in summary.values())
    print(f"  lowest R_train: {worst:.3f} (target >= 0.98)")
    return {"per_config": summary, "lowest_r_train": worst}


def method(args: argparse.Namespace) -> str:
    """How the two sides shared the machine, for the table's title."""
    if args.concurrent:
        return "concurrent repetitions"
    where = f" on core {args.pin} alone" if args.pin is not None else ""
    return f"interleaved repetitions{where}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", nargs="+", help=f"of {sorted(CONFIGS)} and --config names")
    parser.add_argument("--config", action="append", default=[],
                        metavar="NAME=OVERRIDE,OVERRIDE",
                        help="add a configuration: env=halfcheetah plus these overrides (or "
                             "the task an env=<task> among them names)")
    parser.add_argument("--backends", nargs="+", choices=["dummy", "subproc", "envpool"])
    parser.add_argument("--steps", type=int)
    parser.add_argument("--reps", type=int)
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="the store the workbench side logs to (e.g. a tracking server's "
                             "http://host:port) instead of a fresh SQLite file")
    parser.add_argument("--concurrent", action="store_true",
                        help="run bare and workbench at the same time, one core each (swapped "
                             "every repetition; each gets 1 core's budget)")
    parser.add_argument("--pin", type=int, metavar="CORE",
                        help="one after the other, both on this one core with a one-core "
                             "budget (background threads included: the quietest method)")
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    parser.add_argument("--go-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pin is not None and (args.concurrent or args.pin not in os.sched_getaffinity(0)):
        parser.error(f"--pin {args.pin}: needs a core this process may use "
                     f"({sorted(os.sched_getaffinity(0))}) and no --concurrent")
    if args.bare:
        bare_child(json.loads(args.bare), args.steps, args.go_file)
        return {}
    from time_to_reward import split_overrides
    from workbench.envs import envpool_vec

    for item in args.config:
        name, _, overrides = item.partition("=")
        given = split_overrides(overrides)
        task = [] if any(o.startswith("env=") for o in given) else ["env=halfcheetah"]
        CONFIGS[name] = [*task, *given]
    unknown = sorted(set(args.configs or []) - set(CONFIGS))
    if unknown:
        parser.error(f"unknown --configs {unknown}; choose from {sorted(CONFIGS)} or add --config")

    pool = ["envpool"] if envpool_vec.is_installed() else []
    args.configs = args.configs or (["default"] if args.quick else list(CONFIGS))
    args.backends = args.backends or (["dummy", *pool] if args.quick else
                                      ["dummy", "subproc", *pool])
    args.steps = args.steps or (8192 if args.quick else 50_000)
    args.reps = args.reps or (1 if args.quick else 3)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(f"train throughput: {harness.load_line()}", flush=True)
    rows = measure(args)
    summary = summarize(rows, args)
    path = harness.write_results("train_throughput", {"runs": rows, "summary": summary,
                                                      "args": vars(args)})
    print(f"results: {path}  ({harness.load_line()})")
    return summary


if __name__ == "__main__":
    main()
