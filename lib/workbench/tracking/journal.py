"""The outbox's journal: an append-only record of a run's tracking writes and their
acknowledgements, replayed against the store in order (metric batches merged).

Replays are idempotent: metrics carry their original timestamp and step (MLflow ignores an
identical metric row), tags and the status are last-write-wins, artifacts are overwritten.

The journal keeps every write of the run, delivered or not, and the artifact files of every
upload until a later write deletes that artifact (checkpoints beyond ``keep_last``), so that
a run the store lost (a server replaced by an empty one, a run purged) can be re-created from
it; ``store.json`` beside it records the store and how the run was created (its origin).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict, ParseDict
from mlflow.entities import DatasetInput, Metric, Param, RunTag
from mlflow.protos.service_pb2 import DatasetInput as ProtoDatasetInput
from mlflow.tracking import MlflowClient

from workbench.tracking.logged_models import sync_logged_models

JOURNAL = "journal.jsonl"
LOCK_FILE = "lock"
STORE_FILE = "store.json"
MAX_MERGED_METRICS = 1000  # MLflow's limit per log_batch call
REAPED_TAG = "workbench.reaped"  # set by `workbench runs reap` (workbench.tracking.runs)
REAP_ERROR_PREFIX = "reaped: "  # how the reap's ``error`` tag begins


@dataclass
class Journal:
    """Append-only record of one run's writes and their acknowledgements."""

    folder: Path
    lock: threading.RLock = field(default_factory=threading.RLock)  # prune_deleted scans
    # seq -> artifact path of the uploads whose files are still staged (built on first use)
    _uploads: dict[int, str] | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.folder / JOURNAL

    def files(self, seq: int) -> Path:
        """Folder holding the artifact files of write ``seq``."""
        return self.folder / "files" / str(seq)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line and flush it to the OS (survives a kill of this process)."""
        line = json.dumps(record, separators=(",", ":"))
        with self.lock, self.path.open("a") as handle:
            handle.write(line + "\n")
            if self._uploads is not None and record.get("op") == "log_artifacts":
                self._uploads[int(record["seq"])] = record.get("artifact_path") or ""

    def scan(self) -> tuple[list[dict[str, Any]], set[int]]:
        """Every journaled write in order, and the acknowledged sequence numbers.

        A torn last line (the process died while writing it) is ignored: it was never queued.
        """
        with self.lock:
            text = self.path.read_text() if self.path.exists() else ""
        writes: dict[int, dict[str, Any]] = {}
        acked: set[int] = set()
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "ack" in record:
                acked.add(int(record["ack"]))
            elif "seq" in record:
                writes[int(record["seq"])] = record
        return [writes[seq] for seq in sorted(writes)], acked

    def pending(self) -> list[dict[str, Any]]:
        """Journaled writes without an acknowledgement, in order."""
        writes, acked = self.scan()
        return [r for r in writes if r["seq"] not in acked]

    def history(self) -> list[dict[str, Any]]:
        """Journaled writes the store acknowledged, in order."""
        writes, acked = self.scan()
        return [r for r in writes if r["seq"] in acked]

    def prune_deleted(self, artifact_path: str, before_seq: int) -> None:
        """Drop the staged files of earlier uploads that a delivered deletion removed.

        What the store no longer holds need not be kept for a re-creation either; this keeps
        the outbox of a long run as large as the run's artifacts, not as all it ever wrote.
        """
        with self.lock:  # no upload is appended between the scan and the index
            if self._uploads is None:
                writes, _ = self.scan()
                self._uploads = {r["seq"]: r.get("artifact_path") or "" for r in writes
                                 if r.get("op") == "log_artifacts"}
            gone = [seq for seq, path in self._uploads.items()
                    if seq < before_seq and is_under(path, artifact_path)]
            for seq in gone:
                del self._uploads[seq]
        for seq in gone:
            shutil.rmtree(self.files(seq), ignore_errors=True)

    def last_seq(self) -> int:
        """Highest sequence number written so far (0 for a new journal)."""
        if not self.path.exists():
            return 0
        seqs = [0]
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                seqs.append(int(json.loads(line).get("seq", 0)))
        return max(seqs)


def is_under(path: str, folder: str) -> bool:
    """True when artifact ``path`` is ``folder`` or inside it (``""`` is the root)."""
    return not folder or path == folder or path.startswith(folder.rstrip("/") + "/")


def surviving(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``records`` without the uploads a later deletion removed, and without the deletions.

    What replaying the writes in order would leave, for a run re-created from its journal: a
    deletion refers to artifacts of the lost run, and an upload it removed is not kept.
    """
    kept: list[Mapping[str, Any]] = []
    deleted: list[str] = []
    for record in reversed(records):
        if record["op"] == "delete_artifacts":
            deleted.append(record["artifact_path"] or "")
        elif record["op"] != "log_artifacts" or not any(
                is_under(record.get("artifact_path") or "", d) for d in deleted):
            kept.append(record)
    return kept[::-1]


def read_info(folder: Path) -> dict[str, Any]:
    """The outbox's ``store.json`` (the store, the login, the run's origin); {} if unreadable."""
    with contextlib.suppress(OSError, ValueError):
        info = json.loads((folder / STORE_FILE).read_text())
        if isinstance(info, dict):
            return info
    return {}


def write_info(folder: Path, info: Mapping[str, Any]) -> None:
    """Replace ``store.json`` atomically (a kill leaves the old or the new one, never half)."""
    temporary = folder / f".{STORE_FILE}.tmp"
    temporary.write_text(json.dumps(info, indent=1, sort_keys=True))
    os.replace(temporary, folder / STORE_FILE)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[bool]:
    """Hold the outbox's lock (False when another live process holds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK_FILE).open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


def encode_batch(
    metrics: Sequence[Metric], params: Sequence[Param], tags: Sequence[RunTag]
) -> dict[str, Any]:
    """A ``log_batch`` call as a journal record."""
    return {
        "op": "log_batch",
        "metrics": [[m.key, m.value, m.timestamp, m.step] for m in metrics],
        "params": [[p.key, p.value] for p in params],
        "tags": [[t.key, t.value] for t in tags],
    }


def encode_dataset_input(dataset: DatasetInput) -> dict[str, Any]:
    """An MLflow run input as a journal record's JSON (its protobuf message as a dict)."""
    return MessageToDict(dataset.to_proto())


def decode_dataset_input(data: Mapping[str, Any]) -> DatasetInput:
    """:func:`encode_dataset_input` undone."""
    return DatasetInput.from_proto(ParseDict(dict(data), ProtoDatasetInput()))


def metric_batches(queue: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The head of the queue: one record, or the run of metric-only batches that starts it.

    Params and tags are never merged (MLflow refuses duplicate keys within one batch); the
    merged metrics stay within MLflow's per-call limit.
    """
    head = queue[0]
    if not is_metric_only(head):
        return [head]
    run, count = [], 0
    for record in queue:
        if not is_metric_only(record) or count + len(record["metrics"]) > MAX_MERGED_METRICS:
            break
        run.append(record)
        count += len(record["metrics"])
    return run or [head]


def is_metric_only(record: Mapping[str, Any]) -> bool:
    """A ``log_batch`` record with metrics and nothing else."""
    return (record.get("op") == "log_batch" and not record["params"] and not record["tags"]
            and bool(record["metrics"]))


def merge_metric_batches(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One ``log_batch`` record carrying the metrics of ``records``, in order."""
    return {"op": "log_batch", "seq": records[-1]["seq"], "params": [], "tags": [],
            "metrics": [m for record in records for m in record["metrics"]]}


def apply(client: MlflowClient, run_id: str, record: Mapping[str, Any], journal: Journal) -> None:
    """Perform one journaled write against the store (raises on failure)."""
    op = record["op"]
    if op == "log_batch":
        metrics = [Metric(k, float(v), int(t), int(step)) for k, v, t, step in record["metrics"]]
        MlflowClient.log_batch(
            client,
            run_id,
            metrics=metrics,
            params=[Param(k, v) for k, v in record["params"]],
            tags=[RunTag(k, v) for k, v in record["tags"]],
        )
    elif op == "set_terminated":
        clear_reap(client, run_id)
        MlflowClient.set_terminated(client, run_id, record["status"], record["end_time"])
    elif op == "log_artifacts":
        folder = journal.files(record["seq"])
        MlflowClient.log_artifacts(client, run_id, str(folder), record.get("artifact_path"))
    elif op == "delete_artifacts":
        delete_artifacts(client, run_id, record["artifact_path"])
    elif op == "log_inputs":
        client.log_inputs(run_id, datasets=[decode_dataset_input(d) for d in record["datasets"]])
    elif op == "logged_models":
        sync_logged_models(client, run_id, record["state"])
    else:
        raise ValueError(f"unknown outbox operation {op!r}")


def clear_reap(client: MlflowClient, run_id: str) -> bool:
    """Remove a reap's marks from a run whose process turned out to be alive; True if any.

    `workbench runs reap` marks a run KILLED when no heartbeat reached the store for a while;
    a write that arrives afterwards proves the process was alive, so the reap's tag and its
    ``error`` (not an error of the run's own) go before the run's true status is written.
    """
    tags = MlflowClient.get_run(client, run_id).data.tags
    if REAPED_TAG not in tags:
        return False
    MlflowClient.delete_tag(client, run_id, REAPED_TAG)
    if tags.get("error", "").startswith(REAP_ERROR_PREFIX):
        MlflowClient.delete_tag(client, run_id, "error")
    return True


def delete_artifacts(client: MlflowClient, run_id: str, artifact_path: str) -> None:
    """Delete a run's artifact folder through the store's artifact repository."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    artifact_uri = MlflowClient.get_run(client, run_id).info.artifact_uri
    repo = get_artifact_repository(artifact_uri, tracking_uri=client.tracking_uri)
    repo.delete_artifacts(artifact_path)


def stage_files(target: Path, copy_from: Path | None, text: tuple[str, str] | None) -> None:
    """Copy an artifact file or folder (or write a text artifact) into the outbox."""
    target.mkdir(parents=True, exist_ok=True)
    if text is not None:
        (target / text[0]).write_text(text[1])
    elif copy_from is not None and copy_from.is_dir():
        shutil.copytree(copy_from, target, dirs_exist_ok=True)
    elif copy_from is not None:
        shutil.copy2(copy_from, target / copy_from.name)
