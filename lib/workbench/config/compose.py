"""Composition: ``conf/config.yaml`` + Hydra overrides -> a validated :class:`WorkbenchConfig`.

``load_config(overrides)`` composes with Hydra's compose API (so it works the same from the
CLI, a notebook and the tests), merges the result into the schema and runs the checks of
:mod:`workbench.config.checks`. Overrides are checked against the schema and the group
options first, so a typo fails with one line and a "did you mean" suggestion. Every failure
is a :class:`ConfigError` naming the key, the problem and the fix; the CLI turns it into
exit code 2 before any environment or MLflow run exists.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from workbench import paths
from workbench.config.algorithms import ALGORITHMS
from workbench.config.checks import describe_omegaconf_error, validate
from workbench.config.errors import ConfigError
from workbench.config.schema import WorkbenchConfig, schema_field

SCHEMA_NAME = "workbench_schema"
# Groups whose option follows from others (config.yaml's defaults list): -> where it comes from
CHOSEN_GROUPS = {"tuning": "algo and env (conf/tuning/<algo>_<env>.yaml)",
                 "algo_env": "algo (conf/algo_env/<algo>.yaml)"}
INTERPOLATED_KEY = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # ${env.num_envs} inside a value
GROUPS = ("env", "algo", "tuning", "algo_env", "experiment", "sweep", "search", "tracking", "video",
          "debug")


def minibatch(num_envs: int, n_steps: int, minibatches: int) -> int:
    """``${minibatch:${env.num_envs},${algo.n_steps},k}``: a k-th of the rollout (at least 2).

    conf/algo/ppo.yaml sizes its minibatch this way, so overriding ``env.num_envs`` or
    ``algo.n_steps`` keeps the same number of gradient steps per update (docs/benchmarks.md).
    """
    return max(2, int(num_envs) * int(n_steps) // int(minibatches))


# OmegaConf's extension point for computed values; replace=True makes re-imports harmless.
OmegaConf.register_new_resolver("minibatch", minibatch, replace=True)


def conf_dir() -> Path:
    """The directory holding ``config.yaml`` and the config groups."""
    return paths.project_root() / "conf"


def user_conf_dir() -> Path:
    """Config the workbench writes for its user, searched after ``conf/``: ``experiments/conf``.

    ``workbench tune`` writes a study's best trial there as ``experiment/tuned/<study>.yaml``
    (``experiment=tuned/<study>``); a file copied into ``conf/`` under the same name wins.
    """
    return paths.experiments_dir() / "conf"


def group_options(group: str) -> list[str]:
    """Names of the options of a config group: the YAML files under ``conf/<group>/`` and
    ``experiments/conf/<group>/``, subfolders included (``tuned/<study>``)."""
    names: set[str] = set()
    for root in (conf_dir(), user_conf_dir()):
        base = root / group
        names.update(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))
    return sorted(names)


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides, without validating the result.

    Hydra's compose API keeps global state; clearing it first means re-running a notebook
    cell never fails with "GlobalHydra is already initialized".
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    check_overrides(overrides)
    # The schema is the first entry of config.yaml's defaults list: every key exists with its
    # type before the YAML files and overrides are merged in (Hydra's structured configs).
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=schema_node())
    for name, schema in ALGORITHMS.items():  # conf/algo/<option>.yaml: "defaults: [<name>_schema]"
        store.store(group="algo", name=f"{name}_schema", node=schema)
    GlobalHydra.instance().clear()
    # Hydra's search path (primary config first): the user's written config after conf/.
    extra = user_conf_dir()
    search = [f"hydra.searchpath=[{hydra_value(f'file://{extra}')}]"] if extra.is_dir() else []
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=[*overrides, *search])
    except ConfigError:
        raise
    except Exception as exc:  # Hydra wraps OmegaConf errors in several exception types
        raise ConfigError(describe_hydra_error(exc, overrides)) from exc


def interpolation_sources(overrides: Sequence[str] = ()) -> dict[str, tuple[str, ...]]:
    """Config keys whose value follows from other keys, each with the keys it reads: an
    interpolation such as conf/algo/ppo.yaml's ``batch_size:
    ${minibatch:${env.num_envs},${algo.n_steps},2}`` in the composition of ``overrides``."""
    found: dict[str, tuple[str, ...]] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        elif isinstance(node, str) and "${" in node:
            found[prefix.rstrip(".")] = tuple(dict.fromkeys(INTERPOLATED_KEY.findall(node)))

    walk(OmegaConf.to_container(compose(overrides), resolve=False), "")
    return found


def schema_node() -> DictConfig:
    """The schema as Hydra's first config, with ``sweep.grid`` open to new keys.

    Hydra composes in struct mode, where a dict field takes a key only through ``+``;
    ``sweep.grid={algo.learning_rate:[1e-4,3e-4]}`` names every key it adds, so the grid's
    node is not in struct mode (its keys are checked by workbench.sweeps.grid instead).
    The ``algo`` node is left open (``???``): the group option's own algorithm schema fills it,
    so each algorithm's keys, types and defaults are its own.
    """
    node = OmegaConf.structured(WorkbenchConfig)
    OmegaConf.set_struct(node.sweep.grid, False)
    node.algo = "???"
    return node


def load_config(overrides: Sequence[str] = ()) -> WorkbenchConfig:
    """Compose, type-check and validate ``conf/config.yaml`` with ``overrides``.

    ``resume=<run_id>`` is kept as given here: the run's own config comes from the tracking
    store, so :func:`workbench.training.load_config` (the training run's loader) resolves it.
    """
    return validate(compose(overrides))


def precheck(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``overrides`` and run every check of this layer; returns the composition.

    Keys, group options and types (:func:`compose`), ranges and cross-field checks
    (:func:`validate`): everything that needs no simulator, learner or store, so the CLI
    answers a typo before those load. ``resume=<run_id>`` skips the range checks: that run's
    config comes from the store and may differ from the composition. A run's loader continues
    from the returned composition (:func:`workbench.training.load_config`).
    """
    composed = compose(overrides)
    if not composed.get("resume"):
        validate(composed)
    return composed


# --------------------------------------------------------------------------- overrides


def check_overrides(overrides: Sequence[str]) -> None:
    """Check override keys against the schema and group options before Hydra composes.

    Hydra would reject most of these too, but with multi-line messages and without the list
    of valid choices; this gives one actionable line (and "did you mean" suggestions).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"override {text!r}: cannot parse ({first}); write key=value, e.g. seed=3"
            ) from exc
        key = override.key_or_group
        if override.is_sweep_override():  # key=a,b: several runs, which a sweep makes
            raise ConfigError(
                f"override {text!r}: several values for one run; sweep them with "
                f"`workbench sweep {text}`, or write a list value as {key}=[...]"
            )
        if override.is_add() or override.is_force_add() or override.is_delete():
            continue  # the user asked for Hydra's explicit append/delete semantics
        if key in CHOSEN_GROUPS and override.value() is None:
            raise ConfigError(
                f"override {text!r}: the {key} group is chosen from "
                f"{CHOSEN_GROUPS[key]}; write ~{key} to compose without it"
            )
        if key in GROUPS:
            _check_group_option(key, override.value())
        else:
            _check_schema_key(key)


def _check_group_option(group: str, value: Any) -> None:
    options = group_options(group)
    values = value if isinstance(value, list) else [value]
    for option in values:
        if option is None or str(option) in options:
            continue
        close = difflib.get_close_matches(str(option), options, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(
            f"{group}={option}: unknown {group} option{hint}; choose one of {', '.join(options)}"
        )


def _check_schema_key(dotted: str) -> None:
    node: Any = WorkbenchConfig
    walked: list[str] = []
    for part in dotted.split("."):
        if not (isinstance(node, type) and is_dataclass(node)):
            return  # inside a free-form dict (env.kwargs, tracking.tags): anything goes
        names = _key_names(node, walked)
        if part not in names:
            where = ".".join(walked) or "the top level"
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {'.'.join([*walked, close[0]])}? " if close else ""
            raise ConfigError(
                f"{dotted}: unknown config key; {hint}valid keys of {where}: "
                f"{', '.join(sorted(names))}"
            )
        walked.append(part)
        node = schema_field(".".join(walked))


def _key_names(node: type, walked: list[str]) -> list[str]:
    """The keys under ``walked``: a dataclass's fields; under ``algo``, those of any algorithm
    (which algorithm a key belongs to is checked when the config is composed)."""
    if walked[:1] != ["algo"]:
        return [f.name for f in fields(node)]
    names: dict[str, None] = {}
    for algo in ALGORITHMS:
        declared = schema_field(".".join(walked), algo)
        if isinstance(declared, type) and is_dataclass(declared):
            names.update(dict.fromkeys(f.name for f in fields(declared)))
    return list(names)


def describe_hydra_error(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """One line from a Hydra composition error, from its most specific cause.

    Read from the exceptions' types and fields, never from Hydra's wording: an OmegaConf
    error names its key (``full_key``); a key missing from the composed config that an
    override sets (e.g. inside ``env.kwargs``) needs Hydra's ``+`` to be added.
    """
    cause: BaseException | None = exc
    while cause is not None:
        key = getattr(cause, "full_key", None)
        if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key and \
                key.startswith("algo."):
            return describe_foreign_algo_key(key, getattr(cause, "object_type", None))
        if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
            given = next((o for o in overrides if o.split("=", 1)[0] == key), None)
            if given is not None:
                return f"{key}: not in the composed config; to add it write +{given}"
        if isinstance(cause, OmegaConfBaseException) and key:
            return describe_omegaconf_error(cause)
        cause = cause.__cause__ or cause.__context__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines[:3]) if lines else type(exc).__name__


def describe_foreign_algo_key(key: str, schema: Any) -> str:
    """``algo.n_epochs`` given to ``algo=sac``: whose key it is and what SAC's keys are."""
    parts = key.split(".")
    parent = ".".join(parts[:-1])
    name = next((n for n in ALGORITHMS if schema_field(parent, n) is schema), None)
    if name is None:
        return f"{key}: not a key of the chosen algorithm; check algo= and the key's spelling"
    declared = schema_field(parent, name)
    valid = sorted(f.name for f in fields(declared)) if is_dataclass(declared) else []
    others = [n for n in ALGORITHMS if schema_field(key, n) is not None]
    whose = f" (a key of {', '.join(f'algo={o}' for o in others)})" if others else ""
    return (f"{key}: not an option of algo={name}{whose}; drop it or choose another algo; "
            f"{name}'s keys under {parent}: {', '.join(valid)}")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if "e" in text:  # Hydra's grammar has no leading zeros in exponents (1e-05 -> 1e-5)
            mantissa, exponent = text.split("e")
            text = f"{mantissa}e{int(exponent)}"
        return text
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    bare = text.replace("-", "").replace("/", "").replace(".", "").replace("_", "")
    if bare.isalnum() and text[0].isalpha() and text.lower() not in ("true", "false", "null"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
