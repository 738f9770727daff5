"""Team mode: a shared MLflow tracking server on PostgreSQL with MLflow's basic-auth app.

``workbench server start|stop|status`` (``make server``) manages two processes that live
under ``experiments/server/``:

- a private PostgreSQL cluster (``pgdata/``) holding three databases, ``mlflow`` (runs,
  params, metrics, tags), ``mlflow_auth`` (users and permissions of the basic-auth app) and
  ``optuna`` (the studies of ``workbench tune``).
  It listens on a Unix socket only, in ``run/`` (mode 0700): no TCP port, so there is no
  database password to leak and no way around MLflow's access control from another account
  on the machine. PostgreSQL refuses to run as root; as root the cluster runs as the
  ``postgres`` system user (Debian's ``postgresql`` package creates it).
- ``mlflow server`` with ``--app-name basic-auth`` (MLflow's own authentication app),
  bound to 127.0.0.1 by default, proxying artifact uploads and downloads
  (``--serve-artifacts``) to ``artifacts/``, so clients need nothing but HTTP.

The admin password comes from ``MLFLOW_AUTH_ADMIN_PASSWORD`` (MLflow's own variable; there is
never a default) and is handed to the server through its environment only: no file, log or
command line holds it. MLflow uses it to create the admin account on the first start; later
starts check that it still opens that account.
"""

from __future__ import annotations

import configparser
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from workbench import processes
from workbench.config import ConfigError
from workbench.team.layout import Layout, ServerError, default_layout
from workbench.team.postgres import (
    database_uri,
    ensure_databases,
    init_cluster,
    postgres_bin_dir,
    postgres_running,
    service_user,
    start_postgres,
    stop_postgres,
    write_cluster_settings,
)

ADMIN_PASSWORD_ENV = "MLFLOW_AUTH_ADMIN_PASSWORD"  # read by MLflow's auth app itself
ADMIN_USERNAME_ENV = "MLFLOW_AUTH_ADMIN_USERNAME"
DEFAULT_ADMIN = "admin"
DEFAULT_PORT = 5050  # `make ui` (the embedded store's UI) keeps 5000
DEFAULT_PG_PORT = 5433  # names the socket file run/.s.PGSQL.<port>; no TCP port is opened
PERMISSIONS = ("READ", "EDIT", "MANAGE", "NO_PERMISSIONS")
START_TIMEOUT_S = 180.0  # schema migrations on a busy 2-core machine take a while
STOP_TIMEOUT_S = 30.0
AUTH_CACHE_TTL_S = 60
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; the socket file name adds ".s.PGSQL.NNNNN"


@dataclass(frozen=True)
class ServerSettings:
    """How to run the server (command-line flags of ``workbench server start``)."""

    host: str = "127.0.0.1"  # interface to bind; 0.0.0.0 for other machines (docs/team-mode.md)
    port: int = DEFAULT_PORT
    pg_port: int = DEFAULT_PG_PORT
    workers: int = 2  # uvicorn workers serving the REST API
    default_permission: str = "READ"  # what users get on experiments they did not create


@dataclass(frozen=True)
class ServerState:
    """What ``start`` recorded in ``server.json`` (no secrets): enough to stop and report."""

    url: str
    host: str
    port: int
    pg_port: int
    pid: int  # the `mlflow server` process; it leads its own process group
    started_at: str


# --------------------------------------------------------------------------- checks


def admin_credentials() -> tuple[str, str]:
    """Admin user name and password from the environment; a missing password is bad input."""
    password = os.environ.get(ADMIN_PASSWORD_ENV, "")
    if not password:
        raise ConfigError(
            f"{ADMIN_PASSWORD_ENV} is not set: export the server's admin password "
            f"(at least 12 characters; there is no default) before `workbench server start`"
        )
    if len(password) < 12:
        raise ConfigError(
            f"{ADMIN_PASSWORD_ENV}: too short ({len(password)} characters); MLflow's auth app "
            "needs at least 12"
        )
    return os.environ.get(ADMIN_USERNAME_ENV) or DEFAULT_ADMIN, password


def check_settings(settings: ServerSettings, layout: Layout) -> None:
    """Reject unusable flags before anything starts."""
    if settings.default_permission not in PERMISSIONS:
        raise ConfigError(
            f"--default-permission {settings.default_permission}: choose one of "
            f"{', '.join(PERMISSIONS)}"
        )
    for flag, port in (("--port", settings.port), ("--pg-port", settings.pg_port)):
        if not 1 <= port <= 65535:
            raise ConfigError(f"{flag} {port}: not a TCP port number (1-65535)")
    if settings.workers < 1:
        raise ConfigError(f"--workers {settings.workers}: must be >= 1")
    socket_path = layout.socket_dir / f".s.PGSQL.{settings.pg_port}"
    if len(str(socket_path)) > SOCKET_PATH_MAX:
        raise ConfigError(
            f"{layout.root}: path too long for PostgreSQL's Unix socket ({socket_path}); "
            "set WORKBENCH_EXPERIMENTS to a shorter directory"
        )
    if not port_is_free(settings.host, settings.port):
        raise ConfigError(
            f"--port {settings.port}: {settings.host}:{settings.port} is already in use; "
            "stop what listens there or choose another --port"
        )


def port_is_free(host: str, port: int) -> bool:
    """True if ``host:port`` can be bound right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- PostgreSQL


# --------------------------------------------------------------------------- MLflow server


def write_auth_config(layout: Layout, settings: ServerSettings, admin: str) -> None:
    """MLflow's basic-auth config: user store in PostgreSQL; no password in it, ever."""
    parser = configparser.ConfigParser(interpolation=None)
    parser["mlflow"] = {
        "default_permission": settings.default_permission,
        # ConfigParser's default interpolation (which MLflow uses) treats % specially.
        "database_uri": database_uri(layout, settings.pg_port, "mlflow_auth").replace("%", "%%"),
        "admin_username": admin,
        "authorization_function": "mlflow.server.auth:authenticate_request_basic_auth",
        # Without the cache every request pays a PBKDF2 hash (a training run makes several
        # per second); with it a password change or a deleted account reaches the other
        # workers within this many seconds.
        "auth_cache_ttl_seconds": str(AUTH_CACHE_TTL_S),
    }
    with layout.auth_config.open("w") as handle:
        handle.write("# Written by `workbench server start`; the admin password is never stored "
                     "here (MLFLOW_AUTH_ADMIN_PASSWORD).\n")
        parser.write(handle)


def mlflow_command(layout: Layout, settings: ServerSettings) -> list[str]:
    """The ``mlflow server`` command line (no secrets: they travel in the environment)."""
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", database_uri(layout, settings.pg_port, "mlflow"),
        "--serve-artifacts", "--artifacts-destination", layout.artifacts.as_uri(),
        "--app-name", "basic-auth",
        "--host", settings.host, "--port", str(settings.port),
        "--workers", str(settings.workers),
        # uvicorn's supervisor kills a worker that misses a 5 s health ping; importing MLflow
        # on a loaded machine takes longer than that, which turned into a restart loop.
        "--uvicorn-opts", f"--timeout-worker-healthcheck {int(START_TIMEOUT_S)}",
    ]


def server_environment(layout: Layout, admin: str, password: str) -> dict[str, str]:
    """The server's environment: auth config, admin bootstrap, a fresh CSRF secret."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                        "MLFLOW_TRACKING_PASSWORD")}
    env.update({
        "MLFLOW_AUTH_CONFIG_PATH": str(layout.auth_config),
        ADMIN_USERNAME_ENV: admin,
        ADMIN_PASSWORD_ENV: password,
        # The auth app's CSRF key must be the same in all workers of one server; a new one per
        # start only logs browser sessions out, and keeps one more secret off the disk.
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32),
        # MLflow's job runner (seven huey consumers) serves GenAI evaluation jobs, which the
        # workbench never submits; on a shared machine it only costs memory and CPU.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    })
    return env


def url_for(settings: ServerSettings) -> str:
    """The URL clients on this machine use (0.0.0.0 binds all interfaces, loopback included)."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    return f"http://{host}:{settings.port}"


def wait_until_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll ``/health`` until it answers 200; fail fast if the server process exits."""
    problem = processes.wait_until_healthy(url, process, START_TIMEOUT_S)
    if problem is not None:
        detail = f": {last_error_line(log)}" if process.poll() is not None else ""
        raise ServerError(f"mlflow server {problem}{detail} (log: {log})")


def last_error_line(log: Path) -> str:
    """The most telling line of a server log: the last exception message, else the last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if line.strip()] if log.exists() else []
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line
    return lines[-1] if lines else "no output"


# --------------------------------------------------------------------------- start / stop


def read_state(layout: Layout) -> ServerState | None:
    """The recorded server, if ``server.json`` exists."""
    if not layout.state_file.exists():
        return None
    return ServerState(**json.loads(layout.state_file.read_text()))


def process_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_our_server(pid: int, layout: Layout) -> bool:
    """True if ``pid`` still is the ``mlflow server`` of this layout (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "mlflow" in cmdline and layout.artifacts.as_uri() in cmdline


def start(settings: ServerSettings, layout: Layout | None = None) -> ServerState:
    """Start PostgreSQL and the MLflow server; returns the running server's state.

    Idempotent: a server already running from this layout is returned as it is. Every check
    that can fail on bad input runs before anything is created or started; a failure later
    stops whatever this call started.
    """
    layout = layout or default_layout()
    admin, password = admin_credentials()
    running = read_state(layout)
    if running is not None and is_our_server(running.pid, layout):
        return running
    check_settings(settings, layout)
    bin_dir = postgres_bin_dir()
    user = service_user()

    init_cluster(layout, bin_dir, user)
    write_cluster_settings(layout, settings.pg_port, user)
    layout.artifacts.mkdir(parents=True, exist_ok=True)
    started_postgres = False
    process: subprocess.Popen[bytes] | None = None
    try:
        if not postgres_running(layout, bin_dir, user):
            start_postgres(layout, bin_dir, user)
            started_postgres = True
        ensure_databases(layout, settings.pg_port)
        write_auth_config(layout, settings, admin)
        log = layout.logs / "mlflow.log"
        with log.open("ab") as handle:
            # A session of its own: `stop` ends the server with its uvicorn workers as a group.
            process = subprocess.Popen(
                mlflow_command(layout, settings), stdout=handle, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=server_environment(layout, admin, password),
                start_new_session=True, cwd=layout.root,
            )
        url = url_for(settings)
        wait_until_healthy(url, process, log)
        check_admin_login(url, admin, password)
    except BaseException:
        if process is not None:
            processes.terminate_group(process.pid, STOP_TIMEOUT_S)
        if started_postgres:
            stop_postgres(layout, bin_dir, user)
        raise
    state = ServerState(url=url, host=settings.host, port=settings.port,
                        pg_port=settings.pg_port, pid=process.pid,
                        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    layout.state_file.write_text(json.dumps(asdict(state), indent=2) + "\n")
    return state


def check_admin_login(url: str, admin: str, password: str) -> None:
    """The admin password must open the admin account (it was fixed at the first start)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    code = 0
    while code == 0 and time.monotonic() < deadline:  # 0: a worker is still starting
        code = processes.http_status(f"{url}/api/2.0/mlflow/users/get?username={quote(admin)}",
                           auth=(admin, password), timeout=30.0)
    if code == 200:
        return
    if code == 401:
        raise ConfigError(
            f"{ADMIN_PASSWORD_ENV} does not open the admin account {admin!r} created at the "
            "server's first start: export that password (rotate it later through MLflow's "
            "update-password API)"
        )
    raise ServerError(f"checking the admin login on {url} failed with HTTP {code}")


def stop(layout: Layout | None = None) -> list[str]:
    """Stop the MLflow server and PostgreSQL; returns what was stopped (empty: nothing ran)."""
    layout = layout or default_layout()
    stopped: list[str] = []
    state = read_state(layout)
    if state is not None:
        # After a reboot the recorded pid may belong to someone else: only our server's
        # group is signalled (its workers outlive a crashed leader in the same group).
        if is_our_server(state.pid, layout) or (
                processes.group_alive(state.pid) and not process_alive(state.pid)):
            processes.terminate_group(state.pid, STOP_TIMEOUT_S)
            stopped.append(f"mlflow server (pid {state.pid}, {state.url})")
        layout.state_file.unlink()
    if (layout.pgdata / "postmaster.pid").exists():
        bin_dir = postgres_bin_dir()
        if stop_postgres(layout, bin_dir, service_user()):
            stopped.append(f"postgresql ({layout.pgdata})")
    return stopped


@dataclass(frozen=True)
class Status:
    """What ``workbench server status`` reports."""

    running: bool
    url: str | None
    pid: int | None
    healthy: bool
    postgres: bool
    root: Path


def status(layout: Layout | None = None) -> Status:
    """Whether the server and its database run, and whether ``/health`` answers."""
    layout = layout or default_layout()
    state = read_state(layout)
    alive = state is not None and is_our_server(state.pid, layout)
    healthy = alive and state is not None and processes.http_status(f"{state.url}/health") == 200
    pg = False
    if (layout.pgdata / "PG_VERSION").exists():
        pg = postgres_running(layout, postgres_bin_dir(), service_user())
    return Status(running=alive, url=state.url if state else None,
                  pid=state.pid if state else None, healthy=healthy, postgres=pg,
                  root=layout.root)


def optuna_storage_url(layout: Layout | None = None) -> str | None:
    """The ``optuna`` database of the server running on this machine (``workbench tune``'s
    studies, next to MLflow's database), or None when no server runs here."""
    layout = layout or default_layout()
    state = read_state(layout)
    if state is None or not is_our_server(state.pid, layout):
        return None
    return database_uri(layout, state.pg_port, "optuna")


# --------------------------------------------------------------------------- command line


def add_cli_arguments(parser: Any) -> None:
    """``workbench server start|stop|status`` and the flags of ``start``."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start_parser = actions.add_parser(
        "start", help=f"start PostgreSQL and the MLflow server (needs {ADMIN_PASSWORD_ENV})")
    start_parser.add_argument("--host", default=ServerSettings.host,
                              help="interface to bind (default 127.0.0.1; 0.0.0.0 for a team)")
    start_parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    start_parser.add_argument("--pg-port", type=int, default=DEFAULT_PG_PORT,
                              help="PostgreSQL's port number (its Unix socket only; no TCP)")
    start_parser.add_argument("--workers", type=int, default=ServerSettings.workers)
    start_parser.add_argument("--default-permission", default=ServerSettings.default_permission,
                              choices=PERMISSIONS,
                              help="users' permission on experiments they did not create")
    actions.add_parser("stop", help="stop the MLflow server and PostgreSQL")
    actions.add_parser("status", help="is it running, where, and is it healthy (exit 1: no)")


def run_command(args: Any) -> int:
    """Carry out ``workbench server ACTION``; returns the exit code (1: ServerError)."""
    try:
        return _run_action(args)
    except ServerError as exc:
        print(f"workbench: server: {exc}", file=sys.stderr)
        return 1


def _run_action(args: Any) -> int:
    if args.action == "start":
        settings = ServerSettings(host=args.host, port=args.port, pg_port=args.pg_port,
                                  workers=args.workers,
                                  default_permission=args.default_permission)
        state = start(settings)
        print(f"MLflow tracking server on {state.url} (pid {state.pid}; PostgreSQL socket "
              f"{default_layout().socket_dir}, port {state.pg_port})")
        print(f"clients: tracking=server (or MLFLOW_TRACKING_URI={state.url}) with "
              "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD set")
        return 0
    if args.action == "stop":
        stopped = stop()
        print("stopped: " + "; ".join(stopped) if stopped else "not running")
        return 0
    report = status()
    if report.running:
        health = "healthy" if report.healthy else "NOT answering /health"
        print(f"running: {report.url} (pid {report.pid}, {health}); "
              f"postgresql {'running' if report.postgres else 'STOPPED'}; files {report.root}")
        return 0 if report.healthy and report.postgres else 1
    pg = "; postgresql still running (workbench server stop)" if report.postgres else ""
    print(f"not running{pg}; files {report.root}")
    return 1
