"""MuJoCo's warnings, routed through Python instead of MuJoCo's own handler.

MuJoCo's default handler prints ``WARNING: ...`` to stdout and appends every warning to
``MUJOCO_LOG.TXT`` in the current directory: a file that grows in the user's project on
every run. Routed here, a warning is printed once per process to stderr, and the known
deprecation in gymnasium's own MuJoCo assets (HalfCheetah's ``settotalmass``: nothing a user
can change) is dropped.
"""

from __future__ import annotations

import functools
import sys

import mujoco

# Warnings about gymnasium's bundled models, not about anything the user wrote.
UPSTREAM_ASSET_WARNINGS = ("compiler attribute 'settotalmass' is deprecated",)


@functools.cache
def route_warnings() -> None:
    """Install the handler (once per process; env workers call it too)."""
    mujoco.set_mju_user_warning(warn)


@functools.cache
def warn(message: str) -> None:
    """Print a MuJoCo warning once per process, unless it is about gymnasium's own assets."""
    if not message.startswith(UPSTREAM_ASSET_WARNINGS):
        print(f"mujoco warning: {message}", file=sys.stderr, flush=True)
