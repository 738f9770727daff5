"""The run's outbox: tracking writes that survive an unreachable or locked store.

Design (a training neither dies after minutes of retries nor silently drops metrics):

1. **Journal first.** Every write a training makes to its MLflow run (metric batches, tags,
   the final status, artifacts such as checkpoints and the model) is first appended to a local
   journal, ``experiments/outbox/<run_id>/journal.jsonl`` (artifact files are copied next to
   it). Nothing that was journaled can be lost, not even by a SIGKILL.
2. **Deliver in the background.** A thread sends the journaled writes to the store in order
   and acknowledges each in the journal. Training never waits for the store: when it is down
   or locked, the thread retries with a capped backoff (0.5 s doubling to 15 s) while training
   goes on; MLflow's own HTTP retries are shortened for the run so one attempt fails fast.
   Consecutive metric batches (one per PPO iteration) are merged into one ``log_batch`` call
   at most every ``batch_interval_s`` (1 s): a call costs the store about the same CPU whatever
   its size, and a longer interval bought nothing measurable while heartbeats, tags and
   outage detection queued behind it (docs/benchmarks/costs.md#tracking-overhead).
3. **Only an acknowledged write leaves the journal.** A refusal is judged first
   (:mod:`workbench.tracking.rejection`): a refused login is retried like an outage, a run
   the store lost is re-created from the journal, a run in the store's trash waits, and only
   a single malformed write to a live run is dropped (with a warning).
4. **Drain at the end.** When the run ends the client waits up to ``drain_timeout_s`` for the
   queue to empty. Whatever the store still has not accepted stays in the outbox and
   ``workbench runs sync`` (or resuming the run) delivers it later; the console says so.

Replays are idempotent: metrics carry their original timestamp and step (MLflow ignores an
identical metric row), tags and the status are last-write-wins, artifacts are overwritten.
MLflow's own asynchronous logging (``synchronous=False``) is not used because it neither
persists pending writes nor retries them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import DatasetInput, Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from workbench import paths
from workbench.tracking import rejection
from workbench.tracking.journal import (
    JOURNAL,
    LOCK_FILE,
    STORE_FILE,
    Journal,
    apply,
    clear_reap,
    encode_batch,
    encode_dataset_input,
    is_metric_only,
    merge_metric_batches,
    metric_batches,
    read_info,
    stage_files,
    write_info,
)
from workbench.tracking.redaction import redact_uri
from workbench.tracking.rejection import CannotRecreate, Verdict
from workbench.tracking.store import truncate

# One HTTP attempt must fail fast; the outbox does the retrying (MLflow's defaults retry for
# about four minutes per request). Only set where the user has not chosen values.
FAST_FAIL_HTTP = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
}

HEARTBEAT_TAG = "workbench.heartbeat"


def shorten_http_retries() -> dict[str, str | None]:
    """Set :data:`FAST_FAIL_HTTP` where the user has not chosen values; the previous values
    (for :func:`restore_environment`)."""
    saved = {key: os.environ.get(key) for key in FAST_FAIL_HTTP}
    for key, value in FAST_FAIL_HTTP.items():
        os.environ.setdefault(key, value)
    return saved


def restore_environment(saved: Mapping[str, str | None]) -> None:
    """Put back the variables :func:`shorten_http_retries` found (unset where they were)."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def fast_fail_http() -> Iterator[None]:
    """MLflow's HTTP retries shortened (:data:`FAST_FAIL_HTTP`) within the block."""
    saved = shorten_http_retries()
    try:
        yield
    finally:
        restore_environment(saved)


def outbox_root() -> Path:
    """Where outboxes live: ``experiments/outbox``."""
    return paths.experiments_dir() / "outbox"


def short_error(exc: BaseException, limit: int = 200) -> str:
    """First line of an exception, for console messages."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return truncate(f"{type(exc).__name__}: {text}", limit)


# --------------------------------------------------------------------------- the client


class RunWriter:
    """Every write a training makes to its MLflow run, in one place: the run's outbox.

    A training holds this object, not an ``MlflowClient``: it can only perform these writes,
    each either **journaled and delivered** (appended to the run's journal first, sent in
    order by a background thread, kept until the store acknowledges it, replayed by
    ``workbench runs sync`` after a crash or an outage) or **best effort** by name:

    =====================  =============================================  ==================
    operation              what it writes                                 guarantee
    =====================  =============================================  ==================
    ``log_batch``          params, metrics, tags                          journaled
    ``set_tag``            one tag                                        journaled
    ``log_artifacts``,     files and folders (checkpoints, the model,     journaled (copied
    ``log_artifact``,      the manifest, videos, the resolved config)     into the outbox)
    ``log_text``
    ``delete_artifacts``   an artifact folder (checkpoint retention)      journaled, in order
    ``log_inputs``         MLflow run inputs (robot model, Hub dataset)   journaled
    ``logged_models``      the checkpoints' MLflow logged models, as the  journaled; the last
                           whole state they should be in                  state is what counts
    ``set_terminated``     the run's final status                         journaled
    ``heartbeat``          tag ``workbench.heartbeat``                    best effort: never
                                                                          journaled or retried
    =====================  =============================================  ==================

    Reads (``get_run``, ``list_artifacts``...) go to :attr:`store`, a plain ``MlflowClient``.
    Writes return at once. ``skip_logged`` maps metric keys to the last step the store already
    holds for them: after a resume the iterations between the checkpoint and the interruption
    are recomputed, and their values (identical on the same machine) are not logged twice.
    ``origin`` says how the run was created (:func:`workbench.tracking.rejection.origin_of`),
    so that a store that loses the run gets it back; after that :attr:`store_run_id` is the
    id of the run in the store. A write for another run id goes straight to the store.
    """

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        *,
        origin: Mapping[str, Any] | None = None,
        skip_logged: Mapping[str, int] | None = None,
        drain_timeout_s: float = 10.0,
        batch_interval_s: float = 1.0,
        folder: Path | None = None,
    ) -> None:
        self.store = MlflowClient(tracking_uri=tracking_uri)  # reads, and delivery
        self.run_id = run_id
        self.uri = tracking_uri
        self.skip_logged = dict(skip_logged or {})
        self.drain_timeout_s = drain_timeout_s
        self.batch_interval_s = batch_interval_s
        self.urgent = False  # flush/close: deliver without waiting for more to batch
        self.journal = Journal(folder or outbox_root() / run_id)
        self.journal.folder.mkdir(parents=True, exist_ok=True)
        self._lock_handle = (self.journal.folder / LOCK_FILE).open("a")
        try:
            fcntl.flock(self._lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_handle.close()
            raise RuntimeError(
                f"run {run_id} is being recorded by another live process "
                f"(outbox {self.journal.folder} is locked)"
            ) from exc
        info = read_info(self.journal.folder)  # an earlier process's origin and re-creation
        write_info(self.journal.folder, {
            **info, "tracking_uri": redact_uri(tracking_uri), "run_id": run_id,
            "user": rejection.login_of(tracking_uri) or info.get("user"),
            "origin": info.get("origin") or (dict(origin) if origin else None),
        })
        self.target = str(info.get("recreated_as") or run_id)  # the run's id in the store
        self.queue: deque[dict[str, Any]] = deque(self.journal.pending())
        self.seq = self.journal.last_seq()
        self.cond = threading.Condition()
        self.wake = threading.Event()
        self.closing = False
        self.outage_since: float | None = None
        self.last_error: BaseException | None = None
        self.verdict: Verdict | None = None  # why the last attempt failed (None: it did not)
        self.ended = False  # the run's status was delivered: a late heartbeat revives nothing
        self.delivered = 0
        self.rejected: list[str] = []
        self._saved_env = shorten_http_retries()
        self.thread = threading.Thread(target=self._deliver, name="workbench-outbox", daemon=True)
        self.thread.start()
        self.heartbeat()  # alive from its creation on, not only once it steps

    @property
    def store_run_id(self) -> str:
        """The run's id in the store: ``run_id``, or the run re-created after the store lost it."""
        return self.target

    @property
    def unreachable(self) -> bool:
        """The store has not answered the latest delivery attempts (an outage is ongoing)."""
        return self.outage_since is not None

    # ----------------------------------------------------------------- the writes

    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[Metric] = (),
        params: Sequence[Param] = (),
        tags: Sequence[RunTag] = (),
    ) -> None:
        """Params, metrics and tags (MlflowClient.log_batch's arguments)."""
        metrics = [m for m in metrics if m.step > self.skip_logged.get(m.key, -1)]
        if metrics or params or tags:
            self._submit(run_id, encode_batch(metrics, params, tags))

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        """One tag."""
        self._submit(run_id, encode_batch([], [], [RunTag(key, str(value))]))

    def set_terminated(self, run_id: str, status: str | None = None,
                       end_time: int | None = None) -> None:
        """The run's final status (FINISHED unless given)."""
        end_time = end_time if end_time is not None else int(time.time() * 1000)
        self._submit(run_id, {"op": "set_terminated", "status": status or "FINISHED",
                              "end_time": end_time})

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        """A folder's files under ``artifact_path`` (copied into the outbox first)."""
        record = {"op": "log_artifacts", "artifact_path": artifact_path}
        self._submit(run_id, record, copy_from=Path(local_dir))

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """One file (or a folder's files) under ``artifact_path``."""
        source = Path(local_path)
        if source.is_dir():
            self.log_artifacts(run_id, local_path, artifact_path)
            return
        record = {"op": "log_artifacts", "artifact_path": artifact_path}
        self._submit(run_id, record, copy_from=source)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        """A text artifact."""
        directory, _, name = artifact_file.rpartition("/")
        record = {"op": "log_artifacts", "artifact_path": directory or None}
        self._submit(run_id, record, text=(name, text))

    def delete_artifacts(self, run_id: str, artifact_path: str) -> None:
        """Delete an artifact folder of the run (after the writes queued before it)."""
        self._submit(run_id, {"op": "delete_artifacts", "artifact_path": artifact_path})

    def log_inputs(self, run_id: str, datasets: Sequence[DatasetInput]) -> None:
        """MLflow run inputs (``run.inputs.dataset_inputs``)."""
        self._submit(run_id, {"op": "log_inputs",
                              "datasets": [encode_dataset_input(d) for d in datasets]})

    def logged_models(self, run_id: str, state: Mapping[str, Any]) -> None:
        """The whole state the run's checkpoint logged models should be in
        (:func:`workbench.tracking.logged_models.sync_logged_models`); a later state replaces
        an earlier one that has not been delivered yet."""
        self._submit(run_id, {"op": "logged_models", "state": dict(state)})

    def heartbeat(self) -> None:
        """Stamp the run as alive (tag ``workbench.heartbeat``); never journaled or retried.

        Delivering it also undoes a reap that came while the run was alive (its heartbeats
        did not reach the store for a while): the run is RUNNING again, without the reap's
        tags.
        """
        with self.cond:
            if any(r.get("op") == "heartbeat" for r in self.queue):
                return
            self.queue.append({"op": "heartbeat", "time": time.time()})
            self.cond.notify()

    # ----------------------------------------------------------------- lifecycle

    def pending(self) -> int:
        """Writes not yet accepted by the store."""
        with self.cond:
            return sum(1 for r in self.queue if r["op"] != "heartbeat")

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the queue to empty; True when it did."""
        deadline = time.monotonic() + timeout_s
        self.urgent = True
        self.wake.set()
        try:
            with self.cond:
                while self.queue and time.monotonic() < deadline:
                    self.cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                return not self.queue
        finally:
            self.urgent = False

    def close(self) -> int:
        """Drain (up to ``drain_timeout_s``), stop the thread; returns writes left in the outbox."""
        drained = self.flush(self.drain_timeout_s)
        with self.cond:
            self.closing = self.urgent = True
            self.cond.notify_all()
        self.wake.set()
        self.thread.join(timeout=1.0 if drained else 0.1)
        left = self.pending()
        restore_environment(self._saved_env)
        fcntl.flock(self._lock_handle, fcntl.LOCK_UN)
        self._lock_handle.close()
        if left == 0 and not self.thread.is_alive():
            shutil.rmtree(self.journal.folder, ignore_errors=True)
        else:
            print(f"workbench: warning: {left} tracking writes of run {self.run_id} "
                  f"{self._left_reason()}", file=sys.stderr, flush=True)
        return left

    def _left_reason(self) -> str:
        """Why writes are left at the end, where they are, and what delivers them."""
        folder = self.journal.folder
        if self.verdict is Verdict.LOGIN and self.last_error is not None:
            return ("were not accepted: "
                    + rejection.login_advice(self.uri, folder, self.last_error))
        if self.verdict is Verdict.DELETED_RUN:
            return "were not accepted: " + rejection.deleted_advice(self.target, folder)
        reason = short_error(self.last_error) if self.last_error else "timed out"
        return (f"could not reach the store {redact_uri(self.uri)} ({reason}); they are kept in "
                f"{folder}: run `workbench runs sync` when it is back")

    # ----------------------------------------------------------------- internals

    def _submit(
        self,
        run_id: str,
        record: dict[str, Any],
        copy_from: Path | None = None,
        text: tuple[str, str] | None = None,
    ) -> None:
        if run_id != self.run_id:  # not this run's write: no outbox, plain MLflow
            self._direct(run_id, record, copy_from, text)
            return
        with self.cond:
            self.seq += 1
            record = {"seq": self.seq, **record}
            if copy_from is not None or text is not None:
                stage_files(self.journal.files(self.seq), copy_from, text)
            self.journal.append(record)
            self.queue.append(record)
            self.cond.notify()

    def _direct(
        self, run_id: str, record: dict[str, Any], copy_from: Path | None,
        text: tuple[str, str] | None,
    ) -> None:
        journal = Journal(self.journal.folder / "direct")
        record = {"seq": 0, **record}
        if copy_from is not None or text is not None:
            stage_files(journal.files(0), copy_from, text)
        try:
            apply(self.store, run_id, record, journal)
        finally:
            shutil.rmtree(journal.folder, ignore_errors=True)

    def _deliver(self) -> None:
        failures = 0
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue or (self.closing and failures):
                    return
                records = metric_batches(self.queue)
                superseded = self._superseded(records[0])
            record = merge_metric_batches(records) if len(records) > 1 else records[0]
            if superseded:  # a later state of the logged models is queued: only it counts
                self._done(record)
                continue
            try:
                self._send(record)
            except Exception as exc:
                if self._settled(records, record, exc):
                    continue
                failures += 1
                self._outage(exc)
                self.wake.clear()
                self.wake.wait(timeout=min(0.5 * 2 ** (failures - 1), 15.0))
                continue
            failures = 0
            self.verdict = None
            for each in records:
                self._done(each)
            if is_metric_only(record) and not self.urgent and not self._other_waiting():
                self.wake.wait(timeout=self.batch_interval_s)  # let the next batches gather
                self.wake.clear()
            if self.outage_since is not None:
                print(
                    f"workbench: tracking store reachable again after "
                    f"{time.monotonic() - self.outage_since:.0f} s; delivering the outbox",
                    file=sys.stderr, flush=True,
                )
                self.outage_since = None

    def _settled(self, records: Sequence[dict[str, Any]], record: Mapping[str, Any],
                 exc: BaseException) -> bool:
        """Judge a failed write; True when it was settled (go on at once), False to back off.

        A heartbeat is never retried. A refused write to a live run is dropped (a merged
        batch is resent in parts to find the refused one); a run the store lost is re-created;
        an outage, a refused login or a deleted run keeps everything and backs off.
        """
        if record["op"] == "heartbeat":
            self._done(record)
        self.verdict = rejection.judge(self.store, self.target, exc)
        self.last_error = exc
        if self.verdict is Verdict.MISSING_RUN:
            return self._recreate()
        if self.verdict is not Verdict.REJECTED:
            return False
        if record["op"] != "heartbeat" and len(records) == 1:
            self._reject(record, exc)
        elif record["op"] != "heartbeat":
            for each in records:
                self._retry_alone(each)
        self.verdict = None
        return True

    def _recreate(self) -> bool:
        """Re-create the run the store lost, from the journal; False when that failed."""
        try:
            new = rejection.recreate_run(self.store, self.uri, self.journal)
        except Exception as exc:  # CannotRecreate, or the store failed again: keep, back off
            self.last_error = exc
            if isinstance(exc, CannotRecreate):
                self.verdict = Verdict.OUTAGE
            return False
        old, self.target = self.target, new
        self.verdict = None
        print(f"workbench: warning: run {old} no longer exists in the tracking store "
              f"{redact_uri(self.uri)} (replaced or purged); re-created it from the outbox "
              f"journal as run {new} (tag {rejection.RECREATED_TAG}={self.run_id}); "
              "training goes on recording there", file=sys.stderr, flush=True)
        return True

    def _superseded(self, record: Mapping[str, Any]) -> bool:
        """A logged-models state with a later one queued (call with the condition held)."""
        return record.get("op") == "logged_models" and any(
            r is not record and r.get("op") == "logged_models" for r in self.queue)

    def _other_waiting(self) -> bool:
        """A write other than a metric batch is queued: a heartbeat, a tag, params, artifacts.

        Only metric batches are worth gathering; everything else goes out at once, so that a
        heartbeat is never held back behind the batching wait.
        """
        with self.cond:
            return any(not is_metric_only(r) for r in self.queue)

    def _retry_alone(self, record: Mapping[str, Any]) -> None:
        """A merged batch was refused: send its parts one by one to reject only the bad one."""
        try:
            self._send(record)
        except Exception as exc:
            self._reject(record, exc)
            return
        self._done(record)

    def _send(self, record: Mapping[str, Any]) -> None:
        if record["op"] == "heartbeat":
            tag = RunTag(HEARTBEAT_TAG, f"{record['time']:.3f}")
            self.store.log_batch(self.target, tags=[tag])
            self._revive()
        else:
            apply(self.store, self.target, record, self.journal)

    def _revive(self) -> None:
        """The run was reaped while this process was alive: RUNNING again, reap marks gone."""
        if self.ended or not clear_reap(self.store, self.target):
            return
        self.store.update_run(self.target, status="RUNNING")
        print(f"workbench: warning: run {self.target} had been marked KILLED by `workbench runs "
              "reap` (its heartbeats had not reached the store for a while); it is still "
              "training, so it is RUNNING again", file=sys.stderr, flush=True)

    def _done(self, record: Mapping[str, Any]) -> None:
        if record["op"] != "heartbeat":
            self.journal.append({"ack": record["seq"]})
            if record["op"] == "delete_artifacts":
                self.journal.prune_deleted(record["artifact_path"] or "", record["seq"])
            elif record["op"] == "set_terminated":
                self.ended = True
            self.delivered += 1
        with self.cond:
            if self.queue and self.queue[0] is record:
                self.queue.popleft()
            self.cond.notify_all()

    def _reject(self, record: Mapping[str, Any], exc: BaseException) -> None:
        self.rejected.append(short_error(exc))
        print(f"workbench: warning: the tracking store rejected a {record['op']} write of run "
              f"{self.target}, which is dropped: {short_error(exc)}", file=sys.stderr,
              flush=True)
        self._done(record)

    def _outage(self, exc: BaseException) -> None:
        self.last_error = exc
        if self.outage_since is not None:
            return
        self.outage_since = time.monotonic()
        folder = self.journal.folder
        if self.verdict is Verdict.LOGIN:
            why = f"refused the login ({short_error(exc)})"
        elif self.verdict is Verdict.DELETED_RUN:
            why = f"holds run {self.target} as deleted"
        elif isinstance(exc, CannotRecreate):
            why = f"lost the run: {exc}"
        else:
            why = f"not reachable ({short_error(exc)})"
        print(f"workbench: warning: tracking store {redact_uri(self.uri)} {why}; training "
              f"continues, writes are kept in {folder} and retried", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- outboxes


def outboxes(run_id: str | None = None) -> list[Path]:
    """Outbox folders under ``experiments/outbox`` (one run's, or all)."""
    root = outbox_root()
    if not root.is_dir():
        return []
    found = sorted(p for p in root.iterdir() if (p / JOURNAL).exists() or (p / STORE_FILE).exists())
    return [p for p in found if run_id is None or p.name == run_id]


def recorded_uri(folder: Path) -> str | None:
    """The (redacted) tracking URI an outbox was written for."""
    recorded = read_info(folder).get("tracking_uri")
    return str(recorded) if recorded is not None else None
