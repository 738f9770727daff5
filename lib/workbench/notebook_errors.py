"""papermill's command line ends on the workbench's one line when a notebook stops on bad input.

A notebook cell that stops on bad input (a parameter of the wrong type, a bad override) shows
one line, ``workbench: error: ...`` (``notebook.short_errors``). papermill's own command line
(``papermill/cli.py``) then re-raises the cell's error as ``PapermillExecutionError`` without
catching it, so Python prints papermill's traceback through click and ``execute.py`` above
that line. papermill has no extension point for this: its engines (the ``papermill.engine``
entry points) are chosen with ``--engine`` and return before ``raise_for_execution_errors``
raises. Python's ``site`` mechanism is the remaining one: a ``.pth`` file in the environment's
site-packages (``make setup`` writes it with ``python -m workbench.notebook_errors``) calls
:func:`install` at interpreter start, which sets a ``sys.excepthook`` in papermill's command
line only. That hook prints the workbench's line and where the executed notebook was written,
and hands every other error (a real crash in a cell) to the previous hook unchanged.

The same hook has papermill's kernel talk to it over an encrypted transport
(:func:`encrypt_kernel_transport`), which papermill's command line has no option for either.

The ``.pth`` line runs at every interpreter start in the environment, so it compares a string
first and imports this module only for papermill; this module imports nothing beyond the
standard library at import (never papermill or torch; jupyter_client and zmq, which papermill
loads anyway, once it runs), and a missing package costs nothing.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Callable, Sequence
from itertools import pairwise
from pathlib import Path
from types import TracebackType

PREFIX = "workbench: error: "
# The notebook's parameter check raises this (workbench.notebook.ParameterError); its message
# is the workbench's line even where the kernel showed a traceback.
PARAMETER_ERROR = "ParameterError"
# `site` reads .pth files in name order: this one after setuptools' "__editable__.*.pth",
# which puts the editable package on the path.
PTH_NAME = "workbench-papermill.pth"
# A .pth line starting with "import" is executed by `site` (docs.python.org/3/library/site.html);
# the try keeps an environment without the package silent.
PTH_LINE = (
    'import sys; exec("try:\\n from workbench.notebook_errors import install\\n'
    'except ImportError: pass\\nelse: install()") '
    'if "papermill" in " ".join(sys.orig_argv[:3]) else None\n'
)
# ANSI colour sequences, as papermill's exceptions.strip_color removes them.
ANSI_COLOUR = re.compile("\x1b\\[(K|.*?m)")

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


def is_papermill_cli(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """True when the program is papermill's command line: its ``papermill`` script or
    ``python -m papermill``."""
    script = os.path.basename(argv[0]) if argv else ""
    return script == "papermill" or any(
        flag == "-m" and module == "papermill" for flag, module in pairwise(orig_argv))


def workbench_line(error: BaseException) -> str | None:
    """The workbench's one-line error a ``PapermillExecutionError`` carries, or None for any
    other error (a real crash keeps papermill's full report).

    A cell stopped by ``notebook.short_errors`` has the one line as its whole traceback; the
    notebook's ``ParameterError`` (and any error whose message is already the workbench's
    line) is one too without that hook.
    """
    exceptions = sys.modules.get("papermill.exceptions")
    if exceptions is None or not isinstance(error, exceptions.PapermillExecutionError):
        return None
    lines = [ANSI_COLOUR.sub("", line) for line in error.traceback or []]
    evalue = str(error.evalue or "").strip()
    if len(lines) == 1 and lines[0].startswith(PREFIX):
        return lines[0].strip()
    if evalue.startswith(PREFIX) and "\n" not in evalue:
        return evalue
    if error.ename == PARAMETER_ERROR and evalue and "\n" not in evalue:
        return PREFIX + evalue
    return None


def output_notebook(tb: TracebackType | None) -> str | None:
    """Where papermill wrote the failed notebook: ``raise_for_execution_errors``'s
    ``output_path`` (papermill writes the notebook, error marked, just before raising);
    None when it went to stdout or the frame is not there."""
    path = None
    while tb is not None:
        frame = tb.tb_frame
        if (frame.f_code.co_name == "raise_for_execution_errors"
                and frame.f_globals.get("__name__") == "papermill.execute"):
            path = frame.f_locals.get("output_path")
        tb = tb.tb_next
    return str(path) if path and str(path) != "-" else None


class OneLineHook:
    """``sys.excepthook`` for papermill's command line: the workbench's line, else ``previous``."""

    def __init__(self, previous: ExceptHook) -> None:
        self.previous = previous

    def __call__(self, etype: type[BaseException], value: BaseException,
                 tb: TracebackType | None) -> None:
        line = workbench_line(value)
        if line is None:
            self.previous(etype, value, tb)
            return
        path = output_notebook(tb)
        where = f"; the executed notebook, error marked: {path}" if path else ""
        sys.stderr.write(f"{line}{where}\n")
        sys.stderr.flush()


def install() -> None:
    """Set the one-line hook when this interpreter runs papermill's command line (idempotent:
    ``site`` may read the same site-packages twice, e.g. through a ``lib64`` link), and
    encrypt its kernel's transport."""
    if not is_papermill_cli(sys.argv, sys.orig_argv) or isinstance(sys.excepthook, OneLineHook):
        return
    sys.excepthook = OneLineHook(sys.excepthook)
    encrypt_kernel_transport()


def encrypt_kernel_transport() -> None:
    """papermill's kernel talks to it over CurveZMQ-encrypted TCP, not plain text.

    jupyter_client's kernel manager provisions CurveZMQ keys for a kernel whose spec declares
    support (ipykernel's does) when ``transport_encryption`` is ``auto``; its default is
    ``disabled``, and ipykernel then warns at every start that code and outputs travel in
    plain text. papermill's command line takes no kernel manager option, so the trait's
    default is set here, for papermill's command line only (``workbench sweep`` sets it on
    its own kernel manager). Nothing changes where libzmq lacks CurveZMQ.
    """
    try:
        import zmq
        from jupyter_client.manager import KernelManager
    except ImportError:
        return
    if zmq.has("curve"):
        KernelManager.class_traits()["transport_encryption"].default_value = "auto"


def installed_pth() -> Path:
    """Where the ``.pth`` file belongs: this environment's site-packages."""
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def install_pth(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` file into ``site_packages`` (this environment's by default)."""
    path = site_packages / PTH_NAME if site_packages else installed_pth()
    path.write_text(PTH_LINE)
    return path


if __name__ == "__main__":
    print(f"papermill's one-line notebook errors: {install_pth()}")
