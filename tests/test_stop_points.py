"""SIGTERM at any instant of a real `workbench train` leaves a truthful status and no process.

Each case is a real training process (tests/stop_at.py: `workbench train` that sends itself a
real SIGTERM at one exact instant, from the store being opened to the first rollout, and at
the end) with a temporary SQLite store; a last one signals a plain `workbench train` as soon
as its run appears in the store. Every case checks the exit code, that the run ends KILLED
with an ``error`` tag (or that no run exists, or FINISHED when only its status was left to
write), never RUNNING, that the outbox was delivered and that nothing of the process's
session survives it.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from .conftest import ROOT, TINY

BASE = [*TINY, "tracking.system_metrics=true", "eval.every_steps=0",
        "console.iteration_lines=true"]

# point (tests/stop_at.py) -> the run's final status (None: no run may exist)
slow = pytest.mark.slow
POINTS = [
    pytest.param("setup", None, marks=slow),
    pytest.param("run_created", "KILLED"),  # the store had created the run, nothing else
    pytest.param("outbox_opened", "KILLED", marks=slow),
    pytest.param("system_metrics", "KILLED", marks=slow),
    pytest.param("manifest", "KILLED", marks=slow),
    pytest.param("env_build", "KILLED", marks=slow),  # subprocess workers half started
    pytest.param("model_build", "KILLED", marks=slow),
    pytest.param("first_rollout", "KILLED", marks=slow),
    pytest.param("model_save", "KILLED", marks=slow),
    pytest.param("final_status", "FINISHED", marks=slow),  # trained; its status was written
]


def session_survivors(leader: int) -> list[psutil.Process]:
    """Processes of the session ``leader`` started that are still alive (zombies included)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == leader:
                found.append(proc)
        except OSError:
            continue
    return found


def wait_no_survivors(leader: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while session_survivors(leader) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert session_survivors(leader) == []


def all_runs(client: MlflowClient) -> list:
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


def check_truthful(store: Path, expected: str | None, err: str) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    found = all_runs(client)
    if expected is None:
        assert found == [], err
        return
    (run,) = found
    assert run.info.status == expected, err
    if expected == "KILLED":
        assert run.data.tags["error"].startswith("interrupted: "), run.data.tags
        assert run.info.end_time is not None
    outbox = store / "outbox"
    assert not outbox.exists() or list(outbox.iterdir()) == [], "outbox left undelivered"


@pytest.mark.parametrize(("point", "expected"), POINTS)
def test_sigterm_at_any_instant_leaves_a_truthful_status(
    point: str, expected: str | None, store: Path, tmp_path: Path
) -> None:
    vec_env = "env.vec_env=subproc" if point in ("env_build", "first_rollout") else ""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    proc = psutil.Popen(
        [sys.executable, "-m", "tests.stop_at", point, *BASE, *filter(None, [vec_env])],
        cwd=ROOT, start_new_session=True, stdout=out.open("w"), stderr=err.open("w"),
        env={**os.environ},
    )
    code = proc.wait(timeout=600)
    assert "stop_at: SIGTERM" in err.read_text(), err.read_text()
    assert code == 143, err.read_text()
    check_truthful(store, expected, err.read_text())
    wait_no_survivors(proc.pid)


@pytest.mark.slow
def test_sigterm_as_soon_as_the_run_appears_in_the_store(store: Path, tmp_path: Path) -> None:
    # The tester's report: a scheduler's SIGTERM right after the run shows up in the store.
    err = tmp_path / "stderr.txt"
    proc = psutil.Popen([sys.executable, "-m", "workbench", "train", *BASE,
                         "env.vec_env=subproc"], cwd=ROOT, start_new_session=True,
                        stdout=(tmp_path / "stdout.txt").open("w"), stderr=err.open("w"),
                        env={**os.environ})
    deadline = time.monotonic() + 300
    while True:  # poll the store itself, as often as SQLite lets a reader
        assert proc.poll() is None, err.read_text()
        assert time.monotonic() < deadline, "no run appeared"
        try:
            with sqlite3.connect(store / "mlflow.db", timeout=0.1) as db:
                if db.execute("select count(*) from runs").fetchone()[0]:
                    break
        except sqlite3.Error:  # not created yet, or being written
            pass
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, err.read_text()
    check_truthful(store, "KILLED", err.read_text())
    wait_no_survivors(proc.pid)


@pytest.mark.unit
def test_held_signals_are_raised_on_release_and_a_second_one_at_once() -> None:
    from workbench.training.faults import HeldSignals

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        held = HeldSignals().hold()
        signal.raise_signal(signal.SIGTERM)  # held: nothing happens yet
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            held.release()
        assert signal.getsignal(signal.SIGTERM) is interrupt

        held = HeldSignals().hold()
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):  # a second one stops at once (a hung call)
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is interrupt
        held.release()  # nothing left to deliver

        held = HeldSignals().hold()
        signal.raise_signal(signal.SIGTERM)
        held.release(deliver=False)  # already stopping: dropped
    finally:
        signal.signal(signal.SIGTERM, previous)
