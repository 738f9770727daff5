"""Sweeps: ``notebooks/train.ipynb`` executed by papermill once per grid point, nested in MLflow.

Data flow::

    overrides --plan_sweep--> SweepPlan (validated; nothing computed or written yet)
      --prepare_store--> migrated store + one parent run (params: the grid)
      --executor (local threads | Ray tasks)--> execute_point, one per point:
            papermill -> fresh kernel -> workbench.training.trainer (a child run under the parent)
      --> PointOutcome per point --> result table, exit code

Properties (issue 4):

- **Parallel within a CPU budget**: at most ``sweep.workers`` points run at once (never more
  than there are cores); each point's kernel gets ``WORKBENCH_CPU_BUDGET`` = its share of the
  cores, which ``train`` turns into torch threads, so points never oversubscribe the machine.
- **Resumable**: the sweep id is the sweep's name plus a hash of its points and overrides, so
  the same command finds its parent run again and skips points with a FINISHED child.
- **Failure isolation**: each point runs in its own kernel. A notebook error, a dead kernel or
  ``sweep.timeout`` marks that point FAILED (the error in the child run's ``error`` tag; a run
  left RUNNING by a dead kernel is closed), keeps its executed notebook with the failing cell
  marked, and the other points go on.
- **SQLite**: the store is created and migrated, and switched to write-ahead logging, once
  before the points fan out; MLflow itself sets a busy timeout on every SQLite session.
- **Ray**: ``sweep.executor=ray`` runs the same ``execute_point`` as Ray tasks on an existing
  cluster; a retried task first looks for its point's FINISHED run (no duplicates).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from workbench import config, paths
from workbench.config import ConfigError, SweepConfig, WorkbenchConfig
from workbench.envs.checks import check_config
from workbench.envs.cores import cpu_budget
from workbench.tracking import runs
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import (
    MAX_TAG_VALUE_LENGTH,
    ensure_experiment,
    is_embedded,
    log_params,
    make_client,
    resolve_tracking_uri,
    truncate,
)

NOTEBOOK = "notebooks/train.ipynb"  # relative to the project root of whichever machine runs it
# Config keys the grid sets for each point; overriding them for the whole sweep is an error.
GRID_KEYS = {"env.num_envs": "sweep.num_envs", "algo.n_steps": "sweep.n_steps",
             "seed": "sweep.seeds", "tracking.run_name": "the point name"}
SWEEP_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")
KERNEL_START_TIMEOUT_S = 180  # a busy machine can take a while to import torch in a new kernel
STOP_GRACE_S = 15.0  # after SIGINT, a kernel gets this long to mark its run and close its envs
FINISHED, FAILED, KILLED, SKIPPED = "FINISHED", "FAILED", "KILLED", "SKIPPED"


# --------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Point:
    """One grid point: the values the grid sets; everything else comes from the overrides."""

    env: str
    num_envs: int
    n_steps: int
    seed: int

    @property
    def name(self) -> str:
        """The point's name, which is also its child run's name."""
        return point_name(self.env, self.num_envs, self.n_steps, self.seed)


def point_name(env: str, num_envs: int, n_steps: int, seed: int) -> str:
    """``<env>-ne<num_envs>-ns<n_steps>-s<seed>``: ``train``'s default run name for the point."""
    return f"{env}-ne{num_envs}-ns{n_steps}-s{seed}"


def expand_grid(sweep: SweepConfig, env: str) -> list[Point]:
    """The points of the grid num_envs x n_steps x seeds, in that order, without duplicates.

    Iso-batch mode (``sweep.iso_batch=B``) keeps the samples per update constant: each
    num_envs gets ``n_steps = B / num_envs`` (field practice: halve the envs, double the
    rollout) and ``sweep.n_steps`` is not used.
    """
    for key, example in (("num_envs", "[1,2,4]"), ("n_steps", "[128,256]"), ("seeds", "[0]")):
        if not getattr(sweep, key) and not (key == "n_steps" and sweep.iso_batch is not None):
            raise ConfigError(f"sweep.{key}=[]: the grid needs at least one value, "
                              f"e.g. sweep.{key}={example}")
    points: list[Point] = []
    for num_envs in sweep.num_envs:
        for n_steps in iso_batch_steps(sweep.iso_batch, num_envs) or sweep.n_steps:
            for seed in sweep.seeds:
                point = Point(env, num_envs, n_steps, seed)
                if point not in points:
                    points.append(point)
    return points


def iso_batch_steps(iso_batch: int | None, num_envs: int) -> list[int]:
    """``[iso_batch / num_envs]`` in iso-batch mode, ``[]`` otherwise."""
    if iso_batch is None:
        return []
    if num_envs < 1 or iso_batch % num_envs:
        raise ConfigError(
            f"sweep.iso_batch={iso_batch} is not a multiple of num_envs={num_envs}: choose "
            "num_envs that divide it (e.g. powers of two with sweep.iso_batch=2048)"
        )
    return [iso_batch // num_envs]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class SweepPlan:
    """Everything a sweep will do, validated before any compute or store write."""

    sweep_id: str
    name: str
    env: str
    points: list[Point]
    point_overrides: list[str]  # Hydra overrides every point's notebook receives
    total_timesteps: int
    workers: int
    timeout: float | None
    executor: str
    ray_address: str | None
    tracking_uri: str
    experiment: str
    out_dir: Path  # experiments/sweeps/<sweep_id>: executed notebooks
    invalid: dict[str, str] = field(default_factory=dict)  # point -> config error

    def grid_params(self) -> dict[str, Any]:
        """The parent run's params: the grid and what every point shares."""
        num_envs = sorted({p.num_envs for p in self.points})
        return {
            "sweep.id": self.sweep_id,
            "sweep.name": self.name,
            "sweep.env": self.env,
            "sweep.num_envs": num_envs,
            "sweep.n_steps": sorted({p.n_steps for p in self.points}),
            "sweep.seeds": sorted({p.seed for p in self.points}),
            "sweep.points": len(self.points),
            "sweep.point_names": [p.name for p in self.points],
            "sweep.overrides": self.point_overrides,
            "sweep.total_timesteps": self.total_timesteps,
        }


def plan_sweep(overrides: Sequence[str]) -> SweepPlan:
    """Compose and check a sweep request; raises :class:`ConfigError` on bad input.

    Request-level problems (types, unknown keys, an empty grid, a grid key overridden for
    all points, every point invalid) stop here. A grid point whose own combination is
    invalid (e.g. a rollout smaller than ``algo.batch_size``) is only reported: it fails
    alone, in its notebook, while the valid points run.
    """
    overrides = list(overrides)
    check_grid_keys(overrides, "on the command line")
    typed = compose_typed(overrides)
    sweep = typed.sweep
    check_grid_keys(sweep.overrides, "in sweep.overrides")
    # The preset's overrides first: the command line wins over a conf/sweep/ file.
    point_overrides = list(sweep.overrides) + [o for o in overrides if not is_sweep_override(o)]
    if sweep.overrides:
        typed = compose_typed(point_overrides)  # what the points compose, checked once here
    check_sweep_settings(sweep)
    check_config(typed)  # the env checks, once: every point shares env.id, kwargs, randomization
    points = expand_grid(sweep, typed.env.name)
    invalid = invalid_points(typed, points)
    if len(invalid) == len(points):
        first = points[0].name
        raise ConfigError(f"every point of the sweep is invalid, e.g. {first}: {invalid[first]}")
    sweep_id = sweep.id or sweep_identity(sweep.name, points, point_overrides)
    return SweepPlan(
        sweep_id=sweep_id,
        name=sweep.name,
        env=typed.env.name,
        points=points,
        point_overrides=point_overrides,
        total_timesteps=typed.total_timesteps,
        workers=sweep.workers,
        timeout=sweep.timeout,
        executor=sweep.executor,
        ray_address=sweep.ray.address,
        tracking_uri=resolve_tracking_uri(typed.tracking.uri),
        experiment=typed.tracking.experiment,
        out_dir=paths.experiments_dir() / "sweeps" / sweep_id,
        invalid=invalid,
    )


def compose_typed(overrides: Sequence[str]) -> WorkbenchConfig:
    """Hydra composition merged into the schema (types, keys), without cross-field checks."""
    from omegaconf import OmegaConf

    typed = OmegaConf.to_object(config.compose(overrides))
    assert isinstance(typed, WorkbenchConfig)
    return typed


def override_key(text: str) -> str:
    """The key (or config group) an override sets, e.g. ``env.num_envs`` or ``sweep``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return str(OverridesParser.create().parse_override(text).key_or_group)
    except Exception:  # unparsable: config.compose reports it with the fix
        return text.split("=", 1)[0].lstrip("+~")


def is_sweep_override(text: str) -> bool:
    """True for overrides of the sweep itself (``sweep=...``, ``sweep.*``)."""
    key = override_key(text)
    return key == "sweep" or key.startswith("sweep.")


def check_grid_keys(overrides: Iterable[str], where: str) -> None:
    """Refuse overrides of the keys the grid sets for each point."""
    for text in overrides:
        key = override_key(text)
        if key in GRID_KEYS:
            raise ConfigError(
                f"{text!r} {where}: {key} is set per point by the sweep; "
                f"use {GRID_KEYS[key]} instead" + (
                    f", e.g. {GRID_KEYS[key]}=[{text.split('=', 1)[-1]}]"
                    if key != "tracking.run_name" else "")
            )


def check_sweep_settings(sweep: SweepConfig) -> None:
    """Range and choice checks of the ``sweep`` group."""
    if sweep.executor not in ("local", "ray"):
        raise ConfigError(f"sweep.executor={sweep.executor!r}: choose local or ray")
    if sweep.workers < 1:
        raise ConfigError(f"sweep.workers={sweep.workers}: must be >= 1")
    if sweep.timeout is not None and sweep.timeout <= 0:
        raise ConfigError(f"sweep.timeout={sweep.timeout}: must be > 0 seconds (or null)")
    if sweep.id is not None and not SWEEP_ID_PATTERN.match(sweep.id):
        raise ConfigError(f"sweep.id={sweep.id!r}: use letters, digits, '_', '.', '-' only")
    if not SWEEP_ID_PATTERN.match(sweep.name):
        raise ConfigError(f"sweep.name={sweep.name!r}: use letters, digits, '_', '.', '-' only")


def invalid_points(typed: WorkbenchConfig, points: Sequence[Point]) -> dict[str, str]:
    """Points whose full config fails the cross-field checks, with the error line."""
    invalid: dict[str, str] = {}
    for point in points:
        cfg = copy.deepcopy(typed)
        cfg.env.num_envs, cfg.algo.n_steps, cfg.seed = point.num_envs, point.n_steps, point.seed
        try:
            config.check_values(cfg)
        except ConfigError as exc:
            invalid[point.name] = str(exc)
    return invalid


def sweep_identity(name: str, points: Sequence[Point], point_overrides: Sequence[str]) -> str:
    """``<name>-<8 hex>``: the same points and overrides give the same id (resumable)."""
    payload = json.dumps({"points": [p.name for p in points],
                          "overrides": list(point_overrides)}, sort_keys=True)
    return f"{name}-{hashlib.sha256(payload.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------- store and runs


def prepare_store(uri: str, experiment: str) -> tuple[MlflowClient, str]:
    """Create and migrate the store once, before points fan out; returns client, experiment id.

    Parallel kernels then only open an up-to-date database (no schema-migration races). On
    SQLite the database is switched to write-ahead logging, so the MLflow UI and the points
    read while another point writes; MLflow sets a busy timeout on each session itself.
    """
    client = make_client(uri)
    experiment_id = ensure_experiment(client, experiment, uri)
    if is_embedded(uri):
        with contextlib.closing(sqlite3.connect(uri.removeprefix("sqlite:///"))) as db:
            db.execute("PRAGMA journal_mode=WAL")  # persistent: stored in the database file
    return client, experiment_id


def child_filter(sweep_id: str, point: str | None = None) -> str:
    """MLflow search filter for the sweep's child runs (one point's, when given)."""
    text = f"tags.sweep_id = '{sweep_id}' and tags.`sweep.role` = 'child'"
    return text + (f" and tags.`sweep.point` = '{point}'" if point else "")


def search_all(client: MlflowClient, experiment_id: str, filter_string: str) -> list[Run]:
    """Every run matching ``filter_string`` (all result pages), newest first."""
    runs: list[Run] = []
    token: str | None = None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=1000,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def start_parent_run(client: MlflowClient, experiment_id: str, plan: SweepPlan) -> str:
    """The sweep's parent run: found again on resume (set RUNNING), else created."""
    found = search_all(client, experiment_id,
                       f"tags.sweep_id = '{plan.sweep_id}' and tags.`sweep.role` = 'parent'")
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    tags = {"sweep_id": plan.sweep_id, "sweep.role": "parent", "env": plan.env}
    run = client.create_run(experiment_id, run_name=plan.sweep_id, tags=tags)
    log_params(client, run.info.run_id, plan.grid_params())
    return run.info.run_id


def reap_dead_points(plan: SweepPlan) -> list[str]:
    """Before resuming: mark this sweep's points left RUNNING by a hard-killed attempt KILLED.

    Only runs whose heartbeat is stale are touched (``workbench runs reap``), so the points of
    the same sweep running live elsewhere (a second machine, a Ray worker) keep running.
    """
    reaped = runs.reap_stale_runs(plan.tracking_uri, experiment_names=[plan.experiment],
                                  filter_string=child_filter(plan.sweep_id))
    if reaped:
        print(f"sweep {plan.sweep_id}: {len(reaped)} point run(s) of a killed attempt marked "
              f"KILLED (no heartbeat): {', '.join(reaped)}", flush=True)
    return reaped


def finished_children(client: MlflowClient, experiment_id: str, sweep_id: str) -> dict[str, Run]:
    """Point name -> its newest FINISHED child run."""
    done: dict[str, Run] = {}
    for run in search_all(client, experiment_id,
                          child_filter(sweep_id) + " and attributes.status = 'FINISHED'"):
        done.setdefault(run.data.tags["sweep.point"], run)
    return done


def finish_parent(client: MlflowClient, parent_id: str, outcomes: Sequence[PointOutcome],
                  wall_s: float, status: str | None = None) -> str:
    """Close the parent run: FINISHED when every point is, else FAILED (or KILLED)."""
    failed = [o for o in outcomes if not o.ok]
    status = status or (FAILED if failed else FINISHED)
    metrics = {
        "sweep/points_finished": sum(o.ok for o in outcomes),
        "sweep/points_failed": len(failed),
        "sweep/wall_time_s": wall_s,
    }
    for key, value in metrics.items():
        client.log_metric(parent_id, key, float(value))
    client.log_dict(parent_id, {"points": [o.record() for o in outcomes]}, "sweep_results.json")
    if failed:
        names = ", ".join(o.point for o in failed)
        client.set_tag(parent_id, "error", truncate(
            f"{len(failed)} of {len(outcomes)} points did not finish: {names}",
            MAX_TAG_VALUE_LENGTH))
    else:
        with contextlib.suppress(Exception):  # no error tag left from an earlier attempt
            client.delete_tag(parent_id, "error")
    client.set_terminated(parent_id, status)
    return status


# --------------------------------------------------------------------------- one point


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


@dataclass
class PointOutcome:
    """What became of one point."""

    point: str
    status: str  # FINISHED | FAILED | KILLED | SKIPPED (FINISHED by an earlier attempt)
    run_id: str | None = None
    error: str | None = None
    final_reward: float | None = None
    fps: float | None = None
    wall_s: float | None = None  # the whole point: kernel start, imports, training, saving
    train_s: float | None = None  # model.learn only (summary/wall_time_s)
    setup_s: float | None = None  # point start -> its run created (kernel start + imports)
    notebook: str | None = None  # where its executed notebook is kept
    notebook_json: str | None = None  # the executed notebook, carried back from a Ray worker

    @property
    def ok(self) -> bool:
        return self.status in (FINISHED, SKIPPED)

    def record(self) -> dict[str, Any]:
        """The outcome for ``sweep_results.json`` (without the notebook itself)."""
        return {k: v for k, v in asdict(self).items() if k != "notebook_json"}


def point_specs(plan: SweepPlan, points: Sequence[Point], parent_id: str, experiment_id: str,
                cpus_per_point: int) -> list[PointSpec]:
    """The executor's work list."""
    specs = []
    for point in points:
        parameters = {
            "env": point.env,
            "num_envs": point.num_envs,
            "n_steps": point.n_steps,
            "total_timesteps": plan.total_timesteps,
            "seed": point.seed,
            "overrides": list(plan.point_overrides),
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
                  "n_steps": str(point.n_steps), "seed": str(point.seed)},
            env_vars={
                # Every point logs to the sweep's store, whatever the worker's own settings.
                "MLFLOW_TRACKING_URI": plan.tracking_uri,
                "WORKBENCH_CPU_BUDGET": budget,  # -> torch threads (workbench.envs)
                "OMP_NUM_THREADS": budget,  # numpy/BLAS thread pools
                "MKL_NUM_THREADS": budget,
                "WORKBENCH_NOTEBOOK": str(plan.out_dir / f"{point.name}.ipynb"),
            },
            timeout=plan.timeout,
        ))
    return specs


def point_environment(spec: PointSpec) -> dict[str, str]:
    """The kernel's environment: this process's, plus the point's, minus ``MLFLOW_RUN_ID``.

    MLflow's fluent API would attach to the run named by ``MLFLOW_RUN_ID``; a point must
    create its own child run, never inherit the parent (or another point) through it.
    """
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    env.update(spec.env_vars)
    return env


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

        kernel = self

        class PointKernelManager(AsyncKernelManager):  # type: ignore[misc]
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
    Ray task, a resumed sweep), and runs left RUNNING by a dead earlier attempt are closed.
    """
    started = time.time()
    client = MlflowClient(spec.tracking_uri)
    done = point_runs(client, spec, status=FINISHED)
    if done:
        return outcome_from_run(spec.point, SKIPPED, done[0], notebook=str(output))
    close_runs(client, point_runs(client, spec, status="RUNNING"), FAILED,
               "abandoned: the sweep process that ran this point stopped before it ended")
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
    wall = time.time() - started
    run = settle_runs(client, spec, started, error, status)
    if error is None and run is not None and run.info.status == FINISHED:
        return outcome_from_run(spec.point, FINISHED, run, wall_s=wall, notebook=str(output),
                                started=started)
    error = error or "the notebook ended without a FINISHED run"
    return PointOutcome(spec.point, status, run_id=run.info.run_id if run else None, error=error,
                        wall_s=wall, notebook=str(output))


def run_papermill(spec: PointSpec, output: Path, kernel: PointKernel) -> str | None:
    """One papermill execution; returns the error line, or None when every cell ran."""
    import papermill
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient.exceptions import DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    source = paths.project_root() / NOTEBOOK
    try:
        papermill.execute_notebook(
            str(source), str(output), parameters=spec.parameters,
            kernel_manager_class=kernel.manager_class(),
            cwd=str(source.parent), progress_bar=False,
            start_timeout=KERNEL_START_TIMEOUT_S,
        )
    except PapermillExecutionError as exc:  # a cell raised: papermill marked it already
        return f"{exc.ename}: {first_line(exc.evalue)}"
    except Exception as exc:  # the kernel died (or never started): mark the cell it was in
        message = f"{type(exc).__name__}: {first_line(str(exc))}"
        if isinstance(exc, NoSuchKernel):
            message += " (register it: make setup, or python -m ipykernel install --sys-prefix "\
                       "--name workbench)"
        elif isinstance(exc, DeadKernelError) and kernel.stop_reason is None:
            message += " (the kernel process died: out of memory, a crash, or a kill)"
        mark_failing_cell(output, type(exc).__name__, message)
        return message
    return None


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
    started = [c for c in code if c.get("metadata", {}).get("papermill", {}).get("start_time")]
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


def close_runs(client: MlflowClient, runs: Iterable[Run], status: str, error: str) -> None:
    """Terminate runs with ``status`` and the error in their ``error`` tag."""
    for run in runs:
        client.set_tag(run.info.run_id, "error", truncate(error, 5000))
        client.set_terminated(run.info.run_id, status)


def settle_runs(client: MlflowClient, spec: PointSpec, started: float, error: str | None,
                status: str) -> Run | None:
    """Make the point's MLflow record truthful after its execution; returns its run.

    A kernel that died left its run RUNNING; a timed-out kernel's run was marked KILLED by
    ``train`` on the SIGINT: both become ``status`` with the error. A point that failed before
    ``train`` created a run (a bad parameter, a config error) gets a run recording the error.
    """
    runs = point_runs(client, spec, since=started)
    if error is None:
        return runs[0] if runs else None
    stale = [r for r in runs if r.info.status == "RUNNING"
             or (r.info.status == KILLED and status == FAILED)]
    close_runs(client, stale, status, error)
    if runs:
        return client.get_run(runs[0].info.run_id)
    tags = {**spec.tags, "sweep_id": spec.sweep_id, "sweep.role": "child",
            "sweep.point": spec.point, "mlflow.parentRunId": spec.parent_run_id,
            "error": truncate(error, 5000)}
    run = client.create_run(spec.experiment_id, run_name=spec.point, tags=tags)
    client.set_terminated(run.info.run_id, status)
    return client.get_run(run.info.run_id)


def outcome_from_run(point: str, status: str, run: Run, wall_s: float | None = None,
                     notebook: str | None = None, started: float | None = None) -> PointOutcome:
    """An outcome with the run's summary metrics."""
    metrics = run.data.metrics
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


def execute_point_remote(spec: PointSpec) -> PointOutcome:
    """A point as a Ray task: executed into a temporary folder on the worker; the notebook
    travels back in the outcome, and the driver keeps it under experiments/sweeps/."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="workbench-point-") as tmp:
        output = Path(tmp) / f"{spec.point}.ipynb"
        outcome = execute_point(spec, output)
        if output.exists():
            outcome.notebook_json = output.read_text()
    return outcome


# --------------------------------------------------------------------------- executors


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


# --------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    """What ``workbench sweep`` did."""

    sweep_id: str
    parent_run_id: str
    status: str
    outcomes: list[PointOutcome]
    out_dir: Path
    wall_s: float

    @property
    def failures(self) -> list[PointOutcome]:
        return [o for o in self.outcomes if not o.ok]


def run_sweep(overrides: Sequence[str]) -> SweepResult:
    """Plan, prepare the store, run the points, close the parent run, print the table.

    Raises :class:`ConfigError` for a bad request (before anything is written) and
    ``KeyboardInterrupt`` when stopped (running points are stopped and marked KILLED).
    """
    plan = plan_sweep(overrides)
    executor = make_executor(plan)
    try:
        return sweep_with(plan, executor)
    finally:
        executor.close()


def sweep_with(plan: SweepPlan, executor: Executor) -> SweepResult:
    """The sweep proper, on a connected executor."""
    started = time.perf_counter()
    client, experiment_id = prepare_store(plan.tracking_uri, plan.experiment)
    parent_id = start_parent_run(client, experiment_id, plan)
    reap_dead_points(plan)
    earlier = finished_children(client, experiment_id, plan.sweep_id)
    todo = [p for p in plan.points if p.name not in earlier]
    outcomes = {name: outcome_from_run(name, SKIPPED, run, notebook=str(
        plan.out_dir / f"{name}.ipynb")) for name, run in earlier.items()
        if name in {p.name for p in plan.points}}
    specs = point_specs(plan, todo, parent_id, experiment_id, executor.cpus_per_point)
    print_plan(plan, executor, parent_id, len(todo), len(outcomes))
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    status = None
    with progress_bar(len(todo), plan.sweep_id) as report:
        def record(outcome: PointOutcome) -> None:
            outcomes[outcome.point] = outcome
            report(outcome)

        try:
            executor.run(specs, plan.out_dir, record)
        except KeyboardInterrupt:
            status = KILLED
    ordered = [outcomes[p.name] for p in plan.points if p.name in outcomes]
    wall = time.perf_counter() - started
    status = finish_parent(client, parent_id, ordered, wall, status)
    result = SweepResult(plan.sweep_id, parent_id, status, ordered, plan.out_dir, wall)
    print_results(result, plan)
    if status == KILLED:
        raise KeyboardInterrupt
    return result


@contextlib.contextmanager
def progress_bar(total: int, sweep_id: str) -> Any:
    """A tqdm bar over points; yields a reporter that prints one line per finished point."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=f"sweep {sweep_id}", unit="point", dynamic_ncols=True,
               file=sys.stderr)

    def report(outcome: PointOutcome) -> None:
        bar.update(1)
        bar.write(f"{outcome.status:<8} {outcome.point}  {outcome_figures(outcome)}"
                  + (f"  error: {outcome.error}" if outcome.error else ""), file=sys.stderr)

    try:
        yield report
    finally:
        bar.close()


def outcome_figures(outcome: PointOutcome) -> str:
    """``reward .. | fps .. | wall ..`` for a finished point."""
    parts = []
    if outcome.final_reward is not None:
        parts.append(f"reward {outcome.final_reward:.1f}")
    if outcome.fps is not None:
        parts.append(f"fps {outcome.fps:.0f}")
    if outcome.wall_s is not None:
        parts.append(f"wall {outcome.wall_s:.0f}s")
    return " | ".join(parts)


def print_plan(plan: SweepPlan, executor: Executor, parent_id: str, todo: int,
               skipped: int) -> None:
    """What the sweep is about to do, printed once."""
    rows = {
        "sweep": f"{plan.sweep_id}  (parent run {parent_id})",
        "grid": f"{plan.env}: num_envs {sorted({p.num_envs for p in plan.points})} x "
                f"n_steps {sorted({p.n_steps for p in plan.points})} x "
                f"seeds {sorted({p.seed for p in plan.points})} = {len(plan.points)} points",
        "to run": f"{todo} points ({skipped} FINISHED earlier, skipped)",
        "budget": f"{plan.total_timesteps} steps per point"
                  + (f", timeout {plan.timeout:g} s" if plan.timeout else ""),
        "executor": executor.describe(),
        "overrides": " ".join(plan.point_overrides) or "(none)",
        "tracking": f"{redact_uri(plan.tracking_uri)}  experiment {plan.experiment!r}",
        "notebooks": str(plan.out_dir),
    }
    width = max(len(k) for k in rows)
    print("-" * 72)
    for key, value in rows.items():
        print(f"{key:<{width}} : {value}")
    for name, error in plan.invalid.items():
        print(f"warning: point {name} will fail: {error}")
    if plan.executor == "ray" and is_embedded(plan.tracking_uri):
        print("warning: a Ray sweep across machines needs a tracking server "
              "(tracking.uri=http://HOST:PORT); the SQLite file only works on one machine")
    print("-" * 72, flush=True)


def results_table(outcomes: Sequence[PointOutcome]) -> str:
    """The result table: point, status, final reward, fps, wall time."""
    header = ("point", "status", "final reward", "fps", "wall time")
    rows = [header] + [(
        o.point,
        o.status,
        "-" if o.final_reward is None else f"{o.final_reward:.1f}",
        "-" if o.fps is None else f"{o.fps:.0f}",
        "-" if o.wall_s is None else f"{o.wall_s:.0f} s",
    ) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def print_results(result: SweepResult, plan: SweepPlan) -> None:
    """The final table, the failures, and where to look."""
    print(f"\nSweep {result.sweep_id}: {result.status} in {result.wall_s:.0f} s")
    print("=" * 72)
    print(results_table(result.outcomes))
    print("=" * 72)
    for outcome in result.failures:
        print(f"{outcome.status} {outcome.point}: {outcome.error}")
    print(f"executed notebooks : {result.out_dir}/<point>.ipynb")
    print(f"MLflow             : parent run {result.parent_run_id} in experiment "
          f"{plan.experiment!r} ({redact_uri(plan.tracking_uri)}); "
          "make ui -> http://127.0.0.1:5000", flush=True)
