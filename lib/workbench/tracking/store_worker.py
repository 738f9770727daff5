"""A helper process that writes a run's metric batches into an embedded SQLite store.

MLflow's SQLAlchemy store spends ~60 µs of Python per metric row (one ORM object each) in the
process that calls ``log_batch``; in the training process that work holds the interpreter
lock the training loop needs, ~2 % of a core at ~10 PPO iterations a second. The outbox's
delivery thread hands its metric-only batches to this process instead (one JSON line per
batch on its stdin, one JSON line back per answer) and waits for the answer without the lock;
on a machine with a free core the rows then cost the training process almost nothing
(docs/benchmarks.md#the-workbenchs-own-cost).

The helper is only a faster path, never the only one: the journal keeps every batch until
the answer acknowledges it, a refusal comes back as the same ``MlflowException`` (message and
error code) that a call in the training process would have raised, and a helper that cannot
start or dies (:class:`WorkerGone`) makes the outbox write in-process again. It ends when its
stdin closes: when the outbox closes it, or when the training process dies in any way.
Answers are JSON, never code: a line that is not an answer counts as the helper gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import ErrorCode
from mlflow.tracking import MlflowClient

from workbench.tracking.journal import log_batch_record

READY = "ready"
START_TIMEOUT_S = 60.0  # importing MLflow on a loaded machine


class WorkerGone(RuntimeError):
    """The helper did not start, died or answered nonsense: write in-process instead."""


class StoreWorker:
    """One helper process writing to ``tracking_uri`` (started by :meth:`start`)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lock = threading.Lock()

    @classmethod
    def start(cls, tracking_uri: str) -> StoreWorker:
        """Start the helper and wait until it has opened the store; raises :class:`WorkerGone`."""
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "workbench.tracking.store_worker", tracking_uri],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=helper_env())
        except OSError as exc:
            raise WorkerGone(f"could not start the store helper: {exc}") from exc
        worker = cls(process)
        timer = threading.Timer(START_TIMEOUT_S, process.kill)  # a hung start reads as EOF
        timer.start()
        try:
            if worker.receive() != {READY: True}:
                raise WorkerGone("the store helper did not report ready")
        except WorkerGone:
            worker.close()
            raise
        finally:
            timer.cancel()
        return worker

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_batch(self, run_id: str, record: Mapping[str, Any]) -> None:
        """Write one journaled metric batch; raises what MLflow raised, or :class:`WorkerGone`."""
        line = json.dumps({"run_id": run_id, "record": record}, separators=(",", ":"))
        with self.lock:
            try:
                stdin = self.stdin()
                stdin.write(line + "\n")
                stdin.flush()
            except (OSError, ValueError) as exc:  # broken pipe, or closed by close()
                raise WorkerGone(f"the store helper is gone: {exc}") from exc
            answer = self.receive()
        if answer.get("ok") is True:
            return
        error = answer.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            raise WorkerGone(f"the store helper answered {str(answer)[:200]!r}")
        code = error.get("error_code")
        if isinstance(code, str):
            raise MlflowException(error["message"], error_code=error_code_value(code))
        raise RuntimeError(error["message"])

    def stdin(self) -> IO[str]:
        if self.process.stdin is None:
            raise ValueError("no stdin")
        return self.process.stdin

    def receive(self) -> dict[str, Any]:
        """The helper's next answer (one JSON object per line)."""
        stdout = self.process.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            raise WorkerGone("the store helper is gone (its output ended)")
        try:
            answer = json.loads(line)
        except ValueError as exc:
            raise WorkerGone(f"the store helper answered {line[:200]!r}") from exc
        if not isinstance(answer, dict):
            raise WorkerGone(f"the store helper answered {line[:200]!r}")
        return answer

    def close(self, timeout_s: float = 5.0) -> None:
        """End the helper: its stdin closes, so it exits after the write in hand (killed if it
        has not within ``timeout_s``). A thread waiting for its answer then gets it, or EOF."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None and not self.lock.locked():
            self.process.stdout.close()  # else the waiting thread reads EOF; the GC closes it


def helper_env() -> dict[str, str]:
    """This environment, with the folder holding ``workbench/`` importable (a notebook or a
    test may have put it on ``sys.path`` only in this process; an installed package is)."""
    package_root = str(Path(__file__).resolve().parents[2])
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    path = os.environ.get("PYTHONPATH")
    if package_root in installed or package_root in (path or "").split(os.pathsep):
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}


def error_code_value(name: str) -> int:
    """MLflow's numeric error code for its name (an unknown name: INTERNAL_ERROR)."""
    try:
        return int(ErrorCode.Value(name))
    except ValueError:
        return int(ErrorCode.Value("INTERNAL_ERROR"))


# --------------------------------------------------------------------------- the helper


def answer_for(client: MlflowClient, request: Mapping[str, Any]) -> dict[str, Any]:
    """Perform one request; the answer says ok, or the error as the caller re-raises it."""
    try:
        log_batch_record(client, str(request["run_id"]), request["record"])
    except MlflowException as exc:
        return {"error": {"message": exc.message, "error_code": exc.error_code}}
    except Exception as exc:  # e.g. SQLAlchemy's own, unwrapped: the caller judges it
        return {"error": {"message": f"{type(exc).__name__}: {exc}"}}
    return {"ok": True}


def serve(tracking_uri: str, requests: IO[str], answers: IO[str]) -> None:
    """Answer requests until ``requests`` ends."""
    client = MlflowClient(tracking_uri=tracking_uri)
    client.search_experiments(max_results=1)  # opens the store (its schema check) first
    answers.write(json.dumps({READY: True}) + "\n")
    answers.flush()
    for line in requests:
        answers.write(json.dumps(answer_for(client, json.loads(line))) + "\n")
        answers.flush()


def main() -> None:
    # Ctrl-C reaches the whole foreground process group: the training decides what stops,
    # and this process ends when the training closes its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = sys.stdout
    sys.stdout = sys.stderr  # MLflow's own prints must not mix with the answers
    serve(sys.argv[1], sys.stdin, answers)


if __name__ == "__main__":
    main()
