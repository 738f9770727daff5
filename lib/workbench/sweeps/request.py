"""A sweep request, checked without the simulator or the store: the grid and the overrides.

``check_request(overrides)`` composes the request (the ``sweep`` group plus the overrides
every point shares) and runs every check that is pure config: grid keys set per point, the
sweep's own settings, every point's range and cross-field checks. It loads no learner,
simulator or tracking store, so the CLI answers a typo at once;
:func:`workbench.sweeps.plan.plan_sweep` continues from the :class:`SweepRequest` with the
checks that need them (the env checks, the tracking store) into a plan. The sweep id is the
sweep's name plus a hash of its points and overrides, so the same command finds its parent
run again (resumable).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench import config
from workbench.config import ConfigError, SweepConfig, WorkbenchConfig

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Config keys the grid sets for each point; overriding them for the whole sweep is an error.
GRID_KEYS = {"env.num_envs": "sweep.num_envs", "algo.n_steps": "sweep.n_steps",
             "seed": "sweep.seeds", "tracking.run_name": "the point name"}
SWEEP_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")  # fullmatch: no trailing newline


# --------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Point:
    """One grid point: the values the grid sets; everything else comes from the overrides."""

    env: str
    num_envs: int
    n_steps: int
    seed: int

    @property
    def name(self) -> str:
        """The point's name, which is also its child run's name."""
        return point_name(self.env, self.num_envs, self.n_steps, self.seed)


def point_name(env: str, num_envs: int, n_steps: int, seed: int) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>-s<seed>``: ``train``'s default run name for the point."""
    return f"{env}-ne{num_envs}-ns{n_steps}-s{seed}"


def expand_grid(sweep: SweepConfig, env: str) -> list[Point]:
    """The points of the grid num_envs x n_steps x seeds, in that order, without duplicates.

    Iso-batch mode (``sweep.iso_batch=B``) keeps the samples per update constant: each
    num_envs gets ``n_steps = B / num_envs`` (halve the envs, double the
    rollout) and ``sweep.n_steps`` is not used.
    """
    for key, example in (("num_envs", "[1,2,4]"), ("n_steps", "[128,256]"), ("seeds", "[0]")):
        if not getattr(sweep, key) and not (key == "n_steps" and sweep.iso_batch is not None):
            raise ConfigError(f"sweep.{key}=[]: the grid needs at least one value, "
                              f"e.g. sweep.{key}={example}")
    points: list[Point] = []
    for num_envs in sweep.num_envs:
        for n_steps in iso_batch_steps(sweep.iso_batch, num_envs) or sweep.n_steps:
            for seed in sweep.seeds:
                point = Point(env, num_envs, n_steps, seed)
                if point not in points:
                    points.append(point)
    return points


def iso_batch_steps(iso_batch: int | None, num_envs: int) -> list[int]:
    """``[iso_batch / num_envs]`` in iso-batch mode, ``[]`` otherwise."""
    if iso_batch is None:
        return []
    if num_envs < 1 or iso_batch % num_envs:
        raise ConfigError(
            f"sweep.iso_batch={iso_batch} is not a multiple of num_envs={num_envs}: choose "
            "num_envs that divide it (e.g. powers of two with sweep.iso_batch=2048)"
        )
    return [iso_batch // num_envs]


# --------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class SweepRequest:
    """A sweep request whose config checks passed: the grid and what every point shares."""

    sweep: SweepConfig
    shared: WorkbenchConfig  # what every point composes, before the grid sets its values
    points: list[Point]
    point_overrides: list[str]  # Hydra overrides every point's notebook receives
    sweep_id: str
    invalid: dict[str, str] = field(default_factory=dict)  # point -> config error


def check_request(overrides: Sequence[str]) -> SweepRequest:
    """Compose and check a sweep request's config; raises :class:`ConfigError` on bad input.

    Request-level problems (types, unknown keys, an empty grid, a grid key overridden for
    all points, every point invalid) stop here. A grid point whose own combination is
    invalid (e.g. a rollout smaller than ``algo.batch_size``) is only reported: it fails
    alone, in its notebook, while the valid points run.
    """
    overrides = list(overrides)
    check_grid_keys(overrides, "on the command line")
    composed = config.compose(overrides)
    typed = typed_config(composed)
    config.check_names(typed)  # before a sweep id or a point name is built from them
    sweep = typed.sweep
    check_grid_keys(sweep.overrides, "in sweep.overrides")
    # The preset's overrides first: the command line wins over a conf/sweep/ file.
    point_overrides = list(sweep.overrides) + [o for o in overrides if not is_sweep_override(o)]
    if sweep.overrides:
        composed = config.compose(point_overrides)  # what the points compose, checked here
        typed = typed_config(composed)
    check_sweep_settings(sweep)
    points = expand_grid(sweep, typed.env.name)
    invalid = invalid_points(composed, points)
    if len(invalid) == len(points):
        first = points[0].name
        raise ConfigError(f"every point of the sweep is invalid, e.g. {first}: {invalid[first]}")
    sweep_id = sweep.id or sweep_identity(sweep.name, points, point_overrides)
    return SweepRequest(sweep=sweep, shared=typed, points=points,
                        point_overrides=point_overrides, sweep_id=sweep_id, invalid=invalid)


def compose_typed(overrides: Sequence[str]) -> WorkbenchConfig:
    """Hydra composition merged into the schema (types, keys), without cross-field checks."""
    return typed_config(config.compose(overrides))


def typed_config(composed: DictConfig) -> WorkbenchConfig:
    """A composed config resolved into the schema's dataclasses (no cross-field checks)."""
    from omegaconf import OmegaConf

    typed = OmegaConf.to_object(composed)
    assert isinstance(typed, WorkbenchConfig)
    return typed


def override_key(text: str) -> str:
    """The key (or config group) an override sets, e.g. ``env.num_envs`` or ``sweep``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return str(OverridesParser.create().parse_override(text).key_or_group)
    except Exception:  # unparsable: config.compose reports it with the fix
        return text.split("=", 1)[0].lstrip("+~")


def is_sweep_override(text: str) -> bool:
    """True for overrides of the sweep itself (``sweep=...``, ``sweep.*``)."""
    key = override_key(text)
    return key == "sweep" or key.startswith("sweep.")


def check_grid_keys(overrides: Iterable[str], where: str) -> None:
    """Refuse overrides of the keys the grid sets for each point."""
    for text in overrides:
        key = override_key(text)
        if key in GRID_KEYS:
            raise ConfigError(
                f"{text!r} {where}: {key} is set per point by the sweep; "
                f"use {GRID_KEYS[key]} instead" + (
                    f", e.g. {GRID_KEYS[key]}=[{text.split('=', 1)[-1]}]"
                    if key != "tracking.run_name" else "")
            )


def check_sweep_settings(sweep: SweepConfig) -> None:
    """Range and choice checks of the ``sweep`` group."""
    if sweep.workers < 1:
        raise ConfigError(f"sweep.workers={sweep.workers}: must be >= 1")
    if sweep.timeout is not None and sweep.timeout <= 0:
        raise ConfigError(f"sweep.timeout={sweep.timeout}: must be > 0 seconds (or null)")
    if sweep.id is not None and not SWEEP_ID_PATTERN.fullmatch(sweep.id):
        raise ConfigError(f"sweep.id={sweep.id!r}: use letters, digits, '_', '.', '-' only")
    if not SWEEP_ID_PATTERN.fullmatch(sweep.name):
        raise ConfigError(f"sweep.name={sweep.name!r}: use letters, digits, '_', '.', '-' only")
    if sweep.ray.gpus_per_point < 0:
        raise ConfigError(f"sweep.ray.gpus_per_point={sweep.ray.gpus_per_point:g}: must be >= 0 "
                          "(0: the points get no GPU from Ray)")


def invalid_points(composed: DictConfig, points: Sequence[Point]) -> dict[str, str]:
    """Points whose full config fails the cross-field checks, with the error line.

    Each point's values go into the composed config before it is resolved, as the point's
    own composition does, so what follows from them (``algo.batch_size``, half a rollout by
    default) is the point's, not the base config's.
    """
    from omegaconf import OmegaConf

    invalid: dict[str, str] = {}
    for point in points:
        own = copy.deepcopy(composed)
        for key, value in (("env.num_envs", point.num_envs), ("algo.n_steps", point.n_steps),
                           ("seed", point.seed)):
            OmegaConf.update(own, key, value, merge=False)
        try:
            config.check_values(typed_config(own))
        except ConfigError as exc:
            invalid[point.name] = str(exc)
    return invalid


def sweep_identity(name: str, points: Sequence[Point], point_overrides: Sequence[str]) -> str:
    """``<name>-<8 hex>``: the same points and overrides give the same id (resumable)."""
    payload = json.dumps({"points": [p.name for p in points],
                          "overrides": list(point_overrides)}, sort_keys=True)
    return f"{name}-{hashlib.sha256(payload.encode()).hexdigest()[:8]}"
