"""Tracking overhead: ``workbench train`` vs a bare SB3 script, same configuration.

Each repetition runs both, each in a fresh process, in alternating order (bare first in odd
repetitions, workbench first in even ones), so machine-load drift hits both alike; the ratio is
the median of the per-repetition ratios. Printed: the median training wall time of each, its
rollout / update split (where the workbench's ``time/*`` metrics split it), their ratios
(target <= 1.03), end-to-end process time, and peak RSS of each process.

On a shared machine the speed of each core drifts by +-20 % within minutes, more than the few
per cent measured here. ``--concurrent`` runs both sides at the same time, one core each,
swapping cores every repetition; ``--control`` puts the bare script on both sides, so its
ratios show how far from 1.0 two identical programs land (the method's resolution).

    python benchmarks/tracking_overhead.py                 # 8 envs, n_steps 256, 50k steps, 4 reps
    python benchmarks/tracking_overhead.py --steps 20000 --reps 2
    python benchmarks/tracking_overhead.py --concurrent --reps 6
    python benchmarks/tracking_overhead.py --concurrent --reps 6 --control
    python benchmarks/tracking_overhead.py --workbench-overrides tracking.system_metrics=false
                                          # ablation: what one part of the workbench costs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness


def bare_main(args: argparse.Namespace) -> None:
    """The baseline: SB3 PPO with the same hyperparameters, no tracking, no callbacks."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from workbench.envs.cores import auto_torch_threads

    torch.set_num_threads(auto_torch_threads(args.num_envs, "dummy"))
    venv = make_vec_env(args.env_id, n_envs=args.num_envs, seed=0)
    model = PPO("MlpPolicy", venv, n_steps=args.n_steps, batch_size=args.batch_size, seed=0,
                device="cpu", verbose=0)
    timer = harness.phase_timer()
    harness.wait_for_go(args.go_file)  # --concurrent: learn together with the workbench side
    started = time.perf_counter()
    model.learn(args.steps, callback=timer)
    print(json.dumps({"train_s": time.perf_counter() - started, **timer.spans}))


def commands_for(args: argparse.Namespace, steps: int) -> tuple[list[str], list[str]]:
    """The bare script and the ``workbench train`` command, same configuration."""
    bare = [sys.executable, __file__, "--bare", f"--env-id={args.env_id}",
            f"--num-envs={args.num_envs}", f"--n-steps={args.n_steps}",
            f"--batch-size={args.batch_size}", f"--steps={steps}"]
    env_name = {"HalfCheetah-v5": "halfcheetah", "Hopper-v5": "hopper"}.get(args.env_id)
    workbench = [sys.executable, "-m", "workbench", "train", f"env={env_name}",
                 f"env.num_envs={args.num_envs}", f"algo.n_steps={args.n_steps}",
                 f"algo.batch_size={args.batch_size}", f"total_timesteps={steps}",
                 "eval.final_episodes=0", "device=cpu",
                 # the bare script's setting, whatever conf/ defaults to
                 "algo=ppo_sb3", "env.normalize=false", "env.vec_env=dummy",
                 *args.workbench_overrides]
    return bare, workbench


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The measured configuration (shared with ``instruction_overhead.py``)."""
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workbench-overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra overrides for the workbench side (ablations), e.g. "
                             "console.progress_bar=false tracking.system_metrics=false")


def workbench_times(run_id: str, uri: str) -> dict[str, float]:
    """Training wall time the workbench measured around ``learn`` (same span as bare) and
    its rollout / update split (sums of the per-iteration ``time/*`` metrics)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    times = {"train_s": client.get_run(run_id).data.metrics["summary/wall_time_s"]}
    for phase in ("rollout_s", "update_s"):
        times[phase] = sum(m.value for m in client.get_metric_history(run_id, f"time/{phase}"))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--concurrent", action="store_true",
                        help="run both sides at the same time, one core each (swapped every "
                             "repetition): machine-load drift then hits both alike")
    parser.add_argument("--control", action="store_true",
                        help="run the bare script on both sides: how far from 1.0 two "
                             "identical programs land is the resolution of the method here")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--go-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_main(args)
        return

    tmp = Path(tempfile.mkdtemp(prefix="wb-bench-"))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(tmp)}
    bare_cmd, wb_cmd = commands_for(args, args.steps)
    rows: dict[str, list[dict[str, float]]] = {"bare": [], "workbench": []}
    commands = {"bare": bare_cmd, "workbench": bare_cmd if args.control else wb_cmd}
    bare_sides = ("bare", "workbench") if args.control else ("bare",)
    for rep in range(args.reps):
        for name, result in harness.run_pair(commands, env, rep, args.concurrent,
                                             bare_sides=bare_sides).items():
            last = str(result.pop("stdout")).strip().splitlines()[-1]  # JSON / the run id
            result.update(json.loads(last) if name in bare_sides else workbench_times(last, uri))
            rows[name].append(result)
        print(f"rep {rep + 1}/{args.reps}: bare {rows['bare'][-1]['train_s']:.1f}s, "
              f"workbench {rows['workbench'][-1]['train_s']:.1f}s", flush=True)

    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in rows.items()}
    ratios = [w["train_s"] / b["train_s"] for b, w in zip(rows["bare"], rows["workbench"],
                                                           strict=True)]
    how = ("at the same time, one core each" if args.concurrent
           else "one after the other in alternating order")
    print(f"\n{args.env_id}, {args.num_envs} envs, n_steps {args.n_steps}, "
          f"{args.steps} steps, {args.reps} repetitions {how} (medians)")
    print(f"{'':<10} {'train s':>9} {'rollout s':>10} {'update s':>9} {'process s':>10} "
          f"{'peak RSS MiB':>13}")
    for name in ("bare", "workbench"):
        m = med[name]
        label = "bare #2" if args.control and name == "workbench" else name
        print(f"{label:<10} {m['train_s']:>9.2f} {m['rollout_s']:>10.2f} {m['update_s']:>9.2f} "
              f"{m['process_s']:>10.2f} {m['peak_rss_mb']:>13.0f}")
    ratio = statistics.median(ratios)
    print(f"wall-time ratio workbench/bare (training): {ratio:.3f}  (target <= 1.03; "
          f"per rep: {', '.join(f'{r:.3f}' for r in ratios)})")
    for phase in ("rollout_s", "update_s"):
        phase_ratios = [w[phase] / b[phase] for b, w in zip(rows["bare"], rows["workbench"],
                                                            strict=True)]
        print(f"  {phase[:-2]} ratio: {statistics.median(phase_ratios):.3f}  (per rep: "
              f"{', '.join(f'{r:.3f}' for r in phase_ratios)})")
    process_ratio = med["workbench"]["process_s"] / med["bare"]["process_s"]
    print(f"end-to-end process ratio: {process_ratio:.3f}")
    out = harness.write_results("tracking_overhead", {"args": vars(args), "runs": rows,
                                                      "ratio": ratio})
    print(f"results: {out}")


if __name__ == "__main__":
    main()
