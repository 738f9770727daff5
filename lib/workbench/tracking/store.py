"""The MLflow store: which one (URI resolution), a client for it, experiments, params, tags.

A store that cannot be used is bad input, found before anything is created: a tracking server
that does not answer (one short request, not MLflow's minutes of retries), a SQLite store in a
directory that cannot be written or a file that is not an intact MLflow database (not SQLite,
corrupt or truncated, another application's tables: left untouched).
Artifacts of an embedded store live beside it (``<store dir>/mlartifacts``).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import logging
import os
import re
import sqlite3
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from workbench import paths
from workbench.config import ConfigError
from workbench.tracking.redaction import redact_uri, remote_without_credentials

# MLflow's limits (mlflow.utils.validation): params per batch and value length.
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
TRUNCATION_MARK = "...[truncated]"
SERVER_TIMEOUT_S = 5.0  # one /health request; an unreachable server fails well within 10 s

# MLflow 3's UI opens experiments in its GenAI view (traces, an empty overview) unless the URL
# asks for the "Model training" workflow (``workflowType=machine_learning``, see ui_link), or,
# where that selector is off, the experiment's kind tag says so.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
UI_WORKFLOW = "workflowType=machine_learning"


def quiet_mlflow_console() -> None:
    """MLflow's console output as the workbench wants it, here and in every child process.

    - When a run on a tracking server ends, MLflow prints "View run <name> at: <url>" with
      the URI's user:password in the URL; the workbench prints its own, redacted, lines.
    - MLflow logs at INFO (database creation and migration, system metrics started and
      stopped) on every run, and a notebook shows each line as a stderr box; WARNING keeps
      what needs attention. ``MLFLOW_LOGGING_LEVEL=INFO`` (MLflow's variable) brings them back.

    The variables are inherited by sweep kernels, tune trials and Ray workers.
    """
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    if "MLFLOW_LOGGING_LEVEL" not in os.environ:
        os.environ["MLFLOW_LOGGING_LEVEL"] = "WARNING"
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # mlflow is imported already


quiet_mlflow_console()


def ui_link(base: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """A page of MLflow's UI at ``base`` in its "Model training" view: the experiment list,
    an experiment's runs table, or a run."""
    path = "/"
    if experiment_id is not None:
        path = f"/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/#{path}?{UI_WORKFLOW}"


def resolve_tracking_uri(configured: str | None) -> str:
    """``MLFLOW_TRACKING_URI`` wins (MLflow's convention), then ``tracking.uri``, then SQLite."""
    return os.environ.get("MLFLOW_TRACKING_URI") or configured or paths.default_tracking_uri()


def is_embedded(uri: str) -> bool:
    """True for a local SQLite store (artifacts then live under experiments/mlartifacts)."""
    return uri.startswith("sqlite:")


def make_client(uri: str) -> MlflowClient:
    """A client for ``uri`` once it is known to be usable; creates and migrates the embedded
    store if needed (:class:`ConfigError` naming the store and the fix otherwise).

    MLflow creates and migrates a SQLite database on a client's first request; two processes
    doing that at once on a fresh database fail with ``duplicate column name`` (two runs
    started together in two terminals, seeds trained side by side), so for the embedded
    store that first request is made here, under :func:`_creation_lock`.
    """
    if not is_embedded(uri):
        check_server(uri)
        return MlflowClient(tracking_uri=uri)
    db_path = Path(uri.removeprefix("sqlite:///"))
    check_sqlite_store(uri, db_path)
    with _creation_lock(db_path):
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    return client


def check_server(uri: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """One request to the tracking server's ``/health``: it answers, or one line says so.

    MLflow's own client retries a connection for minutes before it gives up; this asks once.
    A server that answers at all (even 401/403: its auth app guards the API) is usable here;
    the login is checked by the first real request (:func:`get_experiment_or_explain`).
    """
    reason = server_problem(uri, timeout_s)
    if reason is not None:
        raise ConfigError(
            f"tracking server {redact_uri(uri)}: not reachable ({reason}); start it (workbench "
            "server start) or point MLFLOW_TRACKING_URI / tracking.uri at one that runs"
        )


def server_problem(uri: str, timeout_s: float = SERVER_TIMEOUT_S) -> str | None:
    """Why the tracking server at ``uri`` does not answer one ``/health`` request within
    ``timeout_s`` (nothing listens, or it accepts and never replies), or None when it does."""
    if urlsplit(uri).scheme not in ("http", "https"):
        return None  # databricks://, file stores: nothing to ask
    # /health needs no login, and urllib cannot parse a URI's user:password part.
    url = remote_without_credentials(uri).rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):  # http(s) URLs only
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def check_store(uri: str) -> None:
    """An existing store can be read: a server answers (:func:`check_server`), an existing
    SQLite file is an intact MLflow database (:func:`check_sqlite_file`). Nothing is created."""
    if is_embedded(uri):
        check_sqlite_file(uri, Path(uri.removeprefix("sqlite:///")))
    else:
        check_server(uri)


def check_sqlite_store(uri: str, db_path: Path) -> None:
    """The store's directory can be written and its file, if any, is an intact MLflow database.

    Nothing is created or modified when a check fails; the directory is created otherwise.
    """
    shown = redact_uri(uri)
    check_sqlite_file(uri, db_path)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=db_path.parent, prefix=".write-test-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"tracking store {shown}: its directory {db_path.parent} cannot be written "
            f"({reason}); fix its permissions or point MLFLOW_TRACKING_URI / tracking.uri at a "
            "writable place"
        ) from None


def check_sqlite_file(uri: str, db_path: Path) -> None:
    """An existing, non-empty SQLite store file is a database, intact, and MLflow's.

    A missing or empty file is left to MLflow, which creates its tables there.
    """
    if not (db_path.is_file() and db_path.stat().st_size):
        return
    problem = sqlite_problem(db_path)
    if problem is not None:
        raise ConfigError(
            f"tracking store {redact_uri(uri)}: {db_path.name} {problem}; move it away (or "
            "restore it from a backup), or point MLFLOW_TRACKING_URI / tracking.uri at "
            "another store"
        )


# Tables every MLflow store has (MLflow's migrations create them first); a database holding
# tables but none of these belongs to another application.
MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs"})


def sqlite_problem(db_path: Path) -> str | None:
    """Why ``db_path`` cannot be an MLflow store, asked through SQLite itself (read-only), or
    None: not a database, corrupt or truncated (its schema cannot be read: SQLite compares
    the header's page count with the file), or another application's tables.

    Not by opening the file: closing any descriptor of a file releases every POSIX lock the
    process holds on it, those of its open SQLite connections included (a notebook's
    earlier run, a sweep's earlier attempt), and another process may then reset the WAL
    under them ("database disk image is malformed"). SQLite's own connections share one
    descriptor per file within a process and keep the locks.
    """
    try:
        with contextlib.closing(sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            return "is not a SQLite database (corrupt or another file)"
        if "malformed" in str(exc) or "corrupt" in str(exc):
            return f"is corrupt or truncated ({exc})"
        return None  # busy, cannot open: MLflow's turn, with its own message
    if tables and not tables & MLFLOW_TABLES:
        shown = ", ".join(sorted(tables)[:3])
        return (f"holds another application's tables ({shown}), not MLflow's; it is left "
                "as it is")
    return None


def artifacts_root(uri: str) -> Path:
    """Where an embedded store's runs keep their artifacts: ``mlartifacts`` beside the file."""
    return Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts"


@contextlib.contextmanager
def _creation_lock(db_path: Path) -> Iterator[None]:
    """Exclusive lock (``<db>.lock``) around an embedded store's creation and migration."""
    try:
        lock = open(db_path.with_name(db_path.name + ".lock"), "a")  # noqa: SIM115
    except OSError:  # a read-only store (reports, the UI): nobody can migrate it anyway
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """Id of experiment ``name``, created if missing (embedded store: fixed artifact root).

    The experiment is marked as model training (:data:`EXPERIMENT_KIND`) unless it says what
    it is already, so that MLflow's UI opens it on the runs table.
    """
    existing = get_experiment_or_explain(client, name, uri)
    if existing is not None:
        if EXPERIMENT_KIND_TAG not in existing.tags:
            # Marking someone else's team experiment needs MANAGE; without it the UI just
            # opens on its default view, which is no reason to stop a run.
            with contextlib.suppress(Exception):
                client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG,
                                          EXPERIMENT_KIND)
        return existing.experiment_id
    location = None
    if is_embedded(uri):
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        location = (artifacts_root(uri) / slug).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:
        # Another process (a parallel sweep point) created it first.
        existing = client.get_experiment_by_name(name)
        if existing is None:
            raise
        return existing.experiment_id


def get_experiment_or_explain(client: MlflowClient, name: str, uri: str) -> Any:
    """``get_experiment_by_name``; a tracking server's 401 becomes one line (exit code 2).

    It is the first request a run makes, so a missing or wrong login (team mode, see
    workbench.team.server) is reported before anything is created or computed.
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_experiment_by_name(name)
    except MlflowException as exc:
        if exc.error_code != "UNAUTHENTICATED":
            raise
        given = "was refused" if os.environ.get("MLFLOW_TRACKING_USERNAME") else "is missing"
        raise ConfigError(
            f"tracking server {redact_uri(uri)}: the login {given} (401); export "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD of your account"
        ) from None


def source_tags(source: str, kind: str = "LOCAL") -> dict[str, str]:
    """The tags behind the "Source" and "Created by" columns of MLflow's run table.

    MLflow's fluent API fills them from its run-context providers; runs created through the
    client (all of the workbench's) get none. ``source`` is what started the run (a command
    line, a notebook's path), ``kind`` MLflow's source type (``LOCAL``, ``NOTEBOOK``).
    "Created by" is the tracking server login when one is set (team mode), else the OS user
    (the manifest records the git commit; MLflow's git provider would warn on every run
    where git is not installed).
    """
    return {
        "mlflow.source.name": source,
        "mlflow.source.type": kind,
        "mlflow.user": os.environ.get("MLFLOW_TRACKING_USERNAME") or os_user(),
    }


def os_user() -> str:
    """The OS login name; a container's arbitrary UID without a passwd entry gives its UID."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


class RunWrites(Protocol):
    """The writes the recording helpers make to a run: an ``MlflowClient``'s, or a training's
    :class:`workbench.tracking.outbox.RunWriter` (the same calls, journaled)."""

    def log_batch(self, run_id: str, metrics: Sequence[Metric] = ...,
                  params: Sequence[Param] = ..., tags: Sequence[RunTag] = ...) -> Any: ...

    def log_text(self, run_id: str, text: str, artifact_file: str) -> Any: ...

    def log_artifacts(self, run_id: str, local_dir: str,
                      artifact_path: str | None = ...) -> Any: ...


def truncate(value: Any, limit: int) -> str:
    """``str(value)`` cut deliberately to MLflow's length limit, marked as truncated."""
    text = str(value)
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def log_params(client: RunWrites, run_id: str, params: Mapping[str, Any]) -> None:
    """Log params in batches of MLflow's maximum size, values truncated to its limit."""
    items = [Param(k, truncate(v, MAX_PARAM_VALUE_LENGTH)) for k, v in sorted(params.items())]
    for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + MAX_PARAMS_PER_BATCH])


def set_tags(client: RunWrites, run_id: str, tags: Mapping[str, Any]) -> None:
    """Set several tags in one call."""
    items = [RunTag(k, truncate(v, MAX_TAG_VALUE_LENGTH)) for k, v in tags.items()]
    if items:
        client.log_batch(run_id, tags=items)
