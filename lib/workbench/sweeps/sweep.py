"""Sweeps: ``notebooks/train.ipynb`` executed by papermill once per grid point, nested in MLflow.

Data flow::

    overrides --plan_sweep--> SweepPlan (validated; nothing computed or written yet)
      --prepare_store--> migrated store + one parent run (params: the grid)
      --executor (local threads | Ray tasks)--> execute_point, one per point:
            papermill -> fresh kernel -> workbench.training.trainer (a child run under the parent)
      --> PointOutcome per point --> result table, exit code

Properties:

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
  cluster; a retried task first looks for its point's FINISHED run (no duplicates); a head
  that stops answering ends the sweep with :class:`ClusterLost`, its runs closed
  (:mod:`workbench.sweeps.ray_cluster`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from workbench import console
from workbench.sweeps.executors import Executor, make_executor
from workbench.sweeps.kernels import check_kernels
from workbench.sweeps.plan import SweepPlan, plan_sweep
from workbench.sweeps.point import (
    FAILED,
    FINISHED,
    KILLED,
    SKIPPED,
    ClusterLost,
    PointOutcome,
    outcome_from_run,
    point_specs,
)
from workbench.sweeps.request import SweepRequest
from workbench.sweeps.store import (
    finished_children,
    parent_closed_on_error,
    prepare_store,
    reap_dead_points,
    start_parent_run,
)
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import (
    MAX_TAG_VALUE_LENGTH,
    is_embedded,
    truncate,
)


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


def run_sweep(overrides: Sequence[str] | SweepRequest) -> SweepResult:
    """Plan, prepare the store, run the points, close the parent run, print the table.

    ``overrides`` may be checked already (:func:`workbench.sweeps.request.check_request`).
    Raises :class:`ConfigError` for a bad request (a kernel that is missing or lacks the
    workbench included; before anything is written),
    ``KeyboardInterrupt`` when stopped (running points are stopped and marked KILLED) and
    :class:`ClusterLost` when the Ray head stops answering (the same, then the parent run is
    closed FAILED).
    """
    plan = plan_sweep(overrides)
    check_kernels(p.kernel for p in plan.points)  # each exists and holds the workbench
    executor = make_executor(plan)
    try:
        return sweep_with(plan, executor)
    finally:
        executor.close()


def sweep_with(plan: SweepPlan, executor: Executor) -> SweepResult:
    """The sweep proper, on a connected executor."""
    started = time.perf_counter()
    client, experiment_id = prepare_store(plan.tracking_uri, plan.experiment)
    plan.out_dir.mkdir(parents=True, exist_ok=True)  # before any run exists
    parent_id = start_parent_run(client, experiment_id, plan)
    with parent_closed_on_error(client, parent_id):
        return sweep_points(plan, executor, client, experiment_id, parent_id, started)


def sweep_points(plan: SweepPlan, executor: Executor, client: MlflowClient,
                 experiment_id: str, parent_id: str, started: float) -> SweepResult:
    """The points of a sweep whose parent run exists, then the parent closed."""
    reap_dead_points(plan)
    earlier = finished_children(client, experiment_id, plan.sweep_id)
    todo = [p for p in plan.points if p.name not in earlier]
    outcomes = {name: outcome_from_run(name, SKIPPED, run, notebook=str(
        plan.out_dir / f"{name}.ipynb")) for name, run in earlier.items()
        if name in {p.name for p in plan.points}}
    specs = point_specs(plan, todo, parent_id, experiment_id, executor.cpus_per_point)
    print_plan(plan, executor, parent_id, len(todo), len(outcomes))
    status = None
    lost: ClusterLost | None = None
    with progress_bar(len(todo), plan.sweep_id) as report:
        def record(outcome: PointOutcome) -> None:
            outcomes[outcome.point] = outcome
            report(outcome)

        try:
            executor.run(specs, plan.out_dir, record)
        except KeyboardInterrupt:
            status = KILLED
        except ClusterLost as exc:
            status, lost = FAILED, exc
    ordered = [outcomes[p.name] for p in plan.points if p.name in outcomes]
    wall = time.perf_counter() - started
    status = finish_parent(client, parent_id, ordered, wall, status)
    result = SweepResult(plan.sweep_id, parent_id, status, ordered, plan.out_dir, wall)
    print_results(result, plan)
    if status == KILLED:
        raise KeyboardInterrupt
    if lost is not None:
        unfinished = len(plan.points) - sum(o.ok for o in ordered)
        raise ClusterLost(
            f"{lost}: {unfinished} of {len(plan.points)} points did not finish (runs in flight "
            "closed KILLED); restart the cluster and run the same command again to resume "
            "(FINISHED points are skipped)") from lost
    return result


def finish_parent(client: MlflowClient, parent_id: str, outcomes: Sequence[PointOutcome],
                  wall_s: float, status: str | None = None) -> str:
    """Close the parent run: FINISHED when every point is, else FAILED (or KILLED).

    ``sweep/attempt_wall_time_s`` is this attempt's wall time; ``sweep/wall_time_s`` the sum
    over every attempt of the sweep (a resume that had nothing left to run adds seconds, it
    does not replace the hours the points took).
    """
    failed = [o for o in outcomes if not o.ok]
    status = status or (FAILED if failed else FINISHED)
    earlier = client.get_run(parent_id).data.metrics.get("sweep/wall_time_s", 0.0)
    metrics = {
        "sweep/points_finished": sum(o.ok for o in outcomes),
        "sweep/points_failed": len(failed),
        "sweep/attempt_wall_time_s": wall_s,
        "sweep/wall_time_s": earlier + wall_s,
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


@contextlib.contextmanager
def progress_bar(total: int, sweep_id: str) -> Any:
    """A tqdm bar over points; yields a reporter that prints one line per finished point."""
    bar = console.progress(total, f"sweep {sweep_id}", "point")

    def report(outcome: PointOutcome) -> None:
        bar.update(1)
        bar.write(f"{outcome.status:<8} {outcome.point}  {outcome_figures(outcome)}"
                  + (f"  error: {outcome.error}" if outcome.error else "")
                  + (f"  note: {outcome.note}" if outcome.note else ""), file=sys.stderr)

    try:
        yield report
    finally:
        bar.close()


def outcome_figures(outcome: PointOutcome) -> str:
    """``reward .. | fps .. | training ..s | point ..s`` for a finished point.

    Training time is ``model.learn`` alone (the report's and MLflow's ``summary/wall_time_s``);
    the point's time adds the kernel's start, imports, env building and saving.
    """
    parts = []
    if outcome.final_reward is not None:
        parts.append(f"reward {outcome.final_reward:.1f}")
    if outcome.fps is not None:
        parts.append(f"fps {outcome.fps:.0f}")
    if outcome.train_s is not None:
        parts.append(f"training {outcome.train_s:.1f}s")
    if outcome.wall_s is not None:
        parts.append(f"point {outcome.wall_s:.0f}s")
    return " | ".join(parts)


def print_plan(plan: SweepPlan, executor: Executor, parent_id: str, todo: int,
               skipped: int) -> None:
    """What the sweep is about to do, printed once."""
    rows = {
        "sweep": f"{plan.sweep_id}  (parent run {parent_id})",
        "grid": f"{plan.env}: {plan.grid_line()} = {len(plan.points)} points",
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
    """The result table: point, status, final reward, fps, training and whole-point time."""
    header = ("point", "status", "final reward", "fps", "training", "point (kernel incl.)")
    rows = [header] + [(
        o.point,
        o.status,
        "-" if o.final_reward is None else f"{o.final_reward:.1f}",
        "-" if o.fps is None else f"{o.fps:.0f}",
        "-" if o.train_s is None else f"{o.train_s:.1f} s",
        "-" if o.wall_s is None else f"{o.wall_s:.0f} s",
    ) for o in outcomes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def print_results(result: SweepResult, plan: SweepPlan) -> None:
    """The final table and where to look. A failure's error is printed twice in all: on its
    point's line when it happens, and in the command's last line (workbench.cli)."""
    print(f"\nSweep {result.sweep_id}: {result.status} in {result.wall_s:.0f} s")
    print("=" * 72)
    print(results_table(result.outcomes))
    print("=" * 72)
    print(f"executed notebooks : {result.out_dir}/<point>.ipynb")
    print(f"MLflow             : parent run {result.parent_run_id} in experiment "
          f"{plan.experiment!r} ({redact_uri(plan.tracking_uri)}); "
          "make ui -> http://127.0.0.1:5000", flush=True)
