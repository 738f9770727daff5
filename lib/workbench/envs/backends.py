"""The vectorization backends a spec can name: ``dummy``, ``subproc``, ``envpool`` and
``batched``.

Each is built under :class:`workbench.envs.guards.GuardedVecEnv` (named worker crashes, NaN
and inf checks on raw values), without normalization: :mod:`workbench.envs.vector` adds
``VecNormalize`` for training, :mod:`workbench.envs.calibration` measures the raw backends.
Environment classes must live in importable modules: ``SubprocVecEnv`` starts its workers
with the forkserver method, which re-imports them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from workbench.config import RandomizationConfig
from workbench.envs import guards, robots  # robots registers the workbench's own ids
from workbench.envs.batched import BatchedVecEnv
from workbench.envs.cores import cpu_budget
from workbench.envs.envpool_vec import EnvPoolVecEnv
from workbench.envs.randomization import is_active, wrap
from workbench.envs.spec import EnvSpec

VecEnvClass = type[DummyVecEnv] | type[SubprocVecEnv]
VEC_ENV_CLASSES: dict[str, VecEnvClass] = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv}


def build_backend(spec: EnvSpec) -> VecEnv:
    """``spec.num_envs`` copies on the backend ``spec.vec_env`` names, rank r seeded
    ``seed + r``, under the guard; ``auto`` must have been resolved."""
    if spec.vec_env not in (*VEC_ENV_CLASSES, "envpool", "batched"):
        raise ValueError(f"vec_env={spec.vec_env!r}: resolve it first (calibration.resolve_spec)")
    venv: VecEnv
    if spec.vec_env == "envpool":
        venv = EnvPoolVecEnv(
            spec.env_id,
            spec.num_envs,
            seed=spec.seed,
            max_episode_steps=spec.max_episode_steps,
            kwargs=dict(spec.kwargs or {}),
            num_threads=spec.threads(cpu_budget()),
        )
    else:  # SB3's own make_vec_env: Monitor for episode statistics, seeds seed + rank
        venv = make_vec_env(
            robots.importable_id(spec.env_id),
            n_envs=spec.num_envs,
            seed=spec.seed,
            vec_env_cls=vec_env_class(spec),
            env_kwargs=spec.env_kwargs(),
            wrapper_class=randomization_wrapper(spec.randomization),
        )
    return guards.GuardedVecEnv(venv, spec.env_id)


def vec_env_class(spec: EnvSpec) -> Any:
    """SB3 ``vec_env_cls`` for ``make_vec_env``: guarded ``DummyVecEnv``/``SubprocVecEnv``,
    or the batched one (a guarded ``DummyVecEnv`` stepping the physics in threads)."""
    if spec.vec_env == "batched":
        return functools.partial(BatchedVecEnv, env_id=spec.env_id,
                                 num_threads=spec.threads(cpu_budget()))
    return guards.guarded(VEC_ENV_CLASSES[spec.vec_env], spec.env_id)


def randomization_wrapper(
    settings: RandomizationConfig | None,
) -> Callable[[Any], Any] | None:
    """SB3 ``wrapper_class`` applying ``settings`` (None when nothing is randomized)."""
    if settings is None or not is_active(settings):
        return None
    return functools.partial(wrap, settings=settings)
