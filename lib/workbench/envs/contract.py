"""The env's side of an exported policy's contract: what each observation and action entry is.

A robot's driver must send the observation entries in the order, units and ranges the policy
was trained on, and read the action entries with the scale, offset and clip training used.
:func:`env_contract` derives all of it from the env itself, so it is never typed twice:

- an env whose unwrapped class has a ``workbench_contract()`` method (the mini duck; a user's
  robot may implement one) declares its entries: ``{"observation": [{"name", "size", "unit",
  "low", "high"}, ...], "action": [{"name", "unit", "scale", "offset"}, ...], "commands":
  [names of observation entries that an operator sets]}``; sizes default to 1, units and
  ranges to unknown, scale and offset to 1 and 0;
- a gymnasium MuJoCo task (``observation_structure``: ``qpos``, ``qvel``, ``cfrc_ext``...) is
  named element by element from the MJCF's joints and bodies (:mod:`workbench.envs.model_names`)
  and its actions from the actuators;
- any other env gets indexed names (``obs[3]``, ``action[0]``).

The spaces add what the env does not say: an entry's range where the observation space bounds
it, every action's clip (the exported graph clips to the action space). The control period
is the env's ``dt`` (MuJoCo: timestep x frame skip), and the robot description is the MJCF
file and every file it uses, hashed as the run's manifest records it
(:mod:`workbench.envs.robot_files`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.config import ConfigError
from workbench.envs import model_names, robot_files
from workbench.envs.model_names import Element
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env

HOOK = "workbench_contract"  # the method a robot env may implement


@dataclass(frozen=True)
class ObservationEntry:
    """Observation elements ``[start, stop)``: one quantity in one unit."""

    name: str
    start: int
    stop: int
    unit: str | None = None
    low: float | None = None  # every element is >= low (None: not bounded)
    high: float | None = None

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "index": [self.start, self.stop], "unit": self.unit,
                "low": self.low, "high": self.high}


@dataclass(frozen=True)
class ActionEntry:
    """Action element ``index``: the command sent is ``offset + scale * action`` in ``unit``,
    the action itself within ``[low, high]``."""

    name: str
    index: int
    unit: str | None
    scale: float
    offset: float
    low: float
    high: float

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "index": self.index, "unit": self.unit, "scale": self.scale,
                "offset": self.offset, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class EnvContract:
    """What the env says about its observation, action, control rate and robot."""

    env_id: str
    observation: tuple[ObservationEntry, ...]
    action: tuple[ActionEntry, ...]
    commands: tuple[str, ...]
    period_s: float | None  # one control step (the env's dt); None: the env does not say
    frame_skip: int | None
    timestep_s: float | None  # one simulator step
    robot: robot_files.RobotFiles | None

    def record(self) -> dict[str, Any]:
        """The contract's env sections, as plain JSON values."""
        period = self.period_s
        return {
            "env_id": self.env_id,
            "observation": {"size": self.observation[-1].stop if self.observation else 0,
                            "entries": [e.record() for e in self.observation]},
            "action": {"size": len(self.action), "entries": [e.record() for e in self.action]},
            "commands": list(self.commands),
            "control": {"rate_hz": None if period is None else 1.0 / period,
                        "period_s": period, "frame_skip": self.frame_skip,
                        "timestep_s": self.timestep_s},
            "robot": None if self.robot is None else {"model": self.robot.model,
                                                      "sha256": self.robot.sha256},
        }


def env_contract(spec: EnvSpec) -> EnvContract:
    """The contract of ``spec``'s env: builds one copy, asks it, closes it."""
    env = make_env(spec)
    try:
        return describe(env, spec.env_id)
    finally:
        env.close()


def describe(env: Any, env_id: str) -> EnvContract:
    """The contract of a built env (:mod:`the module docstring <workbench.envs.contract>`)."""
    unwrapped = env.unwrapped
    hook = getattr(unwrapped, HOOK, None)
    declared = hook() if callable(hook) else derived(unwrapped, env.observation_space,
                                                     env.action_space)
    where = f"{env_id}: {HOOK}()" if callable(hook) else env_id
    observation = observation_entries(declared.get("observation", []), env.observation_space,
                                      where)
    action = action_entries(declared.get("action", []), env.action_space, where)
    commands = tuple(declared.get("commands", ()))
    unknown = sorted(set(commands) - {e.name for e in observation})
    if unknown:
        raise ConfigError(f"{where}: command {unknown[0]!r} is not an observation entry")
    model = getattr(unwrapped, "model", None)
    timestep = float(model.opt.timestep) if model is not None else None
    period = getattr(unwrapped, "dt", None)
    frame_skip = getattr(unwrapped, "frame_skip", None)
    model_file = robot_files.model_file(env)
    return EnvContract(
        env_id=env_id, observation=observation, action=action, commands=commands,
        period_s=float(period) if isinstance(period, int | float) else None,
        frame_skip=int(frame_skip) if isinstance(frame_skip, int) else None,
        timestep_s=timestep,
        robot=None if model_file is None else robot_files.collect(model_file, env_id),
    )


# --------------------------------------------------------------------------- derived entries


def derived(unwrapped: Any, observation_space: Any, action_space: Any) -> dict[str, Any]:
    """Entries of an env without the hook: a gymnasium MuJoCo task's named from its model,
    else indexed."""
    size = int(np.prod(observation_space.shape or (0,)))
    model = getattr(unwrapped, "model", None)
    structure = getattr(unwrapped, "observation_structure", None)
    named = (structure_elements(model, structure)
             if model is not None and isinstance(structure, Mapping) else None)
    if named is None or len(named) != size:
        named = [Element(f"obs[{i}]", None) for i in range(size)]
    actions = int(np.prod(action_space.shape or (0,)))
    if model is not None and model.nu == actions:
        action_names = [model_names.actuator_name(model, i) for i in range(actions)]
    else:
        action_names = [f"action[{i}]" for i in range(actions)]
    return {"observation": [{"name": e.name, "unit": e.unit} for e in named],
            "action": [{"name": name} for name in action_names]}


def structure_elements(model: Any, structure: Mapping[str, Any]) -> list[Element] | None:
    """The elements gymnasium's ``observation_structure`` lists, in its order: each key's
    elements are the last ``size`` of that array's (``skipped_qpos`` leaves out the first
    positions, the per-body arrays the world body); None for a key this module cannot name."""
    elements: list[Element] = []
    for key, size in structure.items():
        if key == "skipped_qpos" or not size:
            continue
        if not isinstance(size, int):
            return None
        if key == "qpos":
            available = model_names.qpos_elements(model)
        elif key == "qvel":
            available = model_names.qvel_elements(model)
        elif key == "qfrc_actuator":
            available = model_names.dof_elements(model, key, force=True)
        elif key in model_names.BODY_PARTS:
            available = model_names.body_elements(model, key, first_body=0)
        else:
            return None
        if size > len(available):
            return None
        elements += available[len(available) - size:]
    return elements


# --------------------------------------------------------------------------- checked entries


def observation_entries(declared: Sequence[Mapping[str, Any]], space: Any, where: str
                        ) -> tuple[ObservationEntry, ...]:
    """Declared observation entries laid end to end, checked to cover the observation
    exactly; a range the entry does not declare comes from the space's bounds when they
    bound every element of it alike."""
    low = np.asarray(getattr(space, "low", []), dtype=np.float64).reshape(-1)
    high = np.asarray(getattr(space, "high", []), dtype=np.float64).reshape(-1)
    size = int(np.prod(space.shape or (0,)))
    entries: list[ObservationEntry] = []
    start = 0
    for item in declared:
        stop = start + int(item.get("size", 1))
        if stop <= start or stop > size:
            raise ConfigError(f"{where}: observation entry {item.get('name')!r} ends at "
                              f"{stop}, outside the {size} observation values")
        entries.append(ObservationEntry(
            name=str(item["name"]), start=start, stop=stop, unit=item.get("unit"),
            low=bound(item.get("low"), low[start:stop]),
            high=bound(item.get("high"), high[start:stop])))
        start = stop
    if start != size:
        raise ConfigError(f"{where}: the observation entries cover {start} of the {size} "
                          "observation values")
    check_unique([e.name for e in entries], where, "observation")
    return tuple(entries)


def bound(declared: Any, space_bounds: np.ndarray) -> float | None:
    """A declared bound, else the space's when it is finite and the same for every element."""
    if declared is not None:
        return float(declared)
    if len(space_bounds) and np.all(space_bounds == space_bounds[0]) and \
            math.isfinite(space_bounds[0]):
        return float(space_bounds[0])
    return None


def action_entries(declared: Sequence[Mapping[str, Any]], space: Any, where: str
                   ) -> tuple[ActionEntry, ...]:
    """Declared action entries with the clip of the action space (what the graph applies)."""
    low = np.asarray(space.low, dtype=np.float64).reshape(-1)
    high = np.asarray(space.high, dtype=np.float64).reshape(-1)
    if len(declared) != len(low):
        raise ConfigError(f"{where}: {len(declared)} action entries for the "
                          f"{len(low)} values of the action space")
    entries = tuple(
        ActionEntry(name=str(item["name"]), index=i, unit=item.get("unit"),
                    scale=float(item.get("scale", 1.0)), offset=float(item.get("offset", 0.0)),
                    low=float(low[i]), high=float(high[i]))
        for i, item in enumerate(declared))
    check_unique([e.name for e in entries], where, "action")
    return entries


def check_unique(names: Sequence[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"{where}: two {what} entries are named {name!r}")
        seen.add(name)
