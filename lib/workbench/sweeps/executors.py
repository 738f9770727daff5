"""Executors run the points concurrently: threads on this machine, or tasks on a Ray cluster.

At most ``sweep.workers`` points run at once (never more than there are cores); each point's
kernel gets ``WORKBENCH_CPU_BUDGET`` = its share of the cores, which ``train`` turns into torch
threads, so points never oversubscribe a machine. ``sweep.executor=ray`` runs the same
:func:`workbench.sweeps.point.execute_point` as Ray tasks on an existing cluster
(:mod:`workbench.sweeps.ray_cluster`); a retried task first looks for its point's FINISHED
run (no duplicates).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Protocol

from workbench.envs.cores import cpu_budget
from workbench.sweeps.plan import SweepPlan
from workbench.sweeps.point import (
    PointKernel,
    PointOutcome,
    PointSpec,
    Report,
    execute_point,
    point_environment,
)
from workbench.sweeps.ray_cluster import RayExecutor


class Executor(Protocol):
    """Runs points concurrently and reports each outcome as it arrives."""

    workers: int
    cpus_per_point: int

    def describe(self) -> str: ...

    def run(self, specs: Sequence[PointSpec], out_dir: Path, report: Report) -> None: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Points on this machine: a thread per running point, each driving its own kernel."""

    def __init__(self, workers: int) -> None:
        self.cores = cpu_budget()
        self.requested = workers
        self.workers = min(workers, self.cores)  # more points than cores would oversubscribe
        self.cpus_per_point = max(1, self.cores // self.workers)

    def describe(self) -> str:
        capped = (f" (sweep.workers={self.requested} capped at the {self.cores} cores)"
                  if self.requested > self.workers else "")
        return (f"local: {self.workers} points at a time x {self.cpus_per_point} CPU each, "
                f"{self.cores} cores{capped}")

    def run(self, specs: Sequence[PointSpec], out_dir: Path, report: Report) -> None:
        kernels = {s.point: PointKernel(point_environment(s), out_dir / f"{s.point}.log")
                   for s in specs}
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sweep-point")
        futures = [pool.submit(execute_point, s, out_dir / f"{s.point}.ipynb", kernels[s.point])
                   for s in specs]
        reported: set[Future[PointOutcome]] = set()
        try:
            for future in as_completed(futures):
                reported.add(future)
                report(future.result())
        except KeyboardInterrupt:
            for kernel in kernels.values():
                kernel.stop("interrupt", grace_s=5.0)
            for future in futures:  # the points in flight, each reported once
                if future not in reported and not future.cancel():
                    with contextlib.suppress(Exception):
                        report(future.result(timeout=60))
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Nothing to release."""


def make_executor(plan: SweepPlan) -> Executor:
    """The executor the plan asks for (Ray connects here, before anything is written)."""
    if plan.executor == "ray":
        return RayExecutor(plan.workers, plan.ray_address, plan.ray_gpus_per_point)
    return LocalExecutor(plan.workers)
