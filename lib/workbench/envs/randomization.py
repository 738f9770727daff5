"""Domain randomization for any MuJoCo task: gymnasium wrappers built from config.

Sim-to-real practice: a policy that only ever saw the nominal simulator
overfits to it. These wrappers perturb what the policy sees (observation noise), what the
robot does (action noise, action delay) and the physics itself (friction, masses, joint
damping, actuator gains, re-sampled every episode). ``env.randomization`` configures the
training envs and ``eval.randomization`` the evaluation env independently, so a sweep can
train under one setting and evaluate under another.

:func:`wrap` is what ``workbench.envs`` hands to SB3's ``make_vec_env`` as ``wrapper_class``
(it is applied outside SB3's ``Monitor``, so episode statistics stay the task's own reward).
Outermost first: observation noise, action noise, action delay, physics randomization.

Every wrapper draws from its own generator, seeded from the seed given to ``reset`` (SB3
seeds env rank r with ``seed + r``): the task's own random stream (initial states) is left
exactly as it would be without the wrapper, and runs stay reproducible.

Every wrapper keeps its per-episode state (generators, the delayed actions, the sampled
physics) through the protocol ``workbench_state() / workbench_restore(state)`` of
:mod:`workbench.envs.simstate`, so a checkpoint of a randomized run resumes exactly. The two
that change actions tell what they will pass on without changing anything
(``workbench_preview_action``), which ``env.vec_env=batched`` (:mod:`workbench.envs.batched`)
uses to step the physics of all copies ahead, in threads.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs
from numpy.typing import NDArray

from workbench.config import ConfigError, RandomizationConfig

PHYSICS_KEYS = ("friction", "mass_scale", "damping", "actuator_gain")

# Distinct streams per wrapper for the same reset seed (arbitrary, fixed constants).
OBS_NOISE_STREAM = 101
ACTION_NOISE_STREAM = 202
PHYSICS_STREAM = 303


def stream(seed: int, salt: int) -> np.random.Generator:
    """A generator for one wrapper, derived from the episode seed and the wrapper's salt."""
    return np.random.default_rng([salt, seed])


def generator_state(rng: np.random.Generator) -> dict[str, Any]:
    """The bit generator state of ``rng`` (plain values), for a checkpoint."""
    return dict(rng.bit_generator.state)


def restored_generator(state: dict[str, Any]) -> np.random.Generator:
    """A generator continuing exactly where the one :func:`generator_state` saw stopped."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    return rng


# --------------------------------------------------------------------------- settings


def is_active(settings: RandomizationConfig) -> bool:
    """True when any randomization is configured (otherwise no wrapper is added)."""
    return bool(
        settings.obs_noise_std
        or settings.action_noise_std
        or settings.action_delay
        or any(getattr(settings, key) is not None for key in PHYSICS_KEYS)
    )


def physics_ranges(settings: RandomizationConfig) -> dict[str, tuple[float, float]]:
    """The configured physics ranges, ``{name: (low, high)}``."""
    ranges: dict[str, tuple[float, float]] = {}
    for key in PHYSICS_KEYS:
        value = getattr(settings, key)
        if value is not None:
            ranges[key] = (float(value[0]), float(value[1]))
    return ranges


def check_settings(prefix: str, settings: RandomizationConfig, env_id: str) -> None:
    """Reject impossible settings with the key's name (:class:`ConfigError`), before any run."""
    # noise and delay ranges are the schema's (config/checks.py)
    for key in PHYSICS_KEYS:
        value = getattr(settings, key)
        if value is None:
            continue
        if len(value) != 2 or not 0 < value[0] <= value[1] or not math.isfinite(value[1]):
            raise ConfigError(
                f"{prefix}.{key}={list(value)}: must be [low, high] scale factors with "
                f"0 < low <= high, e.g. {prefix}.{key}=[0.8,1.2]"
            )
    if physics_ranges(settings) and not is_mujoco_task(env_id):
        raise ConfigError(
            f"{prefix}: physics randomization ({', '.join(physics_ranges(settings))}) needs a "
            f"MuJoCo task; env.id={env_id!r} is not a gymnasium MujocoEnv (remove those keys)"
        )


def is_mujoco_task(env_id: str) -> bool:
    """Whether the registered entry point of ``env_id`` is a ``MujocoEnv`` (no env is built).

    ``module:Id`` (gymnasium's form for ids a module registers, imported by the env checks
    before this runs) is looked up by its bare id.
    """
    from gymnasium.envs.mujoco import MujocoEnv
    from gymnasium.envs.registration import load_env_creator

    entry_point: Any = gymnasium.envs.registry[env_id.rpartition(":")[2]].entry_point
    if isinstance(entry_point, str):
        entry_point = load_env_creator(entry_point)
    return isinstance(entry_point, type) and issubclass(entry_point, MujocoEnv)


def wrap(env: gymnasium.Env, settings: RandomizationConfig) -> gymnasium.Env:
    """``env`` inside the wrappers ``settings`` asks for (none when nothing is configured)."""
    ranges = physics_ranges(settings)
    if ranges:
        env = PhysicsRandomization(env, ranges)
    if settings.action_delay:
        env = ActionDelay(env, settings.action_delay)
    if settings.action_noise_std:
        env = ActionNoise(env, settings.action_noise_std)
    if settings.obs_noise_std:
        env = ObservationNoise(env, settings.obs_noise_std)
    return env


# --------------------------------------------------------------------------- wrappers


class ObservationNoise(gymnasium.ObservationWrapper, RecordConstructorArgs):
    """Adds ``N(0, std^2)`` to every observation value (reset and step), like a noisy sensor.

    Bounded observation spaces keep their bounds (the noisy value is clipped).
    """

    def __init__(self, env: gymnasium.Env, std: float) -> None:
        RecordConstructorArgs.__init__(self, std=std)  # lets gymnasium re-create the env
        super().__init__(env)
        if not isinstance(env.observation_space, spaces.Box):
            raise TypeError(f"ObservationNoise needs a Box observation space, got "
                            f"{env.observation_space}")
        self.std = float(std)
        self.rng = np.random.default_rng()
        # Read once: every step pays for it (the wrapper chain's properties, a clip to +-inf).
        self.space = env.observation_space
        self.bounded = bool(np.isfinite(self.space.low).any() or np.isfinite(self.space.high).any())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = stream(seed, OBS_NOISE_STREAM)
        return super().reset(seed=seed, options=options)

    def observation(self, observation: NDArray[Any]) -> NDArray[Any]:
        noisy = observation + self.rng.normal(0.0, self.std, size=np.shape(observation))
        if self.bounded:
            noisy = np.clip(noisy, self.space.low, self.space.high)
        return noisy.astype(self.space.dtype, copy=False)

    def workbench_state(self) -> dict[str, Any]:
        """The noise generator (:mod:`workbench.envs.simstate`'s protocol)."""
        return {"rng": generator_state(self.rng)}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        self.rng = restored_generator(state["rng"])


class ActionNoise(gymnasium.ActionWrapper, RecordConstructorArgs):
    """Adds Gaussian noise to each action, ``std`` being a fraction of the dimension's half
    range (so one setting means the same on every task), then clips to the action space."""

    def __init__(self, env: gymnasium.Env, std: float) -> None:
        RecordConstructorArgs.__init__(self, std=std)
        super().__init__(env)
        if not isinstance(env.action_space, spaces.Box):
            raise TypeError(f"ActionNoise needs a Box action space, got {env.action_space}")
        self.std = float(std)
        self.space = env.action_space  # read once: every step clips into it
        self.scale = self.std * (self.space.high - self.space.low) / 2.0
        self.rng = np.random.default_rng()
        self.noise: NDArray[np.float64] | None = None  # the next step's noise, once drawn

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = stream(seed, ACTION_NOISE_STREAM)
            self.noise = None
        return super().reset(seed=seed, options=options)

    def action(self, action: NDArray[Any]) -> NDArray[Any]:
        noisy = self.workbench_preview_action(action)
        self.noise = None  # used: the next step draws its own
        return noisy

    def workbench_preview_action(self, action: NDArray[Any]) -> NDArray[Any]:
        """What :meth:`action` returns for ``action`` at the next step, changing nothing it
        would not: the step's noise is drawn once, here or there, so the stream is the same."""
        space = self.space
        if self.noise is None:
            self.noise = self.rng.normal(0.0, 1.0, size=space.shape) * self.scale
        noisy = np.asarray(action) + self.noise
        return np.clip(noisy, space.low, space.high).astype(space.dtype)

    def workbench_state(self) -> dict[str, Any]:
        """The noise generator and a drawn, unused noise (:mod:`workbench.envs.simstate`)."""
        return {"rng": generator_state(self.rng),
                "noise": None if self.noise is None else self.noise.copy()}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        self.rng = restored_generator(state["rng"])
        noise = state["noise"]
        self.noise = None if noise is None else np.array(noise, dtype=np.float64)


class ActionDelay(gymnasium.Wrapper, RecordConstructorArgs):
    """Each action reaches the task exactly ``steps`` env steps after the policy chose it,
    as with a slow bus or servo loop. Until then (after every reset) the task receives the
    neutral action: zero, clipped into the action space."""

    def __init__(self, env: gymnasium.Env, steps: int) -> None:
        RecordConstructorArgs.__init__(self, steps=steps)
        super().__init__(env)
        if steps < 1:
            raise ValueError(f"ActionDelay steps={steps}: must be >= 1")
        if not isinstance(env.action_space, spaces.Box):
            raise TypeError(f"ActionDelay needs a Box action space, got {env.action_space}")
        self.steps = steps
        space = env.action_space
        self.neutral = np.clip(np.zeros(space.shape), space.low, space.high).astype(space.dtype)
        self.pending: deque[NDArray[Any]] = deque()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.pending = deque(self.neutral.copy() for _ in range(self.steps))
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        self.pending.append(np.array(action, copy=True))
        return self.env.step(self.pending.popleft())

    def workbench_preview_action(self, action: Any) -> Any:
        """The action the task receives at the next step (the oldest pending one)."""
        return self.pending[0] if self.pending else action

    def workbench_state(self) -> dict[str, Any]:
        """The actions on their way (:mod:`workbench.envs.simstate`'s protocol)."""
        return {"pending": [a.copy() for a in self.pending]}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        self.pending = deque(np.array(a, copy=True) for a in state["pending"])


@dataclass(frozen=True)
class NominalPhysics:
    """The model values physics randomization scales, copied before any change."""

    friction: NDArray[np.float64]  # geom_friction[:, 0] (sliding)
    mass: NDArray[np.float64]  # body_mass
    inertia: NDArray[np.float64]  # body_inertia
    damping: NDArray[np.float64]  # dof_damping
    gain: NDArray[np.float64]  # actuator_gainprm[:, 0]
    bias: NDArray[np.float64]  # actuator_biasprm[:, 1] (a position servo's -kp)


class PhysicsRandomization(gymnasium.Wrapper, RecordConstructorArgs):
    """Per-episode physics: at every reset each configured quantity of the MuJoCo model is
    set to its nominal value times a scale drawn uniformly from its ``[low, high]`` range.

    - ``friction``: every geom's sliding friction (torsional and rolling left alone);
    - ``mass_scale``: every body's mass and inertia (the same factor: density scaling);
    - ``damping``: every degree of freedom's damping;
    - ``actuator_gain``: every actuator's gain; for position servos (affine bias) the
      position feedback ``-kp`` too, so a weaker servo still holds the same target.

    The sampled scales are in ``info["randomization"]`` on reset and on every step.
    """

    def __init__(self, env: gymnasium.Env, ranges: dict[str, tuple[float, float]]) -> None:
        RecordConstructorArgs.__init__(self, ranges=ranges)
        super().__init__(env)
        unknown = set(ranges) - set(PHYSICS_KEYS)
        if unknown:
            raise ValueError(f"unknown physics quantities {sorted(unknown)}; use {PHYSICS_KEYS}")
        model = getattr(env.unwrapped, "model", None)
        if model is None:
            raise TypeError(f"PhysicsRandomization needs a MuJoCo task; {env.unwrapped} has "
                            "no .model")
        self.model = model
        self.ranges = dict(ranges)
        self.nominal = NominalPhysics(
            friction=model.geom_friction[:, 0].copy(),
            mass=model.body_mass.copy(),
            inertia=model.body_inertia.copy(),
            damping=model.dof_damping.copy(),
            gain=model.actuator_gainprm[:, 0].copy(),
            bias=model.actuator_biasprm[:, 1].copy(),
        )
        self.rng = np.random.default_rng()
        self.sampled: dict[str, float] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.rng = stream(seed, PHYSICS_STREAM)
        self.sampled = {key: float(self.rng.uniform(lo, hi)) for key, (lo, hi) in
                        self.ranges.items()}
        self.apply(self.sampled)
        # The new model is in place before the task resets, so its reset computes with it.
        observation, info = self.env.reset(seed=seed, options=options)
        return observation, {**info, "randomization": dict(self.sampled)}

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return observation, reward, terminated, truncated, {
            **info, "randomization": dict(self.sampled)
        }

    def workbench_state(self) -> dict[str, Any]:
        """The generator and this episode's scales (:mod:`workbench.envs.simstate`)."""
        return {"rng": generator_state(self.rng), "sampled": dict(self.sampled)}

    def workbench_restore(self, state: dict[str, Any]) -> None:
        """The episode's scales written into the model again, the generator continued."""
        self.rng = restored_generator(state["rng"])
        self.sampled = {key: float(value) for key, value in state["sampled"].items()}
        self.apply(self.sampled)

    def apply(self, scales: dict[str, float]) -> None:
        """Write nominal values times ``scales`` into the model (missing keys: nominal)."""
        model, nominal = self.model, self.nominal
        model.geom_friction[:, 0] = nominal.friction * scales.get("friction", 1.0)
        mass = scales.get("mass_scale", 1.0)
        model.body_mass[:] = nominal.mass * mass
        model.body_inertia[:] = nominal.inertia * mass
        model.dof_damping[:] = nominal.damping * scales.get("damping", 1.0)
        gain = scales.get("actuator_gain", 1.0)
        model.actuator_gainprm[:, 0] = nominal.gain * gain
        # mjBIAS_AFFINE (1): bias = b0 + b1*length + b2*velocity; b1 is the servo's -kp.
        affine = model.actuator_biastype == 1
        model.actuator_biasprm[affine, 1] = nominal.bias[affine] * gain
