"""A requirements file that recreates a recorded run's environment: ``workbench manifest lock``.

Every manifest lists every installed distribution (``pip_freeze``); this turns that list into
a file ``pip install -r`` takes, with a header naming the run, its Python, and its torch build
and CUDA. torch's build travels in its local version label (``2.13.0+cu128``): such a torch
only exists on PyTorch's own index, which the file then names (``--extra-index-url``, since
everything else comes from PyPI). Left out: the workbench itself (this checkout, installed
editable; the header names the commit to check out) and pip, the installer.

A manifest in a store is data (a shared store, a copied run): the file this writes is fed to
``pip install -r``, which also takes options (``--index-url``, ``-e``, ``-r FILE``) and URLs.
So only ``name==version`` lines with a PEP 508 name and a PEP 440 version are written; every
other entry is left out and listed (:attr:`Lock.dropped`), and every other value from the
manifest goes in a comment line with its control characters escaped
(:func:`workbench.console.printable`), so a newline in ``git.commit`` cannot start a line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from workbench.console import printable
from workbench.tracking.manifest import normalize_name

# PyTorch's package index, per build (cpu, cu126, ...): where `make setup` takes torch from
# (scripts/torch_build.py).
PYTORCH_INDEX = "https://download.pytorch.org/whl"
LEFT_OUT = {"workbench": "this checkout, installed editable", "pip": "the installer"}
# A pin: a PEP 508 project name, ==, a version (checked to be PEP 440 by packaging).
PIN = re.compile(r"([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])==([A-Za-z0-9.+!_-]+)")
# PyTorch's builds (its wheel index has a folder per build): cpu, cu126, rocm6.2, xpu.
TORCH_BUILD = re.compile(r"cpu|cu\d{2,4}|rocm\d+(?:\.\d+)*|xpu")


@dataclass(frozen=True)
class Lock:
    """A requirements file and the ``pip_freeze`` entries left out of it (not pins)."""

    text: str
    pinned: int
    dropped: list[str]


def pin(entry: Any) -> str | None:
    """``entry`` if it is ``name==version`` (PEP 508 name, PEP 440 version), else None."""
    match = PIN.fullmatch(entry) if isinstance(entry, str) else None
    if match is None:
        return None
    try:
        Version(match[2])
    except InvalidVersion:
        return None
    return entry


def lock_requirements(manifest: Mapping[str, Any], label: str) -> Lock:
    """The requirements file for the run ``label`` described by ``manifest``."""
    freeze = manifest.get("pip_freeze")
    entries = freeze if isinstance(freeze, list) else [freeze]
    pins, dropped = [], []
    for entry in entries:
        line = pin(entry)
        if line is None:
            dropped.append(printable(str(entry))[:120])
        elif normalize_name(line.partition("==")[0]) not in LEFT_OUT:
            pins.append(line)
    torch = next((line.partition("==")[2] for line in pins
                  if normalize_name(line.partition("==")[0]) == "torch"), None)
    build = torch.partition("+")[2] if torch else ""
    index = f"{PYTORCH_INDEX}/{build}" if TORCH_BUILD.fullmatch(build) else None
    lines = [*header(manifest, label, torch), *([f"--extra-index-url {index}"] if index else []),
             *pins]
    return Lock("\n".join(lines) + "\n", len(pins), dropped)


def header(manifest: Mapping[str, Any], label: str, torch: str | None) -> list[str]:
    """Comment lines: which run, how to use the file, Python, torch and CUDA, what is left out.

    Each value from the manifest is escaped (:func:`workbench.console.printable`): a line
    break in it would otherwise end the comment and start a live requirement line.
    """
    return [f"# {printable(line)}" for line in header_lines(manifest, label, torch)]


def section(manifest: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A mapping section of the manifest, or an empty one if it is missing or not a mapping."""
    value = manifest.get(key)
    return value if isinstance(value, Mapping) else {}


def header_lines(manifest: Mapping[str, Any], label: str, torch: str | None) -> list[str]:
    """The header's text, before escaping and the ``# `` of each line."""
    python, os_, git = (section(manifest, key) for key in ("python", "os", "git"))
    commit = git.get("commit")
    checkout = f"a checkout of commit {commit}" if commit else "a checkout of the workbench"
    dirty = " (the run had uncommitted changes: its git.diff)" if git.get("dirty") else ""
    where = ", ".join(str(v) for v in (os_.get("system"), os_.get("machine"), os_.get("libc"))
                      if v)
    version = str(python.get("version"))
    gpus = section(manifest, "hardware").get("gpus")
    gpus = gpus if isinstance(gpus, list) else []
    return [
        f"The Python environment of {label}, from its manifest (recorded "
        f"{manifest.get('created_at')} on {where}). Recreate it with:",
        f"  python{'.'.join(version.split('.')[:2])} -m venv .venv && "
        ".venv/bin/pip install -r THIS_FILE",
        f"  .venv/bin/pip install --no-deps -e .    # in {checkout}{dirty}",
        f"python {version} ({python.get('implementation')})",
        f"torch {torch_line(torch, section(manifest, 'cuda'), gpus)}",
        "left out: " + ", ".join(f"{name} ({why})" for name, why in LEFT_OUT.items()),
    ]


def torch_line(torch: str | None, cuda: Mapping[str, Any], gpus: list[Mapping[str, Any]]
               ) -> str:
    """``2.13.0+cu128: CUDA 12.8, cuDNN 91002; driver 570.86.15 (CUDA 12.8), NVIDIA H100``."""
    if torch is None:
        return "not installed"
    build = torch.partition("+")[2]
    if not cuda.get("torch_cuda"):
        return f"{torch}: the CPU build (no CUDA)"
    origin = "" if build else ", PyPI's default wheel"
    facts = [f"CUDA {cuda['torch_cuda']}{origin}", *([f"cuDNN {cuda['cudnn']}"]
                                                     if cuda.get("cudnn") else [])]
    ran = []
    if cuda.get("driver"):
        level = f" (CUDA {cuda['driver_cuda']})" if cuda.get("driver_cuda") else ""
        ran.append(f"driver {cuda['driver']}{level}")
    if gpus:
        names = {str(g.get("name")) for g in gpus if isinstance(g, Mapping)}
        ran.append(", ".join(sorted(names)))
    return f"{torch}: " + ", ".join(facts) + (f"; ran on {', '.join(ran)}" if ran else "")
