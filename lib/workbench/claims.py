"""Exclusive claims: work that one process on this machine does at a time.

A claim is a ``flock`` on a file, taken without waiting: the process that holds it does the
work, another one is told who does (the holder's pid is written into the file). The kernel
releases the lock when its holder ends, however it ends (SIGKILL included), so a dead holder's
claim is taken over by the next process. Two users: a sweep point
(:mod:`workbench.sweeps.claim`, ``<point>.claim`` beside its notebook) and a run being resumed
(:func:`workbench.training.resume.resume_claim`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive_claim(path: Path, remove: bool = False) -> Iterator[bool]:
    """Hold the claim at ``path`` for the block; yields False when another process holds it.

    ``remove``: the file is deleted when the claim is released (while still locked), so a
    claim leaves nothing behind; a process that locked the file just as it was deleted sees
    that its inode is gone and tries again on the new one. The descriptor is not inherited
    (Python opens files close-on-exec), so a child process does not keep the claim after its
    owner is gone.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        if not remove or same_file(fd, path):
            break
        os.close(fd)  # deleted by its last holder after we opened it: claim the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
        try:
            yield True
        finally:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    """True while ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def claim_holder(path: Path) -> str:
    """The process id written by the claim's holder, or ``"?"``."""
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"
