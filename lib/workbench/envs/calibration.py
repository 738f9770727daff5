"""``env.vec_env=auto``: the backend chosen by a documented rule, and ``workbench calibrate``.

The same command on the same machine must give the same numbers whatever the machine's load,
and the backend changes the numbers (EnvPool's reset noise differs from gymnasium's), so
``auto`` is decided by a rule, never by a timing:

- ``envpool`` when it is installed, runs the task as configured (one of its gymnasium
  MuJoCo tasks, kwargs it knows, no ``env.randomization``) and the run has at least
  :data:`ENVPOOL_MIN_ENVS` envs: its C++ threads step without Python per env step, faster
  than ``dummy`` and more so with more cores (docs/benchmarks.md#physics-limit-and-sampling).
  Each batched step pays a fixed ~100-150 us hand-off to its threads, so with fewer envs
  ``dummy`` steps faster (measured per task and env count:
  docs/benchmarks.md#envvec_envauto-below-8-envs);
- ``batched`` otherwise, for gymnasium MuJoCo tasks (the duck, any task under
  ``env.randomization``) with at least :data:`BATCHED_MIN_ENVS` envs and two threads to step
  them on (:mod:`workbench.envs.batched`). Its numbers are bit-identical to ``dummy``'s, so
  this choice changes only the speed;
- ``dummy`` otherwise: one process, the easiest to debug. ``subproc`` (one process per env,
  pipes in between) is never chosen by ``auto``: it pays only for expensive steps on spare
  cores, which a user pins with ``env.vec_env=subproc`` after measuring.

The choice is logged as the param ``derived.vec_env``, with the reason in the run's header.
``workbench calibrate`` measures on purpose: it steps each candidate backend with random
actions for a fraction of a second and prints the table, so a user can pin a faster backend
(:func:`calibrate`; rates are timings, so they are printed, never logged as params).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from workbench import console
from workbench.config import ConfigError, load_config
from workbench.envs import batched, envpool_vec
from workbench.envs.backends import build_backend
from workbench.envs.cores import cpu_budget
from workbench.envs.spec import EnvSpec

SAMPLE_SECONDS = 0.3  # stepping time per measured backend (after a short warm-up)
ENVPOOL_MIN_ENVS = 8  # fewer envs: dummy steps faster (EnvPool's per-step thread hand-off)
# fewer envs: dummy steps as fast (the threads' per-step hand-off, as EnvPool's; the
# copies' Python stays on one thread): docs/benchmarks.md#batched-physics-with-randomization
BATCHED_MIN_ENVS = 8


@dataclass(frozen=True)
class VecEnvChoice:
    """The vectorization a run uses and why."""

    name: str  # dummy | subproc | envpool | batched
    reason: str  # one line, for the header

    def params(self) -> dict[str, Any]:
        """MLflow params: ``derived.vec_env`` (a decision, the same for the same command)."""
        return {"derived.vec_env": self.name}


def choose_vec_env(spec: EnvSpec) -> VecEnvChoice:
    """Resolve ``spec.vec_env``: explicit choices pass through, ``auto`` follows the rule."""
    if spec.vec_env != "auto":
        return VecEnvChoice(spec.vec_env, "set in the config")
    why_not = envpool_vec.unsupported_reason(spec.env_id, spec.kwargs, spec.randomization)
    if why_not is None and spec.num_envs < ENVPOOL_MIN_ENVS:
        why_not = (f"{spec.num_envs} envs: below {ENVPOOL_MIN_ENVS}, EnvPool's per-step "
                   "thread hand-off costs more than it saves")
    if why_not is None:
        return VecEnvChoice("envpool", f"auto: EnvPool runs {spec.env_id}")
    no_batch = batched_reason(spec)
    if no_batch is None:
        return VecEnvChoice("batched", f"auto: batched, {spec.threads(cpu_budget())} physics "
                            f"threads; not EnvPool: {why_not}")
    return VecEnvChoice("dummy", f"auto: dummy ({why_not}; {no_batch})")


def batched_reason(spec: EnvSpec) -> str | None:
    """Why ``auto`` does not choose ``batched`` for ``spec``, or None when it does."""
    why_not = batched.unsupported_reason(spec.env_id)
    if why_not is None and spec.num_envs < BATCHED_MIN_ENVS:
        why_not = f"batched needs {BATCHED_MIN_ENVS} envs or more"
    if why_not is None and spec.threads(cpu_budget()) < 2:
        why_not = "batched needs 2 threads or more"
    return why_not


def resolve_spec(spec: EnvSpec) -> EnvSpec:
    """``spec`` with ``vec_env=auto`` replaced by the rule's choice."""
    return replace(spec, vec_env=choose_vec_env(spec).name)


def candidates(spec: EnvSpec) -> list[str]:
    """Backends worth measuring for this task and env count."""
    names = ["dummy"]
    if envpool_vec.unsupported_reason(spec.env_id, spec.kwargs, spec.randomization) is None:
        names.append("envpool")
    if spec.num_envs >= 2:
        names.append("subproc")
        if batched.unsupported_reason(spec.env_id) is None:
            names.append("batched")
    return names


def calibrate(spec: EnvSpec, names: list[str], seconds: float = SAMPLE_SECONDS
              ) -> dict[str, float]:
    """Random-action stepping rate (env-steps/s) of each named backend.

    A backend that fails to build or step is left out (its error surfaces when a run uses it).
    """
    rates: dict[str, float] = {}
    for name in names:
        try:
            venv = build_backend(replace(spec, vec_env=name))
        except Exception:
            continue
        try:
            rates[name] = stepping_rate(venv, seconds)
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):  # a crashed worker's pipe
                venv.close()
    return rates


def stepping_rate(venv: Any, seconds: float, warmup_steps: int = 5) -> float:
    """Env-steps per second of ``venv`` under uniformly random actions."""
    rng = np.random.default_rng(0)
    venv.reset()
    for _ in range(warmup_steps):
        venv.step(random_actions(venv, rng))
    steps = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        venv.step(random_actions(venv, rng))
        steps += 1
        elapsed = time.perf_counter() - started
    return steps * venv.num_envs / elapsed


def random_actions(venv: Any, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random action per env copy (Box or Discrete action spaces)."""
    space = venv.action_space
    if hasattr(space, "n"):
        return rng.integers(0, int(space.n), size=venv.num_envs)
    shape = (venv.num_envs, *space.shape)
    return rng.uniform(space.low, space.high, shape).astype(space.dtype)


# --------------------------------------------------------------------------- workbench calibrate


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench calibrate [--seconds S] [OVERRIDES]``."""
    parser.add_argument("--seconds", type=float, default=1.0, metavar="S",
                        help="stepping time per backend (default 1.0)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides choosing the task, e.g. env=hopper env.num_envs=8")


def run_command(args: argparse.Namespace) -> int:
    """Measure every candidate backend for the configured task and print the table."""
    if not args.seconds > 0:
        raise ConfigError(f"--seconds {args.seconds:g}: must be > 0 (e.g. --seconds 1)")
    spec = EnvSpec.from_config(load_config(args.overrides))
    rates = calibrate(spec, candidates(spec), args.seconds)
    auto = choose_vec_env(replace(spec, vec_env="auto"))
    base = rates.get("dummy")
    rows = [(name, f"{rate:,.0f} env-steps/s" + (f"  ({rate / base:.2f} x dummy)" if base else ""))
            for name, rate in sorted(rates.items(), key=lambda item: -item[1])]
    rows += [("auto", auto.reason),
             ("cores", f"{cpu_budget()} (WORKBENCH_CPU_BUDGET or the physical cores)")]
    console.print_table(rows, title=f"Backends for {spec.env_id} x {spec.num_envs} envs "
                        f"({args.seconds:g} s each, random actions)")
    fastest = max(rates, key=lambda name: rates[name]) if rates else None
    if fastest and fastest != auto.name:
        print(f"{fastest} stepped fastest here; pin it with env.vec_env={fastest} (timings vary "
              "with the machine's load: auto never depends on them)")
    return 0
