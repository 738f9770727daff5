"""Tracking overhead: ``workbench train`` vs a bare SB3 script, same configuration.

Each repetition runs both, each in a fresh process, in alternating order (bare first in odd
repetitions, workbench first in even ones), so machine-load drift hits both alike; the ratio is
the median of the per-repetition ratios. Printed: the median training wall time of each, their
ratio (target <= 1.03), end-to-end process time, and peak RSS of each process.

    python benchmarks/tracking_overhead.py                 # 8 envs, n_steps 256, 50k steps, 4 reps
    python benchmarks/tracking_overhead.py --steps 20000 --reps 2
    python benchmarks/tracking_overhead.py --workbench-overrides tracking.system_metrics=false
                                          # ablation: what one part of the workbench costs
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
RESULTS = Path(os.environ.get("WORKBENCH_BENCH_RESULTS") or ROOT / "benchmarks" / "results")


def bare_main(args: argparse.Namespace) -> None:
    """The baseline: SB3 PPO with the same hyperparameters, no tracking, no callbacks."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from workbench.envs import auto_torch_threads

    torch.set_num_threads(auto_torch_threads(args.num_envs, "dummy"))
    venv = make_vec_env(args.env_id, n_envs=args.num_envs, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=args.n_steps, batch_size=args.batch_size, seed=0,
                device="cpu", verbose=0)
    started = time.perf_counter()
    model.learn(args.steps)
    print(json.dumps({"train_s": time.perf_counter() - started}))


def run_child(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run one measured process; returns wall time, peak RSS and what it printed."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed ({proc.returncode}): {' '.join(command)}")
    return {"process_s": time.perf_counter() - started, "peak_rss_mb": usage.ru_maxrss / 1024,
            "stdout": out}  # type: ignore[dict-item]


def workbench_train_s(run_id: str, uri: str) -> float:
    """Training wall time the workbench measured around ``learn`` (same span as bare)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_run(run_id).data.metrics["summary/wall_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--workbench-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra overrides for the workbench side (ablations), e.g. "
                             "console.progress_bar=false tracking.system_metrics=false")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_main(args)
        return

    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(tmp)}
    common = [f"--env-id={args.env_id}", f"--num-envs={args.num_envs}",
              f"--n-steps={args.n_steps}", f"--batch-size={args.batch_size}",
              f"--steps={args.steps}"]
    bare_cmd = [sys.executable, __file__, "--bare", *common]
    env_name = {"HalfCheetah-v5": "halfcheetah", "Hopper-v5": "hopper"}.get(args.env_id)
    wb_cmd = [sys.executable, "-m", "workbench", "train", f"env={env_name}",
              f"env.num_envs={args.num_envs}", f"algo.n_steps={args.n_steps}",
              f"algo.batch_size={args.batch_size}", f"total_timesteps={args.steps}",
              "eval.final_episodes=0", "device=cpu",
              # the bare script's setting, whatever conf/ defaults to (issue 8 changed them)
              "algo=ppo_sb3", "env.normalize=false", "env.vec_env=dummy",
              *args.workbench_overrides]
    rows: dict[str, list[dict[str, float]]] = {"bare": [], "workbench": []}
    commands = {"bare": bare_cmd, "workbench": wb_cmd}
    for rep in range(args.reps):
        for name in ("bare", "workbench") if rep % 2 == 0 else ("workbench", "bare"):
            result = run_child(commands[name], env)
            last = str(result.pop("stdout")).strip().splitlines()[-1]  # JSON / the run id
            result["train_s"] = (json.loads(last)["train_s"] if name == "bare"
                                 else workbench_train_s(last, uri))
            rows[name].append(result)
        print(f"rep {rep + 1}/{args.reps}: bare {rows['bare'][-1]['train_s']:.1f}s, "
              f"workbench {rows['workbench'][-1]['train_s']:.1f}s", flush=True)

    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rows.items()}
    ratios = [w["train_s"] / b["train_s"] for b, w in zip(rows["bare"], rows["workbench"],
                                                           strict=True)]
    print(f"\n{args.env_id}, {args.num_envs} envs, n_steps {args.n_steps}, "
          f"{args.steps} steps, {args.reps} repetitions in alternating order (medians)")
    print(f"{'':<10} {'train s':>9} {'process s':>10} {'peak RSS MiB':>13}")
    for name in ("bare", "workbench"):
        m = med[name]
        print(f"{name:<10} {m['train_s']:>9.2f} {m['process_s']:>10.2f} {m['peak_rss_mb']:>13.0f}")
    ratio = statistics.median(ratios)
    print(f"wall-time ratio workbench/bare (training): {ratio:.3f}  (target <= 1.03; "
          f"per rep: {', '.join(f'{r:.3f}' for r in ratios)})")
    process_ratio = med["workbench"]["process_s"] / med["bare"]["process_s"]
    print(f"end-to-end process ratio: {process_ratio:.3f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tracking_overhead.json"
    out.write_text(json.dumps({"args": vars(args), "runs": rows, "ratio": ratio}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
