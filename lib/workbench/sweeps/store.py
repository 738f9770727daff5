"""The sweep's runs in the MLflow store: the store prepared once, the parent run, the points'
child runs (tags ``sweep_id``, ``sweep.role``, ``sweep.point``) and the ones already done.
"""

from __future__ import annotations

import contextlib
import shlex
import sqlite3
import sys
from collections.abc import Iterator

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from workbench.sweeps.plan import SweepPlan
from workbench.tracking import runs
from workbench.tracking.redaction import scrub, scrub_command
from workbench.tracking.store import (
    MAX_TAG_VALUE_LENGTH,
    ensure_experiment,
    is_embedded,
    log_params,
    make_client,
    source_tags,
    truncate,
)


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


def reopen_parent(client: MlflowClient, run: Run) -> None:
    """A resumed sweep's or study's parent: RUNNING again, without the error of the invocation
    that ended it (this one records its own)."""
    client.update_run(run.info.run_id, status="RUNNING")
    if "error" in run.data.tags:
        client.delete_tag(run.info.run_id, "error")


def start_parent_run(client: MlflowClient, experiment_id: str, plan: SweepPlan) -> str:
    """The sweep's parent run: found again on resume (set RUNNING), else created."""
    found = search_all(client, experiment_id,
                       f"tags.sweep_id = '{plan.sweep_id}' and tags.`sweep.role` = 'parent'")
    if found:
        run_id = found[0].info.run_id
        reopen_parent(client, found[0])
        # `sweep.id=NAME` may extend the sweep (more seeds): the description says so.
        note = found[0].data.tags.get("mlflow.note.content", "")
        if plan.describe() not in note:
            client.set_tag(run_id, "mlflow.note.content",
                           scrub(f"{note} Then: {plan.describe()}" if note else plan.describe()))
        return run_id
    tags = {**command_source_tags(), "sweep_id": plan.sweep_id, "sweep.role": "parent",
            "env": plan.env, "mlflow.note.content": plan.describe()}
    run = client.create_run(experiment_id, run_name=plan.sweep_id, tags=scrub(tags))
    log_params(client, run.info.run_id, plan.grid_params())
    return run.info.run_id


@contextlib.contextmanager
def parent_closed_on_error(client: MlflowClient, parent_id: str) -> Iterator[None]:
    """Close the parent run if the sweep or study fails before it closes it itself.

    An error while setting up the points (a folder the file system refuses, a store that went
    away) would otherwise leave the parent RUNNING: it ends FAILED with the error (KILLED on
    Ctrl-C), and the exception goes on.
    """
    try:
        yield
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        with contextlib.suppress(Exception):  # the store itself may be what failed
            if client.get_run(parent_id).info.status == "RUNNING":
                client.set_tag(parent_id, "error", truncate(
                    scrub_command(f"{type(exc).__name__}: {exc}"), MAX_TAG_VALUE_LENGTH))
                client.set_terminated(parent_id, status)
        raise


def command_source_tags() -> dict[str, str]:
    """"Source" and "Created by" of a parent run: this process's ``workbench`` command."""
    return source_tags(scrub_command(shlex.join(["workbench", *sys.argv[1:]])))


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
