"""The environments a run trains and evaluates on, behind SB3's VecEnv interface.

``make_envs`` builds the training copies on the chosen backend (``vec_env=auto`` resolved by
:mod:`workbench.envs.calibration`'s rule), optionally wrapped in SB3's
``VecNormalize``; ``make_eval_env`` one in-process copy for deterministic evaluation;
``make_env`` one raw gymnasium env (export and replay).
"""

from __future__ import annotations

from typing import Any

import gymnasium
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecNormalize

from workbench.config import RandomizationConfig
from workbench.envs import guards, mujoco_log, robots
from workbench.envs.backends import build_backend, randomization_wrapper
from workbench.envs.calibration import resolve_spec
from workbench.envs.spec import EnvSpec
from workbench.envs.video import VideoSettings, render_kwargs


def make_envs(spec: EnvSpec) -> VecEnv:
    """Training environments: ``num_envs`` copies, rank r seeded with ``seed + r``."""
    if spec.vec_env == "auto":
        spec = resolve_spec(spec)
    venv = build_backend(spec)
    if spec.normalize:
        venv = VecNormalize(
            venv,
            norm_obs=spec.norm_obs,
            norm_reward=spec.norm_reward,
            clip_obs=spec.clip_obs,
            gamma=spec.norm_gamma,
        )
    return venv


def make_eval_env(
    spec: EnvSpec, seed_offset: int = 10_000, randomization: RandomizationConfig | None = None,
    video: VideoSettings | None = None,
) -> VecEnv:
    """One in-process copy for deterministic evaluation, seeded apart from training envs.

    ``randomization`` is the evaluation's own setting (``eval.randomization``); the training
    envs' ``spec.randomization`` does not apply here. With ``video`` the copy can render
    frames (``render_mode="rgb_array"``, :mod:`workbench.envs.video`): it is the only env of
    a run that ever renders, and only when a video is recorded.

    With normalization the statistics are frozen (``training=False``) and rewards are raw;
    call ``sync_envs_normalization(train_env, eval_env)`` before each evaluation.
    """
    env_id = robots.importable_id(spec.env_id)
    rendering = render_kwargs(env_id, video) if video else {}
    venv: VecEnv = make_vec_env(
        env_id, n_envs=1, seed=spec.seed + seed_offset,
        env_kwargs={**spec.env_kwargs(), **rendering},
        wrapper_class=randomization_wrapper(randomization),
        vec_env_cls=guards.guarded(DummyVecEnv, spec.env_id),
    )
    venv = guards.GuardedVecEnv(venv, spec.env_id)  # same wrapper depth as the training envs
    if spec.normalize:
        venv = VecNormalize(
            venv, norm_obs=spec.norm_obs, norm_reward=False, clip_obs=spec.clip_obs, training=False
        )
    return venv


def make_env(spec: EnvSpec, video: VideoSettings | None = None) -> Any:
    """One raw gymnasium env as training built it (same id, kwargs and time limit); with
    ``video`` it renders frames (the export's replay video)."""
    mujoco_log.route_warnings()
    env_id = robots.importable_id(spec.env_id)
    rendering = render_kwargs(env_id, video) if video else {}
    return gymnasium.make(env_id, **spec.env_kwargs(), **rendering)
