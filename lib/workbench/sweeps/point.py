"""One grid point: ``notebooks/train.ipynb`` executed by papermill in its own kernel.

Failure isolation: a notebook error, a dead kernel or ``sweep.timeout`` marks that point
FAILED (the error in the child run's ``error`` tag; a run left RUNNING by a dead kernel is
closed), keeps its executed notebook with the failing cell marked, and the other points go
on. The same :func:`execute_point` runs locally and as a Ray task
(:mod:`workbench.sweeps.ray_cluster`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from workbench import paths
from workbench.sweeps.claim import claim_holder, point_claim
from workbench.sweeps.grid import key_tags
from workbench.sweeps.kernels import DEFAULT_KERNEL, KERNEL_KEY
from workbench.sweeps.plan import NOTEBOOK, Point, SweepPlan
from workbench.sweeps.store import child_filter, search_all
from workbench.tracking.redaction import scrub_command
from workbench.tracking.store import (
    truncate,
)

KERNEL_START_TIMEOUT_S = 180  # a busy machine can take a while to import torch in a new kernel
KERNEL_START_ATTEMPTS = 2  # a kernel that never answered (no cell ran) is started once more
STOP_GRACE_S = 15.0  # after SIGINT, a kernel gets this long to mark its run and close its envs
FINISHED, FAILED, KILLED, SKIPPED = "FINISHED", "FAILED", "KILLED", "SKIPPED"
POINT_ARTIFACTS = "point"  # a point run's executed notebook and kernel log
# The point's wall time, kernel start included, logged on its FINISHED run.
POINT_WALL_KEY = "sweep/point_wall_s"
# Tags known only where the point runs (the Ray node), as a JSON object in the kernel's
# environment; the notebook adds them to the point's run (workbench.notebook).
POINT_TAGS_ENV = "WORKBENCH_POINT_TAGS"
RAY_NODE_ID, RAY_NODE_IP, RAY_HOSTNAME = "ray.node_id", "ray.node_ip", "ray.hostname"


class ClusterLost(RuntimeError):
    """The machines running the points are gone (a Ray head that stopped answering)."""


@dataclass(frozen=True)
class PointSpec:
    """Plain values an executor needs to run one point (picklable for Ray)."""

    sweep_id: str
    point: str
    parent_run_id: str
    experiment_id: str
    tracking_uri: str
    parameters: dict[str, Any]  # papermill parameters of notebooks/train.ipynb
    tags: dict[str, str]  # the point's grid values, for a run recorded by the sweep itself
    env_vars: dict[str, str]  # added to the kernel's environment
    timeout: float | None
    kernel: str = DEFAULT_KERNEL  # the Jupyter kernel (software stack) papermill starts


@dataclass
class PointOutcome:
    """What became of one point."""

    point: str
    status: str  # FINISHED | FAILED | KILLED | SKIPPED (FINISHED earlier, or held elsewhere)
    run_id: str | None = None
    error: str | None = None
    final_reward: float | None = None
    fps: float | None = None
    wall_s: float | None = None  # the whole point: kernel start, imports, training, saving
    train_s: float | None = None  # model.learn only (summary/wall_time_s)
    setup_s: float | None = None  # point start -> its run created (kernel start + imports)
    notebook: str | None = None  # where its executed notebook is kept
    notebook_json: str | None = None  # the executed notebook, carried back from a Ray worker
    note: str | None = None  # something to know about a FINISHED point
    log_text: str | None = None  # the kernel's own output, carried back from a Ray worker

    @property
    def ok(self) -> bool:
        return self.status in (FINISHED, SKIPPED)

    def record(self) -> dict[str, Any]:
        """The outcome for ``sweep_results.json`` (without the notebook and log themselves)."""
        return {k: v for k, v in asdict(self).items() if k not in ("notebook_json", "log_text")}


Report = Callable[[PointOutcome], None]  # an executor's callback, once per finished point


def point_specs(plan: SweepPlan, points: Sequence[Point], parent_id: str, experiment_id: str,
                cpus_per_point: int) -> list[PointSpec]:
    """The executor's work list."""
    specs = []
    for point in points:
        parameters = {
            "env": point.env,
            "num_envs": point.num_envs,
            "n_steps": point.n_steps,
            "total_timesteps": point.total_timesteps or plan.total_timesteps,
            "seed": point.seed,
            "overrides": [*plan.point_overrides, *point.overrides()],
            "sweep_id": plan.sweep_id,
            "parent_run_id": parent_id,
            "point": point.name,
        }
        budget = str(cpus_per_point)
        specs.append(PointSpec(
            sweep_id=plan.sweep_id,
            point=point.name,
            parent_run_id=parent_id,
            experiment_id=experiment_id,
            tracking_uri=plan.tracking_uri,
            parameters=parameters,
            tags={"env": point.env, "num_envs": str(point.num_envs),
                  "n_steps": str(point.n_steps), "seed": str(point.seed), **point.tags(),
                  **kernel_tag(point.kernel)},
            env_vars={
                # the notebook tags its run with them (its config id it computes itself)
                POINT_TAGS_ENV: json.dumps({**key_tags(point.keys), **kernel_tag(point.kernel)}),
                # Every point logs to the sweep's store, whatever the worker's own settings.
                "MLFLOW_TRACKING_URI": plan.tracking_uri,
                "WORKBENCH_CPU_BUDGET": budget,  # -> torch threads (workbench.envs)
                "OMP_NUM_THREADS": budget,  # numpy/BLAS thread pools
                "MKL_NUM_THREADS": budget,
                "WORKBENCH_NOTEBOOK": str(plan.out_dir / f"{point.name}.ipynb"),
            },
            timeout=plan.timeout,
            kernel=point.kernel,
        ))
    return specs


def kernel_tag(kernel: str) -> dict[str, str]:
    """``{"sweep.kernel": NAME}`` for a point run in another kernel than the project's."""
    return {} if kernel == DEFAULT_KERNEL else {KERNEL_KEY: kernel}


def point_environment(spec: PointSpec) -> dict[str, str]:
    """The kernel's environment: this process's, plus the point's, minus ``MLFLOW_RUN_ID``.

    MLflow's fluent API would attach to the run named by ``MLFLOW_RUN_ID``; a point must
    create its own child run, never inherit the parent (or another point) through it.
    """
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    env.update(spec.env_vars)
    return env


def point_tags_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags an executor put in ``WORKBENCH_POINT_TAGS`` for this point's run (e.g. the Ray
    node it runs on); none when unset. Only a JSON object of strings is accepted: anything
    else is ignored rather than trusted."""
    raw = (os.environ if environ is None else environ).get(POINT_TAGS_ENV, "")
    try:
        tags = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(tags, dict):
        return {}
    return {k: v for k, v in tags.items() if isinstance(k, str) and isinstance(v, str)}


class PointKernel:
    """The kernel of one point: started with the point's environment, stoppable from another
    thread (a timeout watchdog, the driver on Ctrl-C) by signalling its process group."""

    def __init__(self, env: Mapping[str, str], log: Path | None = None) -> None:
        self.env = dict(env)
        self.log = log  # the kernel process's own stdout/stderr (C-level output, crashes)
        self.pgid: int | None = None
        self.stop_reason: str | None = None
        self.done = False
        self.lock = threading.Lock()
        self.escalation: threading.Timer | None = None

    def manager_class(self) -> type:
        """A jupyter_client kernel manager class that starts the kernel with ``self.env``.

        nbclient (under papermill) creates the manager from this class; ``env`` is
        jupyter_client's own ``start_kernel`` option for the kernel's environment.
        """
        from jupyter_client.manager import AsyncKernelManager
        from traitlets import default

        kernel = self

        class PointKernelManager(AsyncKernelManager):  # type: ignore[misc]
            @default("transport_encryption")
            def _encrypted(self) -> str:
                """CurveZMQ keys for the kernel where libzmq has them: code and outputs
                never travel in plain text (ipykernel warns otherwise)."""
                import zmq

                return "auto" if zmq.has("curve") else "disabled"

            async def start_kernel(self, **kw: Any) -> None:  # type: ignore[override]
                with kernel.log_file() as log:
                    await super().start_kernel(**{**kw, "env": kernel.env, "stdout": log,
                                                  "stderr": log})
                # LocalProvisioner starts the kernel in its own session: pgid covers its
                # children too (subprocess env workers).
                kernel.started(getattr(self.provisioner, "pgid", None))

        return PointKernelManager

    @contextlib.contextmanager
    def log_file(self) -> Any:
        """The kernel's log, open for the launch (the kernel keeps its own descriptor)."""
        if self.log is None:
            yield None
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as handle:
            yield handle

    def started(self, pgid: int | None) -> None:
        """Record the kernel's process group; a stop requested meanwhile takes effect now."""
        with self.lock:
            self.pgid = pgid
            stop_now = self.stop_reason is not None
        if stop_now:
            self.kill()

    def stop(self, reason: str, grace_s: float = STOP_GRACE_S) -> None:
        """SIGINT the kernel (``train`` marks its run and closes its envs), SIGKILL after
        ``grace_s`` if it is still there."""
        with self.lock:
            if self.stop_reason is not None or self.done:
                return
            self.stop_reason = reason
        self.signal(signal.SIGINT)
        self.escalation = threading.Timer(grace_s, self.kill)
        self.escalation.daemon = True
        self.escalation.start()

    def kill(self) -> None:
        """SIGKILL the kernel's whole process group (env workers included)."""
        self.signal(signal.SIGKILL)

    def signal(self, signum: int) -> None:
        with self.lock:
            if self.pgid is None or self.done:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signum)

    def finish(self) -> None:
        """The execution is over: no more signals (the process group id may be reused)."""
        if self.escalation is not None:
            self.escalation.cancel()
        with self.lock:
            self.done = True


def execute_point(spec: PointSpec, output: Path, kernel: PointKernel | None = None) -> PointOutcome:
    """Execute ``notebooks/train.ipynb`` for one point with papermill; never raises for a
    failing point (the outcome says FAILED), so one point cannot stop the sweep.

    Idempotent: a point that already has a FINISHED child run is not run again (a retried
    Ray task, a resumed sweep), and runs left RUNNING by a dead earlier attempt are closed
    KILLED, with the reason in their ``error`` tag.
    """
    claim = output.with_suffix(".claim")
    with point_claim(claim) as held:
        if not held:
            return PointOutcome(spec.point, SKIPPED, notebook=str(output), note=(
                f"run by another `workbench sweep` of {spec.sweep_id} (pid "
                f"{claim_holder(claim)}); not started twice"))
        return execute_claimed_point(spec, output, kernel)


def execute_claimed_point(spec: PointSpec, output: Path, kernel: PointKernel | None
                          ) -> PointOutcome:
    """:func:`execute_point` once this process holds the point's claim."""
    started = time.time()  # compared with the runs' start times (epoch milliseconds)
    clock = time.monotonic()  # the point's wall time: immune to the machine's clock steps
    client = MlflowClient(spec.tracking_uri)
    done = point_runs(client, spec, status=FINISHED)
    if done:
        return outcome_from_run(spec.point, SKIPPED, done[0], notebook=str(output))
    for earlier in point_runs(client, spec, status="RUNNING"):
        close_runs(client, [earlier], KILLED, abandoned_reason(earlier, spec))
    kernel = kernel or PointKernel(point_environment(spec), output.with_suffix(".log"))
    output.parent.mkdir(parents=True, exist_ok=True)
    watchdog = None
    if spec.timeout:
        watchdog = threading.Timer(spec.timeout, kernel.stop, ("timeout",))
        watchdog.daemon = True
        watchdog.start()
    error: str | None = None
    try:
        error = run_papermill(spec, output, kernel)
    except KeyboardInterrupt:  # a cancelled Ray task; the local driver stops kernels itself
        kernel.stop("interrupt", grace_s=5.0)
        wait_for_kernel(kernel, 10.0)
        error = "KeyboardInterrupt"
    finally:
        if watchdog is not None:
            watchdog.cancel()
        kernel.finish()
    status = KILLED if kernel.stop_reason == "interrupt" else FAILED
    if kernel.stop_reason == "timeout":
        error = f"timed out after {spec.timeout:g} s (sweep.timeout); the kernel was stopped"
    elif kernel.stop_reason == "interrupt":
        error = "interrupted: the sweep was stopped (Ctrl-C or SIGTERM)"
    wall = time.monotonic() - clock
    run = settle_runs(client, spec, started, error, status)
    if run is not None:
        attach_point_files(client, run.info.run_id, output)
    if run is not None and run.info.status == FINISHED:
        with contextlib.suppress(Exception):  # a resumed sweep's SKIPPED row reads it back
            client.log_metric(run.info.run_id, POINT_WALL_KEY, wall)
        # The run is the point's result. When the kernel was stopped (sweep.timeout, Ctrl-C)
        # or a cell failed after training had finished, the point is FINISHED all the same,
        # as its run says and as a resumed sweep will see it; the note says what was cut.
        outcome = outcome_from_run(spec.point, FINISHED, run, wall_s=wall,
                                   notebook=str(output), started=started)
        if error is not None:
            outcome.note = f"training finished, then the notebook stopped: {error}"
        return outcome
    error = error or "the notebook ended without a FINISHED run"
    return PointOutcome(spec.point, status, run_id=run.info.run_id if run else None, error=error,
                        wall_s=wall, notebook=str(output))


def attach_point_files(client: MlflowClient, run_id: str, output: Path) -> None:
    """Log the executed notebook and the kernel's console log to the point's run (artifact
    path ``point/``), so reviewers of a shared store open them without the sweep's machine.

    The store may be gone by now (a server restarting); the files stay on disk either way,
    so a failed upload is a warning, not a failed point.
    """
    for path in (output, output.with_suffix(".log")):
        if not path.is_file():
            continue
        try:
            client.log_artifact(run_id, str(path), POINT_ARTIFACTS)
        except Exception as exc:  # the point's result stands; say where the file still is
            print(f"workbench: warning: could not attach {path} to run {run_id}: "
                  f"{type(exc).__name__}: {first_line(str(exc))}", flush=True)


class KernelDeathLine(logging.Filter):
    """Drops nbclient's "Kernel died while waiting for execute reply." (logged through
    papermill's logger just before it raises): the point's own line says it, and why (the
    sweep was stopped, a timeout, a crash), so on Ctrl-C it no longer stands between the
    KILLED lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "Kernel died while waiting for execute reply."


def quiet_kernel_deaths() -> None:
    """Install :class:`KernelDeathLine` on papermill's logger, once."""
    log = logging.getLogger("papermill")
    if not any(isinstance(f, KernelDeathLine) for f in log.filters):
        log.addFilter(KernelDeathLine())


def run_papermill(spec: PointSpec, output: Path, kernel: PointKernel) -> str | None:
    """One papermill execution; returns the error line, or None when every cell ran."""
    import papermill
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    source = paths.project_root() / NOTEBOOK
    quiet_kernel_deaths()
    try:
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            try:
                papermill.execute_notebook(
                    str(source), str(output), parameters=spec.parameters,
                    kernel_name=spec.kernel, kernel_manager_class=kernel.manager_class(),
                    cwd=str(source.parent), progress_bar=False,
                    start_timeout=KERNEL_START_TIMEOUT_S,
                )
                break
            except RuntimeError as exc:
                if attempt == KERNEL_START_ATTEMPTS or not kernel_never_answered(exc, output,
                                                                                 kernel):
                    raise
                print(f"workbench: {spec.point}: the kernel did not answer ({first_line(str(exc))}"
                      f"); starting it again", flush=True)
    except PapermillExecutionError as exc:  # a cell raised: papermill marked it already
        return f"{exc.ename}: {first_line(exc.evalue)}"
    except Exception as exc:  # the kernel died (or never started): mark the cell it was in
        message = f"{type(exc).__name__}: {first_line(str(exc))}"
        if isinstance(exc, NoSuchKernel):
            message += (" (register it: make setup, or python -m ipykernel install --sys-prefix "
                        f"--name {spec.kernel})")
        elif isinstance(exc, DeadKernelError) and kernel.stop_reason is None:
            message += " (the kernel process died: out of memory, a crash, or a kill)"
        mark_failing_cell(output, type(exc).__name__, message)
        return message
    return None


def kernel_never_answered(exc: RuntimeError, output: Path, kernel: PointKernel) -> bool:
    """Whether a failed execution is a kernel that never answered its first request, before
    any cell ran and with no stop asked for: then starting it once more is safe.

    jupyter_client times that wait on the wall clock, so a clock step on the machine (a
    fresh VM's first time sync) ends it at once; a kernel stuck in a busy machine's start-up
    is the other cause.
    """
    if "didn't respond" not in str(exc) or kernel.stop_reason is not None:
        return False
    if not output.exists():
        return True
    import nbformat

    return not started_cells(nbformat.read(output, as_version=4))


def started_cells(nb: Any) -> list[Any]:
    """The code cells papermill started (its ``start_time`` in the cell's metadata)."""
    return [c for c in nb.cells if c.cell_type == "code"
            and c.get("metadata", {}).get("papermill", {}).get("start_time")]


def first_line(text: str) -> str:
    """The first non-empty line of an error message."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def mark_failing_cell(output: Path, ename: str, message: str) -> None:
    """Show a dead kernel in the executed notebook the way papermill shows a cell error.

    papermill only marks cells that raised; when the kernel dies the cell it was running
    looks completed. The cell that started last gets an error output, then papermill's own
    ``raise_for_execution_errors`` adds its banner and link to the failing cell.
    """
    import nbformat
    from papermill.exceptions import PapermillExecutionError
    from papermill.execute import raise_for_execution_errors

    if not output.exists():
        return
    nb = nbformat.read(output, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    started = started_cells(nb)
    if not code:
        return
    cell = started[-1] if started else code[0]
    cell.setdefault("outputs", []).append(nbformat.v4.new_output(
        "error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"]))
    cell.metadata.setdefault("papermill", {}).update({"exception": True, "status": "failed"})
    with contextlib.suppress(PapermillExecutionError):
        raise_for_execution_errors(nb, str(output))


def wait_for_kernel(kernel: PointKernel, timeout_s: float) -> None:
    """Wait until the kernel's process group is gone (after a stop)."""
    deadline = time.monotonic() + timeout_s
    while kernel.pgid is not None and time.monotonic() < deadline:
        try:
            os.killpg(kernel.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)
    kernel.kill()


def point_runs(client: MlflowClient, spec: PointSpec, status: str | None = None,
               since: float | None = None) -> list[Run]:
    """The point's child runs (newest first), optionally of one status or since a time."""
    text = child_filter(spec.sweep_id, spec.point)
    if status:
        text += f" and attributes.status = '{status}'"
    runs = search_all(client, spec.experiment_id, text)
    if since is not None:
        runs = [r for r in runs if r.info.start_time >= int(since * 1000) - 1000]
    return runs


def abandoned_reason(run: Run, spec: PointSpec) -> str:
    """Why an earlier attempt's RUNNING run is closed as the point starts again."""
    tags = run.data.tags
    if RAY_NODE_ID not in tags:
        return ("killed: abandoned, the sweep process that ran this point stopped before it "
                "ended; the point was run again")
    retried = (f" on node {spec.tags.get(RAY_NODE_IP, '?')} {spec.tags[RAY_NODE_ID]}"
               if RAY_NODE_ID in spec.tags else "")
    return (f"killed: the Ray worker or node that ran this attempt died (node "
            f"{tags.get(RAY_NODE_IP, '?')} {tags[RAY_NODE_ID]}); Ray retried the point{retried}")


def close_runs(client: MlflowClient, runs: Iterable[Run], status: str, error: str) -> None:
    """Terminate runs with ``status`` and the error in their ``error`` tag."""
    for run in runs:
        client.set_tag(run.info.run_id, "error", truncate(scrub_command(error), 5000))
        client.set_terminated(run.info.run_id, status)


def settle_runs(client: MlflowClient, spec: PointSpec, started: float, error: str | None,
                status: str, record_missing: bool = True) -> Run | None:
    """Make the point's MLflow record truthful after its execution; returns its run.

    Only the runs created since ``started`` (this attempt's) are touched. A kernel that died
    left its run RUNNING; a timed-out kernel's run was marked KILLED by ``train`` on the
    SIGINT: both become ``status`` with the error. A point that failed before ``train``
    created a run (a bad parameter, a config error) gets a run recording the error, unless
    ``record_missing`` is false (a point that never started).
    """
    runs = point_runs(client, spec, since=started)
    if error is None:
        return runs[0] if runs else None
    stale = [r for r in runs if r.info.status == "RUNNING"
             or (r.info.status == KILLED and status == FAILED)]
    close_runs(client, stale, status, error)
    if runs:
        return client.get_run(runs[0].info.run_id)
    if not record_missing:
        return None
    tags = {**spec.tags, "sweep_id": spec.sweep_id, "sweep.role": "child",
            "sweep.point": spec.point, "mlflow.parentRunId": spec.parent_run_id,
            "error": truncate(scrub_command(error), 5000)}
    run = client.create_run(spec.experiment_id, run_name=spec.point, tags=tags)
    client.set_terminated(run.info.run_id, status)
    return client.get_run(run.info.run_id)


def outcome_from_run(point: str, status: str, run: Run, wall_s: float | None = None,
                     notebook: str | None = None, started: float | None = None) -> PointOutcome:
    """An outcome with the run's summary metrics; the point's wall time (kernel start
    included) as the sweep measured it, else the run's own start to end."""
    metrics = run.data.metrics
    wall_s = wall_s if wall_s is not None else metrics.get(POINT_WALL_KEY)
    if wall_s is None and run.info.end_time:
        wall_s = (run.info.end_time - run.info.start_time) / 1000.0
    return PointOutcome(
        point=point,
        status=status,
        run_id=run.info.run_id,
        final_reward=metrics.get("summary/eval_mean_reward"),
        fps=metrics.get("summary/fps"),
        wall_s=wall_s,
        train_s=metrics.get("summary/wall_time_s"),
        setup_s=(run.info.start_time / 1000.0 - started) if started else None,
        notebook=notebook,
    )
