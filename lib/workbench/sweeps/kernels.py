"""The Jupyter kernels sweep points run in: each one a software stack (a virtualenv).

A point is papermill's execution of ``notebooks/train.ipynb`` in the kernel ``sweep.kernel``
names (papermill's ``kernel_name``; ``workbench``, the project's own environment, by
default). A second virtualenv registered as another kernel (``make candidate``) runs the same
points on other package versions, so one sweep can train A in today's lock and B in a
candidate lock (``sweep.grid={sweep.kernel:[workbench,workbench-candidate]}``), and the runs'
manifests say what differs between the stacks.

Before anything starts, every kernel a sweep names must exist (Jupyter's kernel specs, the
same search path papermill uses) and its Python must have the workbench installed: otherwise
one line names the kernel, the problem and the fix (exit 2). With ``sweep.executor=ray`` the
kernels are checked on this machine; every node needs the same ones (docs/sweeps.md).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from workbench.config import ConfigError

DEFAULT_KERNEL = "workbench"  # the project's kernel, registered by make setup
KERNEL_KEY = "sweep.kernel"  # the setting, a grid key, and the tag on every point's run
CHECK_TIMEOUT_S = 60  # a cold start of a Python on a busy machine
# Run by the kernel's own interpreter: exit 0 when it can import the workbench (without
# importing it: that would load torch). importlib.util is a submodule, imported explicitly.
HAS_WORKBENCH = ("import importlib.util, sys; "
                 "sys.exit(0 if importlib.util.find_spec('workbench') else 3)")


def kernel_python(name: str) -> str:
    """The interpreter of the kernel ``name`` (its spec's first argument), resolved on PATH
    when relative; :class:`ConfigError` when no such kernel is registered."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    manager = KernelSpecManager()
    try:
        spec = manager.get_kernel_spec(name)
    except NoSuchKernel:
        known = ", ".join(sorted(manager.find_kernel_specs())) or "none"
        raise ConfigError(f"{KERNEL_KEY}={name}: no Jupyter kernel {name!r} (registered: "
                          f"{known}); register the environment as one: make candidate, or "
                          f"<venv>/bin/python -m ipykernel install --prefix .venv --name "
                          f"{name}") from None
    program = spec.argv[0] if spec.argv else ""
    found = program if Path(program).is_absolute() else shutil.which(program)
    if not found:
        raise ConfigError(f"{KERNEL_KEY}={name}: its interpreter {program!r} does not exist; "
                          f"register the kernel again from its virtualenv")
    return found


def check_kernels(names: Iterable[str]) -> None:
    """Each kernel exists and its Python finds the workbench; else :class:`ConfigError`."""
    for name in dict.fromkeys(names):
        python = kernel_python(name)
        try:
            done = subprocess.run([python, "-c", HAS_WORKBENCH], capture_output=True,
                                  timeout=CHECK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"{KERNEL_KEY}={name}: its interpreter {python} does not start "
                              f"({type(exc).__name__}); register the kernel again from a "
                              "working virtualenv") from None
        if done.returncode != 0:
            raise ConfigError(f"{KERNEL_KEY}={name}: its interpreter {python} has no workbench "
                              f"installed; install the project into that virtualenv ({python} "
                              "-m pip install --no-deps -e .), or build it with make candidate")
