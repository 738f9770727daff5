"""The team server fixture: a real PostgreSQL + MLflow basic-auth server on loopback.

Started once per test session through the real CLI (``workbench server start``) in a
private directory, stopped by its finalizer through ``workbench server stop``, which must
leave no process behind. Every CLI output the team tests capture is kept in
``TeamServer.outputs`` so the last test can check that no credential ever reached one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.support.ports import free_port

ALICE = "alice"


@dataclass
class TeamServer:
    """A running team server and the secrets that must never leak."""

    url: str
    root: Path  # WORKBENCH_EXPERIMENTS of the server side
    admin_password: str
    alice_password: str
    pid: int
    outputs: list[str] = field(default_factory=list)  # every captured stdout/stderr

    def env(self, user: str | None = ALICE) -> dict[str, str]:
        """Environment of a client: the server's URI and (optionally) a user's login."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MLFLOW_TRACKING_", "MLFLOW_AUTH_"))}
        env["MLFLOW_TRACKING_URI"] = self.url
        env["WORKBENCH_EXPERIMENTS"] = str(self.root / "client")
        if user == ALICE:
            env.update(MLFLOW_TRACKING_USERNAME=ALICE, MLFLOW_TRACKING_PASSWORD=self.alice_password)
        elif user == "admin":
            env.update(MLFLOW_TRACKING_USERNAME="admin",
                       MLFLOW_TRACKING_PASSWORD=self.admin_password)
        return env

    def cli(self, *args: str, user: str | None = ALICE, timeout: float = 600,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``python -m workbench ARGS`` as a client of this server; output is recorded."""
        done = run_cli(*args, env={**self.env(user), **(extra_env or {})}, timeout=timeout)
        self.outputs += [done.stdout, done.stderr]
        return done


def leftover_processes(text: str, pgid: int) -> list[str]:
    """Live (non-zombie) processes whose command line contains ``text`` (PostgreSQL's
    postmaster, ``mlflow server``) or that belong to process group ``pgid`` (its uvicorn
    workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, group = fields[0], int(fields[2])
        if state != "Z" and (text in cmdline or (pgid and group == pgid)):
            found.append(f"{proc.name}: {cmdline.strip()}")
    return found


@pytest.fixture(scope="session")
def team_server() -> Iterator[TeamServer]:
    """Start the team server for the session; skip (visibly) only without PostgreSQL."""
    from workbench.team import layout, postgres, server

    try:
        postgres.postgres_bin_dir()
        postgres.service_user()
    except layout.ServerError as exc:
        pytest.skip(f"team server tests need PostgreSQL ({exc}); .ci/run installs it")
    # Under /tmp, world-traversable: as root the cluster runs as the postgres user, which
    # must reach its data directory (pytest's own tmp dirs are private to root).
    root = Path(tempfile.mkdtemp(prefix="wb-team-", dir="/tmp"))
    root.chmod(0o755)
    admin_password = "adm-" + secrets.token_urlsafe(18)
    env = {"WORKBENCH_EXPERIMENTS": str(root), "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password}
    port = free_port()
    started = run_cli("server", "start", "--port", str(port), "--pg-port", str(free_port()),
                      env=env, timeout=400)
    team = TeamServer(url=f"http://127.0.0.1:{port}", root=root,
                      admin_password=admin_password,
                      alice_password="alc-" + secrets.token_urlsafe(18), pid=0,
                      outputs=[started.stdout, started.stderr])
    try:
        assert started.returncode == 0, started.stderr
        team.pid = server.read_state(layout.Layout(root / "server")).pid  # type: ignore[union-attr]
        create_user(team)
        yield team
    finally:
        stopped = run_cli("server", "stop", env=env, timeout=120)
        team.outputs += [stopped.stdout, stopped.stderr]
        leftovers = wait_for_no_processes(str(root), team.pid)
        shutil.rmtree(root, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stderr
        assert leftovers == [], f"processes left after `workbench server stop`: {leftovers}"


@contextlib.contextmanager
def logged_in(user: str, password: str) -> Iterator[None]:
    """MLflow's client reads the login from the environment: set it for this block only."""
    keys = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict(zip(keys, (user, password), strict=True)))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def create_user(team: TeamServer) -> None:
    """An account for the tests' client, created by the admin through MLflow's auth client."""
    from mlflow.server import get_app_client

    with logged_in("admin", team.admin_password):
        get_app_client("basic-auth", tracking_uri=team.url).create_user(ALICE, team.alice_password)


def wait_for_no_processes(marker: str, pgid: int, timeout: float = 30.0) -> list[str]:
    """Processes of the server still alive once ``timeout`` has passed (none expected)."""
    deadline = time.monotonic() + timeout
    left = leftover_processes(marker, pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = leftover_processes(marker, pgid)
    return left
