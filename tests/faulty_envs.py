"""Real MuJoCo tasks with injected faults, for the failure tests (importable by workers).

Used as ``env.id=tests.faulty_envs:WorkbenchTest/<Name>-v0``: gymnasium imports this module
(in the trainer and in every ``SubprocVecEnv`` worker) before making the id. Each fault hits
only the env copy of rank 1 (the one reset with ``seed + 1``), at its ``FAULT_STEP``-th step.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path
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


class HeldCheetah(FaultyCheetah):
    """Holds a sweep point or trial mid-training until the test lets it go, instead of a long
    training that is only probably still running when the test acts (kills a node, a head).

    Every copy, at its ``FAULT_STEP``-th step, writes ``<notebook>.held`` beside the point's
    executed notebook (``WORKBENCH_NOTEBOOK``, set by the sweep or study for each point) and
    waits until ``<notebook>.release`` or ``release-all`` in that folder exists: see
    :func:`held_points` and :func:`release`. Outside a sweep or study it never holds.
    """

    def misbehave(self, obs: np.ndarray, reward: float) -> tuple[np.ndarray, float]:
        notebook = os.environ.get("WORKBENCH_NOTEBOOK")
        if notebook and self.steps == FAULT_STEP:
            path = Path(notebook)
            path.with_suffix(".held").touch()
            while not (path.with_suffix(".release").exists()
                       or (path.parent / RELEASE_ALL).exists()):
                time.sleep(0.1)
        return obs, reward

    def step(self, action: Any) -> Any:  # every copy holds, whatever its rank
        obs, reward, terminated, truncated, info = HalfCheetahEnv.step(self, action)
        self.steps += 1
        obs, reward = self.misbehave(obs, reward)
        return obs, reward, terminated, truncated, info


RELEASE_ALL = "release-all"
HELD = "tests.faulty_envs:WorkbenchTest/HeldCheetah-v0"


class CollapsingCheetah(HalfCheetahEnv):
    """HalfCheetah-v5 whose return rises, then collapses late, whatever the policy does.

    The copies of this process count their steps together (training and evaluation copies
    alike, in a fixed order for a given run): each step is rewarded count / ``COLLAPSE_AFTER``
    (0 to 1, so every evaluation returns more than the one before), and once the count
    passed ``COLLAPSE_AFTER``, ``COLLAPSED_REWARD``. Deterministic: the best checkpoint is
    the last one evaluated before the collapse. :func:`reset_collapse` starts the count anew
    (before a run in the test's process; a new process starts from zero).
    """

    def step(self, action: Any) -> Any:
        obs, _, terminated, truncated, info = super().step(action)
        COLLAPSE_COUNT[0] += 1
        reward = (COLLAPSE_COUNT[0] / COLLAPSE_AFTER if COLLAPSE_COUNT[0] <= COLLAPSE_AFTER
                  else COLLAPSED_REWARD)
        return obs, reward, terminated, truncated, info


COLLAPSE_AFTER = 700
COLLAPSED_REWARD = -100.0
COLLAPSE_COUNT = [0]  # steps made by this process's CollapsingCheetah copies
COLLAPSING = "tests.faulty_envs:WorkbenchTest/CollapsingCheetah-v0"


def reset_collapse() -> None:
    """Count the steps before the collapse from zero again."""
    COLLAPSE_COUNT[0] = 0


def held_points(folder: Path) -> set[str]:
    """The points (or trials) held now or before under ``folder`` (a store: every sweep's
    and study's notebook folder under it)."""
    return {p.stem for p in folder.rglob("*.held")}


def release(folder: Path, point: str | None = None) -> None:
    """Let one held point go (``point``), or every point, now and later (None), in each
    sweep's or study's notebook folder under ``folder``."""
    if point is not None:
        for held in folder.rglob(f"{point}.held"):
            held.with_suffix(".release").touch()
        return
    for notebooks in {p.parent for p in [*folder.rglob("*.held"), *folder.rglob("*.ipynb")]}:
        (notebooks / RELEASE_ALL).touch()


for _cls in (CrashingCheetah, SegfaultingCheetah, NanObservationCheetah, NanRewardCheetah,
             HugeRewardCheetah, HangingCheetah, HeldCheetah, CollapsingCheetah):
    _id = f"WorkbenchTest/{_cls.__name__}-v0"
    if _id not in gymnasium.envs.registry:
        gymnasium.register(_id, entry_point=f"{__name__}:{_cls.__name__}", max_episode_steps=1000)
