"""Checks of the environment settings that need the simulator's registry (exit code 2).

Run before any environment is built or any run exists: the env id is registered (with "did
you mean" suggestions), the env class accepts ``env.kwargs``, randomization applies to the
task, EnvPool or the batched backend supports the settings when chosen, the thread count
fits the machine's cores and the copies its memory. An env id from data (a pulled bundle)
is resolved against the registry without importing anything (:func:`check_data_env_id`).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import psutil

from workbench.config import ConfigError, EnvConfig, WorkbenchConfig
from workbench.envs import (
    batched,
    randomization,
    robots,  # registers the workbench's own ids
)
from workbench.envs.cores import physical_cores
from workbench.envs.envpool_vec import check_support

# A copy of gymnasium's and the workbench's MuJoCo tasks needs 1.2-1.7 MiB (its model, two
# MjData, the env's Python objects): while num_envs * this fits, no copy is built to measure
# (a robot with meshes of tens of MiB is measured only from there).
MAX_COPY_BYTES = 64 * 2**20
# A copy's Python objects (env, wrappers) and the pages of MuJoCo's arena a step touches: one
# copy's resident memory was 1.25-1.64 MiB with its model (the duck, HalfCheetah, Ant, Humanoid).
COPY_OVERHEAD_BYTES = 2**20


def check_config(cfg: WorkbenchConfig) -> None:
    """Every environment check of a validated config; raises :class:`ConfigError`."""
    check_env_id(cfg.env.id)
    check_env_kwargs(cfg.env.id, cfg.env.kwargs)
    randomization.check_settings("env.randomization", cfg.env.randomization, cfg.env.id)
    randomization.check_settings("eval.randomization", cfg.eval.randomization, cfg.env.id)
    if cfg.env.vec_env == "envpool":
        check_support(cfg.env.id, cfg.env.kwargs, cfg.env.randomization)
    if cfg.env.vec_env == "batched":
        batched.check_support(cfg.env.id)
    check_threads(cfg.env)
    check_copies_fit(cfg.env)


def check_threads(env: EnvConfig) -> None:
    """``env.num_threads``: only for backends with threads, at most one per core."""
    if env.num_threads is None:
        return
    if env.vec_env in ("dummy", "subproc"):
        raise ConfigError(f"env.num_threads={env.num_threads}: env.vec_env={env.vec_env} steps "
                          "no threads; drop env.num_threads or use env.vec_env=batched")
    cores = physical_cores()
    if env.num_threads > cores:
        raise ConfigError(f"env.num_threads={env.num_threads}: more threads than this machine's "
                          f"{cores} cores; use env.num_threads={cores} or drop it (one per core)")


def check_copies_fit(env: EnvConfig) -> None:
    """``env.num_envs`` copies of a MuJoCo task fit in the memory available now (each copy's
    model, two MjData and :data:`COPY_OVERHEAD_BYTES`, measured on one copy: a lower bound)."""
    available = psutil.virtual_memory().available
    if env.num_envs * MAX_COPY_BYTES <= available or not randomization.is_mujoco_task(env.id):
        return
    one = gymnasium.make(robots.importable_id(env.id), **env.kwargs)
    try:
        model, data = one.unwrapped.model, one.unwrapped.data  # type: ignore[attr-defined]
        per_copy = model.nbuffer + 2 * data.nbuffer + COPY_OVERHEAD_BYTES
    finally:
        one.close()
    if env.num_envs * per_copy > available:
        raise ConfigError(
            f"env.num_envs={env.num_envs}: that many copies of {env.id} need at least "
            f"{env.num_envs * per_copy / 2**30:.1f} GiB ({per_copy / 2**20:.1f} MiB each) and "
            f"this machine has {available / 2**30:.1f} GiB available; lower env.num_envs to at "
            f"most {available // per_copy}")


def check_env_id(env_id: str) -> None:
    """Fail early, with suggestions, on an id gymnasium does not know (no env is created).

    The id comes from the user's own config, so a ``module:Id`` imports its module, as
    gymnasium itself would (that module registers the id). Ids read from data (a pulled
    bundle's config) go through :func:`check_data_env_id` instead, which imports nothing.
    """
    module, bare = split_env_id(env_id)
    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import module {module!r} ({exc})") from exc
    check_registered(bare)


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """``("module", "Id")`` for gymnasium's ``module:Id`` form, ``(None, env_id)`` otherwise."""
    if ":" not in env_id:
        return None, env_id
    module, _, bare = env_id.partition(":")
    return module, bare


def check_registered(env_id: str) -> None:
    """``env_id`` (a bare id) is in gymnasium's registry; looking it up imports nothing."""
    registry = gymnasium.envs.registry
    if env_id in registry:
        return
    close = difflib.get_close_matches(env_id, list(registry), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.envs.registry"
    raise ConfigError(f"env.id={env_id!r}: not a registered gymnasium id ({hint})")


def module_allowed(module: str, allowed: Sequence[str]) -> bool:
    """``module`` is one of ``allowed`` or inside one of those packages (``pkg`` allows
    ``pkg.robots``); a name that is not a dotted Python identifier is never allowed."""
    if not all(part.isidentifier() for part in module.split(".")):
        return False
    return any(module == name or module.startswith(name + ".") for name in allowed)


def check_data_env_id(env_id: str, allowed_modules: Sequence[str], trust_hint: str) -> None:
    """An env id read from data (a pulled bundle's config), resolved without running its code.

    A bare id must already be in gymnasium's registry (the workbench's and gymnasium's own
    ids, and those of modules this process imported). ``module:Id`` would make gymnasium
    import ``module`` (any importable code, even a file the data shipped next to itself), so
    it is refused unless the user allowed that module (``trust_hint`` says how); an allowed
    module is imported here, as the user's own ``env.id`` would be.
    """
    if env_id.count(":") > 1 or not env_id.strip():
        raise ConfigError(f"env.id={env_id!r}: not a gymnasium id (write Id or module:Id)")
    module, bare = split_env_id(env_id)
    if module is not None:
        if not module_allowed(module, allowed_modules):
            raise ConfigError(
                f"env.id={env_id!r} would import module {module!r}, and code from data is "
                f"never run unless you allow it ({trust_hint.format(module=module)})"
            )
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"env.id: cannot import module {module!r} ({exc})") from exc
    check_registered(bare)


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
