"""The sweep's grid: its axes (any config keys, group choices included), checked, and the
points' names and tags.

An axis is a config key with the values its points take: ``sweep.grid`` gives any number of
them (``sweep.grid={algo.learning_rate:[1e-4,3e-4],env:[hopper,walker2d]}``, or one key at a
time, ``sweep.grid.algo.learning_rate=[1e-4,3e-4]``), ``sweep.num_envs`` / ``sweep.n_steps``
are shorthand for the axes ``env.num_envs`` / ``algo.n_steps``, and ``sweep.seeds`` is crossed
with all of them. Without ``sweep.grid`` the shorthand defaults to today's grid, num_envs
[1, 2] x n_steps [128, 256], and the points keep their names (``<env>-ne<N>-ns<S>-s<seed>``);
with it, a shorthand axis exists only when set, and a point is named after the keys that
vary (``lr1e-4-hopper-s0``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench import config
from workbench.config import ConfigError, SweepConfig
from workbench.config.compose import hydra_value
from workbench.sweeps.kernels import KERNEL_KEY

# Shorthand settings of the sweep group for two grid keys; their defaults without sweep.grid.
SHORTHAND = {"env.num_envs": "sweep.num_envs", "algo.n_steps": "sweep.n_steps"}
DEFAULT_NUM_ENVS, DEFAULT_N_STEPS = [1, 2], [128, 256]
# Keys every point sets itself: never a grid key, never overridden for the whole sweep.
PER_POINT = {"seed": "sweep.seeds", "tracking.run_name": "the point name"}
# A point run's tag per grid key: sweep.grid.<key> = value (not "sweep.key.": tag names with
# a credential word such as "key" have their values masked, workbench.tracking.redaction).
KEY_TAG_PREFIX = "sweep.grid."
# Short labels of the keys a point name shows (the key's last part otherwise).
ABBREVIATIONS = {
    "learning_rate": "lr", "num_envs": "ne", "n_steps": "ns", "batch_size": "bs",
    "n_epochs": "ep", "gamma": "g", "gae_lambda": "gl", "clip_range": "clip",
    "ent_coef": "ent", "vf_coef": "vf", "max_grad_norm": "gn", "target_kl": "kl",
    "total_timesteps": "ts",
}
NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")  # anything else in a label becomes '_'


@dataclass(frozen=True)
class Axis:
    """One grid key and its values, in the order given, without duplicates."""

    key: str
    values: tuple[Any, ...]
    shorthand: bool = False  # from sweep.num_envs / sweep.n_steps, not sweep.grid

    @property
    def is_group(self) -> bool:
        """True for a config-group choice (``env``, ``algo``, ``experiment``, ...)."""
        return self.key in config.GROUPS

    @property
    def varies(self) -> bool:
        return len(self.values) > 1


def override(key: str, value: Any) -> str:
    """The Hydra override setting ``key`` to ``value``, e.g. ``algo.learning_rate=0.0001``."""
    return f"{key}={hydra_value(value)}"


def flat_grid(grid: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``sweep.grid`` as ``{dotted key: values}``: ``sweep.grid.algo.learning_rate=[..]``
    nests dicts, ``sweep.grid={algo.learning_rate:[..]}`` does not; both mean the same."""
    flat: dict[str, Any] = {}
    for key, value in grid.items():
        name = f"{prefix}{key}"
        found = flat_grid(value, f"{name}.") if isinstance(value, Mapping) else {name: value}
        for repeated in set(found) & set(flat):
            raise repeated_key(repeated)
        flat.update(found)
    return flat


def repeated_key(key: str) -> ConfigError:
    """The error for a grid key given twice: one of its lists would be dropped silently."""
    return ConfigError(f"sweep.grid: key {key} is given twice; give it once, with all its "
                       f"values in one list (e.g. sweep.grid.{key}=[a,b])")


def hydra_sweeps(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with Hydra's own sweep syntax turned into grid axes.

    ``key=a,b,c``, ``key=range(1,4)``, ``key=choice(a,b)`` and, for a config group,
    ``env=glob(h*)``, as every Hydra user writes them (Hydra's override parser and sweep
    iterator enumerate the values), become one ``sweep.grid={...}`` in the order given, or
    ``sweep.grid.<key>=[...]`` beside a ``sweep.grid`` dict of the same command line: the
    same grid as the ``sweep.grid`` form. An interval (``interval(0,1)``) has no list of
    values to sweep: bad input.
    """
    from types import SimpleNamespace

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    parser = OverridesParser.create()
    plain: list[str] = []
    axes: list[str] = []
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception:  # not an override: composing it says why, in one line
            plain.append(text)
            continue
        if not override.is_sweep_override():
            plain.append(text)
            continue
        key = override.key_or_group
        if override.value_type == ValueType.INTERVAL_SWEEP:
            raise ConfigError(f"{text}: an interval is not a list of values to sweep; write "
                              f"{key}=a,b,c, {key}=range(START,STOP,STEP) or {key}=choice(a,b)")
        # glob() lists the group's options through a config loader: the workbench's own list
        # (the one method glob() calls, not Hydra's whole ConfigLoader)
        override.config_loader = SimpleNamespace(  # type: ignore[assignment]
            get_group_options=lambda group, results_filter=None: config.group_options(group))
        values = list(override.sweep_iterator())
        if not values:
            raise ConfigError(f"{text}: sweeps no value; e.g. {key}=a,b")
        axes.append(f"{key}:{hydra_value(values)}")
    if not axes:
        return plain
    if any(override_key(text) == "sweep.grid" for text in plain):  # beside a sweep.grid dict
        return plain + [f"sweep.grid.{axis.replace(':', '=', 1)}" for axis in axes]
    return [*plain, "sweep.grid={" + ",".join(axes) + "}"]  # one dict: the keys in order


def check_unique_keys(overrides: Iterable[str]) -> None:
    """Every grid key once on the command line: in two overrides of it, or twice in one
    dict (``sweep.grid={algo.gamma:[0.9],algo.gamma:[0.99]}``), Hydra keeps the last."""
    seen: set[str] = set()
    for text in overrides:
        key = override_key(text)
        if not (key == "sweep.grid" or key.startswith("sweep.grid.")):
            continue
        if key in seen and key != "sweep.grid":
            raise repeated_key(key.removeprefix("sweep.grid."))
        seen.add(key)
        repeated = repeated_dict_key(text)
        if repeated is not None:
            raise repeated_key(repeated)


def repeated_dict_key(text: str) -> str | None:
    """A key a dict of the override ``text`` names twice, or None (also when it does not
    parse: composing it reports that). Hydra's own grammar and visitor, which keep the last
    value of a repeated key, with the repetition noted."""
    from antlr4 import CommonTokenStream, InputStream
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.overrides_visitor import HydraOverrideVisitor
    from hydra.grammar.gen.OverrideLexer import OverrideLexer
    from hydra.grammar.gen.OverrideParser import OverrideParser

    repeated: list[str] = []

    class Visitor(HydraOverrideVisitor):  # type: ignore[misc]
        def visitDictContainer(self, ctx: Any) -> Any:  # ANTLR's name
            keys = [str(self.visitDictKey(ctx.getChild(i).getChild(0)))
                    for i in range(1, ctx.getChildCount() - 1, 2)]
            repeated.extend(k for i, k in enumerate(keys) if k in keys[:i])
            return super().visitDictContainer(ctx)

    lexer = OverrideLexer(InputStream(text))
    lexer.removeErrorListeners()
    parser = OverrideParser(CommonTokenStream(lexer))
    parser.removeErrorListeners()
    try:
        Visitor(OverridesParser.create().functions).visit(parser.override())
    except Exception:  # not an override: config.compose says why
        return None
    return repeated[0] if repeated else None


def sweep_axes(sweep: SweepConfig) -> list[Axis]:
    """The grid's axes, ``sweep.grid``'s keys first, then the shorthand; checked.

    Raises :class:`ConfigError` for a key or group option that does not exist, an axis
    without values, a key the sweep sets itself, or a grid key that the shorthand (or
    ``sweep.iso_batch``) also sets.
    """
    axes = [grid_axis(key, values) for key, values in flat_grid(sweep.grid).items()]
    keys = {axis.key for axis in axes}
    defaults = not axes  # without sweep.grid, the shorthand's defaults make today's grid
    if sweep.iso_batch is not None and "algo.n_steps" in keys:
        raise ConfigError(
            "sweep.grid key algo.n_steps with sweep.iso_batch: the iso-batch grid derives "
            "n_steps from num_envs; drop one of them (sweep.iso_batch=null for an n_steps axis)")
    for key, setting in SHORTHAND.items():
        given = sweep.num_envs if key == "env.num_envs" else sweep.n_steps
        if key == "algo.n_steps" and sweep.iso_batch is not None:
            continue  # derived per point: iso_batch / num_envs
        if given is not None and key in keys:
            raise ConfigError(
                f"{setting}={hydra_value(list(given))} with sweep.grid key {key}: both set the "
                f"same axis; keep one of them")
        if given is None and defaults:
            given = DEFAULT_NUM_ENVS if key == "env.num_envs" else DEFAULT_N_STEPS
        if given is not None:
            if not given:
                example = "[1,2,4]" if key == "env.num_envs" else "[128,256]"
                raise ConfigError(f"{setting}=[]: the grid needs at least one value, "
                                  f"e.g. {setting}={example}")
            axes.append(Axis(key, tuple(dict.fromkeys(given)), shorthand=True))
    if not sweep.seeds:
        raise ConfigError("sweep.seeds=[]: the grid needs at least one value, e.g. "
                          "sweep.seeds=[0]")
    return axes


def grid_axis(key: str, values: Any) -> Axis:
    """One ``sweep.grid`` entry as an axis; raises :class:`ConfigError` when unusable."""
    where = f"sweep.grid key {key}"
    if key in PER_POINT:
        fix = (f"use {PER_POINT[key]} instead, e.g. {PER_POINT[key]}=[0,1,2]" if key == "seed"
               else "the sweep names each point's run itself")
        raise ConfigError(f"{where}: {key} is set per point by the sweep; {fix}")
    if (key == "sweep" or key.startswith("sweep.") or key == "resume") and key != KERNEL_KEY:
        raise ConfigError(f"{where}: the sweep's own settings (and resume) cannot vary per "
                          f"point, but for {KERNEL_KEY}; sweep over training keys, e.g. "
                          "sweep.grid.algo.gamma=[0.99,0.999]")
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise ConfigError(f"{where}={hydra_value(values)}: an axis is a list of values; "
                          f"write sweep.grid.{key}=[{hydra_value(values)}]")
    if not values:
        raise ConfigError(f"{where}=[]: the axis needs at least one value, e.g. "
                          f"sweep.grid.{key}=[...]")
    unique = tuple(dict.fromkeys(hashable(v) for v in values))
    module = next((v for v in unique if key == "env.id" and ":" in str(v)), None)
    if module is not None:  # the request check imports nothing; each point's kernel would
        raise ConfigError(f"{where}: {module!r} names a module to import; a grid value is "
                          f"never imported: give env.id={module} on the command line for "
                          "every point (it imports as your own env.id does), or sweep over "
                          "conf/env options (sweep.grid.env=[...])")
    try:  # the key and each group option, with the config layer's "did you mean"
        config.check_overrides([override(key, v) for v in unique])
    except ConfigError as exc:
        raise ConfigError(f"sweep.grid: {exc}") from exc
    return Axis(key, unique)


def hashable(value: Any) -> Any:
    """Lists (e.g. a policy's layer sizes) as tuples, so values can be told apart."""
    return tuple(hashable(v) for v in value) if isinstance(value, list | tuple) else value


def plain(value: Any) -> Any:
    """A grid value back as OmegaConf and Hydra take it (tuples as lists)."""
    return [plain(v) for v in value] if isinstance(value, tuple) else value


def override_key(text: str) -> str:
    """The key (or config group) an override sets, e.g. ``env.num_envs`` or ``sweep``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return str(OverridesParser.create().parse_override(text).key_or_group)
    except Exception:  # unparsable: config.compose reports it with the fix
        return text.split("=", 1)[0].lstrip("+~")


def check_not_overridden(axes: Iterable[Axis], overrides: Iterable[str], where: str) -> None:
    """Refuse a sweep-wide override of a key that an axis sets per point."""
    own = {axis.key: axis for axis in axes}
    for text in overrides:
        key = override_key(text)
        if key in PER_POINT or key in own and own[key].shorthand:
            setting = PER_POINT.get(key) or SHORTHAND[key]
            raise ConfigError(
                f"{text!r} {where}: {key} is set per point by the sweep; use {setting} "
                "instead" + (f", e.g. {setting}=[{text.split('=', 1)[-1]}]"
                             if key != "tracking.run_name" else ""))
        if key in own:
            raise ConfigError(
                f"{text!r} {where}: {key} is also a key of sweep.grid, which sets it per "
                "point; drop one of them")


def point_count(axes: Sequence[Axis], seeds: Sequence[int]) -> int:
    """Points of the product (before any point is composed)."""
    return math.prod(len(axis.values) for axis in axes) * len(dict.fromkeys(seeds))


def check_size(axes: Sequence[Axis], sweep: SweepConfig, yes: bool) -> None:
    """Refuse a grid of more than ``sweep.max_points`` points unless confirmed."""
    count = point_count(axes, sweep.seeds)
    if count > sweep.max_points and not yes:
        shape = " x ".join([*(f"{len(a.values)} {a.key}" for a in axes),
                            f"{len(dict.fromkeys(sweep.seeds))} seeds"])
        raise ConfigError(
            f"sweep: {count} points ({shape}) is more than sweep.max_points="
            f"{sweep.max_points}; pass --yes to run them all, or set sweep.max_points={count}")


# --------------------------------------------------------------------------- names, tags


def value_text(value: Any) -> str:
    """A value as a point name shows it: ``1e-4``, ``0.99``, ``64x64``, ``hopper``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != 0 and not 1e-2 <= abs(value) < 1e5:
            mantissa, exponent = f"{value:.3e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "x".join(value_text(v) for v in value)
    return NAME_CHARS.sub("_", str(value))


def label(axis: Axis, value: Any, prefix: str | None = None) -> str:
    """A grid value in a point name: a group option or a kernel as itself (``hopper``), a
    boolean as the key or ``no`` + key, anything else key + value (``lr1e-4``, ``ne4``)."""
    if axis.is_group or axis.key == KERNEL_KEY:  # a kernel's name says which stack
        return value_text(value)
    name = prefix or ABBREVIATIONS.get(axis.key.rsplit(".", 1)[-1], axis.key.rsplit(".", 1)[-1])
    if isinstance(value, bool):
        return name if value else f"no{name}"
    text = value_text(value)
    return f"{name}_{text}" if text[:1].isalpha() else f"{name}{text}"


def label_prefixes(axes: Sequence[Axis]) -> dict[str, str]:
    """Each axis's prefix in names: its abbreviation, or its whole key where two collide."""
    short = {a.key: ABBREVIATIONS.get(a.key.rsplit(".", 1)[-1], a.key.rsplit(".", 1)[-1])
             for a in axes}
    taken = list(short.values())
    return {key: (NAME_CHARS.sub("_", key) if taken.count(value) > 1 else value)
            for key, value in short.items()}


def point_label(axes: Sequence[Axis], values: Mapping[str, Any], seed: int, env: str) -> str:
    """A grid point's name: the labels of the axes that vary, then ``s<seed>``; the env's
    name first when nothing but the seed varies (``hopper-s0``)."""
    prefixes = label_prefixes(axes)
    parts = [label(a, values[a.key], prefixes[a.key]) for a in axes if a.varies]
    return "-".join([*(parts or [env]), f"s{seed}"])


def unique_names(names: Sequence[str], overrides: Sequence[Sequence[str]]) -> list[str]:
    """``names`` where two points would share one get a hash of their overrides appended
    (values that only differ in characters a name cannot hold)."""
    return [name if names.count(name) == 1 else
            f"{name}-{hashlib.sha256(repr(list(own)).encode()).hexdigest()[:6]}"
            for name, own in zip(names, overrides, strict=True)]


def key_tags(keys: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """``sweep.grid.<key>`` tags of a point: its value of every grid key, as its override."""
    return {f"{KEY_TAG_PREFIX}{key}": hydra_value(plain(value)) for key, value in keys}
