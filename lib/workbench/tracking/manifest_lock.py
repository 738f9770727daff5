"""A requirements file that recreates a recorded run's environment: ``workbench manifest lock``.

Every manifest lists every installed distribution (``pip_freeze``); this turns that list into
a file ``pip install -r`` takes, with a header naming the run, its Python, and its torch build
and CUDA. torch's build travels in its local version label (``2.13.0+cu128``): such a torch
only exists on PyTorch's own index, which the file then names (``--extra-index-url``, since
everything else comes from PyPI). Left out: the workbench itself (this checkout, installed
editable; the header names the commit to check out) and pip, the installer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench.tracking.manifest import normalize_name

# PyTorch's package index, per build (cpu, cu126, ...): where `make setup` takes torch from
# (scripts/torch_build.py).
PYTORCH_INDEX = "https://download.pytorch.org/whl"
LEFT_OUT = {"workbench": "this checkout, installed editable", "pip": "the installer"}


def lock_requirements(manifest: Mapping[str, Any], label: str) -> str:
    """The requirements file for the run ``label`` described by ``manifest``."""
    pins = [line for line in manifest["pip_freeze"]
            if normalize_name(line.partition("==")[0]) not in LEFT_OUT]
    torch = next((line.partition("==")[2] for line in pins
                  if normalize_name(line.partition("==")[0]) == "torch"), None)
    build = torch.partition("+")[2] if torch else ""
    index = f"{PYTORCH_INDEX}/{build}" if build else None
    lines = [*header(manifest, label, torch), *([f"--extra-index-url {index}"] if index else []),
             *pins]
    return "\n".join(lines) + "\n"


def header(manifest: Mapping[str, Any], label: str, torch: str | None) -> list[str]:
    """Comment lines: which run, how to use the file, Python, torch and CUDA, what is left out."""
    python, os_, git = manifest["python"], manifest["os"], manifest["git"]
    commit = git.get("commit")
    checkout = f"a checkout of commit {commit}" if commit else "a checkout of the workbench"
    dirty = " (the run had uncommitted changes: its git.diff)" if git.get("dirty") else ""
    where = ", ".join(str(v) for v in (os_.get("system"), os_.get("machine"), os_.get("libc"))
                      if v)
    return [
        f"# The Python environment of {label}, from its manifest (recorded "
        f"{manifest.get('created_at')} on {where}). Recreate it with:",
        f"#   python{'.'.join(python['version'].split('.')[:2])} -m venv .venv && "
        ".venv/bin/pip install -r THIS_FILE",
        f"#   .venv/bin/pip install --no-deps -e .    # in {checkout}{dirty}",
        f"# python {python['version']} ({python.get('implementation')})",
        f"# torch {torch_line(torch, manifest['cuda'], manifest['hardware'].get('gpus') or [])}",
        "# left out: " + ", ".join(f"{name} ({why})" for name, why in LEFT_OUT.items()),
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
        ran.append(", ".join(sorted({str(g.get('name')) for g in gpus})))
    return f"{torch}: " + ", ".join(facts) + (f"; ran on {', '.join(ran)}" if ran else "")
