"""``env.vec_env=envpool``: an SB3 ``VecEnv`` over EnvPool's C++ MuJoCo tasks (extra ``fast``).

EnvPool (https://envpool.readthedocs.io) steps a batch of MuJoCo environments in C++ threads,
without a Python ``step`` per environment, so it samples faster than SB3's ``DummyVecEnv``, the
more so the more cores (docs/benchmarks.md#physics-limit-and-sampling).

What this adapter adds so that SB3 (PPO, ``VecNormalize``, ``evaluate_policy``) sees exactly
what it gets from ``make_vec_env``:

- **Auto-reset.** EnvPool resets a finished environment on the *next* ``step`` call (gymnasium's
  ``NEXT_STEP`` mode) and ignores that step's action. SB3 expects the reset in the *same* step,
  with the last observation in ``info["terminal_observation"]``. So finished environments are
  reset explicitly right away (``reset(env_ids)``), which also clears EnvPool's pending reset.
- **Episode statistics.** SB3's ``Monitor`` wrapper puts ``info["episode"] = {"r", "l", "t"}``
  on an episode's last step; ``rollout/ep_rew_mean`` comes from it. The adapter keeps running
  returns and lengths and emits the same record, plus ``TimeLimit.truncated`` for truncations
  (PPO bootstraps those from the terminal observation).
- **Seeds.** Rank ``r`` is seeded ``seed + r`` like ``make_vec_env``. EnvPool fixes seeds when
  the pool is created, so a later ``seed(s)`` (SB3 calls it from ``set_random_seed``) re-creates
  the pool at the next ``reset`` when the seeds differ.

Compared with gymnasium's ``-v5`` classes (checked in ``tests/test_backends.py``): the same
observation and action spaces (the adapter exposes gymnasium's float32 action box where EnvPool
declares float64); with the same actions both agree up to floating-point round-off, which grows
chaotically in contact-rich tasks, so long returns agree statistically, not bit for bit, and
reset noise comes from EnvPool's own generator. The figures:
docs/benchmarks.md#envpool-vs-gymnasium. Extra per-step info keys (``x_velocity``,
``reward_ctrl``, ...) are not forwarded; SB3 does not use them.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from workbench.config import ConfigError
from workbench.envs.randomization import is_active

INSTALL_HINT = "pip install '.[fast]' (or pip install envpool)"
# gymnasium keyword arguments EnvPool's MuJoCo specs accept under the same name and meaning.
# Tuple-valued ones (healthy_z_range, ...) and xml_file (a path in gymnasium, an asset name in
# EnvPool) are left out on purpose: with them the task needs gymnasium's own classes.
SHARED_KWARGS = frozenset(
    {
        "frame_skip",
        "ctrl_cost_weight",
        "forward_reward_weight",
        "healthy_reward",
        "terminate_when_unhealthy",
        "reset_noise_scale",
        "exclude_current_positions_from_observation",
        "contact_cost_weight",
        "use_contact_forces",
    }
)
INT32_SEEDS = 2**31


def is_installed() -> bool:
    """Whether the optional ``envpool`` package is installed (without importing it: ~1.7 s)."""
    return importlib.util.find_spec("envpool") is not None


def import_envpool() -> Any:
    """The ``envpool`` module, or a one-line :class:`ConfigError` saying how to install it.

    Importing envpool rewrites process-wide environment variables (``MPLBACKEND=Agg`` and
    ``MPLCONFIGDIR`` from its Jumanji renderer, OpenCV's Qt paths...), which every child
    process inherits: a papermill kernel started afterwards showed no figures. The
    environment is put back as it was.
    """
    saved = dict(os.environ)
    try:
        import envpool
    except ImportError as exc:
        raise ConfigError(
            f"env.vec_env=envpool: the envpool package is not installed; {INSTALL_HINT}, "
            "or choose env.vec_env=auto|dummy|subproc"
        ) from exc
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
    return envpool


def unsupported_reason(
    env_id: str, kwargs: Mapping[str, Any] | None = None, randomization: Any = None
) -> str | None:
    """Why EnvPool cannot run this task as configured, or None when it can.

    ``randomization`` (``env.randomization``) needs gymnasium wrappers around each env, which
    EnvPool's C++ environments cannot take.
    """
    if not is_installed():
        return f"the envpool package is not installed ({INSTALL_HINT})"
    if randomization is not None and is_active(randomization):
        return "env.randomization wraps gymnasium envs, which EnvPool does not use"
    envpool = import_envpool()
    try:
        entry = str(gymnasium.spec(env_id).entry_point)
    except gymnasium.error.Error:
        entry = ""
    if not entry.startswith("gymnasium.envs.mujoco") or env_id not in envpool.list_all_envs():
        return f"{env_id} is not one of EnvPool's gymnasium MuJoCo tasks"
    fields = set(envpool.make_spec(env_id).config._fields)
    for key in kwargs or {}:
        if key not in SHARED_KWARGS or key not in fields:
            return f"env.kwargs.{key} has no EnvPool equivalent for {env_id}"
    return None


def check_support(
    env_id: str, kwargs: Mapping[str, Any] | None = None, randomization: Any = None
) -> None:
    """Raise a one-line :class:`ConfigError` when ``env.vec_env=envpool`` cannot work."""
    import_envpool()  # missing package: the install hint
    reason = unsupported_reason(env_id, kwargs, randomization)
    if reason is not None:
        raise ConfigError(
            f"env.vec_env=envpool: {reason}; use env.vec_env=auto (falls back to dummy/subproc)"
        )


def gymnasium_action_space(pool: Any) -> gymnasium.spaces.Box:
    """EnvPool's action box as gymnasium's MuJoCo classes declare it (float32, same bounds)."""
    space = pool.action_space
    return gymnasium.spaces.Box(
        space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32
    )


class EnvPoolVecEnv(VecEnv):
    """SB3 ``VecEnv`` over one EnvPool batch (synchronous: every step moves all envs)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        max_episode_steps: int | None = None,
        kwargs: Mapping[str, Any] | None = None,
        num_threads: int = 0,
    ) -> None:
        check_support(env_id, kwargs)
        self.env_id = env_id
        self.make_kwargs: dict[str, Any] = dict(kwargs or {})
        if max_episode_steps is not None:
            self.make_kwargs["max_episode_steps"] = max_episode_steps
        # EnvPool's threads block on a semaphore between steps, so they never compete with
        # the learner; more threads than envs or cores only adds context switches.
        self.num_threads = num_threads or num_envs
        self.seeds = [(seed + rank) % INT32_SEEDS for rank in range(num_envs)]
        self.pool = self._make_pool(self.seeds, num_envs)
        super().__init__(num_envs, self.pool.observation_space, gymnasium_action_space(self.pool))
        self.episode_returns = np.zeros(num_envs, dtype=np.float64)
        self.episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self.started = time.time()
        self.actions: np.ndarray | None = None

    def _make_pool(self, seeds: list[int], num_envs: int) -> Any:
        envpool = import_envpool()
        return envpool.make(
            self.env_id,
            env_type="gymnasium",
            num_envs=num_envs,
            seed=list(seeds),
            num_threads=min(self.num_threads, num_envs),
            **self.make_kwargs,
        )

    # ------------------------------------------------------------------ VecEnv interface

    def reset(self) -> VecEnvObs:
        """Reset all envs; seeds given through ``seed()`` since the last reset apply now."""
        wanted = [
            (s % INT32_SEEDS) if s is not None else old
            for s, old in zip(self._seeds, self.seeds, strict=True)
        ]
        if wanted != self.seeds:
            self.pool.close()
            self.seeds = wanted
            self.pool = self._make_pool(wanted, self.num_envs)
        obs, info = self.pool.reset()
        obs = self._in_env_order(obs, info["env_id"])
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [{} for _ in range(self.num_envs)]
        self.episode_returns[:] = 0.0
        self.episode_lengths[:] = 0
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        assert self.actions is not None, "step_async must come before step_wait"
        obs, rewards, terminated, truncated, info = self.pool.step(self.actions)
        order = np.asarray(info["env_id"])
        if not np.array_equal(order, np.arange(self.num_envs)):
            obs, rewards, terminated, truncated = (
                self._in_env_order(x, order) for x in (obs, rewards, terminated, truncated)
            )
        self.episode_returns += rewards
        self.episode_lengths += 1
        dones = np.logical_or(terminated, truncated)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        if dones.any():
            obs = self._finish_episodes(obs, terminated, truncated, dones, infos)
        return obs, rewards.astype(np.float32), dones, infos

    def _finish_episodes(
        self,
        obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> np.ndarray:
        """Monitor-style records for finished envs, then reset them in this same step."""
        ids = np.flatnonzero(dones)
        elapsed = round(time.time() - self.started, 6)
        for i in ids:
            infos[i] = {
                "terminal_observation": obs[i].copy(),
                "TimeLimit.truncated": bool(truncated[i] and not terminated[i]),
                "episode": {
                    "r": round(float(self.episode_returns[i]), 6),
                    "l": int(self.episode_lengths[i]),
                    "t": elapsed,
                },
            }
        reset_obs, reset_info = self.pool.reset(ids.astype(np.int32))
        obs = np.array(obs, copy=True)
        obs[np.asarray(reset_info["env_id"])] = reset_obs
        self.episode_returns[ids] = 0.0
        self.episode_lengths[ids] = 0
        return obs

    @staticmethod
    def _in_env_order(values: np.ndarray, env_ids: Any) -> np.ndarray:
        ordered = np.empty_like(values)
        ordered[np.asarray(env_ids)] = values
        return ordered

    def close(self) -> None:
        self.pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attributes of the pool (the same for every env); ``render_mode`` is None."""
        value = None if attr_name == "render_mode" else getattr(self.pool, attr_name)
        return [value for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise AttributeError(
            f"EnvPoolVecEnv cannot set {attr_name!r} on C++ environments; "
            "use env.vec_env=dummy for envs that need attribute access"
        )

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        raise AttributeError(
            f"EnvPoolVecEnv cannot call {method_name!r} on C++ environments; "
            "use env.vec_env=dummy for envs that need method calls"
        )

    def env_is_wrapped(
        self, wrapper_class: type[gymnasium.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """True for SB3's ``Monitor``: this adapter provides its episode statistics."""
        from stable_baselines3.common.monitor import Monitor

        return [wrapper_class is Monitor for _ in self._get_indices(indices)]
