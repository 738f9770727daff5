"""A point claimed by one ``workbench sweep`` at a time: an exclusive lock beside its notebook.

Two invocations of the same sweep id on one machine (two terminals, a cron job and a person)
would otherwise both train every point not yet FINISHED, and each would close the other's
running point KILLED. Before running a point, an invocation takes ``<point>.claim`` in the
sweep's notebook folder with ``flock`` (non-blocking); the other skips the points held and
says so. The kernel releases the lock when the point ends or its owner dies, however it dies
(SIGKILL included), so a dead owner's claim is taken over by the next invocation. The lock is
per machine: Ray workers on other machines rely on the FINISHED-run check instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def point_claim(path: Path) -> Iterator[bool]:
    """Hold the claim at ``path`` for the block; yields False when another process holds it.

    The descriptor is not inherited (Python opens files close-on-exec), so the point's kernel
    does not keep the claim after its owner is gone.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def claim_holder(path: Path) -> str:
    """The process id written by the claim's holder, or ``"?"``."""
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"
