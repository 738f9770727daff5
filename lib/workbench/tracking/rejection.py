"""A store that refuses a run's write: what the refusal means, and what the outbox does.

Only a write the store acknowledged leaves the journal. A refusal is judged before anything
is dropped (:func:`judge`):

- **outage**: no answer, a lock, a server error: kept, retried (the live thread) or left for
  the next ``workbench runs sync``.
- **login**: 401/403, no or a wrong login, or one without permission: kept; ``runs sync``
  stops with one line naming the user to log in as (:class:`LoginRefused`, exit code 2).
- **missing run**: the store no longer has the run (a server replaced by an empty one, a run
  purged): the run is re-created from the journal (:func:`recreate_run`), with the same
  experiment name, run name, start time, tags, params, metrics, artifacts and final status,
  and tag ``workbench.recreated_from`` = the old id; every later write goes to the new run.
- **deleted run**: the run is in the store's trash: kept until it is restored (re-creating
  it would undo a deletion someone chose).
- **rejected**: the run exists and is active, and refuses this one write (a malformed value,
  a param logged twice with different values): that write alone is dropped, and said so.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mlflow.entities import Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from workbench.config import ConfigError
from workbench.tracking import permissions
from workbench.tracking.journal import (
    Journal,
    apply,
    is_metric_only,
    merge_metric_batches,
    metric_batches,
    read_info,
    surviving,
    write_info,
)
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import MAX_PARAMS_PER_BATCH, ensure_experiment

RECREATED_TAG = "workbench.recreated_from"
PARTIAL_TAG = "workbench.recreated_partial"

LOGIN_CODES = {"UNAUTHENTICATED", "PERMISSION_DENIED", "CUSTOMER_UNAUTHORIZED"}
# The store answered and refused: the run is gone or deleted, or this one write is bad.
REFUSAL_CODES = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS",
                 "INVALID_STATE", "BAD_REQUEST"}


class Verdict(enum.Enum):
    """What a failed write means for the journal."""

    OUTAGE = "outage"
    LOGIN = "login"
    MISSING_RUN = "missing run"
    DELETED_RUN = "deleted run"
    REJECTED = "rejected"


class LoginRefused(ConfigError):
    """The store refused the login; every write is kept (exit code 2 at the command line)."""


class CannotRecreate(Exception):
    """A missing run whose journal does not say how to create it again."""


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a refused request (MLflow's REST errors and its artifact uploads)."""
    response = getattr(exc, "response", None)  # requests.HTTPError from artifact repositories
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return status
    if isinstance(exc, MlflowException):
        return int(exc.get_http_status_code())
    return None


def first_verdict(exc: BaseException) -> Verdict | None:
    """The verdict the error alone gives: login or outage; None when the store refused."""
    code = exc.error_code if isinstance(exc, MlflowException) else None
    status = http_status(exc) if code is None else None
    if code in LOGIN_CODES or status in (401, 403):
        return Verdict.LOGIN
    if code in REFUSAL_CODES or (status is not None and 400 <= status < 500
                                 and status not in (408, 429)):
        return None
    return Verdict.OUTAGE


def judge(client: MlflowClient, run_id: str, exc: BaseException) -> Verdict:
    """Why the store refused a write to ``run_id``: asks the store about the run itself."""
    verdict = first_verdict(exc)
    if verdict is not None:
        return verdict
    try:
        run = MlflowClient.get_run(client, run_id)
    except MlflowException as lookup:
        if lookup.error_code == "RESOURCE_DOES_NOT_EXIST":
            return Verdict.MISSING_RUN
        return first_verdict(lookup) or Verdict.OUTAGE
    except Exception:
        return Verdict.OUTAGE
    if run.info.lifecycle_stage == "deleted":
        return Verdict.DELETED_RUN
    return Verdict.REJECTED


def missing_behind_403(client: MlflowClient, uri: str, folder: Path,
                       exc: BaseException) -> bool:
    """A team server answers a login that is not an administrator 403 for a run it does not
    have, as for one the login may not write. Asked which: the run is missing when the login
    may write the experiment the run was created in (or that experiment is gone too), and
    then it is re-created there like any missing run."""
    if http_status(exc) != 403:
        return False
    name = (read_info(folder).get("origin") or {}).get("experiment")
    if not name:
        return False
    try:
        experiment = MlflowClient.get_experiment_by_name(client, name)
    except Exception:  # refused too: a login problem after all
        return False
    if experiment is None:
        return True
    access = permissions.experiment_access(uri, experiment.experiment_id)
    return access is not None and access.can_write


def login_of(uri: str) -> str | None:
    """The user this process logs in as: ``MLFLOW_TRACKING_USERNAME``, else the URI's user."""
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or urlsplit(uri).username or None


def login_advice(uri: str, folder: Path, exc: BaseException) -> str:
    """The one line of a refused login: what was refused, where the writes are, who to be."""
    info = read_info(folder)
    user = info.get("user")
    status = http_status(exc)
    current = login_of(uri)
    if status == 403 and current and current == user:  # logging in again would change nothing
        return (f"tracking server {redact_uri(uri)}: the login {current} may not write run "
                f"{folder.name} (403){experiment_note(uri, info)}; its writes are kept in "
                f"{folder}: ask the experiment's owner or an admin for EDIT permission and "
                "rerun `workbench runs sync`")
    if status == 403:
        refused = f"the login {current or '(none)'} may not write run {folder.name} (403)"
    else:
        refused = (f"the login {'of ' + current + ' was refused' if current else 'is missing'} "
                   "(401)")
    who = user or "the run's owner"
    return (f"tracking server {redact_uri(uri)}: {refused}; its writes are kept in {folder}: "
            f"log in as {who} (MLFLOW_TRACKING_USERNAME/PASSWORD) and rerun `workbench runs sync`")


def experiment_note(uri: str, info: Mapping[str, Any]) -> str:
    """``: it has READ on experiment 'alice-runs'``, when the outbox and the server say."""
    name = (info.get("origin") or {}).get("experiment")
    try:
        found = MlflowClient(uri).get_experiment_by_name(name) if name else None
    except Exception:  # not readable either: the line says what it knows
        return ""
    access = permissions.experiment_access(uri, found.experiment_id) if found else None
    return f": it has {access.permission} on experiment {name!r}" if access else ""


def deleted_advice(run_id: str, folder: Path) -> str:
    """Why the writes of a run in the store's trash are kept, and the way out."""
    return (f"run {run_id} is deleted in the store; its writes are kept in {folder}: restore "
            f"it (`mlflow runs restore --run-id {run_id}`) and rerun `workbench runs sync`, or "
            "remove that folder to drop them")


# --------------------------------------------------------------------------- re-creation


def origin_of(run: Any, experiment: str, *, resumed_from_step: int | None = None
              ) -> dict[str, Any]:
    """How ``run`` was created, for :func:`recreate_run` (kept in the outbox's store.json).

    A fresh run's journal holds every later write; a resumed run's journal starts at the
    resume, so its params and tags are kept here and the steps before it are marked lost.
    """
    return {
        "experiment": experiment,
        "run_name": run.info.run_name,
        "start_time": run.info.start_time,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params) if resumed_from_step is not None else {},
        "resumed_from_step": resumed_from_step,
    }


def recreate_run(client: MlflowClient, uri: str, journal: Journal) -> str:
    """Create the run again from its journal; returns the new run id.

    The new id is recorded in store.json before the history is replayed, so a sync that is
    killed meanwhile continues with the same new run (replays are idempotent). Only the
    writes the lost store had acknowledged are replayed here; the pending ones follow as
    usual. Raises :class:`CannotRecreate` for a journal without its run's origin.
    """
    folder = journal.folder
    info = read_info(folder)
    target = info.get("recreated_as")
    if not target:
        origin = info.get("origin")
        if not origin:
            raise CannotRecreate(
                f"run {folder.name} no longer exists in the store and its outbox does not "
                f"record how it was created (written by an older workbench); kept in {folder}")
        experiment_id = ensure_experiment(client, origin["experiment"], uri)
        tags = {**origin["tags"], RECREATED_TAG: folder.name}
        if origin.get("resumed_from_step") is not None:
            tags[PARTIAL_TAG] = (
                f"metrics and artifacts of the steps before the resume at step "
                f"{origin['resumed_from_step']} were only in the lost store")
        run = MlflowClient.create_run(client, experiment_id, start_time=origin["start_time"],
                                      tags=tags, run_name=origin["run_name"])
        target = run.info.run_id
        info = {**info, "recreated_as": target, "history_replayed": False}
        write_info(folder, info)
    if not info.get("history_replayed"):
        params = [Param(k, v) for k, v in (info.get("origin") or {}).get("params", {}).items()]
        for start in range(0, len(params), MAX_PARAMS_PER_BATCH):
            MlflowClient.log_batch(client, target,
                                   params=params[start:start + MAX_PARAMS_PER_BATCH])
        replay(client, target, surviving(journal.history()), journal, lambda _: None)
        write_info(folder, {**info, "history_replayed": True})
    return str(target)


def replay(client: MlflowClient, run_id: str, records: Sequence[Mapping[str, Any]],
           journal: Journal, done: Callable[[Mapping[str, Any]], None]) -> None:
    """Apply ``records`` to ``run_id`` in order, metric batches merged; ``done`` after each.

    An upload whose staged files are gone (a journal of an older workbench) is skipped.
    Raises the first failure; what was applied before it has had ``done`` called.
    """
    queue = [dict(r) for r in records]
    while queue:
        group = metric_batches(queue)
        record = merge_metric_batches(group) if len(group) > 1 else group[0]
        if record["op"] != "log_artifacts" or journal.files(record["seq"]).is_dir():
            apply(client, run_id, record, journal)
        for each in group:
            done(each)
        del queue[:len(group)]


def merged(records: Sequence[Mapping[str, Any]]) -> bool:
    """True when a refused write was several metric batches sent as one."""
    return len(records) > 1 and all(is_metric_only(r) for r in records)
