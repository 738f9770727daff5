"""Robustness profiles: which perturbations ``workbench eval`` applies to a trained policy.

A profile is ``conf/eval/<name>.yaml``: perturbation factors, each with the fixed values to try
(every value alone, the other factors nominal), pairs of factors whose full grid becomes a
heatmap, the simulator backends to compare at nominal settings (sim-to-sim), the seeds and
episodes of every cell and the tolerance that decides whether a cell holds. ``workbench
promote`` runs one as its gate: the gate passes when every cell holds.

Loading (:func:`load_profile`) merges the file and ``KEY=VALUE`` overrides into
:class:`RobustnessProfile` with OmegaConf and checks every value here, before any simulator,
policy or MLflow run exists; what depends on the task (a physics factor needs a MuJoCo task, a
perturbation cannot be applied on EnvPool) is checked by :mod:`workbench.deploy.robustness`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from workbench import paths
from workbench.config.errors import ConfigError


@dataclass(frozen=True)
class Factor:
    """One perturbation: its nominal value, the values it accepts and how it reads."""

    name: str
    nominal: float  # frame_skip: 0 stands for "the task's own", resolved on the env
    unit: str  # how a value is written in a verdict: "x" (scale), "steps", "std", ""
    integer: bool
    low: float  # smallest value accepted
    low_open: bool  # True: values must be strictly greater than ``low``
    high: float  # largest value accepted: past it a cell measures a different machine
    help: str


# A scale is a robot's part off by up to 10x either way (0.1x..10x covers every shipped
# profile by far); noise and delay beyond their bounds leave no policy anything to act on.
SCALE_MAX = 10.0
FACTORS: dict[str, Factor] = {f.name: f for f in (
    Factor("friction", 1.0, "x", False, 0.0, True, SCALE_MAX,
           "scale of every geom's sliding friction"),
    Factor("mass", 1.0, "x", False, 0.0, True, SCALE_MAX, "scale of every body's mass and inertia"),
    Factor("actuator_gain", 1.0, "x", False, 0.0, True, SCALE_MAX,
           "scale of every actuator's gain"),
    Factor("damping", 1.0, "x", False, 0.0, True, SCALE_MAX, "scale of every joint's damping"),
    Factor("obs_noise", 0.0, "std", False, 0.0, False, 10.0,
           "std of Gaussian noise added to every observation (observation units)"),
    Factor("action_noise", 0.0, "std", False, 0.0, False, 2.0,
           "std of Gaussian action noise, as a fraction of half the action range"),
    Factor("action_delay", 0.0, "steps", True, 0.0, False, 50.0,
           "actions reach the simulator this many control steps late"),
    Factor("frame_skip", 0.0, "", True, 1.0, False, 50.0,
           "simulator steps per control step: the control frequency "
           "(1 / (timestep x frame_skip)); nominal is the task's own"),
)}
PHYSICS_FACTORS = ("friction", "mass", "actuator_gain", "damping")
BACKENDS = ("gymnasium", "envpool")
PROFILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass
class RobustnessProfile:
    """One robustness matrix (``conf/eval/<name>.yaml``)."""

    description: str = ""  # one line: what the profile is for
    seeds: list[int] = field(default_factory=lambda: [0, 1])  # every cell runs each seed
    episodes: int = 2  # deterministic episodes per seed and cell
    # a cell holds while its mean return is at least nominal - max(tolerance x |nominal|,
    # min_drop): a fraction of the nominal return, with an absolute floor for returns near 0
    tolerance: float = 0.2
    min_drop: float = 0.0
    # an absolute floor in the task's return units: a cell below it fails, the nominal cell
    # included, whatever the tolerance (a relative gate alone passes a policy that fails at
    # nominal); None: no floor
    min_return: float | None = None
    # factor -> the values to try, each alone (the other factors nominal)
    # (numbers; typed Any so YAML's 1 and 1.0 both read, checked by check_factor)
    factors: dict[str, list[Any]] = field(default_factory=dict)
    # [a, b] pairs: every combination of the two factors' values, drawn as a heatmap
    pairs: list[list[str]] = field(default_factory=list)
    # the simulator the factors are applied on (EnvPool's C++ tasks take no wrappers: only
    # frame_skip applies there)
    backend: str = "gymnasium"
    # simulator backends compared at nominal settings (sim-to-sim): [gymnasium, envpool]
    backends: list[str] = field(default_factory=list)
    # cap on each episode's length; None: the task's own time limit
    max_episode_steps: int | None = None
    # registry aliases `workbench promote` sets with this profile only as written: KEY=VALUE
    # overrides are refused for them (e.g. [on-robot]: what a robot runs passed the gate as
    # the team wrote it)
    locked_aliases: list[str] = field(default_factory=list)


def profile_dir() -> Path:
    """Where the profiles live: ``conf/eval/``."""
    return paths.project_root() / "conf" / "eval"


def profile_names() -> list[str]:
    """The profiles ``conf/eval/`` holds."""
    return sorted(p.stem for p in profile_dir().glob("*.yaml"))


def load_profile(name: str, overrides: Sequence[str] = ()) -> RobustnessProfile:
    """``conf/eval/<name>.yaml`` with ``KEY=VALUE`` overrides, checked (:class:`ConfigError`).

    An override names a profile key (``seeds=[0,1,2]``, ``tolerance=0.1``) or one factor
    (``factors.friction=[0.5,1,1.5]``; ``factors.friction=[]`` drops it).
    """
    if not PROFILE_NAME.match(name):
        raise ConfigError(f"--profile {name!r}: not a profile name; choose one of "
                          f"{', '.join(profile_names()) or '(none)'} (conf/eval/<name>.yaml)")
    path = profile_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"--profile {name}: no conf/eval/{name}.yaml; choose one of "
                          f"{', '.join(profile_names()) or '(none)'} or write that file")
    schema = OmegaConf.structured(RobustnessProfile)
    try:
        loaded = OmegaConf.load(path)
    except (OSError, ValueError, OmegaConfBaseException) as exc:
        raise ConfigError(f"conf/eval/{name}.yaml: not readable YAML ({one_line(exc)}); "
                          "fix the file") from exc
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{item!r}: not KEY=VALUE; e.g. seeds=[0,1,2] or "
                              "factors.friction=[0.5,1,1.5]")
    try:
        merged = OmegaConf.merge(schema, loaded, OmegaConf.from_dotlist(list(overrides)))
        profile = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise ConfigError(f"profile {name}: {key + ': ' if key else ''}{one_line(exc)}; the "
                          f"keys are {', '.join(RobustnessProfile.__dataclass_fields__)}"
                          ) from exc
    assert isinstance(profile, RobustnessProfile)
    profile.factors = {k: v for k, v in profile.factors.items() if v}
    check_profile(name, profile)
    profile.factors = {k: [float(v) for v in values] for k, values in profile.factors.items()}
    return profile


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_profile(name: str, profile: RobustnessProfile) -> None:
    """Every value of a profile within its range; one :class:`ConfigError` line otherwise."""
    where = f"profile {name}"
    check_episodes(where, profile)
    check_gate(where, profile)
    check_cells(where, profile)


def check_episodes(where: str, profile: RobustnessProfile) -> None:
    """The seeds, episodes and episode length each cell runs."""
    if not profile.seeds or len(set(profile.seeds)) != len(profile.seeds):
        raise ConfigError(f"{where}: seeds={profile.seeds}: give at least one seed, none twice")
    if any(s < 0 for s in profile.seeds):
        raise ConfigError(f"{where}: seeds={profile.seeds}: seeds are >= 0")
    if not 1 <= profile.episodes <= 1000:
        raise ConfigError(f"{where}: episodes={profile.episodes}: must be 1..1000")
    if profile.max_episode_steps is not None and profile.max_episode_steps < 1:
        raise ConfigError(f"{where}: max_episode_steps={profile.max_episode_steps}: must be "
                          ">= 1 (or null for the task's own limit)")


def check_gate(where: str, profile: RobustnessProfile) -> None:
    """What makes a cell hold: tolerance, minimum drop, absolute floor, locked aliases."""
    if not 0 < profile.tolerance < 1:
        raise ConfigError(f"{where}: tolerance={profile.tolerance}: a fraction of the nominal "
                          "return, between 0 and 1 (e.g. 0.2)")
    if not 0 <= profile.min_drop < math.inf:
        raise ConfigError(f"{where}: min_drop={profile.min_drop}: return units, >= 0")
    if profile.min_return is not None and not math.isfinite(profile.min_return):
        raise ConfigError(f"{where}: min_return={profile.min_return}: a return in the task's "
                          "units (e.g. min_return=900), or null for no floor")
    for alias in profile.locked_aliases:
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,62}", alias):
            raise ConfigError(f"{where}: locked_aliases: {alias!r} is not a registry alias "
                              "(a letter, then letters, digits, '-' or '_')")


def check_cells(where: str, profile: RobustnessProfile) -> None:
    """The matrix's cells: factors with values in range, pairs of them, backends."""
    if not profile.factors and not profile.backends:
        raise ConfigError(f"{where}: no factors and no backends: nothing to evaluate; add e.g. "
                          "factors.friction=[0.5,1,1.5]")
    for factor, values in profile.factors.items():
        check_factor(where, factor, values)
    for pair in profile.pairs:
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ConfigError(f"{where}: pairs: {list(pair)} is not a pair of two factors; "
                              "e.g. pairs=[[friction,mass]]")
        for factor in pair:
            if factor not in profile.factors:
                raise ConfigError(f"{where}: pairs: {factor!r} has no values under factors; "
                                  f"add factors.{factor}=[...] or drop the pair")
    for backend in [profile.backend, *profile.backends]:
        if backend not in BACKENDS:
            raise ConfigError(f"{where}: backends: {backend!r} is not a simulator backend; "
                              f"choose from {', '.join(BACKENDS)}")
    if len(set(profile.backends)) != len(profile.backends):
        raise ConfigError(f"{where}: backends={profile.backends}: a backend is repeated")


def check_factor(where: str, factor: str, values: Sequence[Any]) -> None:
    """A factor the workbench knows, with numbers in its range, none twice."""
    spec = FACTORS.get(factor)
    if spec is None:
        raise ConfigError(f"{where}: factors.{factor}: unknown perturbation factor; the "
                          f"factors are {', '.join(FACTORS)}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: factors.{factor}={list(values)}: {value!r} is not a "
                              f"number; e.g. factors.{factor}=[0.5,1.5]")
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: factors.{factor}={list(values)}: a value is repeated")
    for value in values:
        bad = (not math.isfinite(value) or value < spec.low or value > spec.high
               or (spec.low_open and value <= spec.low)
               or (spec.integer and value != int(value)))
        if bad:
            kind = "whole numbers" if spec.integer else "numbers"
            bound = ">" if spec.low_open else ">="
            raise ConfigError(f"{where}: factors.{factor}={list(values)}: {value:g} is out of "
                              f"range; its values are {kind} {bound} {spec.low:g} and <= "
                              f"{spec.high:g} ({spec.help})")
