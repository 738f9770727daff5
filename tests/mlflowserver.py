"""A real `mlflow server` on 127.0.0.1 for outage tests: stopped, restarted on the same store,
or replaced by an empty one on the same port; optionally with MLflow's basic-auth app (users
in a SQLite database beside the store).
"""

from __future__ import annotations

import configparser
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from workbench import processes

from tests.conftest import ROOT
from tests.support.ports import free_port
from tests.teamserver import logged_in

START_TIMEOUT_S = 300.0  # importing MLflow on a loaded machine takes long; uvicorn is told so
STOP_TIMEOUT_S = 30.0


def session_processes(leader: int) -> list[psutil.Process]:
    """Processes still alive in the session started by ``leader`` (zombies included)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == leader:
                found.append(proc)
        except OSError:
            continue
    return found


class MlflowServer:
    """A real `mlflow server` (SQLite store, served artifacts) to stop, restart and replace."""

    def __init__(self, root: Path, *, auth: bool = False) -> None:
        self.root = root
        self.auth = auth
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.generation = 0  # which store it serves: replace() moves to a new, empty one
        self.admin_password = "adm-" + secrets.token_urlsafe(12)

    @property
    def store(self) -> Path:
        """The folder of the store being served (database, artifacts, users)."""
        folder = self.root / f"store-{self.generation}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def start(self) -> None:
        """Serve :attr:`store`; returns once ``/health`` answers (fails with the log if not)."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        for key in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            env.pop(key, None)
        command = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{self.store / 'server.db'}",
            "--serve-artifacts", "--artifacts-destination", (self.store / "artifacts").as_uri(),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            # uvicorn kills a worker that misses a 5 s health ping while it imports MLflow.
            "--uvicorn-opts", f"--timeout-worker-healthcheck {int(START_TIMEOUT_S)}",
        ]
        if self.auth:
            command += ["--app-name", "basic-auth"]
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(self.auth_config()),
                       MLFLOW_AUTH_ADMIN_PASSWORD=self.admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY=secrets.token_urlsafe(16))
        log = self.root / "server.log"
        with log.open("a") as handle:
            self.proc = subprocess.Popen(command, env=env, stdout=handle, stderr=handle,
                                         cwd=self.root, start_new_session=True)
        problem = processes.wait_until_healthy(self.url, self.proc, START_TIMEOUT_S)
        assert problem is None, f"mlflow server {problem}:\n{log.read_text()[-2000:]}"

    def auth_config(self) -> Path:
        """MLflow's basic-auth config: users in SQLite beside the store, READ by default."""
        parser = configparser.ConfigParser(interpolation=None)
        parser["mlflow"] = {
            "default_permission": "READ",
            "database_uri": f"sqlite:///{self.store / 'users.db'}",
            "admin_username": "admin",
            "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        }
        path = self.store / "basic_auth.ini"
        with path.open("w") as handle:
            parser.write(handle)
        return path

    def create_user(self, name: str, password: str) -> None:
        """An account, created by the admin through MLflow's auth client."""
        with logged_in("admin", self.admin_password):
            self.auth_client().create_user(name, password)

    def change_password(self, name: str, password: str) -> None:
        """The admin sets a new password (MLflow drops the old one from its login cache)."""
        with logged_in("admin", self.admin_password):
            self.auth_client().update_user_password(name, password)

    def auth_client(self) -> Any:
        """MLflow's basic-auth client for this server (the login comes from the environment)."""
        from mlflow.server import get_app_client

        return get_app_client("basic-auth", tracking_uri=self.url)

    def replace(self) -> None:
        """Stop, then serve a new, empty store on the same port (a server set up anew)."""
        self.stop()
        self.generation += 1
        self.start()

    def stop(self) -> None:
        """SIGTERM the server's process group (uvicorn workers included), SIGKILL what stays."""
        if self.proc is None:
            return
        processes.terminate_group(self.proc.pid, STOP_TIMEOUT_S)
        self.proc = None


# --------------------------------------------------------------------------- trainings


def start_training(tmp: Path, name: str, *overrides: str) -> tuple[psutil.Popen, Path, Path]:
    """`python -m workbench train` in its own session, with this process's environment;
    (process, stdout file, stderr file)."""
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    proc = psutil.Popen([sys.executable, "-m", "workbench", "train", *overrides], cwd=ROOT,
                        start_new_session=True, stdout=out.open("w"), stderr=err.open("w"),
                        env={**os.environ})
    return proc, out, err


def wait_text(path: Path, text: str, proc: psutil.Popen, timeout: float = 300) -> None:
    """Wait until ``path`` (a training's output) holds ``text``; fail if the training ends."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert proc.poll() is None, path.with_suffix(".err").read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.1)


@pytest.fixture()
def mlflow_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowServer]:
    """A fresh server for one test: the process's tracking URI and experiments point at it;
    stopped afterwards (registered in tests/conftest.py)."""
    root = tmp_path / "server"
    root.mkdir()
    running = MlflowServer(root)
    running.start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", running.url)
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(tmp_path / "experiments"))
    try:
        yield running
    finally:
        running.stop()
