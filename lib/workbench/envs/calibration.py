"""``env.vec_env=auto``: pick dummy / subproc / envpool from a short, cached measurement.

Which vectorization is fastest depends on the task's step cost, the number of envs and the
cores, so ``auto`` measures instead of guessing: it steps each candidate backend with random
actions for a fraction of a second (``SAMPLE_SECONDS``) and keeps the fastest, unless it beats
the simplest one (``dummy``: one process, easiest to debug) by less than ``MARGIN``. The result
is cached per machine, task, ``num_envs``, core budget and library versions
(``~/.cache/workbench/vec_env.json``; ``WORKBENCH_CALIBRATION_CACHE`` moves it), so only the
first run of a setting pays the ~1 s. A calibration measured while the machine was already
busy (1-minute load average at least 1 + half the core budget: more than this run and its
predecessor) is used but not cached: other processes slow the threaded backends more than
``dummy``, and the next run on an idle machine should not inherit that choice. The choice is
logged as ``derived.vec_env`` with the measured rates in ``derived.vec_env_rates``.

Candidates, as measured by ``benchmarks/physics.py`` on 2 shared cores (docs/benchmarks.md):

- ``dummy``: envs stepped one by one in the learner's process; Python overhead per step
  dominates (HalfCheetah ~0.2 of the physics limit).
- ``envpool`` (optional extra ``fast``): C++ threads, no Python per env step; about twice
  ``dummy``'s rate on 2 cores and more with more cores. Considered when installed and the task
  is one of its MuJoCo tasks.
- ``subproc``: one process per env, pipes in between. It only pays when there are cores to
  spare beyond the learner's and each step is expensive, so it is measured only with at least
  ``SUBPROC_MIN_CORES`` cores (on 2 cores it trained slower than ``dummy``: docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from workbench.envs import envpool_vec
from workbench.envs.backends import build_backend
from workbench.envs.cores import cpu_budget
from workbench.envs.spec import EnvSpec

SAMPLE_SECONDS = 0.3  # stepping time per measured backend (after a short warm-up)
MARGIN = 1.15  # a backend other than dummy must be this much faster to be chosen
SUBPROC_MIN_CORES = 3  # below this, the learner and the workers fight over the cores
CACHE_VERSION = 2  # 2: entries from before the busy-machine rule may have been measured under load
BUSY_FRACTION = 0.5  # load average / core budget from which a calibration is not cached


@dataclass(frozen=True)
class VecEnvChoice:
    """The vectorization a run uses and why."""

    name: str  # dummy | subproc | envpool
    reason: str  # one line, for the header and the params
    rates: dict[str, float] = field(default_factory=dict)  # measured env-steps/s per backend
    cached: bool = False  # the rates came from the cache

    def params(self) -> dict[str, Any]:
        """MLflow params: ``derived.vec_env`` and, after a calibration, the measured rates."""
        params: dict[str, Any] = {"derived.vec_env": self.name}
        if self.rates:
            params["derived.vec_env_rates"] = ", ".join(
                f"{name} {rate:.0f}/s" for name, rate in sorted(self.rates.items())
            )
        return params


def choose_vec_env(spec: EnvSpec, budget: int | None = None) -> VecEnvChoice:
    """Resolve ``spec.vec_env``: explicit choices pass through, ``auto`` is calibrated."""
    if spec.vec_env != "auto":
        return VecEnvChoice(spec.vec_env, "set in the config")
    budget = budget or cpu_budget()
    names = candidates(spec, budget)
    if names == ["dummy"]:
        return VecEnvChoice("dummy", "auto: dummy is the only candidate here (no measurement)")
    key = cache_key(spec, budget)
    cache = load_cache()
    rates = cache.get(key)
    cached = rates is not None
    source = "cached calibration"
    if rates is None:
        load = busy_load(budget)
        rates = calibrate(spec, names)
        if not rates:  # the env failed to step: training will report it inside its run
            return VecEnvChoice("dummy", "auto: calibration failed, dummy chosen")
        source = "calibration"
        if load is None:
            cache[key] = rates
            save_cache(cache)
        else:
            source = f"calibration (not cached: load average {load:.1f} on {budget} cores)"
    name = decide(rates)
    shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(rates.items()))
    return VecEnvChoice(name, f"auto: {source} env-steps/s {shown}", dict(rates), cached)


def busy_load(budget: int) -> float | None:
    """The 1-minute load average when other work already occupies the cores, else None."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not available on this platform: assume idle
        return None
    return load if load >= 1.0 + BUSY_FRACTION * budget else None


def resolve_spec(spec: EnvSpec, budget: int | None = None) -> EnvSpec:
    """``spec`` with ``vec_env=auto`` replaced by the calibrated choice."""
    return replace(spec, vec_env=choose_vec_env(spec, budget).name)


def decide(rates: dict[str, float]) -> str:
    """The fastest backend, unless it beats ``dummy`` by less than ``MARGIN``."""
    best = max(rates, key=lambda name: rates[name])
    if best != "dummy" and rates[best] < MARGIN * rates.get("dummy", 0.0):
        return "dummy"
    return best


def candidates(spec: EnvSpec, budget: int) -> list[str]:
    """Backends worth measuring for this task, env count and core budget."""
    names = ["dummy"]
    if envpool_vec.unsupported_reason(spec.env_id, spec.kwargs, spec.randomization) is None:
        names.append("envpool")
    if budget >= SUBPROC_MIN_CORES and spec.num_envs >= 2:
        names.append("subproc")
    return names


def calibrate(spec: EnvSpec, names: list[str]) -> dict[str, float]:
    """Random-action stepping rate (env-steps/s) of each named backend.

    A backend that fails to build or step is left out: ``auto`` must never be the reason a
    run does not start (a broken env then fails inside its run, recorded as FAILED).
    """
    rates: dict[str, float] = {}
    for name in names:
        try:
            venv = build_backend(replace(spec, vec_env=name))
        except Exception:
            continue
        try:
            rates[name] = stepping_rate(venv, SAMPLE_SECONDS)
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):  # a crashed worker's pipe
                venv.close()
    return rates


def stepping_rate(venv: Any, seconds: float, warmup_steps: int = 5) -> float:
    """Env-steps per second of ``venv`` under uniformly random actions."""
    space = venv.action_space
    rng = np.random.default_rng(0)
    shape = (venv.num_envs, *space.shape)
    venv.reset()
    for _ in range(warmup_steps):
        venv.step(rng.uniform(space.low, space.high, shape).astype(space.dtype))
    steps = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        venv.step(rng.uniform(space.low, space.high, shape).astype(space.dtype))
        steps += 1
        elapsed = time.perf_counter() - started
    return steps * venv.num_envs / elapsed


# --------------------------------------------------------------------------- cache


def cache_path() -> Path:
    """Where calibrations are kept: ``WORKBENCH_CALIBRATION_CACHE`` or the user cache dir."""
    explicit = os.environ.get("WORKBENCH_CALIBRATION_CACHE")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "workbench" / "vec_env.json"


def cache_key(spec: EnvSpec, budget: int) -> str:
    """Everything the rates depend on: machine, task, env count, cores, library versions."""
    versions = ",".join(f"{p}={_version(p)}" for p in ("gymnasium", "mujoco", "envpool"))
    kwargs = json.dumps(spec.kwargs or {}, sort_keys=True, default=str)
    return (
        f"v{CACHE_VERSION}|{platform.node()}|{platform.processor() or platform.machine()}|"
        f"{spec.env_id}|n={spec.num_envs}|max_steps={spec.max_episode_steps}|kwargs={kwargs}|"
        f"cores={budget}|rand={spec.randomization!r}|{versions}"
    )


def load_cache() -> dict[str, dict[str, float]]:
    """The cached calibrations; an unreadable cache counts as empty (it is only a cache)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_cache(cache: dict[str, dict[str, float]]) -> None:
    """Write atomically (concurrent sweep points may calibrate at once); failures are ignored."""
    path = cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, path)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"
