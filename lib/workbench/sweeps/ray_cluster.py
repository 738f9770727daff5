"""Points as tasks on a Ray cluster (``sweep.executor=ray``): the executor, the task, where each
point ran, and what a dead node or a dead head does to a sweep.

- **Placement**: each point is a Ray task asking for ``cpus_per_point`` CPUs (the cluster's
  CPUs / ``sweep.workers``, never more than its largest node has, so no task waits forever for
  a node that does not exist) and ``sweep.ray.gpus_per_point`` GPUs; Ray's ``SPREAD``
  strategy puts points on different nodes while there is room.
- **Where it ran**: the task tags the point's run with its node (``ray.node_id``,
  ``ray.node_ip``, ``ray.hostname``) through the kernel's environment
  (``WORKBENCH_POINT_TAGS``, read by the notebook).
- **A dead worker or node**: Ray runs the task again elsewhere (``max_retries``). The dead
  attempt's kernel exits with its Ray worker (ipykernel polls its parent process,
  ``JPY_PARENT_PID``), so it can not finish a duplicate; the retry first looks for the
  point's FINISHED run and closes the dead attempt's RUNNING run as KILLED with the reason.
- **A dead head**: Ray ends a driver abruptly once the head's GCS has not answered for
  ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default). The driver probes the GCS port
  while it waits and gives up on the head well before that: it cancels the running tasks
  (their kernels stop, ``train`` marks their runs KILLED), closes what is left, disconnects
  and raises :class:`ClusterLost`; the same command against a new head resumes.
- **Credentials never travel**: a tracking URI with a password is refused (``plan``); the
  login comes from each node's environment, which the kernel inherits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from workbench.config import ConfigError
from workbench.console import printable, strip_ansi
from workbench.sweeps.point import (
    FAILED,
    FINISHED,
    KILLED,
    POINT_TAGS_ENV,
    RAY_HOSTNAME,
    RAY_NODE_ID,
    RAY_NODE_IP,
    ClusterLost,
    PointOutcome,
    PointSpec,
    Report,
    execute_point,
    first_line,
    outcome_from_run,
    settle_runs,
)

MAX_RETRIES = 2  # a task whose worker or node died runs again (on another node if need be)
POLL_S = 2.0  # the longest wait for a result before the head is probed again
KERNEL_LOG_LIMIT = 200_000  # characters of a kernel's log carried back to the driver


def reconnect_timeout_s() -> float:
    """How long Ray lets a driver live without its GCS (Ray's own setting, 60 s by default)."""
    try:  # Ray's own (case-sensitive) variable name
        return float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60"))  # noqa: SIM112
    except ValueError:
        return 60.0


# --------------------------------------------------------------------------- the task


def node_tags() -> dict[str, str]:
    """The Ray node this task runs on, as run tags."""
    import ray

    return {RAY_NODE_ID: ray.get_runtime_context().get_node_id(),
            RAY_NODE_IP: ray.util.get_node_ip_address(), RAY_HOSTNAME: socket.gethostname()}


def execute_point_remote(spec: PointSpec) -> PointOutcome:
    """A point as a Ray task: executed into a temporary folder on the worker; the notebook and
    the kernel's log travel back in the outcome, and the driver keeps them under
    experiments/sweeps/. The point's run is tagged with this node."""
    tags = node_tags()
    grid_tags = json.loads(spec.env_vars.get(POINT_TAGS_ENV) or "{}")  # the point's own
    spec = replace(spec, tags={**spec.tags, **tags},
                   env_vars={**spec.env_vars, POINT_TAGS_ENV: json.dumps({**grid_tags, **tags})})
    with tempfile.TemporaryDirectory(prefix="workbench-point-") as tmp:
        output = Path(tmp) / f"{spec.point}.ipynb"
        outcome = execute_point(spec, output)
        if output.exists():
            outcome.notebook_json = output.read_text()
        log = output.with_suffix(".log")
        if log.exists():
            outcome.log_text = log.read_text(errors="replace")[-KERNEL_LOG_LIMIT:]
    return outcome


# --------------------------------------------------------------------------- the head


class HeadWatch:
    """Probes the head's GCS port at most every :data:`POLL_S`; raises :class:`ClusterLost`
    once it has not answered for ``lost_after_s`` seconds in a row."""

    def __init__(self, gcs_address: str, lost_after_s: float) -> None:
        host, _, port = gcs_address.rpartition(":")
        self.address = (host, int(port))
        self.lost_after_s = lost_after_s
        self.silent_since: float | None = None
        self.last_probe = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now - self.last_probe < POLL_S:
            return
        self.last_probe = now
        if self.answers():
            self.silent_since = None
            return
        self.silent_since = self.silent_since or now
        if now - self.silent_since >= self.lost_after_s:
            raise ClusterLost(f"the Ray head at {self.address[0]}:{self.address[1]} stopped "
                              f"answering (nothing for {now - self.silent_since:.0f} s)")

    def answers(self) -> bool:
        try:
            socket.create_connection(self.address, timeout=POLL_S).close()
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------- the executor


@dataclass(frozen=True)
class Submitted:
    """A point's task in flight."""

    spec: PointSpec
    at: float  # Unix time of submission: the runs of this attempt start after it


class RayExecutor:
    """Points as Ray tasks on an existing cluster (``sweep.ray.address``).

    Each task requests ``cpus_per_point`` CPUs (and ``gpus_per_point`` GPUs) from Ray's
    scheduler and runs the same ``execute_point`` on the node Ray picks; at most ``workers``
    tasks are in flight. Every node needs the workbench installed (same checkout and venv)
    and must reach the tracking store: use a tracking server URI across machines.
    """

    def __init__(self, workers: int, address: str | None, gpus_per_point: float = 0.0) -> None:
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
        self.gcs_address = ray.get_runtime_context().gcs_address
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        self.cluster_cpus = int(sum(n.get("CPU", 0) for n in nodes))
        largest = int(max((n.get("CPU", 0) for n in nodes), default=0))
        self.workers = workers
        self.cpus_per_point = max(1, min(self.cluster_cpus // workers, largest))
        self.gpus_per_point = gpus_per_point
        try:
            check_capacity(self.address, nodes, largest, gpus_per_point)
        except ConfigError:
            ray.shutdown()
            raise

    def describe(self) -> str:
        gpus = f" + {self.gpus_per_point:g} GPU" if self.gpus_per_point else ""
        return (f"ray at {self.address}: up to {self.workers} points at a time x "
                f"{self.cpus_per_point} CPU each{gpus}, cluster CPUs {self.cluster_cpus}")

    def run(self, specs: Sequence[PointSpec], out_dir: Path, report: Report) -> None:
        import ray

        # max_retries: a task whose worker or node died runs again; execute_point then skips a
        # point that already FINISHED and closes the dead attempt's run (no duplicate runs).
        task = ray.remote(execute_point_remote)
        options = {"num_cpus": self.cpus_per_point, "num_gpus": self.gpus_per_point,
                   "max_retries": MAX_RETRIES, "retry_exceptions": False,
                   "scheduling_strategy": "SPREAD"}
        pending = list(specs)
        inflight: dict[Any, Submitted] = {}
        watch = self.head_watch()
        try:
            while pending or inflight:
                while pending and len(inflight) < self.workers:
                    spec = pending.pop(0)
                    named = task.options(**options, name=f"workbench-sweep:{spec.point}")
                    inflight[named.remote(spec)] = Submitted(spec, time.time())
                for ref in self.wait_ready(list(inflight), watch):
                    report(self.collect(ref, inflight.pop(ref), out_dir))
        except KeyboardInterrupt:
            self.stop(inflight, out_dir, report, "interrupted: the sweep was stopped (Ctrl-C "
                      "or SIGTERM)", wait_s=60.0)
            raise
        except ClusterLost as lost:
            self.give_up(inflight, out_dir, report, f"{lost}; rerun the sweep to resume")
            raise

    def head_watch(self) -> HeadWatch:
        """A watch that gives up on the head at a third of Ray's reconnect timeout."""
        return HeadWatch(self.gcs_address, reconnect_timeout_s() / 3)

    def wait_ready(self, refs: Sequence[Any], watch: HeadWatch) -> list[Any]:
        """The refs ready within :data:`POLL_S` (maybe none), the head probed meanwhile;
        :class:`ClusterLost` once the head, or this machine's Ray node, stopped answering."""
        import ray

        try:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S)
        except OSError as exc:  # this machine's raylet is gone (it was the head's)
            raise ClusterLost(f"the Ray head at {self.gcs_address} or this machine's "
                              f"Ray node stopped answering ({first_line(str(exc))})") from exc
        watch.check()
        return list(ready)

    def give_up(self, inflight: dict[Any, Submitted], out_dir: Path, report: Report,
                error: str) -> None:
        """The head is lost: stop and close the tasks in flight, then disconnect, all within
        Ray's reconnect timeout (after it, Ray ends this process without a word)."""
        self.stop(inflight, out_dir, report, error, wait_s=reconnect_timeout_s() / 6,
                  disconnect=True)

    def stop(self, inflight: dict[Any, Submitted], out_dir: Path, report: Report, error: str,
             wait_s: float, disconnect: bool = False) -> None:
        """Cancel the tasks in flight (each stops its kernel; ``train`` marks its run KILLED),
        collect what comes back within ``wait_s``, disconnect from Ray if asked; the rest are
        closed KILLED with ``error`` through the tracking store alone (no Ray call)."""
        import ray

        refs = list(inflight)
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref)  # KeyboardInterrupt in the task
        ready = wait_quietly(refs, wait_s)
        for ref in ready:
            outcome = self.collect(ref, inflight[ref], out_dir)
            if outcome.status == KILLED:  # the task's own "interrupted" says less
                outcome.error = error
            report(outcome)
        if disconnect:
            # Before Ray's reconnect timeout ends this process without a word.
            with contextlib.suppress(Exception):
                ray.shutdown()
        for ref in refs:
            if ref in ready:
                continue
            submitted = inflight[ref]
            client = MlflowClient(submitted.spec.tracking_uri)
            run = settle_runs(client, submitted.spec, submitted.at, error, KILLED,
                              record_missing=False)
            if run is not None and run.info.status == FINISHED:
                # Its training ended before the cancel: the result is in the store even if
                # the task's answer never arrived (a rerun skips the point).
                report(outcome_from_run(submitted.spec.point, FINISHED, run))
                continue
            report(PointOutcome(submitted.spec.point, KILLED,
                                run_id=run.info.run_id if run else None, error=error))

    @staticmethod
    def collect(ref: Any, submitted: Submitted, out_dir: Path) -> PointOutcome:
        """The task's outcome, its notebook and log kept under ``out_dir``; a lost task
        (retries used up, or cancelled) becomes FAILED (KILLED)."""
        import ray

        spec = submitted.spec
        output = out_dir / f"{spec.point}.ipynb"
        try:
            outcome: PointOutcome = ray.get(ref)
        except (ray.exceptions.RayError, OSError, KeyboardInterrupt) as exc:
            # OSError: the driver's own raylet is gone (it ran on the head that died).
            cancelled = isinstance(exc, ray.exceptions.TaskCancelledError | KeyboardInterrupt)
            status = KILLED if cancelled else FAILED
            error = f"Ray task failed: {task_error(str(exc))}"
            client = MlflowClient(spec.tracking_uri)
            run = settle_runs(client, spec, submitted.at, error, status)
            return PointOutcome(spec.point, status, run_id=run.info.run_id if run else None,
                                error=error)
        output.parent.mkdir(parents=True, exist_ok=True)
        if outcome.notebook_json is not None:
            output.write_text(outcome.notebook_json)
        if outcome.log_text is not None:
            output.with_suffix(".log").write_text(outcome.log_text)
        outcome.notebook_json = outcome.log_text = None
        outcome.notebook = str(output)
        return outcome

    def close(self) -> None:
        """Disconnect from the cluster (the cluster itself keeps running)."""
        import ray

        ray.shutdown()


# The last line of a Python traceback: the exception's dotted type name, a colon, its message
# (``mlflow.exceptions.MlflowException: API request ... failed with error code 401 ...``).
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure):\s*\S")
ERROR_LIMIT = 500  # characters of a point's error kept for its outcome and its run's tag


def task_error(text: str) -> str:
    """The meaningful line of a failed Ray task's error, for a point's outcome.

    Ray's message (:class:`ray.exceptions.RayTaskError`) starts with a coloured header naming
    the task and worker (``ray::run_point() (pid=…, ip=…)``), then the remote traceback,
    whose last exception line says what happened (a store refusing the node's login: ``…
    error code 401 …``). That line is kept, with Ray's colour codes stripped and any other
    control character escaped (:func:`workbench.console.printable`); Ray's own errors without
    a traceback (a lost node, a cancelled task) keep their first line.
    """
    lines = [printable(line).strip() for line in strip_ansi(text).splitlines()]
    lines = [line for line in lines if line]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]
    chosen = raised[-1] if raised else (lines[0] if lines else "")
    return chosen if len(chosen) <= ERROR_LIMIT else chosen[:ERROR_LIMIT - 1] + "…"


def wait_quietly(refs: Sequence[Any], wait_s: float) -> list[Any]:
    """The refs ready within ``wait_s``; none when Ray itself no longer answers (a driver on
    the head's machine loses its raylet with the head: ``ray.wait`` raises at once)."""
    import ray

    if not refs:
        return []
    try:
        return list(ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)[0])
    except (OSError, ray.exceptions.RayError):
        return []


def check_capacity(address: str, nodes: Sequence[dict[str, float]], largest_cpus: int,
                   gpus_per_point: float) -> None:
    """Refuse a cluster on which no point could ever be placed (Ray would wait forever)."""
    if largest_cpus < 1:
        raise ConfigError(
            f"sweep.ray.address={address}: the cluster has no CPUs ({len(nodes)} node(s)); "
            "start worker nodes with `ray start --address=HEAD:PORT --num-cpus=N`")
    most_gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if gpus_per_point > most_gpus:
        raise ConfigError(
            f"sweep.ray.gpus_per_point={gpus_per_point:g}: no node of the cluster at {address} "
            f"has that many GPUs (the most is {most_gpus:g}); lower it, or add GPU nodes "
            "(`ray start --num-gpus=N`)")


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
