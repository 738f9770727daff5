"""The team server's private PostgreSQL cluster: initialized, configured, started and stopped
as the service user (PostgreSQL refuses to run as root), reachable only on its Unix socket.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

from workbench.team.layout import Layout, ServerError

DB_ROLE = "workbench"  # superuser of the private cluster (trusted on its private socket)
DATABASES = ("mlflow", "mlflow_auth", "optuna")  # optuna: workbench tune's studies

def postgres_bin_dir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl`` (``WORKBENCH_PG_BIN`` overrides)."""
    override = os.environ.get("WORKBENCH_PG_BIN")
    candidates = [Path(override)] if override else []
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(Path(found).resolve().parent)
    # Debian installs versioned server binaries off PATH: /usr/lib/postgresql/<major>/bin.
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _major(p.parent.name),
        reverse=True,
    )
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    raise ServerError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install them "
        "(Debian/Ubuntu: apt-get install postgresql) or set WORKBENCH_PG_BIN to their directory"
    )


def _major(name: str) -> int:
    return int(name) if name.isdigit() else -1


def service_user() -> pwd.struct_passwd | None:
    """The account PostgreSQL runs as: None (the caller) unless we are root."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("WORKBENCH_PG_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ServerError(
            f"PostgreSQL refuses to run as root and there is no {name!r} user to run it as: "
            f"create one (useradd --system {name}), set WORKBENCH_PG_USER, or run as a "
            "non-root user"
        ) from None


def _as_service_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    """subprocess arguments that run a command as the cluster's owner."""
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "cwd": "/"}


def _own(path: Path, user: pwd.struct_passwd | None, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(mode)


def _check_reachable(path: Path, user: pwd.struct_passwd) -> None:
    """Every parent of ``path`` must let the cluster's owner through (x permission)."""
    for parent in [*reversed(path.parents), path]:
        st = parent.stat()
        if st.st_uid == user.pw_uid:
            continue
        if not st.st_mode & 0o001:
            raise ServerError(
                f"{parent}: the {user.pw_name!r} user running PostgreSQL cannot enter it; "
                f"allow it (chmod o+x {parent}) or set WORKBENCH_EXPERIMENTS elsewhere"
            )


def init_cluster(layout: Layout, bin_dir: Path, user: pwd.struct_passwd | None) -> bool:
    """Create the private cluster on first use; returns True if it was created now."""
    layout.root.mkdir(parents=True, exist_ok=True)
    if user is not None:
        _check_reachable(layout.root, user)
    _own(layout.socket_dir, user, 0o700)
    _own(layout.logs, user, 0o750)
    if (layout.pgdata / "PG_VERSION").exists():
        return False
    _own(layout.pgdata, user, 0o700)
    # Only connections over the private socket are accepted (trusted: the socket directory
    # is the access control); TCP is rejected outright.
    _run(
        [str(bin_dir / "initdb"), "-D", str(layout.pgdata), "-U", DB_ROLE, "-E", "UTF8",
         "--auth-local=trust", "--auth-host=reject", "--no-instructions"],
        user, what="initdb",
    )
    conf = layout.pgdata / "postgresql.conf"
    with conf.open("a") as handle:
        handle.write("\n# workbench server: see lib/workbench/team/server.py\n"
                     "include_if_exists = 'workbench.conf'\n")
    return True


def write_cluster_settings(layout: Layout, pg_port: int, user: pwd.struct_passwd | None) -> None:
    """Socket-only listening on ``pg_port`` (rewritten at each start, so --pg-port applies)."""
    target = layout.pgdata / "workbench.conf"
    target.write_text(
        "listen_addresses = ''\n"
        f"unix_socket_directories = '{layout.socket_dir}'\n"
        f"port = {pg_port}\n"
    )
    if user is not None:
        os.chown(target, user.pw_uid, user.pw_gid)


def start_postgres(layout: Layout, bin_dir: Path, user: pwd.struct_passwd | None) -> None:
    """``pg_ctl start`` and wait until the cluster accepts connections."""
    log = layout.logs / "postgres.log"
    _run([str(bin_dir / "pg_ctl"), "-D", str(layout.pgdata), "-l", str(log), "-w", "-t", "60",
          "start"], user, what="pg_ctl start", log=log)


def stop_postgres(layout: Layout, bin_dir: Path, user: pwd.struct_passwd | None) -> bool:
    """``pg_ctl stop -m fast`` if the cluster runs; returns True if it was running."""
    # A postmaster.pid left by a crash or reboot names no live server: nothing to stop
    # (PostgreSQL itself replaces the stale file at its next start).
    if not postgres_running(layout, bin_dir, user):
        return False
    _run([str(bin_dir / "pg_ctl"), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t", "60",
          "stop"], user, what="pg_ctl stop")
    return True


def postgres_running(layout: Layout, bin_dir: Path, user: pwd.struct_passwd | None) -> bool:
    """``pg_ctl status`` of the cluster."""
    if not (layout.pgdata / "PG_VERSION").exists():
        return False
    status = subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(layout.pgdata), "status"],
                            capture_output=True, text=True, **_as_service_user(user))
    return status.returncode == 0


def _run(command: list[str], user: pwd.struct_passwd | None, *, what: str,
         log: Path | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, **_as_service_user(user))
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        where = f" (log: {log})" if log else ""
        raise ServerError(f"{what} failed: {detail[-1] if detail else done.returncode}{where}")


def database_uri(layout: Layout, pg_port: int, database: str) -> str:
    """SQLAlchemy URI of ``database`` over the private socket (no password: none exists)."""
    host = quote(str(layout.socket_dir), safe="/")
    return f"postgresql+psycopg2://{DB_ROLE}@/{database}?host={host}&port={pg_port}"


def ensure_databases(layout: Layout, pg_port: int) -> None:
    """Create the tracking and auth databases if missing (MLflow creates the tables)."""
    import psycopg2

    connection = psycopg2.connect(host=str(layout.socket_dir), port=pg_port, user=DB_ROLE,
                                  dbname="postgres")
    connection.autocommit = True  # CREATE DATABASE cannot run inside a transaction
    try:
        with connection.cursor() as cursor:
            for name in DATABASES:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{name}" OWNER "{DB_ROLE}"')
    finally:
        connection.close()
