"""MLflow tracking: store resolution, run lifecycle, and SB3's logger forwarded to MLflow.

Metrics reach MLflow through SB3's logger extension point: :class:`MlflowWriter` is a
``KVWriter`` added to the model's logger, so every key SB3 records (``rollout/*``, ``train/*``,
``time/*``) and every key our callbacks record arrives in one batched ``log_batch`` call per
PPO iteration, at ``step = num_timesteps``.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import numbers
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from stable_baselines3.common.logger import KVWriter

from workbench import paths

# MLflow's limits (mlflow.utils.validation): params per batch and value length.
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
TRUNCATION_MARK = "...[truncated]"

# SB3 records train/* inside train(), after the iteration's logs were dumped; they reach the
# logger one dump late. These keys are re-dated to the iteration they belong to.
LATE_PREFIXES = ("train/", "time/update_s")


def resolve_tracking_uri(configured: str | None) -> str:
    """``MLFLOW_TRACKING_URI`` wins (MLflow's convention), then ``tracking.uri``, then SQLite."""
    return os.environ.get("MLFLOW_TRACKING_URI") or configured or paths.default_tracking_uri()


def is_embedded(uri: str) -> bool:
    """True for a local SQLite store (artifacts then live under experiments/mlartifacts)."""
    return uri.startswith("sqlite:")


def redact_uri(uri: str) -> str:
    """A tracking URI without its password (``scheme://user:***@host``)."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", uri)


def make_client(uri: str) -> MlflowClient:
    """A client for ``uri``; creates and migrates the embedded store if needed.

    MLflow creates and migrates a SQLite database on a client's first request; two processes
    doing that at once on a fresh database fail with ``duplicate column name`` (two runs
    started together in two terminals, seeds trained side by side), so for the embedded
    store that first request is made here, under :func:`_creation_lock`.
    """
    if not is_embedded(uri):
        return MlflowClient(tracking_uri=uri)
    db_path = Path(uri.removeprefix("sqlite:///"))
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with _creation_lock(db_path):
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
    return client


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
    """Id of experiment ``name``, created if missing (embedded store: fixed artifact root)."""
    existing = get_experiment_or_explain(client, name, uri)
    if existing is not None:
        return existing.experiment_id
    location = None
    if is_embedded(uri):
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        location = (paths.artifacts_root() / slug).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
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

    from workbench.config import ConfigError

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


def truncate(value: Any, limit: int) -> str:
    """``str(value)`` cut deliberately to MLflow's length limit, marked as truncated."""
    text = str(value)
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def log_params(client: MlflowClient, run_id: str, params: Mapping[str, Any]) -> None:
    """Log params in batches of MLflow's maximum size, values truncated to its limit."""
    items = [Param(k, truncate(v, MAX_PARAM_VALUE_LENGTH)) for k, v in sorted(params.items())]
    for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + MAX_PARAMS_PER_BATCH])


def set_tags(client: MlflowClient, run_id: str, tags: Mapping[str, Any]) -> None:
    """Set several tags in one call."""
    items = [RunTag(k, truncate(v, MAX_TAG_VALUE_LENGTH)) for k, v in tags.items()]
    if items:
        client.log_batch(run_id, tags=items)


def numeric_items(values: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    """The (key, float) pairs of a logger dump that MLflow can store as metrics."""
    for key, value in values.items():
        # numpy scalars register with the numbers ABCs; bools are not metrics.
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield key, float(value)


class MlflowWriter(KVWriter):
    """SB3 logger output that sends each dump to MLflow as one ``log_batch`` call.

    SB3's ``learn`` dumps the logger after each rollout and before the update, so the
    ``train/*`` values in dump k belong to the update of iteration k-1. They are logged at the
    previous dump's step so that every key of one iteration shares its ``num_timesteps``; the
    last update's values arrive with the final dump made at training end.
    """

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.previous_step: int | None = None
        self.calls = 0

    def write(
        self,
        key_values: dict[str, Any],
        key_excluded: dict[str, tuple[str, ...]],
        step: int = 0,
    ) -> None:
        now_ms = int(time.time() * 1000)
        metrics: list[Metric] = []
        for key, value in numeric_items(key_values):
            if key_excluded.get(key) and "mlflow" in key_excluded[key]:
                continue
            late = key.startswith(LATE_PREFIXES)
            metric_step = self.previous_step if late and self.previous_step is not None else step
            # MLflow stores NaN/inf; they are kept so diagnostics can see a diverged run.
            metrics.append(Metric(key, value, now_ms, int(metric_step)))
        if any(not m.key.startswith(LATE_PREFIXES) for m in metrics):
            # A dump with this iteration's own keys: the next late keys belong to this step.
            self.previous_step = step
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
            self.calls += 1

    def close(self) -> None:
        """Nothing to release: the client is owned by the caller."""


def finite_or_none(value: float | None) -> float | None:
    """``value`` if it is a finite number, else None (for summaries)."""
    if value is None or not math.isfinite(value):
        return None
    return value
