"""Executors run the points concurrently: threads on this machine, or tasks on a Ray cluster.

At most ``sweep.workers`` points run at once (never more than there are cores); each point's
kernel gets ``WORKBENCH_CPU_BUDGET`` = its share of the cores, which ``train`` turns into torch
threads, so points never oversubscribe a machine. ``sweep.executor=ray`` runs the same
:func:`workbench.sweeps.point.execute_point` as Ray tasks on an existing cluster; a retried
task first looks for its point's FINISHED run (no duplicates).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol

from mlflow.tracking import MlflowClient

from workbench.config import ConfigError
from workbench.envs.cores import cpu_budget
from workbench.sweeps.plan import SweepPlan
from workbench.sweeps.point import (
    FAILED,
    KILLED,
    PointKernel,
    PointOutcome,
    PointSpec,
    execute_point,
    execute_point_remote,
    first_line,
    point_environment,
    settle_runs,
)

Report = Callable[[PointOutcome], None]


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
        try:
            for future in as_completed(futures):
                report(future.result())
        except KeyboardInterrupt:
            for kernel in kernels.values():
                kernel.stop("interrupt", grace_s=5.0)
            for future in futures:
                if not future.cancel():
                    with contextlib.suppress(Exception):
                        report(future.result(timeout=60))
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Nothing to release."""


class RayExecutor:
    """Points as Ray tasks on an existing cluster (``sweep.ray.address``).

    Each task requests ``cpus_per_point`` CPUs from Ray's scheduler and runs the same
    ``execute_point`` on whichever node Ray picks; at most ``workers`` tasks are in flight.
    Every node needs the workbench installed (same image/venv) and must reach the tracking
    store: use a tracking server URI (``tracking.uri=http://...``) across machines.
    """

    def __init__(self, workers: int, address: str | None) -> None:
        import ray

        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        check_reachable(self.address)
        try:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"sweep.ray.address={self.address}: cannot connect to a Ray cluster "
                f"({first_line(str(exc))}); start one with `ray start --head` or set "
                "sweep.ray.address=HOST:PORT"
            ) from exc
        self.cluster_cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers
        self.cpus_per_point = max(1, self.cluster_cpus // workers)

    def describe(self) -> str:
        return (f"ray at {self.address}: up to {self.workers} points at a time x "
                f"{self.cpus_per_point} CPU each, cluster CPUs {self.cluster_cpus}")

    def run(self, specs: Sequence[PointSpec], out_dir: Path, report: Report) -> None:
        import ray

        # max_retries: a task whose worker died runs again; execute_point then skips a point
        # that already FINISHED and closes the dead attempt's run (no duplicate runs).
        task = ray.remote(execute_point_remote)
        options = {"num_cpus": self.cpus_per_point, "max_retries": 2, "retry_exceptions": False}
        pending = list(specs)
        inflight: dict[Any, PointSpec] = {}
        try:
            while pending or inflight:
                while pending and len(inflight) < self.workers:
                    spec = pending.pop(0)
                    named = task.options(**options, name=f"workbench-sweep:{spec.point}")
                    inflight[named.remote(spec)] = spec
                ready, _ = ray.wait(list(inflight), num_returns=1)
                for ref in ready:
                    report(self.collect(ref, inflight.pop(ref), out_dir))
        except KeyboardInterrupt:
            for ref in inflight:
                ray.cancel(ref)  # KeyboardInterrupt in the task: it stops its kernel
            for ref, spec in inflight.items():
                report(self.collect(ref, spec, out_dir))
            raise

    @staticmethod
    def collect(ref: Any, spec: PointSpec, out_dir: Path) -> PointOutcome:
        """The task's outcome, its notebook kept under ``out_dir``; a lost task becomes FAILED."""
        import ray

        output = out_dir / f"{spec.point}.ipynb"
        try:
            outcome: PointOutcome = ray.get(ref)
        except (ray.exceptions.RayError, KeyboardInterrupt) as exc:
            cancelled = isinstance(exc, ray.exceptions.TaskCancelledError | KeyboardInterrupt)
            status = KILLED if cancelled else FAILED
            error = f"Ray task failed: {first_line(str(exc))}"
            client = MlflowClient(spec.tracking_uri)
            run = settle_runs(client, spec, 0.0, error, status)
            return PointOutcome(spec.point, status, run_id=run.info.run_id if run else None,
                                error=error)
        if outcome.notebook_json is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(outcome.notebook_json)
            outcome.notebook_json = None
        outcome.notebook = str(output)
        return outcome

    def close(self) -> None:
        """Disconnect from the cluster (the cluster itself keeps running)."""
        import ray

        ray.shutdown()


def check_reachable(address: str) -> None:
    """Fail fast on a ``HOST:PORT`` nobody listens on (``ray.init`` would retry forever)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: Ray resolves and reports them itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise ConfigError(
            f"sweep.ray.address={address}: cannot connect to a Ray cluster ({exc}); start "
            "one with `ray start --head` or set sweep.ray.address=HOST:PORT of its head"
        ) from exc


def make_executor(plan: SweepPlan) -> Executor:
    """The executor the plan asks for (Ray connects here, before anything is written)."""
    if plan.executor == "ray":
        return RayExecutor(plan.workers, plan.ray_address)
    return LocalExecutor(plan.workers)
