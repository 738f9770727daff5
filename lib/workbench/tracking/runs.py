"""Keeping the recorded runs truthful and complete: heartbeats, reaping, outbox sync.

MLflow leaves a run RUNNING forever when its process dies without a word (SIGKILL, power
loss, OOM killer). Every training stamps its run with a heartbeat (tag
``workbench.heartbeat``, Unix seconds, at most every :data:`HEARTBEAT_INTERVAL_S` while it
steps its environments); :func:`reap_stale_runs` (``workbench runs reap``) marks RUNNING runs
whose last sign of life is older than a threshold as KILLED. A run whose heartbeat is younger
than :data:`LIVE_WINDOW_S` is live whatever the threshold, and is never reaped; a run reaped
while alive anyway (its heartbeats did not reach the store) undoes the reap with its next
write (:mod:`workbench.tracking.outbox`).

Writes that never reached the store stay in the run's outbox; :func:`sync_outboxes`
(``workbench runs sync``) delivers them, judging every refusal first
(:mod:`workbench.tracking.rejection`): only an acknowledged write leaves the journal. Reaping
syncs first so that a run that finished during a store outage is not mistaken for a dead one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import RunTag
from mlflow.tracking import MlflowClient

from workbench import paths
from workbench.config import ConfigError, load_config
from workbench.tracking import outbox, rejection
from workbench.tracking.journal import (
    REAP_ERROR_PREFIX,
    REAPED_TAG,
    Journal,
    locked,
    merge_metric_batches,
    metric_batches,
    read_info,
)
from workbench.tracking.outbox import HEARTBEAT_TAG, short_error
from workbench.tracking.redaction import redact_uri
from workbench.tracking.rejection import CannotRecreate, LoginRefused, Verdict
from workbench.tracking.store import (
    check_store,
    is_embedded,
    resolve_tracking_uri,
    server_problem,
)

__all__ = ["REAPED_TAG", "LoginRefused"]

HEARTBEAT_INTERVAL_S = 10.0
# A heartbeat younger than two intervals means a live training (one may be late by an
# evaluation or a slow store); `runs reap` never touches such a run, whatever --older-than.
LIVE_WINDOW_S = 2 * HEARTBEAT_INTERVAL_S
DEFAULT_STALE_AFTER_S = 300.0


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


@dataclass
class ReapReport:
    """What one reap did: the runs it marked KILLED, and the live ones it left alone."""

    reaped: list[str]
    live: list[tuple[str, float]]  # (run id, heartbeat age in seconds) within LIVE_WINDOW_S


def reap_stale_runs(
    tracking_uri: str | None = None,
    *,
    older_than_s: float = DEFAULT_STALE_AFTER_S,
    experiment_names: Sequence[str] | None = None,
    filter_string: str = "",
    now: float | None = None,
) -> list[str]:
    """Mark RUNNING runs without a heartbeat for ``older_than_s`` seconds as KILLED.

    The ids of the reaped runs; :func:`reap` tells which live runs were spared, too.
    """
    return reap(tracking_uri, older_than_s=older_than_s, experiment_names=experiment_names,
                filter_string=filter_string, now=now).reaped


def reap(
    tracking_uri: str | None = None,
    *,
    older_than_s: float = DEFAULT_STALE_AFTER_S,
    experiment_names: Sequence[str] | None = None,
    filter_string: str = "",
    now: float | None = None,
) -> ReapReport:
    """Mark RUNNING runs without a heartbeat for ``older_than_s`` seconds as KILLED.

    The store is ``tracking_uri``, else the configured one (``MLFLOW_TRACKING_URI``, then
    the embedded store). ``experiment_names`` limits the search (default: all experiments);
    ``filter_string`` is an MLflow search filter ANDed to ``status = 'RUNNING'``, e.g.
    ``"tags.sweep_id = 'abc'"`` for one sweep's points. Local outboxes are synced first.
    Each reaped run gets status KILLED, ``end_time`` = its last heartbeat, an ``error`` tag
    saying why and how to resume, and tag ``workbench.reaped``.

    A live training refreshes its heartbeat every ``HEARTBEAT_INTERVAL_S`` seconds while it
    steps (an evaluation or a very long update can delay it), so a run whose last sign of
    life is younger than :data:`LIVE_WINDOW_S` is never reaped, whatever ``older_than_s``
    says: it is reported as live. Heartbeats use the training machine's clock.
    """
    uri = tracking_uri or resolve_tracking_uri(None)
    check_store(uri)
    client = MlflowClient(tracking_uri=uri)
    sync_outboxes(uri)
    now = time.time() if now is None else now
    report = ReapReport([], [])
    for run in running_runs(client, filter_string, experiment_names):
        # max(0): a heartbeat stamped while this reap ran is younger than `now`
        age = max(0.0, heartbeat_age_s(run, now))
        if age <= LIVE_WINDOW_S:
            if older_than_s < LIVE_WINDOW_S:  # the threshold asked for it: say it was spared
                report.live.append((run.info.run_id, age))
            continue
        if age <= older_than_s:
            continue
        mark_reaped(client, run, age, now)
        report.reaped.append(run.info.run_id)
    return report


def mark_reaped(client: MlflowClient, run: Any, age: float, now: float) -> None:
    """KILLED at its last heartbeat, with an ``error`` tag saying why and how to resume."""
    last = last_sign_of_life(run)
    when = dt.datetime.fromtimestamp(last, dt.UTC).isoformat(timespec="seconds")
    run_id = run.info.run_id
    message = (
        f"{REAP_ERROR_PREFIX}no heartbeat for {age:.0f} s (last {when}); the training process "
        f"ended without recording it (killed, crashed machine); resume with: workbench train "
        f"resume={run_id}"
    )
    mark_killed(client, run_id, message, end_s=last, now=now)


def mark_killed(client: MlflowClient, run_id: str, message: str, *, end_s: float,
                now: float | None = None) -> None:
    """KILLED at ``end_s`` (Unix seconds), ``error`` = ``message`` (it starts with the reap's
    prefix) and tag ``workbench.reaped``: a process that turns out to be alive undoes it with
    its next write (:mod:`workbench.tracking.outbox`)."""
    now = time.time() if now is None else now
    client.log_batch(run_id, tags=[RunTag("error", message), RunTag(REAPED_TAG, f"{now:.0f}")])
    client.set_terminated(run_id, "KILLED", end_time=int(end_s * 1000))


def sync_outboxes(tracking_uri: str | None = None, run_id: str | None = None
                  ) -> list[SyncResult]:
    """Deliver the local outboxes recorded for this store (``workbench runs sync``).

    Raises :class:`LoginRefused` (exit code 2) at the first outbox whose writes the store
    refuses for the login; that outbox and those after it are left as they were.
    """
    return list(iter_sync(tracking_uri, run_id))


def iter_sync(tracking_uri: str | None = None, run_id: str | None = None
              ) -> Iterator[SyncResult]:
    """:func:`sync_outboxes`, one result as each outbox is done.

    An embedded store must be an intact MLflow database (another application's file is
    refused, untouched: :func:`check_store`). A tracking server is asked once, with one
    short ``/health`` request, before the first outbox: when it does not answer, every
    outbox is reported pending at once instead of after MLflow's minutes of retries per
    request, and MLflow's own retries are shortened for the sync (``FAST_FAIL_HTTP``) in
    case the server goes away midway.
    """
    uri = tracking_uri or resolve_tracking_uri(None)
    if is_embedded(uri):
        check_store(uri)
    client: MlflowClient | None = None
    unreachable: str | None = None
    with outbox.fast_fail_http():
        for folder in outbox.outboxes(run_id):
            recorded = outbox.recorded_uri(folder)
            if recorded is not None and recorded != redact_uri(uri):
                yield SyncResult(folder.name, 0, -1, f"recorded for store {recorded}; skipped")
                continue
            if client is None:
                unreachable = server_problem(uri)
                client = MlflowClient(tracking_uri=uri)
            left = len(Journal(folder).pending()) if unreachable is not None else 0
            if left:
                yield SyncResult(folder.name, 0, left, (
                    f"tracking store {redact_uri(uri)} not reachable ({unreachable}); the "
                    "writes are kept: rerun `workbench runs sync` once it answers"))
                continue
            yield sync_outbox(client, folder)


# --------------------------------------------------------------------------- one outbox


@dataclass
class SyncResult:
    """What ``workbench runs sync`` did for one outbox."""

    run_id: str
    delivered: int
    left: int
    note: str = ""
    recreated_as: str | None = None  # the new id of a run the store had lost
    dropped: int = 0  # writes the store refused for good (each one printed)


def sync_outbox(client: MlflowClient, folder: Path) -> SyncResult:
    """Deliver one outbox's pending writes to ``client``'s store, in order; remove it when empty.

    A run the store lost is re-created from the journal; writes to a deleted run wait; a
    write the live run refuses is dropped and printed. Raises :class:`LoginRefused` when the
    store refuses the login, with the outbox left exactly as it was.
    """
    with locked(folder) as acquired:
        if not acquired:
            return SyncResult(folder.name, 0, -1, "in use by a running training; skipped")
        result = deliver_journal(client, Journal(folder))
    if result.left == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def deliver_journal(client: MlflowClient, journal: Journal) -> SyncResult:
    """The pending writes of ``journal``, in order (metric batches merged), each acknowledged."""
    uri, folder = client.tracking_uri, journal.folder
    result = SyncResult(folder.name, 0, 0)
    info = read_info(folder)
    target = str(info.get("recreated_as") or folder.name)
    if info.get("recreated_as") and not info.get("history_replayed"):
        target = result.recreated_as = rejection.recreate_run(client, uri, journal)
    pending = journal.pending()
    while pending:
        group = metric_batches(pending)
        sent = [merge_metric_batches(group)] if len(group) > 1 else group
        try:
            rejection.replay(client, target, sent, journal, lambda _: None)
        except Exception as exc:
            verdict = rejection.judge(client, target, exc)
            if verdict is Verdict.LOGIN and rejection.missing_behind_403(client, uri, folder, exc):
                verdict = Verdict.MISSING_RUN  # a non-admin's 403 for a run the server lost
            if verdict is Verdict.LOGIN:
                raise LoginRefused(rejection.login_advice(uri, folder, exc)) from None
            if verdict is Verdict.MISSING_RUN and result.recreated_as is None:
                try:
                    target = result.recreated_as = rejection.recreate_run(client, uri, journal)
                except CannotRecreate as lost:
                    result.left, result.note = len(pending), str(lost)
                    return result
                continue
            if verdict is not Verdict.REJECTED:
                result.left, result.note = len(pending), (
                    rejection.deleted_advice(target, folder) if verdict is Verdict.DELETED_RUN
                    else short_error(exc))
                return result
            for each in group:  # find the refused write(s) among the group
                delivered = deliver_or_drop(client, target, each, journal)
                acknowledge(journal, each)
                result.delivered += delivered
                result.dropped += not delivered
        else:
            for each in group:
                acknowledge(journal, each)
            result.delivered += len(group)
        del pending[:len(group)]
    return result


def acknowledge(journal: Journal, record: Mapping[str, Any]) -> None:
    """The write is settled: acknowledged in the journal (a deletion prunes staged files)."""
    journal.append({"ack": record["seq"]})
    if record["op"] == "delete_artifacts":
        journal.prune_deleted(record["artifact_path"] or "", record["seq"])


def deliver_or_drop(client: MlflowClient, run_id: str, record: Mapping[str, Any],
                    journal: Journal) -> bool:
    """One write alone: True when delivered; False when refused for good (printed)."""
    try:
        rejection.replay(client, run_id, [record], journal, lambda _: None)
        return True
    except Exception as exc:
        print(f"workbench: warning: run {run_id}: the store rejected a {record['op']} write "
              f"(#{record['seq']}), which is dropped: {short_error(exc)}", file=sys.stderr,
              flush=True)
        return False


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
    """``workbench runs reap [--older-than S]``: prints each reaped run id, and each live one."""
    if args.older_than < 0:
        raise ConfigError(f"--older-than {args.older_than:g}: must be >= 0 seconds")
    uri = configured_uri(args.overrides)
    report = reap(uri, older_than_s=args.older_than)
    for run_id, age in report.live:
        print(f"live {run_id}: heartbeat {age:.0f} s ago, within {LIVE_WINDOW_S:g} s (two "
              "heartbeat intervals): a training is recording it; not reaped")
    for run_id in report.reaped:
        print(f"reaped {run_id}: KILLED (no heartbeat for more than "
              f"{max(args.older_than, LIVE_WINDOW_S):g} s)")
    print(f"{len(report.reaped)} run(s) reaped in {redact_uri(uri)}")
    return 0


def sync_command(args: argparse.Namespace) -> int:
    """``workbench runs sync``: exit 0 when every outbox was delivered, 2 for a refused login
    (the outbox kept as it was), else 1."""
    uri = configured_uri(args.overrides)
    check_experiments_writable()
    results = []
    for result in iter_sync(uri):
        results.append(result)
        print(sync_line(result), flush=True)
    print(f"{len(results)} outbox(es) in {outbox.outbox_root()}")
    return 0 if all(r.left == 0 for r in results) else 1


def sync_line(result: SyncResult) -> str:
    """One outbox's line: synced/pending/skipped, what was delivered, re-created, dropped."""
    state = "synced" if result.left == 0 else "pending" if result.left > 0 else "skipped"
    notes = [result.note] if result.note else []
    if result.recreated_as:
        notes.append(f"the store had lost the run: re-created as {result.recreated_as}, the "
                     f"old id kept in tag {rejection.RECREATED_TAG}")
    if result.dropped:
        notes.append(f"{result.dropped} write(s) refused by the store and dropped, see above")
    note = f" ({'; '.join(notes)})" if notes else ""
    return f"{state} {result.run_id}: {result.delivered} write(s) delivered{note}"
