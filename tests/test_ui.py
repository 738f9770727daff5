"""``workbench ui`` as a user meets it: the printed link opens the runs table in a real headless
chromium, and SIGTERM stops every process it started, quietly, freeing the port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from workbench.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, ensure_experiment

from .conftest import ROOT


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Ui:
    """A running ``workbench ui`` and what it printed."""

    proc: subprocess.Popen[str]
    port: int
    link: str  # the URL it printed
    run_name: str
    stderr: Path


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """``workbench ui`` on a store with one run in an experiment the workbench created."""
    root = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = ensure_experiment(client, "workbench", uri)
    run = client.create_run(experiment_id, run_name="halfcheetah-ne2-ns64-s0")
    client.set_terminated(run.info.run_id)
    port = free_port()
    stderr = root / "ui.err"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "WORKBENCH_EXPERIMENTS": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "ui", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr.open("w"),
                            text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""  # printed once it answers
        assert line.startswith("MLflow UI on "), (line, stderr.read_text())
        yield Ui(proc, port, line.split()[3], "halfcheetah-ne2-ns64-s0", stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_printed_link_opens_the_runs_table(ui: Ui, browser: object) -> None:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait

    assert isinstance(browser, WebDriver)
    base = f"http://127.0.0.1:{ui.port}"
    assert ui.link == f"{base}/#/experiments/1/runs?workflowType=machine_learning"
    browser.get(ui.link)
    # MLflow 3 otherwise lands on the GenAI view: an empty traces overview, no runs table.
    WebDriverWait(browser, 120).until(
        lambda b: ui.run_name in b.find_element("tag name", "body").text)
    body = browser.find_element("tag name", "body").text
    assert "Detect Issues" not in body and "/overview" not in browser.current_url
    assert "matching run" in body  # the runs table's footer


def test_experiments_it_creates_say_they_hold_training_runs(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    created = client.get_experiment(ensure_experiment(client, "mine", uri))
    assert created.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    older = client.create_experiment("older")  # made before the tag existed: tagged on use
    assert ensure_experiment(client, "older", uri) == older
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    client.set_experiment_tag(older, EXPERIMENT_KIND_TAG, "genai_development")
    ensure_experiment(client, "older", uri)  # a kind someone chose is kept
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_sigterm_stops_every_process_and_frees_the_port(ui: Ui) -> None:
    started = psutil.Process(ui.proc.pid).children(recursive=True)
    assert started, "the MLflow server runs as a child"
    ui.proc.send_signal(signal.SIGTERM)
    assert ui.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, [p.cmdline() for p in started if p.is_running()]
        time.sleep(0.2)
    with socket.socket() as probe:
        # Free again: nothing listens (connections the browser closed may linger in
        # TIME_WAIT, which SO_REUSEADDR allows, as every server sets it).
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", ui.port))
        probe.listen()
    err = ui.stderr.read_text()
    assert "Traceback" not in err and len(err.splitlines()) <= 3, err
