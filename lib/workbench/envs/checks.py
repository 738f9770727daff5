"""Checks of the environment settings that need the simulator's registry (exit code 2).

Run before any environment is built or any run exists: the env id is registered (with "did
you mean" suggestions), the env class accepts ``env.kwargs``, randomization applies to the
task, and EnvPool supports the settings when it was chosen.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium

from workbench.config import ConfigError, WorkbenchConfig
from workbench.envs import (
    randomization,
    robots,  # noqa: F401  (registers the workbench's own ids)
)
from workbench.envs.envpool_vec import check_support


def check_config(cfg: WorkbenchConfig) -> None:
    """Every environment check of a validated config; raises :class:`ConfigError`."""
    check_env_id(cfg.env.id)
    check_env_kwargs(cfg.env.id, cfg.env.kwargs)
    randomization.check_settings("env.randomization", cfg.env.randomization, cfg.env.id)
    randomization.check_settings("eval.randomization", cfg.eval.randomization, cfg.env.id)
    if cfg.env.vec_env == "envpool":
        check_support(cfg.env.id, cfg.env.kwargs, cfg.env.randomization)


def check_env_id(env_id: str) -> None:
    """Fail early, with suggestions, on an id gymnasium does not know (no env is created)."""
    registry = gymnasium.envs.registry
    if ":" in env_id:  # gymnasium's "module:id" form imports the module that registers the id
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import module {module!r} ({exc})") from exc
    if env_id in registry:
        return
    close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.envs.registry"
    raise ConfigError(f"env.id={env_id!r}: not a registered gymnasium id ({hint})")


def check_env_kwargs(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """Let an env class validate ``env.kwargs`` before anything runs.

    An environment class may define ``check_kwargs(kwargs)`` (raising ``ValueError``); the
    workbench's robots do, so a misspelt reward weight fails here with exit code 2.
    """
    # "module:id" (gymnasium's form, see check_env_id): the registry knows the bare id.
    entry_point: Any = gymnasium.envs.registry[env_id.rpartition(":")[2]].entry_point
    if isinstance(entry_point, str):
        entry_point = gymnasium.envs.registration.load_env_creator(entry_point)
    check = getattr(entry_point, "check_kwargs", None)
    if check is None:
        return
    try:
        check(dict(kwargs))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env.kwargs for {env_id}: {exc}") from exc
