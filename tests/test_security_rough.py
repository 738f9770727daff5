"""Hostile values that used to hang, corrupt or lie: each answers in one line, at once.

- ``workbench runs sync`` against a tracking server that does not answer (nothing listens,
  or a socket that accepts and never replies) says ``pending`` within seconds, not after
  MLflow's four minutes of retries.
- Every command that opens a store refuses another application's SQLite file in one line
  (exit 2) and leaves its bytes as they were.
- A study whose ``workbench tune`` was SIGKILLed mid-trial and resumed at once runs the
  requested number of trials and closes every run (slow tier: real papermill trials).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.tracking import journal
from workbench.tracking.redaction import redact_uri

from .conftest import ROOT, run_cli
from .support import runs

RUN_ID = "0123456789abcdef0123456789abcdef"


def write_outbox(experiments: Path, uri: str) -> Path:
    """An outbox holding one metric batch not yet delivered to the store at ``uri``."""
    folder = experiments / "outbox" / RUN_ID
    folder.mkdir(parents=True)
    record = journal.encode_batch([], [], [])
    record.update(seq=1, metrics=[["loss", 1.0, 1_700_000_000_000, 64]])
    journal.Journal(folder).append(record)
    journal.write_info(folder, {"tracking_uri": redact_uri(uri), "run_id": RUN_ID})
    return folder


@contextlib.contextmanager
def dead_server(kind: str) -> Iterator[str]:
    """A tracking server URL that never answers: a closed port, or a socket that accepts
    connections (the kernel's backlog) and never replies."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        if kind == "silent":
            sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("kind", ["closed", "silent"])
def test_sync_to_a_dead_server_says_pending_within_seconds(
    kind: str, store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with dead_server(kind) as url:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        folder = write_outbox(store, url)
        started = time.monotonic()
        code = cli.main(["runs", "sync"])
        took = time.monotonic() - started
    out = capsys.readouterr().out
    print(f"runs sync against a {kind} server: {took:.1f} s")
    assert code == 1
    assert f"pending {RUN_ID}: 0 write(s) delivered" in out
    assert "not reachable" in out
    assert len(journal.Journal(folder).pending()) == 1  # kept for the next sync
    assert took < 30


# --------------------------------------------------------------------------- foreign SQLite


def foreign_database(path: Path) -> str:
    """Another application's SQLite database (one table, one row); its SHA-256."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        db.execute("INSERT INTO customers VALUES (1, 'alice')")
        db.commit()
    return hashlib.sha256(path.read_bytes()).hexdigest()


COMMANDS = {
    "train": ["train", "debug=tiny"],
    "sweep": ["sweep", "debug=tiny"],
    "tune": ["tune", "debug=tiny", "search=tiny"],
    "ui": ["ui", "--port", "1"],
    "export": ["export", "--run", RUN_ID],
    "runs sync": ["runs", "sync"],
    "runs reap": ["runs", "reap"],
    "report": ["report"],
    "manifest diff": ["manifest", "diff", RUN_ID, RUN_ID],
    "runs copy --from": ["runs", "copy", "--from", "FOREIGN", "--to", "sqlite:///OTHER"],
    "runs copy --to": ["runs", "copy", "--from", "sqlite:///OTHER", "--to", "FOREIGN"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_another_application_s_database(
    command: str, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = tmp_path / "app" / "app.db"
    app.parent.mkdir()
    digest = foreign_database(app)
    uri = f"sqlite:///{app}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    other = tmp_path / "other.db"
    argv = [a.replace("FOREIGN", uri).replace("OTHER", str(other)) for a in COMMANDS[command]]
    if command == "runs copy --to":
        MlflowClient(f"sqlite:///{other}").search_experiments()  # an MLflow store as source
    write_outbox(store, uri)  # something for `runs sync` to deliver
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("workbench: error: "), err
    assert "holds another application's tables (customers)" in err
    assert hashlib.sha256(app.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in app.parent.iterdir()) == ["app.db"]


# --------------------------------------------------------------------------- killed study

TINY_STUDY = [*runs.TINY_STUDY, "tune.workers=1"]


def study_runs(uri: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("workbench")
    return [] if experiment is None else client.search_runs([experiment.experiment_id], "")


def kernels_of(pid: int) -> list[psutil.Process]:
    """Processes started by the ``workbench tune`` process ``pid`` (its trials' kernels)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("JPY_PARENT_PID") == str(pid):
                found.append(process)
    return found


@pytest.mark.slow
def test_a_study_killed_mid_trial_resumes_to_its_total_with_every_run_closed(
        store: Path) -> None:
    import optuna

    uri = os.environ["MLFLOW_TRACKING_URI"]
    args = ["tune", "--n-trials", "2", *TINY_STUDY, "tune.study=killed"]
    env = {**os.environ, "WORKBENCH_CPU_BUDGET": "2"}
    first = subprocess.Popen([sys.executable, "-m", "workbench", *args,
                              "total_timesteps=10000000"], cwd=ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
                r.info.status == "RUNNING" and r.data.tags.get("tune.role") == "trial"
                for r in study_runs(uri)):
            time.sleep(0.5)
        time.sleep(1)  # the trial trains
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    started = time.monotonic()
    resumed = run_cli(*args, env={"WORKBENCH_CPU_BUDGET": "2"}, timeout=600)
    print(f"resumed in {time.monotonic() - started:.0f} s")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    trials = optuna.load_study(study_name="killed",
                               storage=f"sqlite:///{store / 'optuna.db'}").trials
    states = [t.state.name for t in trials]
    assert states == ["FAIL", "COMPLETE", "COMPLETE"], states  # the killed one not counted
    assert "died" in trials[0].user_attrs["workbench.abandoned"]
    runs = study_runs(uri)
    status = {r.data.tags.get("tune.trial", "parent"): r.info.status for r in runs}
    assert status == {"parent": "FINISHED", "0": "KILLED", "1": "FINISHED", "2": "FINISHED"}
    (killed,) = [r for r in runs if r.data.tags.get("tune.trial") == "0"]
    assert "workbench tune" in killed.data.tags["error"]
    assert not kernels_of(first.pid)  # the killed trial's kernel went with its driver


# --------------------------------------------------------------------------- unbounded video


def test_a_whole_episode_video_streams_its_frames_instead_of_keeping_them(
        tmp_path: Path) -> None:
    # video=hd renders whole episodes (video.max_steps=null); 150 frames of 320x240 are
    # 34.6 MB of pixels, which the recorder used to hold until encoding.
    import numpy as np
    from workbench.config import load_config
    from workbench.envs import video
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_eval_env

    cfg = load_config(["env=halfcheetah", "debug=tiny", "video=hd", "video.max_steps=null",
                       "video.width=320", "video.height=240", "video.shadows=false",
                       "env.max_episode_steps=150"])
    settings = video.VideoSettings.from_config(cfg.video)
    assert settings.max_steps is None
    venv = make_eval_env(EnvSpec.from_config(cfg), video=settings)
    fps = video.frame_rate(video.rendering_env(venv), settings)
    try:
        tracemalloc.start()
        with video.encoding(tmp_path, "replay", fps) as encoder:
            recording = video.record_vec(
                venv, lambda obs: np.zeros((len(obs), 6), np.float32), settings, encoder.add)
            _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        venv.close()
    files = encoder.close()
    pixels = recording.count * 320 * 240 * 3
    print(f"{recording.count} frames, {pixels / 1e6:.1f} MB of pixels, peak {peak / 1e6:.1f} MB")
    assert recording.count == 150 and not recording.frames
    assert peak < pixels / 4  # the GIF preview's halved frames, not the video's
    assert video.probe(files.video)["frames"] == 150
    assert files.preview.stat().st_size > 0
