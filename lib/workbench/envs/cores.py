"""How many cores a run may use, and how the learner's threads share them with env workers."""

from __future__ import annotations

import contextlib
import os
from typing import Any


def physical_cores() -> int:
    """Physical cores available to this process (falls back to logical CPUs)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False)
    except Exception:  # psutil missing or unable to tell
        cores = None
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    candidates = [c for c in (cores, available, os.cpu_count()) if c]
    return max(1, min(candidates)) if candidates else 1


def cpu_budget() -> int:
    """Cores this run may use: ``WORKBENCH_CPU_BUDGET`` (set by the sweep runner) or all."""
    budget = os.environ.get("WORKBENCH_CPU_BUDGET")
    return max(1, int(budget)) if budget else physical_cores()


LEARNER_CORES_PER_THREAD = 4  # see auto_torch_threads


def auto_torch_threads(num_envs: int, vec_env: str, budget: int | None = None) -> int:
    """Learner threads so that sampling workers + learner never oversubscribe the cores.

    With ``subproc`` each env worker is a busy process during rollouts, so the learner gets
    what is left; with ``dummy`` and ``envpool`` sampling and learning alternate in one
    process (EnvPool's threads sleep while the learner runs). Of the cores left, the learner
    takes one thread per ``LEARNER_CORES_PER_THREAD``: PPO's small MLPs gain little from
    intra-op threads, and OpenMP threads wait for each other at every operation, so one busy
    core elsewhere stalls them all (measured: docs/benchmarks.md#envvec_envauto-and-torch-threads).
    """
    budget = budget or cpu_budget()
    if vec_env == "subproc":
        budget -= min(num_envs, budget - 1)
    return max(1, budget // LEARNER_CORES_PER_THREAD)


def stop_worker_servers() -> None:
    """Stop multiprocessing's forkserver and resource tracker, waiting for both to exit.

    ``SubprocVecEnv`` starts them lazily and they outlive the run until the interpreter
    exits; stopping them explicitly (and reaping them) means a finished or failed command
    leaves no process behind, even where PID 1 does not reap orphans (containers).
    These are CPython's own shutdown hooks (``_stop``), used by its test suite.
    """
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker

    servers: list[Any] = [forkserver._forkserver, resource_tracker._resource_tracker]
    for server in servers:
        with contextlib.suppress(Exception):  # already stopped, or never started
            server._stop()
