"""Where trials run: kernels on this machine, or Ray tasks, one trial submitted at a time.

A study samples each trial when a worker is free (so the sampler sees the results so far),
so trials are submitted one by one rather than as a list. Both backends run the sweep's own
:func:`workbench.sweeps.point.execute_point` (papermill, one kernel per trial, failure
isolation, timeouts, a truthful run record); at most ``tune.workers`` trials run at once,
never more than there are cores, each kernel with its share of them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from workbench.envs.cores import cpu_budget
from workbench.sweeps.point import (
    PointKernel,
    PointOutcome,
    PointSpec,
    execute_point,
    point_environment,
)
from workbench.sweeps.ray_cluster import (
    MAX_RETRIES,
    RayExecutor,
    Submitted,
    execute_point_remote,
)


class TrialBackend(Protocol):
    """Runs trials concurrently; the study loop submits and waits."""

    workers: int
    cpus_per_trial: int

    def describe(self) -> str: ...

    def submit(self, spec: PointSpec, output: Path) -> Any: ...

    def wait(self, handles: Sequence[Any]) -> list[Any]:
        """Some finished handles (maybe none: call again); :class:`ClusterLost` when the
        machines running them are gone."""

    def result(self, handle: Any) -> PointOutcome: ...

    def interrupt(self) -> None: ...

    def abandon(self, handles: Sequence[Any], error: str) -> dict[Any, PointOutcome]:
        """After :class:`ClusterLost`: stop what is in flight and close its runs with
        ``error``; the outcomes that could be had, by handle."""

    def close(self) -> None: ...


class LocalTrials:
    """Trials on this machine: a thread per running trial, each driving its own kernel."""

    def __init__(self, workers: int) -> None:
        self.cores = cpu_budget()
        self.requested = workers
        self.workers = min(workers, self.cores)  # more trials than cores would oversubscribe
        self.cpus_per_trial = max(1, self.cores // self.workers)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.workers, "tune-trial")
        self.kernels: dict[Any, PointKernel] = {}

    def describe(self) -> str:
        capped = (f" (tune.workers={self.requested} capped at the {self.cores} cores)"
                  if self.requested > self.workers else "")
        return (f"local: {self.workers} trials at a time x {self.cpus_per_trial} CPU each, "
                f"{self.cores} cores{capped}")

    def submit(self, spec: PointSpec, output: Path) -> Any:
        kernel = PointKernel(point_environment(spec), output.with_suffix(".log"))
        future = self.pool.submit(execute_point, spec, output, kernel)
        self.kernels[future] = kernel
        return future

    def wait(self, handles: Sequence[Any]) -> list[Any]:
        done, _ = concurrent.futures.wait(handles, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)

    def result(self, handle: Any) -> PointOutcome:
        self.kernels.pop(handle, None)
        outcome: PointOutcome = handle.result(timeout=120)
        return outcome

    def interrupt(self) -> None:
        """Ctrl-C: stop every running kernel (``train`` marks its run KILLED)."""
        for kernel in list(self.kernels.values()):
            kernel.stop("interrupt", grace_s=5.0)

    def abandon(self, handles: Sequence[Any], error: str) -> dict[Any, PointOutcome]:
        """Stop the kernels (this machine's trials have no cluster to lose)."""
        self.interrupt()
        outcomes: dict[Any, PointOutcome] = {}
        for handle in handles:
            with contextlib.suppress(Exception):
                outcomes[handle] = self.result(handle)
        return outcomes

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayTrials:
    """Trials as Ray tasks on an existing cluster (``tune.ray.address``), through the
    sweep's Ray executor: the connection, spreading over the nodes, each trial's run tagged
    with its node, retries without duplicate runs, and executed notebooks carried back to
    this machine."""

    def __init__(self, workers: int, address: str | None, gpus_per_trial: float = 0.0) -> None:
        # Connects; an unreachable head, or one on which no trial fits: exit 2.
        self.ray = RayExecutor(workers, address, gpus_per_trial)
        self.workers = self.ray.workers
        self.cpus_per_trial = self.ray.cpus_per_point
        self.inflight: dict[Any, tuple[Submitted, Path]] = {}
        self.watch = self.ray.head_watch()

    def describe(self) -> str:
        return self.ray.describe().replace("points", "trials")

    def submit(self, spec: PointSpec, output: Path) -> Any:
        import ray

        task = ray.remote(execute_point_remote).options(
            num_cpus=self.cpus_per_trial, num_gpus=self.ray.gpus_per_point,
            max_retries=MAX_RETRIES, retry_exceptions=False, scheduling_strategy="SPREAD",
            name=f"workbench-tune:{spec.sweep_id}:{spec.point}")
        submitted = Submitted(spec, time.time())
        ref = task.remote(spec)
        self.inflight[ref] = (submitted, output.parent)
        return ref

    def wait(self, handles: Sequence[Any]) -> list[Any]:
        """What finished within a poll; the head is probed meanwhile (:class:`ClusterLost`)."""
        return self.ray.wait_ready(handles, self.watch)

    def result(self, handle: Any) -> PointOutcome:
        submitted, out_dir = self.inflight.pop(handle)
        return RayExecutor.collect(handle, submitted, out_dir)

    def interrupt(self) -> None:
        import ray

        for ref in self.inflight:
            with contextlib.suppress(Exception):
                ray.cancel(ref)  # KeyboardInterrupt in the task: it stops its kernel

    def abandon(self, handles: Sequence[Any], error: str) -> dict[Any, PointOutcome]:
        """The head is lost: the sweep's own give-up (cancel, collect what comes back soon,
        close the rest KILLED through the tracking store, disconnect)."""
        inflight = {handle: self.inflight.pop(handle) for handle in handles
                    if handle in self.inflight}
        if not inflight:
            return {}
        out_dir = next(iter(inflight.values()))[1]
        found: dict[str, PointOutcome] = {}
        self.ray.give_up({handle: submitted for handle, (submitted, _) in inflight.items()},
                         out_dir, lambda outcome: found.__setitem__(outcome.point, outcome),
                         error)
        return {handle: found[submitted.spec.point] for handle, (submitted, _) in inflight.items()
                if submitted.spec.point in found}

    def close(self) -> None:
        self.ray.close()


def make_backend(executor: str, workers: int, ray_address: str | None,
                 gpus_per_trial: float = 0.0) -> TrialBackend:
    """The backend ``tune.executor`` names (Ray connects here, before anything is written)."""
    if executor == "ray":
        return RayTrials(workers, ray_address, gpus_per_trial)
    return LocalTrials(workers)
