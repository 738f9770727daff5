"""A search space, checked: ``search.params`` as dimensions Optuna samples, and the overrides
a trial's values become.

Each search key names the config key it sets (``learning_rate`` -> ``algo.learning_rate``;
``net_width`` sets both hidden layers of actor and critic); any other scalar config key can
be searched by its dotted name (``env.max_episode_steps``). A dimension is a range
(``low``..``high``, ``log``, ``step``) or a list of ``choices``; integers or floats follow the
config key's type. Every problem is one :class:`ConfigError` line naming the key.
"""

from __future__ import annotations

import difflib
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from enum import StrEnum
from typing import Any

from workbench.config import ConfigError, WorkbenchConfig
from workbench.config.compose import hydra_value
from workbench.config.schema import Range, schema_field

# Search key -> the config keys its value sets (the zoo's names for the hyperparameters).
KEYS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("algo.learning_rate",),
    "n_steps": ("algo.n_steps",),
    "num_envs": ("env.num_envs",),
    "batch_size": ("algo.batch_size",),
    "n_epochs": ("algo.n_epochs",),
    # VecNormalize's return discount follows the algorithm's, as rl-baselines3-zoo sets it
    "gamma": ("algo.gamma", "env.norm_gamma"),
    "gae_lambda": ("algo.gae_lambda",),
    "ent_coef": ("algo.ent_coef",),
    "clip_range": ("algo.clip_range",),
    "vf_coef": ("algo.vf_coef",),
    "max_grad_norm": ("algo.max_grad_norm",),
    "log_std_init": ("algo.policy.log_std_init",),
    "activation": ("algo.policy.activation",),
    "ortho_init": ("algo.policy.ortho_init",),
    "normalize": ("env.normalize",),
    # the off-policy algorithms'
    "buffer_size": ("algo.buffer_size",),
    "learning_starts": ("algo.learning_starts",),
    "tau": ("algo.tau",),
    "train_freq": ("algo.train_freq",),
    "gradient_steps": ("algo.gradient_steps",),
    "policy_delay": ("algo.policy_delay",),
    "target_policy_noise": ("algo.target_policy_noise",),
    "action_noise_std": ("algo.action_noise_std",),
    "top_quantiles_to_drop_per_net": ("algo.top_quantiles_to_drop_per_net",),
    # two hidden layers of this width for the actor and the critic(s): PPO's and A2C's
    # policy.vf, the off-policy algorithms' policy.qf
    "net_width": ("algo.policy.pi", "algo.policy.vf"),
}
OFF_POLICY_NET = ("algo.policy.pi", "algo.policy.qf")
FIELDS = ("low", "high", "log", "step", "choices")
NET_DEPTH = 2  # net_width=w sets [w, w]


@dataclass(frozen=True)
class Dimension:
    """One checked dimension: a numeric range or categorical choices."""

    name: str  # the search key (also the Optuna parameter's name)
    targets: tuple[str, ...]  # config keys it sets
    kind: str  # "int" | "float" | "categorical"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def describe(self) -> str:
        """``[1e-05, 0.001] log`` or ``{64, 128}``."""
        if self.kind == "categorical":
            return "{" + ", ".join(str(c) for c in self.choices) + "}"
        scale = " log" if self.log else (f" step {self.step:g}" if self.step else "")
        return f"[{self.low:g}, {self.high:g}]{scale}"

    def suggest(self, trial: Any) -> Any:
        """The trial's value (``optuna.Trial.suggest_*``)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            step = int(self.step) if self.step else 1
            return trial.suggest_int(self.name, int(self.low or 0), int(self.high or 0),
                                     step=step, log=self.log)
        return trial.suggest_float(self.name, float(self.low or 0.0), float(self.high or 0.0),
                                   step=self.step, log=self.log)

    def distribution(self) -> Any:
        """The Optuna distribution (for samplers that need the space up front)."""
        import optuna

        if self.kind == "categorical":
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.kind == "int":
            return optuna.distributions.IntDistribution(
                int(self.low or 0), int(self.high or 0), log=self.log,
                step=int(self.step) if self.step else 1)
        return optuna.distributions.FloatDistribution(
            float(self.low or 0.0), float(self.high or 0.0), log=self.log, step=self.step)

    def overrides(self, value: Any) -> list[str]:
        """Hydra overrides that give the trial this value."""
        if self.name == "net_width":
            return [f"{key}={hydra_value([int(value)] * NET_DEPTH)}" for key in self.targets]
        return [f"{key}={hydra_value(value)}" for key in self.targets]


@dataclass(frozen=True)
class SearchSpace:
    """The checked dimensions of ``search.params``, in their order."""

    name: str
    dimensions: tuple[Dimension, ...]

    def __getitem__(self, name: str) -> Dimension:
        return next(d for d in self.dimensions if d.name == name)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dimensions]

    def targets(self) -> dict[str, str]:
        """Config key -> the search key that sets it."""
        return {key: d.name for d in self.dimensions for key in d.targets}

    def describe(self) -> str:
        """``learning_rate [1e-05, 0.001] log, n_steps {64, 128}``."""
        return ", ".join(f"{d.name} {d.describe()}" for d in self.dimensions)

    def fixed_values(self, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """``values`` (search key -> value, e.g. a trial to enqueue) checked against the
        space: each key one of its dimensions, each value one of its choices or within its
        range; bad input is one :class:`ConfigError` line naming ``where``."""
        if not isinstance(values, Mapping) or not values:
            raise ConfigError(f"{where}={values!r}: give search keys and values, e.g. "
                              "{learning_rate: 3e-4, n_steps: 512}")
        checked: dict[str, Any] = {}
        for name, value in values.items():
            if name not in self.names:
                raise ConfigError(f"{where}.{name}: not in search={self.name}; its keys: "
                                  f"{', '.join(self.names)}")
            dim = self[name]
            if dim.kind == "categorical":
                if value not in dim.choices:
                    raise ConfigError(f"{where}.{name}={value!r}: not one of {dim.describe()}")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not (
                    (dim.low or 0.0) <= value <= (dim.high or 0.0)):
                raise ConfigError(f"{where}.{name}={value!r}: outside {dim.describe()}")
            checked[name] = int(value) if dim.kind == "int" else value
        return checked

    def as_dict(self) -> dict[str, Any]:
        """The space as plain values (the study's record of what it searches)."""
        return {d.name: {"kind": d.kind, "range": d.describe()} for d in self.dimensions}

    def grid(self) -> dict[str, list[Any]]:
        """Every dimension's choices, for Optuna's GridSampler; a range is bad input."""
        ranged = [d.name for d in self.dimensions if d.kind != "categorical"]
        if ranged:
            raise ConfigError(
                f"tune.sampler=grid: search.params.{ranged[0]} is a range; the grid needs "
                f"choices for every key, e.g. search.params.{ranged[0]}={{choices:[...]}}, or "
                "use tune.sampler=tpe"
            )
        return {d.name: list(d.choices) for d in self.dimensions}

    def grid_size(self) -> int:
        """How many combinations the grid has."""
        return math.prod(len(d.choices) for d in self.dimensions)

    def overrides(self, values: Mapping[str, Any]) -> list[str]:
        """A trial's sampled values as Hydra overrides, in the space's order."""
        return [o for d in self.dimensions if d.name in values for o in d.overrides(values[d.name])]


def parse_space(name: str, params: Mapping[str, Any], algo: str = "ppo") -> SearchSpace:
    """Check ``search.params`` against the keys of ``algo`` (an ``algo.name``) and return its
    dimensions; raises :class:`ConfigError`."""
    if not params:
        raise ConfigError(
            f"search.params is empty: choose a search space (search={algo}) or add a key, e.g. "
            "'+search.params.learning_rate={low:1e-5,high:1e-3,log:true}'"
        )
    return SearchSpace(name, tuple(parse_dimension(key, spec, algo)
                                   for key, spec in params.items()))


def parse_dimension(key: str, spec: Any, algo: str = "ppo") -> Dimension:
    """One ``search.params.<key>`` entry, checked."""
    where = f"search.params.{key}"
    targets = resolve_key(key, algo)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}={spec!r}: give a range {{low: .., high: ..}} or "
                          "{choices: [..]}")
    unknown = [f for f in spec if f not in FIELDS]
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown field; valid fields: "
                          f"{', '.join(FIELDS)}")
    kind = value_kind(key, targets[0], algo)
    choices = spec.get("choices")
    has_range = spec.get("low") is not None or spec.get("high") is not None
    if choices is not None:
        if has_range:
            raise ConfigError(f"{where}: give either low/high or choices, not both")
        return categorical(key, targets, list(choices), algo)
    if kind == "categorical":
        raise ConfigError(f"{where}: {targets[0]} takes a value from a set; give choices, "
                          f"e.g. {where}={{choices:[...]}}")
    return numeric(key, targets, kind, spec, algo)


def categorical(key: str, targets: tuple[str, ...], choices: list[Any], algo: str = "ppo"
                ) -> Dimension:
    """A choices dimension: at least one value, each a plain scalar in the key's range."""
    where = f"search.params.{key}"
    if not choices:
        raise ConfigError(f"{where}.choices=[]: empty; list at least one value")
    for value in choices:
        if not isinstance(value, bool | int | float | str):
            raise ConfigError(f"{where}.choices: {value!r} is not a number, string or boolean")
        check_choice_type(key, targets[0], value, algo)
        if isinstance(value, int | float) and not isinstance(value, bool):
            check_in_range(key, targets[0], value, algo)
    return Dimension(key, targets, "categorical", choices=tuple(choices))


def check_choice_type(key: str, target: str, value: Any, algo: str = "ppo") -> None:
    """A choice must have the type of the config key it sets: ``n_steps`` takes whole numbers,
    ``gamma`` numbers, ``activation`` one of its names; else every trial would fail."""
    base = int if key == "net_width" else scalar_type(target, algo)
    if base is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if base is bool:
        fits, expected = isinstance(value, bool), "true or false"
    elif issubclass(base, StrEnum):
        names = [str(m.value) for m in base]
        fits, expected = isinstance(value, str) and value in names, f"one of {', '.join(names)}"
    elif base is str:
        fits, expected = isinstance(value, str), "a string"
    elif base is int:
        fits, expected = number and isinstance(value, int), "a whole number"
    else:
        fits, expected = number, "a number"
    if not fits:
        shown = repr(value).encode("ascii", "backslashreplace").decode()
        raise ConfigError(f"search.params.{key}.choices: {shown[:60]} does not fit {target}; "
                          f"each choice must be {expected}")


def numeric(key: str, targets: tuple[str, ...], kind: str, spec: Mapping[str, Any],
            algo: str = "ppo") -> Dimension:
    """A range dimension: both ends, not empty, inside the key's valid range."""
    where = f"search.params.{key}"
    low, high, step = spec.get("low"), spec.get("high"), spec.get("step")
    log = bool(spec.get("log"))
    if low is None or high is None:
        missing = "low" if low is None else "high"
        raise ConfigError(f"{where}: the range needs {missing}, e.g. {where}.{missing}=...")
    for field_name, value in (("low", low), ("high", high), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value)):
            raise ConfigError(f"{where}.{field_name}={value!r}: expected a finite number")
    if low > high:
        raise ConfigError(f"{where}: empty range [{low:g}, {high:g}] (low > high); give "
                          f"low <= high, e.g. {where}.low={high:g} {where}.high={low:g}")
    if kind == "int" and not all(float(v).is_integer() for v in (low, high, step or 1)):
        raise ConfigError(f"{where}: {targets[0]} is an integer; give whole low/high/step")
    if log and low <= 0:
        raise ConfigError(f"{where}.low={low:g}: a log range needs low > 0")
    if log and step is not None:
        raise ConfigError(f"{where}: log and step do not combine (Optuna); drop one")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}.step={step:g}: must be > 0")
    for value in (low, high):
        check_in_range(key, targets[0], value, algo)
    return Dimension(key, targets, kind, float(low), float(high), log,
                     float(step) if step is not None else None)


def resolve_key(key: str, algo: str = "ppo") -> tuple[str, ...]:
    """The config keys a search key sets for ``algo``; an unknown key, or one of another
    algorithm (``n_epochs`` with algo=sac), is bad input."""
    targets = KEYS.get(key)
    if key == "net_width" and schema_field("algo.policy.qf", algo) is not None:
        targets = OFF_POLICY_NET
    if targets is not None:
        for target in targets:
            if schema_field(target, algo) is None:
                raise ConfigError(f"search.params.{key}: sets {target}, which algo={algo} does "
                                  f"not have; drop it or use search={algo}")
        return targets
    if "." in key and scalar_type(key, algo) is not None:
        return (key,)
    close = difflib.get_close_matches(key, list(KEYS), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ConfigError(
        f"search.params.{key}: unknown search key; {hint}valid keys: {', '.join(KEYS)}, or a "
        "scalar config key by its dotted name (e.g. env.max_episode_steps)"
    )


def scalar_type(dotted: str, algo: str = "ppo") -> type | None:
    """``int``/``float``/``bool``/``str``/an Enum for a scalar schema key, else None."""
    declared = schema_field(dotted, algo)
    args = [a for a in typing.get_args(declared) if a is not type(None)]
    base = args[0] if len(args) == 1 else declared
    if isinstance(base, type) and (issubclass(base, bool | int | float | str)):
        return base
    return None


def value_kind(key: str, target: str, algo: str = "ppo") -> str:
    """``int``, ``float`` or ``categorical`` (bools, enums, strings, layer lists)."""
    if key == "net_width":
        return "int"
    base = scalar_type(target, algo)
    if base is bool or base is None or issubclass(base, StrEnum | str):
        return "categorical"
    return "int" if base is int else "float"


def check_in_range(key: str, target: str, value: float, algo: str = "ppo") -> None:
    """A searched value must be valid for the config key it sets (its schema range)."""
    valid = schema_range(target, algo) if key != "net_width" else Range(1, example="64")
    if valid is not None and not valid.contains(float(value)):
        raise ConfigError(f"search.params.{key}: {value:g} is outside {target}'s valid range "
                          f"({valid.describe()})")


def schema_range(dotted: str, algo: str = "ppo") -> Range | None:
    """The declared :class:`Range` of a schema key (``algo.*``: of ``algo``'s), if any."""
    *parents, leaf = dotted.split(".")
    node = schema_field(".".join(parents), algo) if parents else WorkbenchConfig
    if not (isinstance(node, type) and is_dataclass(node)):
        return None
    found = [f for f in fields(node) if f.name == leaf]
    return found[0].metadata.get("range") if found else None


def largest_rollout(space: SearchSpace, num_envs: int, n_steps: int) -> tuple[int, int]:
    """The largest ``num_envs`` and ``n_steps`` a trial can get (for the budget check)."""
    def most(name: str, default: int) -> int:
        if name not in space.names:
            return default
        d = space[name]
        values: Sequence[Any] = d.choices if d.kind == "categorical" else (d.high,)
        return int(max(values))
    return most("num_envs", num_envs), most("n_steps", n_steps)
