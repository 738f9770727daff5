"""Real MuJoCo tasks with injected faults, for the failure tests (importable by workers).

Used as ``env.id=tests.faulty_envs:WorkbenchTest/<Name>-v0``: gymnasium imports this module
(in the trainer and in every ``SubprocVecEnv`` worker) before making the id. Each fault hits
only the env copy of rank 1 (the one reset with ``seed + 1``), at its ``FAULT_STEP``-th step.
"""

from __future__ import annotations

import ctypes
import sys
import time
from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv

FAULT_STEP = 90
FAULT_RANK_SEED = 1  # train() seeds rank r with seed + r; the tests use seed=0


class FaultyCheetah(HalfCheetahEnv):
    """HalfCheetah-v5 whose copy of rank 1 misbehaves once it has made ``FAULT_STEP`` steps."""

    fault = "none"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first_seed: int | None = None
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self.first_seed is None:
            self.first_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        self.steps += 1
        if self.first_seed == FAULT_RANK_SEED and self.steps >= FAULT_STEP:
            obs, reward = self.misbehave(obs, reward)
        return obs, reward, terminated, truncated, info

    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        return obs, reward


class CrashingCheetah(FaultyCheetah):
    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        raise RuntimeError(f"simulated simulator fault at step {self.steps}")


class SegfaultingCheetah(FaultyCheetah):
    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        ctypes.string_at(0)  # a real native crash: SIGSEGV reading address 0
        return obs, reward


class NanObservationCheetah(FaultyCheetah):
    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        obs = obs.copy()
        obs[3] = np.nan
        return obs, reward


class NanRewardCheetah(FaultyCheetah):
    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        return obs, float("inf")


class HugeRewardCheetah(FaultyCheetah):
    """Finite but huge rewards (1e30): the value loss overflows float32 in the update."""

    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        return obs, 1e30


class HangingCheetah(FaultyCheetah):
    """A simulator that hangs (sleeps 120 s) in one step: only a second Ctrl-C gets out."""

    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        if self.steps == FAULT_STEP:
            print("faulty_envs: simulator hangs", file=sys.stderr, flush=True)
            time.sleep(120)
        return obs, reward


for _cls in (CrashingCheetah, SegfaultingCheetah, NanObservationCheetah, NanRewardCheetah,
             HugeRewardCheetah, HangingCheetah):
    _id = f"WorkbenchTest/{_cls.__name__}-v0"
    if _id not in gymnasium.envs.registry:
        gymnasium.register(_id, entry_point=f"{__name__}:{_cls.__name__}", max_episode_steps=1000)
