"""Where EnvPool (or batched) starts to pay: env-steps/s against ``dummy`` per task and env count.

A rollout alternates a policy forward pass and a batched env step. Each row steps the
backend (as ``workbench.envs.backends`` builds it: EnvPool with ``min(num_envs, cores)``
threads) for ``--seconds`` with the default policy's forward pass (256x256 MLP, one torch
thread) between steps, so EnvPool's threads go back to sleep between steps as they do in
training. ``workbench calibrate`` steps with random actions only, which hides that cost.
The crossover decides ``env.vec_env=auto``'s ``ENVPOOL_MIN_ENVS``
(docs/benchmarks.md#envvec_envauto-below-8-envs); with ``--against batched``, the batched
backend's ``BATCHED_MIN_ENVS`` (docs/benchmarks.md#batched-physics-with-randomization). Run it
on a quiet machine.

    python benchmarks/vec_env_crossover.py
    python benchmarks/vec_env_crossover.py --tasks hopper --envs 4 8 --seconds 5
    python benchmarks/vec_env_crossover.py --against batched --tasks duck halfcheetah --envs 1 2 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecEnv
from workbench.config import load_config
from workbench.envs import envpool_vec
from workbench.envs.backends import build_backend
from workbench.envs.spec import EnvSpec


def policy_for(venv: VecEnv) -> torch.nn.Module:
    """The default policy's actor shape: two hidden layers of 256, tanh."""
    obs_dim = int(np.prod(venv.observation_space.shape or (1,)))
    act_dim = int(np.prod(venv.action_space.shape or (1,)))
    return torch.nn.Sequential(torch.nn.Linear(obs_dim, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, 256), torch.nn.Tanh(),
                               torch.nn.Linear(256, act_dim))


def rollout_rate(spec: EnvSpec, seconds: float) -> tuple[float, float]:
    """(env-steps/s, microseconds per batched env step) with a policy forward between steps."""
    venv = build_backend(spec)
    try:
        obs = venv.reset()
        policy = policy_for(venv)
        steps, env_time = 0, 0.0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            with torch.no_grad():
                actions = policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
            before = time.perf_counter()
            obs, *_ = venv.step(np.clip(actions, -1.0, 1.0))
            env_time += time.perf_counter() - before
            steps += 1
        elapsed = time.perf_counter() - started
    finally:
        venv.close()
    return steps * spec.num_envs / elapsed, 1e6 * env_time / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["swimmer", "halfcheetah", "hopper",
                                                       "walker2d"])
    parser.add_argument("--envs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--against", choices=["envpool", "batched"], default="envpool",
                        help="the backend measured against dummy (default envpool)")
    args = parser.parse_args()
    other = args.against
    if other == "envpool" and not envpool_vec.is_installed():
        print("envpool is not installed (extra `fast`): nothing to compare", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    print(f"{'task':12s} {'envs':>4s} {'dummy steps/s':>14s} {other + ' steps/s':>16s} "
          f"{other + '/dummy':>14s}   env step us (dummy, {other})")
    for task in args.tasks:
        for num_envs in args.envs:
            spec = EnvSpec.from_config(load_config([f"env={task}", f"env.num_envs={num_envs}"]))
            dummy, dummy_us = rollout_rate(replace(spec, vec_env="dummy"), args.seconds)
            rate, rate_us = rollout_rate(replace(spec, vec_env=other), args.seconds)
            print(f"{task:12s} {num_envs:4d} {dummy:14,.0f} {rate:16,.0f} {rate / dummy:14.2f}"
                  f"   {dummy_us:.0f}, {rate_us:.0f}", flush=True)
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
