"""A sweep request, checked without the simulator or the store: the grid and the overrides.

``check_request(overrides)`` composes the request (the ``sweep`` group plus the overrides
every point shares) and runs every check that is pure config: the grid's keys and values
(:mod:`workbench.sweeps.grid`), keys set per point, the sweep's own settings and size, and
every point composed with its own overrides through its range and cross-field checks. It
loads no learner, simulator or tracking store, so the CLI answers a typo at once;
:func:`workbench.sweeps.plan.plan_sweep` continues from the :class:`SweepRequest` with the
checks that need them (the env checks, the tracking store) into a plan. The sweep id is the
sweep's name plus a hash of its points and overrides, so the same command finds its parent
run again (resumable).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from workbench import config
from workbench.config import CONFIG_ID_TAG, ConfigError, SweepConfig, WorkbenchConfig, config_id
from workbench.config.checks import describe_omegaconf_error
from workbench.config.margin import parse_margin, parse_percent
from workbench.sweeps import grid
from workbench.sweeps.grid import PER_POINT as PER_POINT
from workbench.sweeps.grid import override_key as override_key  # the sweep's and tune's
from workbench.sweeps.kernels import DEFAULT_KERNEL, KERNEL_KEY

if TYPE_CHECKING:
    from omegaconf import DictConfig

SWEEP_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")  # fullmatch: no trailing newline
# The keys a point passes to notebooks/train.ipynb as its own parameters, not as overrides.
NOTEBOOK_PARAMETER_KEYS = {"env": "env", "env.num_envs": "num_envs", "algo.n_steps": "n_steps"}


# --------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Point:
    """One grid point: the values the grid sets; everything else comes from the overrides.

    ``keys`` are the point's value of every axis (``sweep.grid`` and the shorthand); ``env``,
    ``num_envs`` and ``n_steps`` are what the point's composed config resolves to (the
    notebook's parameters). ``label`` is a grid sweep's name for it; without ``sweep.grid``
    the name is ``train``'s default run name, as before.
    """

    env: str
    num_envs: int
    n_steps: int
    seed: int
    keys: tuple[tuple[str, Any], ...] = ()
    label: str = field(default="", compare=False)
    total_timesteps: int | None = field(default=None, compare=False)  # None: the sweep's
    config_id: str = field(default="", compare=False)  # workbench.config_id of its config
    kernel: str = field(default=DEFAULT_KERNEL, compare=False)  # the Jupyter kernel it runs in

    @property
    def name(self) -> str:
        """The point's name, which is also its child run's name."""
        return self.label or point_name(self.env, self.num_envs, self.n_steps, self.seed)

    def overrides(self) -> list[str]:
        """The point's own Hydra overrides, after the sweep's: its grid keys but those the
        notebook takes as parameters, its kernel when not the project's, and its run name
        when that is not train's default."""
        own = [grid.override(key, grid.plain(value)) for key, value in self.keys
               if key not in NOTEBOOK_PARAMETER_KEYS and key != KERNEL_KEY]
        if self.kernel != DEFAULT_KERNEL:  # the run's config says which stack it ran in
            own.append(grid.override(KERNEL_KEY, self.kernel))
        return own + ([grid.override("tracking.run_name", self.label)] if self.label else [])

    def tags(self) -> dict[str, str]:
        """The point run's grid tags: ``sweep.grid.<key>`` per axis, and its config id."""
        tags = grid.key_tags(self.keys)
        if self.config_id:
            tags[CONFIG_ID_TAG] = self.config_id
        return tags


def rollout_steps(cfg: WorkbenchConfig) -> int:
    """The notebook's ``n_steps`` parameter for a point: PPO's and A2C's ``algo.n_steps``; 0
    for the off-policy algorithms, which have none (the notebook then passes no
    ``algo.n_steps``)."""
    return int(getattr(cfg.algo, "n_steps", 0))


def point_name(env: str, num_envs: int, n_steps: int, seed: int) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>-s<seed>``: ``train``'s default run name for the point."""
    return f"{env}-ne{num_envs}-ns{n_steps}-s{seed}"


def expand_grid(sweep: SweepConfig, env: str) -> list[Point]:
    """The points of the shorthand grid num_envs x n_steps x seeds, in that order, without
    duplicates, without composing them (:func:`expand_points` composes each).

    Iso-batch mode (``sweep.iso_batch=B``) keeps the samples per update constant: each
    num_envs gets ``n_steps = B / num_envs`` (halve the envs, double the
    rollout) and ``sweep.n_steps`` is not used.
    """
    axes = {axis.key: axis.values for axis in grid.sweep_axes(sweep)}
    points: list[Point] = []
    for num_envs in axes["env.num_envs"]:
        for n_steps in iso_batch_steps(sweep.iso_batch, num_envs) or axes["algo.n_steps"]:
            for seed in sweep.seeds:
                point = Point(env, num_envs, n_steps, seed,
                              (("env.num_envs", num_envs), ("algo.n_steps", n_steps)))
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


@dataclass
class Expansion:
    """The grid's points, each composed with its own overrides and checked."""

    points: list[Point] = field(default_factory=list)
    invalid: dict[str, str] = field(default_factory=dict)  # point -> config error
    variants: list[WorkbenchConfig] = field(default_factory=list)  # one per group choice


def expand_points(sweep: SweepConfig, axes: Sequence[grid.Axis], composed: DictConfig,
                  point_overrides: Sequence[str]) -> Expansion:
    """Every point of ``axes`` x seeds, composed as its notebook will compose it.

    Group choices (``env``, ``algo``, ``experiment``, ...) need Hydra: each distinct set of
    them is composed once, after the sweep's overrides; the point's other keys and its seed
    then go into a copy of that composition before it is resolved, as Hydra applies value
    overrides after the defaults list, so what follows from them (``algo.batch_size``, half a
    rollout by default) is the point's own. Each point's config gets the cross-field checks:
    an invalid one is only reported (it fails alone, in its notebook).
    """
    from omegaconf import OmegaConf

    out = Expansion()
    compositions: dict[tuple[str, ...], DictConfig] = {(): composed}
    named = bool(sweep.grid)
    labels: list[str] = []
    for combo in itertools.product(*(axis.values for axis in axes)):
        values = dict(zip((axis.key for axis in axes), combo, strict=True))
        groups = tuple(grid.override(a.key, values[a.key]) for a in axes if a.is_group)
        if groups not in compositions:
            compositions[groups] = config.compose([*point_overrides, *groups])
            variant = typed_config(compositions[groups])
            config.check_names(variant)
            out.variants.append(variant)
        for seed in dict.fromkeys(sweep.seeds):
            own = copy.deepcopy(compositions[groups])
            for key, value in [*((a.key, values[a.key]) for a in axes if not a.is_group),
                               ("seed", seed)]:
                set_value(own, key, grid.plain(value))
            for n_steps in iso_batch_steps(sweep.iso_batch, int(own.env.num_envs)):
                OmegaConf.update(own, "algo.n_steps", n_steps, merge=False)
            typed = typed_config(own)
            keys = tuple(values.items())
            if sweep.iso_batch is not None:
                keys += (("algo.n_steps", rollout_steps(typed)),)
            point = Point(typed.env.name, typed.env.num_envs, rollout_steps(typed), seed, keys,
                          total_timesteps=typed.total_timesteps, config_id=config_id(typed),
                          kernel=str(values.get(KERNEL_KEY, sweep.kernel)))
            if point in out.points:
                continue
            out.points.append(point)
            labels.append(grid.point_label(axes, values, seed, typed.env.name) if named else "")
            try:
                config.check_values(typed)
            except ConfigError as exc:
                out.invalid[point.name if not named else labels[-1]] = str(exc)
    if named:
        names = grid.unique_names(labels, [p.overrides() for p in out.points])
        renamed = {label: name for label, name in zip(labels, names, strict=True)}
        out.points = [replace(p, label=name) for p, name in zip(out.points, names, strict=True)]
        out.invalid = {renamed[label]: error for label, error in out.invalid.items()}
    if not out.variants:
        out.variants.append(typed_config(composed))
    return out


def set_value(own: DictConfig, key: str, value: Any) -> None:
    """A grid value into a point's composition; a value of the wrong type is bad input."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.update(own, key, value, merge=False)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"sweep.grid: {describe_omegaconf_error(exc)}") from exc


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
    axes: list[grid.Axis] = field(default_factory=list)
    variants: list[WorkbenchConfig] = field(default_factory=list)  # one per group choice


def check_request(overrides: Sequence[str], yes: bool = False) -> SweepRequest:
    """Compose and check a sweep request's config; raises :class:`ConfigError` on bad input.

    Request-level problems (types, unknown keys or group options in the grid, an empty axis,
    a grid key also overridden for all points, more than ``sweep.max_points`` points unless
    ``yes``, every point invalid) stop here. A grid point whose own combination is
    invalid (e.g. a rollout smaller than ``algo.batch_size``) is only reported: it fails
    alone, in its notebook, while the valid points run.
    """
    overrides = grid.hydra_sweeps(overrides)  # key=a,b and range(): sweep.grid axes
    shared = [o for o in overrides if not is_sweep_override(o)]
    grid.check_not_overridden([], shared, "on the command line")  # seed, run name: before all
    grid.check_unique_keys(overrides)
    composed = config.compose(overrides)
    typed = typed_config(composed)
    config.check_names(typed)  # before a sweep id or a point name is built from them
    sweep = typed.sweep
    grid.check_not_overridden([], sweep.overrides, "in sweep.overrides")
    check_sweep_settings(sweep)
    axes = grid.sweep_axes(sweep)
    grid.check_not_overridden(axes, shared, "on the command line")
    grid.check_not_overridden(axes, sweep.overrides, "in sweep.overrides")
    grid.check_size(axes, sweep, yes)
    # The preset's overrides first: the command line wins over a conf/sweep/ file.
    point_overrides = list(sweep.overrides) + shared
    if sweep.overrides:
        composed = config.compose(point_overrides)  # what the points compose, checked here
        typed = typed_config(composed)
    expansion = expand_points(sweep, axes, composed, point_overrides)
    points, invalid = expansion.points, expansion.invalid
    if len(invalid) == len(points):
        first = points[0].name
        raise ConfigError(f"every point of the sweep is invalid, e.g. {first}: {invalid[first]}")
    check_verification(sweep, points)
    if sweep.verify.margin is not None:  # A and B alternate: each pair meets the same load
        points = sorted(points, key=lambda p: p.seed)
    sweep_id = sweep.id or sweep_identity(sweep.name, points, point_overrides, sweep)
    return SweepRequest(sweep=sweep, shared=typed, points=points,
                        point_overrides=point_overrides, sweep_id=sweep_id, invalid=invalid,
                        axes=axes, variants=expansion.variants)


def compose_typed(overrides: Sequence[str]) -> WorkbenchConfig:
    """Hydra composition merged into the schema (types, keys), without cross-field checks."""
    return typed_config(config.compose(overrides))


def typed_config(composed: DictConfig) -> WorkbenchConfig:
    """A composed config resolved into the schema's dataclasses (no cross-field checks)."""
    from omegaconf import OmegaConf

    typed = OmegaConf.to_object(composed)
    assert isinstance(typed, WorkbenchConfig)
    return typed


def is_sweep_override(text: str) -> bool:
    """True for overrides of the sweep itself (``sweep=...``, ``sweep.*``)."""
    key = override_key(text)
    return key == "sweep" or key.startswith("sweep.")


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
    if sweep.max_points < 1:
        raise ConfigError(f"sweep.max_points={sweep.max_points}: must be >= 1")
    if not sweep.kernel.strip():
        raise ConfigError(f"{KERNEL_KEY}='': name a Jupyter kernel, e.g. {KERNEL_KEY}="
                          f"{DEFAULT_KERNEL} (jupyter kernelspec list shows them)")
    verify = sweep.verify
    if verify.margin is None:
        return
    parse_margin(verify.margin, "sweep.verify.margin")
    parse_percent(verify.time_margin, "sweep.verify.time_margin")
    first = len(dict.fromkeys(sweep.seeds))
    if verify.max_seeds < first:
        raise ConfigError(f"sweep.verify.max_seeds={verify.max_seeds}: below the first stage's "
                          f"{first} seeds (sweep.seeds); set sweep.verify.max_seeds={first} or "
                          "more, or fewer sweep.seeds")


def side_name(point: Point) -> str:
    """A point's configuration: its name without the seed (``lr3e-5-s0`` -> ``lr3e-5``)."""
    suffix = f"-s{point.seed}"
    return point.name[:-len(suffix)] if point.name.endswith(suffix) else point.name


def check_verification(sweep: SweepConfig, points: Sequence[Point]) -> None:
    """A verification sweep (``sweep.verify.margin`` set) compares two configurations, A the
    grid's first: exactly two, of one task unless ``sweep.verify.allow_different_tasks``."""
    if sweep.verify.margin is None:
        return
    sides = list(dict.fromkeys(side_name(p) for p in points))
    if len(sides) != 2:
        raise ConfigError(f"sweep=verify: the grid has {len(sides)} configuration"
                          f"{'' if len(sides) == 1 else 's'} ({', '.join(sides)}); a "
                          "verification compares two, A first: give one axis two values, e.g. "
                          "'sweep.grid={algo.learning_rate:[3e-4,3e-5]}' or "
                          f"'sweep.grid={{{KERNEL_KEY}:[workbench,workbench-candidate]}}'")
    tasks = [next(p.env for p in points if side_name(p) == side) for side in sides]
    if tasks[0] != tasks[1] and not sweep.verify.allow_different_tasks:
        raise ConfigError(f"sweep=verify: A ({sides[0]}) trains on {tasks[0]}, B ({sides[1]}) "
                          f"on {tasks[1]}, and returns of different tasks are not comparable; "
                          "verify on one task, or set sweep.verify.allow_different_tasks=true")


def sweep_identity(name: str, points: Sequence[Point], point_overrides: Sequence[str],
                   sweep: SweepConfig | None = None) -> str:
    """``<name>-<8 hex>``: the same points and overrides give the same id (resumable).

    A grid sweep's points add their overrides: a key with one value is in no point's name,
    yet two such sweeps are not the same sweep. Points in another kernel, and a
    verification's stages and margins (its levels follow from them), make another sweep too.
    """
    content: dict[str, Any] = {"points": [p.name for p in points],
                               "overrides": list(point_overrides)}
    if any(p.label for p in points):
        content["point_overrides"] = [p.overrides() for p in points]
    if any(p.kernel != DEFAULT_KERNEL for p in points):  # another stack is another sweep
        content["kernels"] = [p.kernel for p in points]
    if sweep is not None and sweep.verify.margin is not None:
        content["verify"] = asdict(sweep.verify)
    payload = json.dumps(content, sort_keys=True)
    return f"{name}-{hashlib.sha256(payload.encode()).hexdigest()[:8]}"
