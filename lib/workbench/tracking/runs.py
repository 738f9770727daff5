"""Keeping the recorded runs truthful and complete: heartbeats, reaping, outbox sync.

MLflow leaves a run RUNNING forever when its process dies without a word (SIGKILL, power
loss, OOM killer). Every training stamps its run with a heartbeat (tag
``workbench.heartbeat``, Unix seconds, at most every :data:`HEARTBEAT_INTERVAL_S` while it
steps its environments); :func:`reap_stale_runs` (``workbench runs reap``) marks RUNNING runs
whose last sign of life is older than a threshold as KILLED. Writes that never reached the
store stay in the run's outbox (:mod:`workbench.tracking.outbox`); :func:`sync_outboxes`
(``workbench runs sync``) delivers them, and reaping syncs first so that a run that finished
during a store outage is not mistaken for a dead one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from workbench import paths
from workbench.config import ConfigError, load_config
from workbench.tracking import outbox
from workbench.tracking.outbox import HEARTBEAT_TAG
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import check_server, resolve_tracking_uri

HEARTBEAT_INTERVAL_S = 10.0
DEFAULT_STALE_AFTER_S = 300.0
REAPED_TAG = "workbench.reaped"


def check_experiments_writable() -> None:
    """Raise :class:`ConfigError` (exit 2) when ``experiments/`` cannot be written.

    Checked before a run is created: a training that cannot write its store, outbox or
    checkpoints must not start. The probe file is removed at once.
    """
    folder = paths.experiments_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"experiments directory {folder}: not writable ({reason}); fix its permissions or "
            "set WORKBENCH_EXPERIMENTS to a writable directory"
        ) from exc


def last_sign_of_life(run: Any) -> float:
    """Unix time of a run's last heartbeat, or its start when it never sent one."""
    beat = run.data.tags.get(HEARTBEAT_TAG)
    try:
        return float(beat) if beat is not None else run.info.start_time / 1000.0
    except ValueError:
        return run.info.start_time / 1000.0


def heartbeat_age_s(run: Any, now: float | None = None) -> float:
    """Seconds since the run's last sign of life."""
    return (now if now is not None else time.time()) - last_sign_of_life(run)


def running_runs(client: MlflowClient, filter_string: str = "",
                 experiment_names: Sequence[str] | None = None) -> list[Any]:
    """All RUNNING runs of the given experiments (default: every experiment in the store)."""
    if experiment_names is None:
        ids = [e.experiment_id for e in client.search_experiments()]
    else:
        found = [client.get_experiment_by_name(n) for n in experiment_names]
        ids = [e.experiment_id for e in found if e is not None]
    if not ids:
        return []
    query = "attributes.status = 'RUNNING'" + (f" and {filter_string}" if filter_string else "")
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(ids, query, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def reap_stale_runs(
    tracking_uri: str | None = None,
    *,
    older_than_s: float = DEFAULT_STALE_AFTER_S,
    experiment_names: Sequence[str] | None = None,
    filter_string: str = "",
    now: float | None = None,
) -> list[str]:
    """Mark RUNNING runs without a heartbeat for ``older_than_s`` seconds as KILLED.

    The store is ``tracking_uri``, else the configured one (``MLFLOW_TRACKING_URI``, then
    the embedded store). ``experiment_names`` limits the search (default: all experiments);
    ``filter_string`` is an MLflow search filter ANDed to ``status = 'RUNNING'``, e.g.
    ``"tags.sweep_id = 'abc'"`` for one sweep's points. Local outboxes are synced first.
    Each reaped run gets status KILLED, ``end_time`` = its last heartbeat, an ``error`` tag
    saying why and how to resume, and tag ``workbench.reaped``. Returns the reaped run ids.

    A live training refreshes its heartbeat every ``HEARTBEAT_INTERVAL_S`` seconds while it
    steps (an evaluation or a very long update can delay it): keep ``older_than_s`` well above
    that. Heartbeats use the training machine's clock.
    """
    uri = tracking_uri or resolve_tracking_uri(None)
    check_server(uri)
    client = MlflowClient(tracking_uri=uri)
    sync_outboxes(uri)
    now = time.time() if now is None else now
    reaped = []
    for run in running_runs(client, filter_string, experiment_names):
        age = heartbeat_age_s(run, now)
        if age <= older_than_s:
            continue
        last = last_sign_of_life(run)
        when = dt.datetime.fromtimestamp(last, dt.UTC).isoformat(timespec="seconds")
        run_id = run.info.run_id
        message = (
            f"reaped: no heartbeat for {age:.0f} s (last {when}); the training process ended "
            f"without recording it (killed, crashed machine); resume with: workbench train "
            f"resume={run_id}"
        )
        client.log_batch(run_id, tags=[RunTag("error", message), RunTag(REAPED_TAG, f"{now:.0f}")])
        client.set_terminated(run_id, "KILLED", end_time=int(last * 1000))
        reaped.append(run_id)
    return reaped


def sync_outboxes(tracking_uri: str | None = None, run_id: str | None = None
                  ) -> list[outbox.SyncResult]:
    """Deliver the local outboxes recorded for this store (``workbench runs sync``)."""
    uri = tracking_uri or resolve_tracking_uri(None)
    results = []
    client: MlflowClient | None = None
    for folder in outbox.outboxes(run_id):
        recorded = outbox.recorded_uri(folder)
        if recorded is not None and recorded != redact_uri(uri):
            results.append(outbox.SyncResult(folder.name, 0, -1,
                                             f"recorded for store {recorded}; skipped"))
            continue
        client = client or MlflowClient(tracking_uri=uri)
        results.append(outbox.sync_outbox(client, folder))
    return results


# --------------------------------------------------------------------------- command line

REAP_HELP = "mark RUNNING runs whose heartbeat is older than --older-than seconds as KILLED"
SYNC_HELP = "deliver tracking writes kept in experiments/outbox/ while the store was unreachable"


def add_cli_actions(actions: Any) -> None:
    """``workbench runs reap`` and ``workbench runs sync`` (sub-parsers of ``runs``)."""
    reap = actions.add_parser("reap", help=REAP_HELP, description=REAP_HELP)
    reap.add_argument(
        "--older-than", type=float, default=DEFAULT_STALE_AFTER_S, metavar="S",
        help=f"heartbeat age in seconds (default {DEFAULT_STALE_AFTER_S:g})",
    )
    reap.set_defaults(runs_func=reap_command)
    sync = actions.add_parser("sync", help=SYNC_HELP, description=SYNC_HELP)
    sync.set_defaults(runs_func=sync_command)
    for parser in (reap, sync):
        parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                            help="Hydra overrides selecting the store, e.g. tracking.uri=...")


def configured_uri(overrides: Sequence[str]) -> str:
    """The tracking store the config (and ``MLFLOW_TRACKING_URI``) selects."""
    return resolve_tracking_uri(load_config(overrides).tracking.uri)


def reap_command(args: argparse.Namespace) -> int:
    """``workbench runs reap [--older-than S]``: prints each reaped run id."""
    if args.older_than < 0:
        raise ConfigError(f"--older-than {args.older_than:g}: must be >= 0 seconds")
    uri = configured_uri(args.overrides)
    reaped = reap_stale_runs(uri, older_than_s=args.older_than)
    for run_id in reaped:
        print(f"reaped {run_id}: KILLED (no heartbeat for more than {args.older_than:g} s)")
    print(f"{len(reaped)} run(s) reaped in {redact_uri(uri)}")
    return 0


def sync_command(args: argparse.Namespace) -> int:
    """``workbench runs sync``: exit 0 when every outbox was delivered, else 1."""
    uri = configured_uri(args.overrides)
    check_experiments_writable()
    results = sync_outboxes(uri)
    for result in results:
        state = "synced" if result.left == 0 else "pending" if result.left > 0 else "skipped"
        note = f" ({result.note})" if result.note else ""
        print(f"{state} {result.run_id}: {result.delivered} write(s) delivered{note}")
    print(f"{len(results)} outbox(es) in {outbox.outbox_root()}")
    return 0 if all(r.left == 0 for r in results) else 1
