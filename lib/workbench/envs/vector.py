"""Vectorized environments: gymnasium MuJoCo tasks behind SB3's VecEnv interface.

Built with SB3's own ``make_vec_env`` (Monitor wrapper for episode statistics, env rank ``r``
seeded with ``seed + r``), optionally wrapped in ``VecNormalize``. Environment classes must
live in importable modules: ``SubprocVecEnv`` starts its workers with the forkserver method,
which re-imports them. ``vec_env="envpool"`` builds
:class:`workbench.envs.envpool_vec.EnvPoolVecEnv` (optional extra ``fast``)
instead; ``vec_env="auto"`` is resolved by
:mod:`workbench.envs.calibration` (a short, cached measurement).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    SubprocVecEnv,
    VecEnv,
    VecNormalize,
)

from workbench.config import RandomizationConfig
from workbench.envs import guards, robots  # robots registers the workbench's own ids
from workbench.envs.randomization import is_active, wrap

VecEnvClass = type[DummyVecEnv] | type[SubprocVecEnv]
VEC_ENV_CLASSES: dict[str, VecEnvClass] = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}


@dataclass(frozen=True)
class EnvSpec:
    """Plain values describing how to build the training environments."""

    env_id: str
    num_envs: int
    vec_env: str = "dummy"  # dummy | subproc | envpool | auto
    seed: int = 0
    max_episode_steps: int | None = None
    kwargs: dict[str, Any] | None = None
    normalize: bool = False
    norm_obs: bool = True
    norm_reward: bool = True
    clip_obs: float = 10.0
    randomization: RandomizationConfig | None = None  # training envs' domain randomization


def make_envs(spec: EnvSpec) -> VecEnv:
    """Training environments: ``num_envs`` copies, rank r seeded with ``seed + r``."""
    if spec.vec_env == "auto":
        from workbench.envs.calibration import resolve_spec

        spec = resolve_spec(spec)
    env_kwargs = dict(spec.kwargs or {})
    venv: VecEnv
    if spec.vec_env == "envpool":
        from workbench.envs.envpool_vec import EnvPoolVecEnv

        venv = EnvPoolVecEnv(
            spec.env_id,
            spec.num_envs,
            seed=spec.seed,
            max_episode_steps=spec.max_episode_steps,
            kwargs=env_kwargs,
            num_threads=min(spec.num_envs, cpu_budget()),
        )
    else:
        if spec.max_episode_steps is not None:
            env_kwargs["max_episode_steps"] = spec.max_episode_steps
        venv = make_vec_env(
            robots.importable_id(spec.env_id),
            n_envs=spec.num_envs,
            seed=spec.seed,
            vec_env_cls=guards.guarded(VEC_ENV_CLASSES[spec.vec_env], spec.env_id),
            env_kwargs=env_kwargs,
            wrapper_class=randomization_wrapper(spec.randomization),
        )
    # NaN/inf checks on raw values and named worker crashes (workbench.envs.guards).
    venv = guards.GuardedVecEnv(venv, spec.env_id)
    if spec.normalize:
        venv = VecNormalize(
            venv,
            norm_obs=spec.norm_obs,
            norm_reward=spec.norm_reward,
            clip_obs=spec.clip_obs,
        )
    return venv


def make_eval_env(
    spec: EnvSpec, seed_offset: int = 10_000, randomization: RandomizationConfig | None = None
) -> VecEnv:
    """One in-process copy for deterministic evaluation, seeded apart from training envs.

    ``randomization`` is the evaluation's own setting (``eval.randomization``); the training
    envs' ``spec.randomization`` does not apply here.

    With normalization the statistics are frozen (``training=False``) and rewards are raw;
    call ``sync_envs_normalization(train_env, eval_env)`` before each evaluation.
    """
    env_kwargs = dict(spec.kwargs or {})
    if spec.max_episode_steps is not None:
        env_kwargs["max_episode_steps"] = spec.max_episode_steps
    venv = make_vec_env(
        robots.importable_id(spec.env_id), n_envs=1, seed=spec.seed + seed_offset,
        env_kwargs=env_kwargs, wrapper_class=randomization_wrapper(randomization),
        vec_env_cls=guards.guarded(DummyVecEnv, spec.env_id),
    )
    venv = guards.GuardedVecEnv(venv, spec.env_id)  # same wrapper depth as the training envs
    if spec.normalize:
        venv = VecNormalize(
            venv, norm_obs=spec.norm_obs, norm_reward=False, clip_obs=spec.clip_obs, training=False
        )
    return venv


def randomization_wrapper(
    settings: RandomizationConfig | None,
) -> Callable[[Any], Any] | None:
    """SB3 ``wrapper_class`` applying ``settings`` (None when nothing is randomized)."""
    if settings is None or not is_active(settings):
        return None
    return functools.partial(wrap, settings=settings)


def physical_cores() -> int:
    """Physical cores available to this process (falls back to logical CPUs)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to tell
        cores = None
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    candidates = [c for c in (cores, available, os.cpu_count()) if c]
    return max(1, min(candidates)) if candidates else 1


def cpu_budget() -> int:
    """Cores this run may use: ``WORKBENCH_CPU_BUDGET`` (set by the sweep runner) or all."""
    budget = os.environ.get("WORKBENCH_CPU_BUDGET")
    return max(1, int(budget)) if budget else physical_cores()


LEARNER_CORES_PER_THREAD = 4  # see auto_torch_threads


def auto_torch_threads(num_envs: int, vec_env: str, budget: int | None = None) -> int:
    """Learner threads so that sampling workers + learner never oversubscribe the cores.

    With ``subproc`` each env worker is a busy process during rollouts, so the learner gets
    what is left; with ``dummy`` and ``envpool`` sampling and learning alternate in one
    process (EnvPool's threads sleep while the learner runs). Of the cores left, the learner
    takes one thread per ``LEARNER_CORES_PER_THREAD``: PPO's small MLPs gain little from
    intra-op threads, and OpenMP threads wait for each other at every operation, so one busy
    core elsewhere stalls them all. Measured on 2 shared cores (README "Performance"): two
    threads trained ~10% faster than one on an idle machine and 2-4x slower as soon as
    another process wanted a core.
    """
    budget = budget or cpu_budget()
    if vec_env == "subproc":
        budget -= min(num_envs, budget - 1)
    return max(1, budget // LEARNER_CORES_PER_THREAD)


def stop_worker_servers() -> None:
    """Stop multiprocessing's forkserver and resource tracker, waiting for both to exit.

    ``SubprocVecEnv`` starts them lazily and they outlive the run until the interpreter
    exits; stopping them explicitly (and reaping them) means a finished or failed command
    leaves no process behind, even where PID 1 does not reap orphans (containers).
    These are CPython's own shutdown hooks (``_stop``), used by its test suite.
    """
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker

    servers: list[Any] = [forkserver._forkserver, resource_tracker._resource_tracker]
    for server in servers:
        with contextlib.suppress(Exception):  # already stopped, or never started
            server._stop()
