"""Validation: merge into the schema, then the range and cross-field checks it cannot express.

Pure checks only: nothing here builds an environment or opens a store. The checks that need
the simulator (env ids, env kwargs, randomization, EnvPool support) are
:mod:`workbench.envs.checks`; the ones that need the tracking store (``resume=``) are
:mod:`workbench.training.start`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from workbench.config.errors import ConfigError
from workbench.config.schema import InitConfig, WorkbenchConfig, choices, schema_type


def validate(cfg: DictConfig | Mapping[str, Any] | WorkbenchConfig) -> WorkbenchConfig:
    """Merge ``cfg`` into the schema (types, unknown keys) and run the range and cross-field
    checks; the environment checks are :func:`workbench.envs.checks.check_config`."""
    if isinstance(cfg, WorkbenchConfig):
        typed = cfg
    else:
        schema = OmegaConf.structured(WorkbenchConfig)
        try:
            merged = OmegaConf.merge(schema, cfg)
            typed = OmegaConf.to_object(merged)  # type: ignore[assignment]
        except OmegaConfBaseException as exc:
            raise ConfigError(describe_omegaconf_error(exc)) from exc
    check_values(typed)
    return typed


def check_values(cfg: WorkbenchConfig) -> None:
    """Cross-field and range checks a schema cannot express; raises :class:`ConfigError`."""
    _check_min("env.num_envs", cfg.env.num_envs, 1)
    _check_min("algo.n_steps", cfg.algo.n_steps, 2)
    _check_min("algo.batch_size", cfg.algo.batch_size, 2)
    _check_min("algo.n_epochs", cfg.algo.n_epochs, 1)
    _check_min("total_timesteps", cfg.total_timesteps, 1)
    _check_min("eval.n_episodes", cfg.eval.n_episodes, 1)
    _check_min("eval.final_episodes", cfg.eval.final_episodes, 0)
    _check_min("eval.every_steps", cfg.eval.every_steps, 0)
    _check_min("torch_threads", cfg.torch_threads, 0)
    _check_min("checkpoint.every_steps", cfg.checkpoint.every_steps, 0)
    _check_min("checkpoint.keep_last", cfg.checkpoint.keep_last, 0)
    if cfg.algo.learning_rate <= 0:
        raise ConfigError(
            f"algo.learning_rate={cfg.algo.learning_rate}: must be > 0 "
            "(e.g. algo.learning_rate=3e-4)"
        )
    rollout = cfg.env.num_envs * cfg.algo.n_steps
    if cfg.algo.batch_size > rollout:
        raise ConfigError(
            f"algo.batch_size={cfg.algo.batch_size} is larger than one rollout "
            f"(env.num_envs * algo.n_steps = {cfg.env.num_envs} * {cfg.algo.n_steps} = {rollout}): "
            f"lower algo.batch_size to at most {rollout} or raise env.num_envs/algo.n_steps"
        )
    if cfg.total_timesteps < rollout:
        raise ConfigError(
            f"total_timesteps={cfg.total_timesteps} is smaller than one rollout "
            f"(env.num_envs * algo.n_steps = {rollout}): raise total_timesteps to at least "
            f"{rollout} or shrink the rollout"
        )
    check_init(cfg.init)


def check_init(init: InitConfig) -> None:
    """A Hub initialization names both the repository and a revision (never a moving default)."""
    if init.hub_repo_id and not init.hub_revision:
        raise ConfigError(
            f"init.hub_revision: missing for init.hub_repo_id={init.hub_repo_id}; pin it, e.g. "
            "init.hub_revision=<commit sha or tag> (workbench hub push prints the commit)"
        )
    if init.hub_revision and not init.hub_repo_id:
        raise ConfigError(
            f"init.hub_revision={init.hub_revision}: set without init.hub_repo_id; add "
            "init.hub_repo_id=<org/name> or drop the revision"
        )


def _check_min(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(f"{key}={value}: must be >= {minimum}")


def describe_omegaconf_error(exc: OmegaConfBaseException) -> str:
    """One line from an OmegaConf validation error: key, problem, expected type or choices.

    Built from the exception's fields (``full_key``, ``value``, ``msg``) and the schema, so
    it does not depend on how OmegaConf words its messages.
    """
    key = getattr(exc, "full_key", None) or "config"
    value = getattr(exc, "value", None)
    valid = choices(key)
    if valid is not None and value is not None:
        return f"{key}={value!r}: not a valid choice; choose one of {', '.join(valid)}"
    msg = getattr(exc, "msg", None) or str(exc)
    problem = msg.strip().splitlines()[0]
    shown = f"{key}={value}" if value is not None else key
    expected = schema_type(key)
    fix = f"; expected {expected}" if expected else ""
    return f"{shown}: {problem}{fix}"


def from_yaml(text: str) -> WorkbenchConfig:
    """A stored ``config.yaml`` (a run's, a checkpoint's, a bundle's) validated by the schema.

    OmegaConf parses YAML with a safe loader: no code runs, whoever wrote the file.
    """
    node = OmegaConf.create(text)
    if not isinstance(node, DictConfig):
        raise ConfigError("config.yaml does not hold a mapping of config keys")
    return validate(node)
