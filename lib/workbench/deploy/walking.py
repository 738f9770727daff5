"""How well a walking policy follows its command: fixed-command episodes of a command-
conditioned robot (the walking duck, ``Workbench/MiniDuckWalk-v0``) with what a gait shows.

A command held for a whole episode is the env's own command ranges narrowed to one value with
no re-sampling (:func:`fixed_command`); :func:`command_episodes` drives seeded, deterministic
episodes with a policy's :data:`~workbench.deploy.robustness.Actor` (the exported graph,
``EvalPolicy.actor``, or any function of a batch of observations, e.g. a policy that holds
the standing pose) and returns, per episode, the mean forward speed and yaw rate the env
tracks (``info["tracked"]``), whether it fell, and the gait: each foot's share of steps on
the ground, the share with exactly one foot down (a stepping gait alternates; a shuffle or a
slide keeps both down) and the torso's mean height. ``benchmarks/duck_walk.py`` reports these
against the preset's goals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from workbench.config import RandomizationConfig, WorkbenchConfig
from workbench.deploy.robustness import Actor
from workbench.envs import randomization
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env


@dataclass(frozen=True)
class CommandEpisode:
    """One episode under one command: what the robot did, averaged over its steps."""

    speed: float  # m/s, forward in the heading frame
    yaw_rate: float  # rad/s
    fell: bool
    seconds: float  # simulated time until it ended
    left_down: float  # share of steps with the left foot on the ground
    right_down: float
    one_foot_down: float  # share of steps with exactly one foot down
    height: float  # mean torso height (m)


def fixed_command(speed: float, yaw_rate: float) -> dict[str, Any]:
    """Env kwargs that hold one command (forward speed, yaw rate) for a whole episode."""
    return {"speed_range": [speed, speed], "yaw_rate_range": [yaw_rate, yaw_rate],
            "standstill_share": 0.0, "resample_s": 1e9}


def command_episodes(actor: Actor, config: WorkbenchConfig, kwargs: Mapping[str, Any],
                     perturbation: Mapping[str, Any] | None = None, count: int = 5,
                     seed: int = 0, max_steps: int = 500,
                     watch: Callable[[Any], None] | None = None) -> list[CommandEpisode]:
    """``count`` deterministic episodes (seeds ``seed``, ``seed + 1``, ...) of the config's
    env with ``kwargs`` over its own and ``perturbation`` as randomization keys, each up to
    ``max_steps`` control steps. Of the training's randomization only its action delay stays
    (the robot's latency, not a gap sampled per episode) unless ``perturbation`` sets one.
    ``watch`` is called with the MuJoCo env after its reset and each step (e.g. to keep
    states for a figure)."""
    spec = EnvSpec.from_config(config)
    spec = replace(spec, kwargs={**(spec.kwargs or {}), **kwargs}, randomization=None)
    settings = {"action_delay": config.env.randomization.action_delay, **(perturbation or {})}
    env = randomization.wrap(make_env(spec), RandomizationConfig(**settings))
    found = []
    try:
        for k in range(count):
            obs, _ = env.reset(seed=seed + k)
            tracked: list[dict[str, float]] = []
            fell = False
            if watch is not None:
                watch(env.unwrapped)
            for _ in range(max_steps):
                obs, _, terminated, truncated, info = env.step(actor(obs[None])[0])
                tracked.append(info["tracked"])
                if watch is not None:
                    watch(env.unwrapped)
                if terminated or truncated:
                    fell = bool(info.get("fell"))
                    break
            seconds = len(tracked) * float(env.unwrapped.dt)  # type: ignore[attr-defined]
            found.append(summarize(tracked, fell, seconds))
    finally:
        env.close()
    return found


def standing_actor(config: WorkbenchConfig) -> Actor:
    """A policy that holds the robot's standing pose whatever it sees (the env's
    ``stand_action()``): what a walking policy's speed is compared with."""
    env = make_env(EnvSpec.from_config(config))
    try:
        action = np.asarray(env.unwrapped.stand_action(), dtype=np.float32)  # type: ignore[attr-defined]
    finally:
        env.close()
    return lambda obs: np.repeat(action[None], len(obs), axis=0)


def summarize(tracked: list[dict[str, float]], fell: bool, seconds: float) -> CommandEpisode:
    """An episode's per-step ``info["tracked"]`` as one :class:`CommandEpisode`."""
    steps = {key: np.array([t[key] for t in tracked]) for key in tracked[0]}
    return CommandEpisode(
        speed=float(steps["speed"].mean()), yaw_rate=float(steps["yaw_rate"].mean()),
        fell=fell, seconds=seconds, left_down=float(steps["left_contact"].mean()),
        right_down=float(steps["right_contact"].mean()),
        one_foot_down=float(np.mean(steps["left_contact"] != steps["right_contact"])),
        height=float(steps["height"].mean()))
