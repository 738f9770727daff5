"""Which OpenGL backend MuJoCo may use in this process, decided before ``import mujoco``.

MuJoCo loads the backend that ``MUJOCO_GL`` names when it is imported (``egl``: libEGL and
libOpenGL; ``osmesa``: Mesa's libOSMesa), and that import fails outright when the library is
missing or the value is unknown, which would stop every run on such a machine, videos or not.
:func:`check_backend` (run by ``workbench.envs`` on import) sees that coming: it sets
``MUJOCO_GL=disable`` for the process, so simulation works, and remembers why; a video then
ends with one line saying what to install (:func:`unusable`). Libraries are probed with
``dlopen`` (no subprocess).
"""

from __future__ import annotations

import ctypes
import os
import sys

# The shared libraries PyOpenGL opens for each off-screen platform (each group: one of them).
LIBRARIES = {
    "egl": (("libEGL.so.1", "libEGL.so"), ("libOpenGL.so.0", "libGL.so.1", "libOpenGL.so")),
    "osmesa": (("libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so"),),
}
# Values mujoco accepts besides those (rendering/classic/gl_context.py); glfw and glx need a
# display, which is checked when a window or a frame is asked for.
OTHER_VALUES = ("", "glfw", "glx", "enable", "enabled", "on", "true", "1",
                "disable", "disabled", "off", "false", "0")
DEBIAN_PACKAGES = {"egl": "libegl1", "osmesa": "libosmesa6"}
_state: dict[str, str | None] = {"unusable": None}


def loadable(names: tuple[str, ...]) -> bool:
    """True when one of the shared libraries ``names`` loads."""
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return True
    return False


def check_backend() -> None:
    """If ``MUJOCO_GL`` names a backend this machine cannot load, disable OpenGL for the
    process (``MUJOCO_GL=disable``) and remember why; otherwise leave everything as it is."""
    if not sys.platform.startswith("linux") or "mujoco" in sys.modules:
        return  # macOS/Windows have their own backends; too late once mujoco is imported
    value = os.environ.get("MUJOCO_GL", "").strip().lower()
    if value in LIBRARIES:
        missing = [names[0] for names in LIBRARIES[value] if not loadable(names)]
        if not missing:
            return
        reason = (f"MUJOCO_GL={value}: {', '.join(missing)} not found (Debian: apt-get install "
                  f"{DEBIAN_PACKAGES[value]}; make setup installs it)")
    elif value in OTHER_VALUES:
        return
    else:
        reason = (f"MUJOCO_GL={os.environ['MUJOCO_GL']}: not a backend MuJoCo knows; use "
                  "egl, osmesa or glfw")
    _state["unusable"] = reason
    os.environ["MUJOCO_GL"] = "disable"


def unusable() -> str | None:
    """Why this process cannot render (set by :func:`check_backend`), or None."""
    return _state["unusable"]


def has_library(backend: str) -> bool:
    """True when the libraries of ``egl`` or ``osmesa`` load on this machine."""
    return all(loadable(names) for names in LIBRARIES[backend])
