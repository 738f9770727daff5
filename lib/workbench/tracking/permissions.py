"""What a team server lets this login write, asked before a command writes anything.

A team server (MLflow's basic-auth app, ``workbench server``) refuses a write the login may
not make with 403, and it does so in the middle of a command: after an export, after a run
was reopened, as a traceback. Commands that write into runs and models someone else may own
(``train resume=``, ``promote``, ``eval``) ask first, through the auth app's own "what may
this user do on that resource" endpoint, and answer in one line before any work.

A store that cannot say (an embedded SQLite store, a server without the auth app, a client
without a login) gives None: the command goes on, and the store answers its writes as before.
Only ``requests``-level calls through MLflow's REST helpers are made here: importing MLflow's
auth client would load the whole server application.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from workbench.tracking.store import is_embedded

# The auth app's REST endpoints (mlflow.server.auth.routes): a user's own record, and the
# permission a user resolves to on one resource, the same way a real request is authorized.
GET_USER = "/api/2.0/mlflow/users/get"
GET_USER_PERMISSION = "/api/3.0/mlflow/users/permissions/get"
# Permissions that may write (mlflow.server.auth.permissions: can_update).
WRITING = frozenset({"EDIT", "MANAGE"})
TIMEOUT_S = 10


@dataclass(frozen=True)
class Access:
    """What ``user`` may do on one resource of a team server."""

    user: str
    permission: str  # READ, USE, EDIT, MANAGE, NO_PERMISSIONS; "admin" for an administrator

    @property
    def can_write(self) -> bool:
        return self.permission == "admin" or self.permission in WRITING


def login() -> str | None:
    """The user this process logs in as (``MLFLOW_TRACKING_USERNAME``), or None."""
    return os.environ.get("MLFLOW_TRACKING_USERNAME") or None


def experiment_access(uri: str, experiment_id: str) -> Access | None:
    """This login's access to an experiment (its runs), or None when the store cannot say."""
    return access(uri, "experiment", experiment_id)


def model_access(uri: str, name: str) -> Access | None:
    """This login's access to a registered model, or None when the store cannot say."""
    return access(uri, "registered_model", name)


def access(uri: str, kind: str, resource_id: str) -> Access | None:
    """Ask the auth app what the login may do on a resource (an administrator may do all)."""
    user = login()
    if user is None or is_embedded(uri) or not uri.startswith(("http://", "https://")):
        return None
    found = ask(uri, GET_USER, {"username": user})
    if found is None:
        return None
    if (found.get("user") or {}).get("is_admin"):
        return Access(user, "admin")
    answer = ask(uri, GET_USER_PERMISSION,
                 {"username": user, "resource_type": kind, "resource_id": resource_id})
    permission = (answer or {}).get("permission")
    return Access(user, str(permission)) if permission else None


def ask(uri: str, endpoint: str, params: dict[str, str]) -> dict[str, Any] | None:
    """One GET to the server's auth app; None when it does not answer it (no auth app,
    another version, a refused login: the command's own requests then say what is wrong)."""
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        response = http_request(get_default_host_creds(uri), endpoint, "GET", params=params,
                                max_retries=0, timeout=TIMEOUT_S)
        if response.status_code != 200:
            return None
        body = response.json()
    except Exception:  # unreachable, not JSON: the store check says why
        return None
    return body if isinstance(body, dict) else None


def write_refusal(access: Access, what: str, owner: str) -> str:
    """``your login bob has READ on experiment 'alice-runs' (403 for any write to run X); ask
    its owner for EDIT permission``: the middle of a one-line refusal."""
    return (f"your login {access.user} has {access.permission} on {owner}, so the team "
            f"server refuses any write to {what} (403); ask its owner or an admin for EDIT "
            "permission")
