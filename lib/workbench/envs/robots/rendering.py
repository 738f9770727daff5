"""Off-screen rendering for the workbench's robots, with an error a person can act on.

MuJoCo renders through an OpenGL context chosen by ``MUJOCO_GL`` (``glfw`` needs a display,
``egl`` a libEGL (GPU driver or Mesa), ``osmesa`` Mesa's software renderer). Gymnasium's
renderer, when the variable is unset, takes the first backend that *imports*, which on a
headless server is ``glfw``, and then fails with an opaque ``FatalError`` when the context is
made. So before the first frame we pick ``egl`` on machines without a display, and turn
whatever still fails into one line saying what to install or set.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from typing import Any

from workbench.envs import opengl

BACKEND_HINT = (
    "off-screen rendering needs an OpenGL backend: set MUJOCO_GL=egl (libEGL: a GPU driver "
    "or Mesa, apt-get install libegl1) or MUJOCO_GL=osmesa (apt-get install libosmesa6), "
    "or render on a machine with a display (MUJOCO_GL=glfw)"
)


class RenderingUnavailable(RuntimeError):
    """No OpenGL context could be created for rendering."""

    reason = "no OpenGL backend"  # what a run's summary says in one phrase


class NotRenderable(RenderingUnavailable):
    """The environment renders no frames (no ``rgb_array`` render mode), whatever OpenGL
    could do: no backend or driver would give it a video."""

    reason = "the env has no rendering"


class RenderFailed(RenderingUnavailable):
    """The env's own ``render()`` raised: a bug of the env, not of the OpenGL backend."""

    reason = "the env's render() failed"


# Where an OpenGL failure is raised from: MuJoCo's bindings and contexts, PyOpenGL, GLFW and
# gymnasium's MuJoCo renderer. An exception raised anywhere else came from the env's code.
RENDERING_MODULES = ("mujoco", "OpenGL", "glfw", "gymnasium.envs.mujoco.mujoco_rendering")


def raised_in(exc: BaseException) -> tuple[str, str]:
    """The module and ``file:line`` of the innermost Python frame ``exc`` passed through."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "", "?"
    frame = tb.tb_frame
    where = f"{os.path.basename(frame.f_code.co_filename)}:{tb.tb_lineno}"
    return str(frame.f_globals.get("__name__", "")), where


def is_backend_failure(exc: BaseException) -> bool:
    """True when ``exc`` came from the rendering stack (or is MuJoCo's own FatalError)."""
    if type(exc).__name__ == "FatalError" or isinstance(exc, ImportError):
        return True
    module, _ = raised_in(exc)
    return any(module == name or module.startswith(name + ".") for name in RENDERING_MODULES)


def prefer_offscreen_backend() -> None:
    """Choose ``MUJOCO_GL`` on a machine without a display, unless the user chose: ``egl``,
    or ``osmesa`` where only Mesa's software library is installed.

    It must be set before the first OpenGL import in the process (PyOpenGL fixes its
    platform then), hence at environment construction rather than at the first frame.
    """
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        only_osmesa = not opengl.has_library("egl") and opengl.has_library("osmesa")
        os.environ["MUJOCO_GL"] = "osmesa" if only_osmesa else "egl"


def has_display() -> bool:
    """True when a window can be opened (an X display is set)."""
    return bool(os.environ.get("DISPLAY"))


NO_DISPLAY = ("render_mode='human' needs a display (DISPLAY is not set): no window is shown; "
              "use render_mode='rgb_array' for off-screen frames")


@functools.cache
def warn_no_display() -> None:
    """Say once per process that a ``human`` env has no window (GLFW would abort without one)."""
    warnings.warn(NO_DISPLAY, RuntimeWarning, stacklevel=3)


def render_or_explain(render: Callable[[], Any]) -> Any:
    """Call ``render``; an OpenGL failure becomes :class:`RenderingUnavailable` with a fix,
    an exception of the env's own code :class:`RenderFailed` naming where it was raised."""
    try:
        return render()
    except RenderingUnavailable:
        raise
    except Exception as exc:  # mujoco.FatalError, ImportError, RuntimeError, AttributeError
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if not is_backend_failure(exc):
            raise RenderFailed(
                f"the env's render() raised {type(exc).__name__}: {text} (at "
                f"{raised_in(exc)[1]}), which is not an OpenGL problem: fix the env's render(), "
                "or record no video (video=off)") from exc
        backend = os.environ.get("MUJOCO_GL", "unset")
        raise RenderingUnavailable(
            f"render failed with MUJOCO_GL={backend} ({type(exc).__name__}: {text}); "
            f"{BACKEND_HINT}") from exc
