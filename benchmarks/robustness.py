"""Robustness costs: checkpoint size and save time for the default net, interruption latency.

Printed, never asserted (see the developers' guide). Three measurements:

1. **Checkpoint size** of the default configuration (HalfCheetah-v5, 64x64 MLP, Adam state),
   split into policy + optimizer, simulator state and the rest.
2. **Time per checkpoint**: the in-memory snapshot taken at every iteration boundary, the
   synchronous part of a save (encode + write + hand to the outbox) and the time until the
   store has it (embedded SQLite store, local artifacts).
3. **Interruption latency**: SIGTERM to a real ``workbench train`` process with subprocess
   workers until it has exited (checkpoint written, run KILLED, workers reaped).

    python benchmarks/robustness.py                # 4 subproc envs, 3 interruptions
    python benchmarks/robustness.py --reps 5 --num-envs 8
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.envs.vector import make_envs, make_eval_env
from workbench.training.faults import Interruption

ROOT = Path(__file__).resolve().parents[1]


def checkpoint_costs(saves: int) -> None:
    """Sizes and times of checkpoints for the default config after one PPO iteration."""
    from mlflow.tracking import MlflowClient
    from workbench import config
    from workbench.envs.spec import EnvSpec
    from workbench.tracking import outbox
    from workbench.training import checkpoint, load_config, snapshot
    from workbench.training.model import build_model

    cfg = load_config(["console.progress_bar=false", "console.iteration_lines=false"])
    spec = EnvSpec.from_config(cfg)
    train_env, eval_env = make_envs(spec), make_eval_env(spec)
    model = build_model(cfg, train_env)
    model.learn(cfg.algo.n_steps * cfg.env.num_envs)  # one iteration: Adam state exists

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["WORKBENCH_EXPERIMENTS"] = tmp
        uri = f"sqlite:///{tmp}/mlflow.db"
        plain = MlflowClient(uri)
        run_id = plain.create_run(plain.create_experiment("bench", (Path(tmp) / "a").as_uri())
                                  ).info.run_id
        client = outbox.RunWriter(uri, run_id)
        recovery = checkpoint.RecoveryCallback(
            client, run_id, config.to_yaml(cfg), train_env, eval_env, every_steps=0,
            keep_last=3, interruption=Interruption())
        captures, syncs, delivered = [], [], []
        for i in range(saves):
            started = time.perf_counter()
            state = snapshot.capture(model, train_env, eval_env)
            captures.append(time.perf_counter() - started)
            state["num_timesteps"] = model.num_timesteps + i  # a new checkpoint each time
            recovery.snapshot = state
            started = time.perf_counter()
            recovery.save()
            syncs.append(time.perf_counter() - started)
            client.flush(60)
            delivered.append(time.perf_counter() - started)
        client.close()
    arrays: dict = {}
    checkpoint.encode(state, arrays)
    by_part = {"policy + optimizer": 0, "simulator state (envs)": 0, "other": 0}
    for key, array in arrays.items():
        part = ("policy + optimizer" if key.startswith(("/policy", "/optimizer"))
                else "simulator state (envs)" if key.startswith("/envs") else "other")
        by_part[part] += array.nbytes
    print(f"default config: {cfg.env.id}, {cfg.env.num_envs} env, net pi/vf "
          f"{list(cfg.algo.policy.pi)}/{list(cfg.algo.policy.vf)}")
    print(f"checkpoint size: {recovery.last_size_bytes / 1024:.1f} KiB on disk "
          f"(arrays: " + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in by_part.items()) + ")")
    print(f"snapshot per iteration (in memory): median {statistics.median(captures) * 1e3:.2f} ms")
    print(f"checkpoint save, training thread:   median {statistics.median(syncs) * 1e3:.1f} ms"
          f", max {max(syncs) * 1e3:.1f} ms ({saves} saves)")
    print("checkpoint save, until in the store: median "
          f"{statistics.median(delivered) * 1e3:.1f} ms")
    train_env.close()
    eval_env.close()


def interruption_latency(reps: int, num_envs: int) -> None:
    """SIGTERM -> exit of ``workbench train`` with ``num_envs`` subprocess workers."""
    latencies = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "WORKBENCH_EXPERIMENTS": tmp,
                   "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
            out = Path(tmp) / "out.txt"
            proc = subprocess.Popen(
                [sys.executable, "-m", "workbench", "train", "env.vec_env=subproc",
                 f"env.num_envs={num_envs}", "algo.n_steps=256", "total_timesteps=1000000",
                 "console.progress_bar=false", "tracking.system_metrics=false"],
                cwd=ROOT, env=env, stdout=out.open("w"), stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            while " steps | " not in out.read_text():  # the first iteration is done
                if proc.poll() is not None:
                    raise SystemExit("training ended before it could be interrupted")
                time.sleep(0.05)
            time.sleep(0.5)  # somewhere inside the next rollout
            sent = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait()
            latencies.append(time.perf_counter() - sent)
            print(f"  SIGTERM -> exit {code}: {latencies[-1]:.2f} s")
    print(f"interruption latency ({num_envs} subproc envs): median "
          f"{statistics.median(latencies):.2f} s, max {max(latencies):.2f} s ({reps} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="interruptions to time")
    parser.add_argument("--saves", type=int, default=10, help="checkpoint saves to time")
    parser.add_argument("--num-envs", type=int, default=4)
    args = parser.parse_args()
    checkpoint_costs(args.saves)
    interruption_latency(args.reps, args.num_envs)


if __name__ == "__main__":
    main()
