"""Where a study lives: Optuna's RDB storage, shared by every worker of the study.

- Embedded tracking (``sqlite:///.../mlflow.db``): ``optuna.db`` beside it.
- The team server (a ``http(s)://`` tracking URI): the ``optuna`` database of the server's
  PostgreSQL, next to MLflow's, when the server runs on this machine; from another machine
  ``tune.storage=postgresql+psycopg2://...`` (e.g. through an SSH tunnel to the server's
  socket, docs/tuning.md).
- ``tune.storage=URL``: any storage URL Optuna takes (``sqlite:///``, ``postgresql://``, ...).

Workers join a study through its storage, the way Optuna documents it for several processes
and machines. Claiming a trial (count, then ask) runs under a lock held in that storage's own
terms: a file lock beside a SQLite file, a PostgreSQL advisory lock on a server, so two
workers never overshoot ``tune.n_trials``. Trials whose worker died are failed at the next
start: at once when the worker ran on this machine (its process, recorded with the trial, is
gone), else once Optuna's heartbeat is older than :data:`GRACE_S`; they, and interrupted
trials, do not count against the total.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workbench.config import ConfigError
from workbench.team.server import optuna_storage_url
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import is_embedded

HEARTBEAT_S = 20  # a worker records each running trial's heartbeat this often
GRACE_S = 120  # a running trial without a heartbeat for this long was abandoned
SQLITE_TIMEOUT_S = 60  # busy timeout of each SQLite connection (parallel workers)
COUNTED = "workbench.failure"  # user attr of a FAIL trial that counts (its training failed)
PRUNED_AT = "workbench.pruned"  # user attr set by the trial's kernel when the pruner stops it
RUN_ID = "mlflow_run_id"  # user attr: the trial's MLflow run
OWNER = "workbench.owner"  # user attr: the worker process running the trial (host, pid, start)
ABANDONED = "workbench.abandoned"  # user attr of a trial failed because its worker died


def storage_url(explicit: str | None, tracking_uri: str) -> str:
    """The study storage for this tracking store (see the module docstring)."""
    if explicit:
        if "://" not in explicit:
            raise ConfigError(f"tune.storage={explicit!r}: not a database URL; e.g. "
                              "sqlite:///path/optuna.db or postgresql+psycopg2://user@host/db")
        return explicit
    if is_embedded(tracking_uri):
        return f"sqlite:///{Path(tracking_uri.removeprefix('sqlite:///')).parent / 'optuna.db'}"
    if tracking_uri.startswith(("http://", "https://")):
        url = optuna_storage_url()
        if url is None:
            raise ConfigError(
                f"tracking store {redact_uri(tracking_uri)} is a server and no team server runs "
                "on this machine: give the study's storage, e.g. tune.storage=postgresql+"
                "psycopg2://workbench@127.0.0.1:5433/optuna through an SSH tunnel to the "
                "server's socket (docs/tuning.md)"
            )
        return url
    raise ConfigError(f"tracking store {redact_uri(tracking_uri)}: no default study storage "
                      "for it; give tune.storage=URL")


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL, else None."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def open_storage(url: str, heartbeat: bool = True) -> Any:
    """Optuna's RDB storage on ``url`` (tables created on first use); unreachable: one line."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine: dict[str, Any] = {}
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    beats: dict[str, Any] = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S}
    try:
        # Under the lock: workers started together would race to create the tables.
        with warnings.catch_warnings(), study_lock(url, "(storage)"):
            warnings.simplefilter("ignore")  # heartbeat is flagged experimental
            return optuna.storages.RDBStorage(url, engine_kwargs=engine,
                                              **(beats if heartbeat else {}))
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise ConfigError(f"study storage {redact_uri(url)}: cannot open it "
                          f"({lines[0] if lines else type(exc).__name__}); check tune.storage "
                          "or the team server (workbench server status)") from exc


@contextlib.contextmanager
def study_lock(url: str, study: str) -> Iterator[None]:
    """Held while a worker claims a trial or creates the study's parent run.

    SQLite: an exclusive lock on ``<file>.lock``; PostgreSQL: an advisory lock keyed by the
    study name, held on a connection of its own. Other databases: no lock (a concurrent
    worker may then overshoot ``tune.n_trials`` by one).
    """
    path = sqlite_path(url)
    if path is not None:
        with open(f"{path}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if urlsplit(url).scheme.startswith("postgresql"):
        with advisory_lock(url, study):
            yield
        return
    yield


@contextlib.contextmanager
def advisory_lock(url: str, study: str) -> Iterator[None]:
    """``pg_advisory_lock`` on a key derived from the study name, for the block's duration."""
    import sqlalchemy

    key = int.from_bytes(hashlib.sha256(f"workbench-tune:{study}".encode()).digest()[:8],
                         "big", signed=True)
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    finally:
        engine.dispose()


def counts(trial: Any) -> bool:
    """Whether a trial counts against ``tune.n_trials``: complete, pruned, running, or failed
    by itself (:data:`COUNTED`); not one interrupted by Ctrl-C or abandoned by a worker that
    died, nor a waiting one (enqueued, not yet claimed)."""
    from optuna.trial import TrialState

    if trial.state == TrialState.WAITING:
        return False
    return trial.state != TrialState.FAIL or COUNTED in trial.user_attrs


def owner_record() -> dict[str, Any]:
    """This worker process as a trial's owner: host name, pid and the pid's start time (a
    pid reused by another process after a reboot or a wrap-around is not the owner)."""
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": psutil.Process().create_time()}


def owner_is_dead(owner: Any) -> bool:
    """True when ``owner`` (:func:`owner_record`) ran on this machine and has exited; False
    when it lives, ran elsewhere or is not known (Optuna's heartbeat decides those)."""
    import psutil

    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return False
    try:
        started = psutil.Process(int(owner["pid"])).create_time()
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
    return abs(started - float(owner.get("started", started))) > 1.0  # the pid was reused


def fail_orphaned_trials(study: Any) -> list[int]:
    """Fail, at once, the RUNNING trials whose worker process on this machine is dead (a
    SIGKILL, the OOM killer); the numbers of the trials failed.

    Optuna's heartbeat (:func:`optuna.storages.fail_stale_trials`) would fail them only after
    :data:`GRACE_S`; until then they would count against ``tune.n_trials`` and keep the
    study's parent RUNNING. They are not :data:`COUNTED`: a resume replaces them.
    """
    import optuna
    from optuna.trial import TrialState

    storage, failed = study._storage, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER)
        if not owner_is_dead(owner):
            continue
        why = (f"its workbench tune process (pid {owner['pid']} on {owner['host']}) died "
               "while it ran; not counted, the study runs another trial in its place")
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            storage.set_trial_user_attr(trial._trial_id, ABANDONED, why)
            if storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                failed.append(trial.number)
    return failed


def list_studies(url: str) -> list[str]:
    """The names of the studies in a storage."""
    import optuna

    return sorted(s.study_name for s in optuna.get_all_study_summaries(open_storage(url, False)))


class Heartbeat:
    """Records the heartbeat of this worker's running trials every :data:`HEARTBEAT_S`."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.trial_ids: set[int] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, name="tune-heartbeat", daemon=True)
        self.thread.start()

    def add(self, trial_id: int) -> None:
        with self.lock:
            self.trial_ids.add(trial_id)
        self.beat(trial_id)

    def discard(self, trial_id: int) -> None:
        with self.lock:
            self.trial_ids.discard(trial_id)

    def beat(self, trial_id: int) -> None:
        with contextlib.suppress(Exception):  # a finished trial, a storage hiccup: next time
            self.storage.record_heartbeat(trial_id)

    def loop(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            with self.lock:
                ids = list(self.trial_ids)
            for trial_id in ids:
                self.beat(trial_id)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def quiet_optuna() -> None:
    """Optuna's per-trial INFO lines and experimental warnings off: the study prints its own."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage")
