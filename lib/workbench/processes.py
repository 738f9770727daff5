"""Server processes the workbench starts (``workbench ui``, ``workbench server``): waiting for
them to answer and stopping their whole process group, so nothing is left behind.

Each server runs in its own session (``start_new_session=True``): a terminal's Ctrl-C reaches
only the workbench, which then stops the group with SIGTERM (MLflow's uvicorn, job runner and
huey consumers shut down quietly) and SIGKILLs what is left after a timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from base64 import b64encode


def http_status(url: str, auth: tuple[str, str] | None = None, timeout: float = 5.0) -> int:
    """HTTP status of a GET (0 when nothing answers)."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def wait_until_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    """Poll ``url/health`` until it answers 200; ``None`` then, else why not (in words).

    Returns early with the exit code when ``process`` exits before answering.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        if http_status(f"{url}/health", timeout=2.0) == 200:
            return None
        time.sleep(0.5)
    return f"did not answer on {url} within {timeout_s:.0f} s"


def group_alive(pgid: int) -> bool:
    """True if any process of process group ``pgid`` is left (uvicorn workers included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate_group(pgid: int, timeout_s: float) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``timeout_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap(pgid)
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    while group_alive(pgid):
        reap(pgid)
        time.sleep(0.1)


def reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):  # not our child: nothing to collect
        os.waitpid(pid, os.WNOHANG)
