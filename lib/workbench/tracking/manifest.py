"""Environment manifest: which software and hardware produced a run, recorded with every run.

Kernel, driver, CUDA, cuDNN, PyTorch and framework versions are written down before training
and kept with the results; months later that is the only way to know which environment
produced a curve. ``train()`` does it for
every run (:func:`record_manifest`): ``manifest.json`` at the run's artifact root and in
``model/``, headline facts as MLflow tags, and the uncommitted code as ``git.diff``.

Schema (docs/tracking.md; ``tests/test_manifest.py:assert_manifest_schema`` checks it)::

    created_at    ISO 8601 UTC timestamp
    python        version, implementation, executable
    packages      name -> version (null when not installed) for HEADLINE_PACKAGES
    pip_freeze    ["name==version", ...] of every installed distribution, sorted
    os            system, kernel, kernel_version, machine, distribution, libc
    hardware      cpu_model, logical_cores, physical_cores, available_cores, memory_bytes,
                  board (device-tree model, e.g. a Jetson), gpus [{index, name, memory_bytes,
                  driver, uuid, compute_capability}] ([] without a GPU)
    cuda          torch_cuda, cudnn, driver, driver_cuda, available, device_count
    git           commit, branch, dirty, dirty_files (tracked files with uncommitted changes,
                  as git sees them), remote (all null outside a git work tree)
    run           started_by, command, argv, notebook, papermill_parameters, overrides, seed,
                  hostname, user, cwd, deterministic, environment, run_id, plus whatever else
                  the caller passed as ``run_info``
    inputs        the files the run read ({} outside a run): robot {env_id, model, sha256,
                  files {path: {sha256, size}}} (null for an env without an MJCF model) and
                  dataset {repo_id, revision, commit, url, sha256, local_dir, files} (null
                  without ``init.dataset``); see docs/tracking.md#inputs

Secrets never reach a manifest, param, tag or artifact (:func:`scrub`): environment variables
whose names look like credentials are never recorded and their values are masked wherever
they appear; URIs lose their password; ``name=value`` pairs with credential-like names lose
their value.

Collection is kept cheap (docs/benchmarks/costs.md#manifest-and-deterministic-mode):
package versions are read from the distributions' metadata headers, not parsed as e-mail
messages, and git is asked once with ``status --porcelain=v2 --branch``.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import paths
from workbench.tracking.redaction import (
    is_secret_name,
    remote_without_credentials,
    scrub,
    scrub_text,
)
from workbench.tracking.store import RunWrites, set_tags

if TYPE_CHECKING:

    pass

MANIFEST_FILE = "manifest.json"
GIT_DIFF_FILE = "git.diff"
TOP_LEVEL_KEYS = (
    "created_at", "python", "packages", "pip_freeze", "os", "hardware", "cuda", "git", "run",
    "inputs",
)
# What a manifest must hold to be compared: ``inputs`` came later, and manifests recorded
# before it are still manifests.
REQUIRED_KEYS = TOP_LEVEL_KEYS[:-1]
# Input facts that describe where this machine keeps a file, not what it is: not compared.
INPUT_KEYS_NOT_COMPARED = ("local_dir",)
# Versions every manifest lists by name (docs/tracking.md), then the project's other key pieces.
HEADLINE_PACKAGES = (
    "torch", "stable-baselines3", "gymnasium", "mujoco", "mlflow", "hydra-core", "papermill",
    "numpy", "omegaconf", "workbench", "nvidia-ml-py", "ray", "envpool", "onnxruntime",
)
# Environment variables that change numerics or parallelism; recorded in run.environment.
RECORDED_ENV_PREFIXES = (
    "CUDA_", "CUBLAS_", "CUDNN_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_",
    "MUJOCO_", "PYTHONHASHSEED", "WORKBENCH_CPU_BUDGET",
)
# Run keys that describe this invocation rather than the environment: not compared by diff.
RUN_KEYS_COMPARED = ("hostname", "deterministic", "environment")
# A git command past this is taken as hung (its answer is left out). Generous: with the
# notebooks' clean filter (nbstripout) git starts a Python process per changed notebook,
# which on a loaded 2-core machine took over 10 s.
GIT_TIMEOUT_S = 60
# Git commands get a clean location: a GIT_DIR inherited from a hook or a shell would make
# the manifest describe some other repository than the project checkout.
GIT_LOCATION_VARS = (
    "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR", "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_PREFIX",
)


# --------------------------------------------------------------------------- secrets


# --------------------------------------------------------------------------- collection


def collect_manifest(
    run_info: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    root: Path | None = None,
    run_id: str | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """This machine's manifest, secrets removed; ``root`` is the checkout git describes,
    ``inputs`` the files the run read (:mod:`workbench.tracking.inputs`)."""
    versions = installed_versions()
    manifest: dict[str, Any] = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": collect_python(),
        "packages": {name: versions.get(normalize_name(name)) for name in HEADLINE_PACKAGES},
        "pip_freeze": [f"{name}=={version}" for name, version in sorted(versions.items())],
        "os": collect_os(),
        "hardware": collect_hardware(),
        "cuda": {},
        "git": collect_git(paths.project_root() if root is None else root),
        "run": collect_run(run_info, seed=seed, run_id=run_id),
        "inputs": dict(inputs or {}),
    }
    manifest["cuda"] = collect_cuda(manifest["hardware"]["gpus"])
    return scrub(manifest)  # type: ignore[no-any-return]


def normalize_name(name: str) -> str:
    """PEP 503 project name normalization (``Stable_Baselines3`` -> ``stable-baselines3``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions() -> dict[str, str]:
    """Normalized name -> version of every distribution on ``sys.path`` (first one wins).

    Reads the ``Name:``/``Version:`` header lines directly: ``Distribution.metadata`` parses
    each file as an e-mail message, about ten times slower for a few hundred packages.
    """
    versions: dict[str, str] = {}
    for dist in metadata.distributions():
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        name, version = _name_and_version(text)
        if name and version:
            versions.setdefault(normalize_name(name), version)
    return versions


def _name_and_version(text: str) -> tuple[str | None, str | None]:
    name = version = None
    for line in text.partition("\n\n")[0].splitlines():  # the header block only
        if line.startswith("Name:"):
            name = line[5:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
        if name and version:
            break
    return name, version


def collect_python() -> dict[str, Any]:
    """Interpreter version, implementation and path."""
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def collect_os() -> dict[str, Any]:
    """Kernel, distribution and C library (the kernel/driver pair matters on GPU servers)."""
    try:
        distribution: str | None = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:  # not a freedesktop system (macOS, minimal containers)
        distribution = platform.platform(terse=True) or None
    return {
        "system": platform.system(),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "machine": platform.machine(),
        "distribution": distribution,
        "libc": _libc(),
    }


def _libc() -> str | None:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        found = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36", no file parsing needed
        if found:
            return found
    name, version = platform.libc_ver()
    return f"{name} {version}" if name else None


def collect_hardware() -> dict[str, Any]:
    """CPU model, cores, memory, board and GPUs."""
    import psutil

    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "available_cores": len(affinity) if affinity else os.cpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "board": _read_first_line(Path("/proc/device-tree/model")),
        "gpus": collect_gpus(),
    }


def _cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            # x86 says "model name"; ARM boards say "Model" or "Hardware".
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    return platform.processor() or None


def _read_first_line(path: Path) -> str | None:
    try:
        text = path.read_text(errors="replace").replace("\x00", "").strip()
    except OSError:
        return None
    return text.splitlines()[0] if text else None


def collect_gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs through NVML (``nvidia-ml-py``); ``[]`` without a GPU or a driver."""
    try:
        import pynvml
    except ImportError:
        return _torch_gpus()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver / library: a CPU machine or a Jetson (no NVML)
        return _torch_gpus()
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append({
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "driver": driver,
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "compute_capability": f"{major}.{minor}",
            })
        return gpus
    except pynvml.NVMLError:
        return _torch_gpus()
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _torch_gpus() -> list[dict[str, Any]]:
    """GPUs torch sees when NVML cannot tell (Jetson boards have CUDA but no NVML)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({
            "index": index,
            "name": props.name,
            "memory_bytes": int(props.total_memory),
            "driver": _proc_driver_version(),
            "uuid": str(getattr(props, "uuid", "")) or None,
            "compute_capability": f"{props.major}.{props.minor}",
        })
    return gpus


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _proc_driver_version() -> str | None:
    """Kernel module version from ``/proc/driver/nvidia/version`` (no NVML needed)."""
    line = _read_first_line(Path("/proc/driver/nvidia/version"))
    match = re.search(r"Kernel Module\s+(\S+)", line or "")
    return match.group(1) if match else None


def collect_cuda(gpus: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """torch's CUDA and cuDNN versions, the driver and its CUDA level; nulls where absent."""
    import torch

    available = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch_cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else None,
        "driver": gpus[0]["driver"] if gpus else _proc_driver_version(),
        "driver_cuda": _driver_cuda_version() if gpus else None,
        "available": available,
        "device_count": torch.cuda.device_count() if available else 0,
    }


def _driver_cuda_version() -> str | None:
    """Highest CUDA version the installed driver supports (``nvidia-smi``'s "CUDA Version")."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            number = int(pynvml.nvmlSystemGetCudaDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml missing or NVML unusable: the fact is simply unknown
        return None
    return f"{number // 1000}.{number % 1000 // 10}"


def collect_git(root: Path) -> dict[str, Any]:
    """Commit, branch, dirty state and files, and remote of the checkout at ``root``.

    All null outside a git work tree. ``dirty`` covers tracked files only (like ``git
    describe --dirty``); untracked files are not code that ran unless imported, and
    ``git.diff`` could not carry them safely anyway. ``dirty_files`` names them (paths from
    the repository root, sorted). Git's own view decides: a file whose change a clean filter
    undoes (a notebook whose only change is outputs, with the repository's nbstripout filter)
    is not dirty.
    """
    status = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=no", "-z")
    if status is None:
        return {"commit": None, "branch": None, "dirty": None, "dirty_files": None,
                "remote": None}
    commit = branch = None
    files: set[str] = set()
    entries = iter(status.split("\0"))
    for line in entries:
        if line.startswith("# branch.oid "):
            oid = line.split()[2]
            commit = None if oid == "(initial)" else oid
        elif line.startswith("# branch.head "):
            head = line.split()[2]
            branch = None if head == "(detached)" else head
        elif line and not line.startswith("#"):
            files.add(_status_path(line))
            if line.startswith("2 "):  # a rename or copy: its original path comes next
                files.add(next(entries, "") or _status_path(line))
    if files and commit is not None:
        files = _changed_files(root, files)
    remote = _git(root, "config", "--get", f"branch.{branch}.remote") if branch else None
    url = _git(root, "remote", "get-url", (remote or "origin").strip())
    return {
        "commit": commit,
        "branch": branch,
        "dirty": bool(files),
        "dirty_files": sorted(files),
        "remote": remote_without_credentials(url.strip()) if url else None,
    }


def _changed_files(root: Path, candidates: set[str]) -> set[str]:
    """The candidates whose content differs from HEAD's, as git would store them.

    ``git status`` calls a file modified when its size changed, before any clean filter runs
    (a notebook saved with outputs), and ``git diff`` trusts the same stat data in some
    states. So each candidate's worktree content is hashed through its filters (``git
    hash-object --stdin-paths``, by the path's attributes) and compared with its blob in HEAD;
    a file gone from the worktree or new since HEAD is changed. Asked only when status found
    something, so a clean tree costs one git call; a git that cannot answer leaves them all.
    """
    present = sorted(c for c in candidates if (root / c).is_file())
    hashed = (_git(root, "hash-object", "--stdin-paths", stdin="\n".join(present) + "\n")
              if present else "")
    listed = _git(root, "ls-tree", "-z", "HEAD", "--", *present) if present else ""
    if hashed is None or listed is None:
        return candidates
    worktree = dict(zip(present, hashed.split(), strict=False))
    head = {}
    for entry in filter(None, listed.split("\0")):
        meta, path = entry.split("\t", 1)
        head[path] = meta.split()[2]
    return {c for c in candidates if c not in worktree or worktree[c] != head.get(c)}


# Fields before the path in ``git status --porcelain=v2`` entries: changed (1), renamed or
# copied (2), unmerged (u).
STATUS_FIELDS = {"1": 8, "2": 9, "u": 10}


def _status_path(entry: str) -> str:
    """The path of one ``--porcelain=v2 -z`` status entry (paths may hold spaces)."""
    return entry.split(" ", STATUS_FIELDS.get(entry[:1], 1))[-1]


def dirty_summary(files: Sequence[str], shown: int = 3) -> str:
    """``2 files: a.py, notebooks/x.ipynb`` (the first ``shown`` names, then ``...``)."""
    names = ", ".join(files[:shown]) + (", ..." if len(files) > shown else "")
    return f"{len(files)} file{'' if len(files) == 1 else 's'}: {names}"


def git_diff(root: Path) -> str | None:
    """Uncommitted changes of tracked files against HEAD, secrets masked; None if none.

    A preamble names the base commit and the untracked files, which are not included
    (``git apply`` skips text before the first ``diff --git`` line, as in a mailed patch).
    """
    diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff", "--no-textconv")
    if not diff:
        return None
    head = (_git(root, "rev-parse", "HEAD") or "").strip()
    untracked = (_git(root, "ls-files", "--others", "--exclude-standard") or "").splitlines()
    preamble = [f"# workbench: uncommitted changes of tracked files against {head}"]
    if untracked:
        preamble.append(f"# untracked files, not included: {' '.join(untracked)}")
    return scrub_text("\n".join(preamble) + "\n\n" + diff)


def _git(root: Path, *args: str, stdin: str | None = None) -> str | None:
    """Output of a read-only git command in ``root``, or None when git cannot answer.

    The user's locale stays: only machine-readable output is read (porcelain status, names,
    hashes, the diff), and the repository's filters, which status, diff and hash-object run,
    get the environment the user's own git gives them (under ``LC_ALL=C`` the notebooks'
    filter failed on a CI machine, and git then compared the unfiltered notebook).
    """
    env = {k: v for k, v in os.environ.items() if k not in GIT_LOCATION_VARS}
    env["GIT_TERMINAL_PROMPT"] = "0"
    try:
        # --no-optional-locks: a background query must not take index.lock from the user's git.
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), *args], input=stdin,
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):  # git not installed, or hung
        return None
    return done.stdout if done.returncode == 0 else None


def collect_run(
    run_info: Mapping[str, Any] | None, *, seed: int | None = None, run_id: str | None = None
) -> dict[str, Any]:
    """How this run was started: detected context, overlaid with what the caller passed."""
    run: dict[str, Any] = {
        **detect_run_context(),
        "seed": seed,
        "hostname": socket.gethostname(),
        "user": _user(),
        "cwd": os.getcwd(),
        "deterministic": _deterministic_enabled(),
        "environment": recorded_environment(),
        "run_id": run_id,
    }
    info = dict(run_info or {})
    if "started_by" not in info and info.get("papermill_parameters") is not None:
        info["started_by"] = "papermill"
    elif "started_by" not in info and info.get("notebook"):
        info["started_by"] = "notebook"
    if info.get("notebook") and "command" not in info:
        run["command"] = run["argv"] = None  # a kernel's argv names only its launcher
    run.update(info)
    return run


def detect_run_context() -> dict[str, Any]:
    """What can be told without help: the command line, or the notebook of a Jupyter kernel."""
    context: dict[str, Any] = {
        "started_by": "python",
        "command": shlex.join(sys.argv) if sys.argv and sys.argv[0] else None,
        "argv": list(sys.argv),
        "notebook": None,
        "papermill_parameters": None,
        "overrides": [],
    }
    program = Path(sys.argv[0] if sys.argv else "")
    if program.name == "workbench" or program.parts[-2:] == ("workbench", "__main__.py"):
        context.update(started_by="cli", command=shlex.join(["workbench", *sys.argv[1:]]))
    shell = _ipython_kernel_shell()
    if shell is not None:
        ns = shell.user_ns
        # ipykernel copies Jupyter's JPY_SESSION_NAME (the notebook path) into __session__;
        # VS Code sets __vsc_ipynb_file__.
        notebook = ns.get("__session__") or ns.get("__vsc_ipynb_file__")
        notebook = notebook or os.environ.get("JPY_SESSION_NAME")
        context.update(started_by="notebook", notebook=notebook, command=None, argv=None)
    return context


def _ipython_kernel_shell() -> Any:
    if "ipykernel" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and hasattr(shell, "kernel") else None


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container uid without a passwd entry
        return None


def _deterministic_enabled() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch.are_deterministic_algorithms_enabled()) if torch is not None else False


def recorded_environment() -> dict[str, str]:
    """Environment variables that change numerics or parallelism; never credential-like ones."""
    return {
        k: v for k, v in sorted(os.environ.items())
        if k.startswith(RECORDED_ENV_PREFIXES) and not is_secret_name(k)
    }


# --------------------------------------------------------------------------- recording


def to_json(manifest: Mapping[str, Any]) -> str:
    """The manifest as stored: indented JSON, keys in schema order."""
    return json.dumps(manifest, indent=2, default=str) + "\n"


def headline_tags(manifest: Mapping[str, Any]) -> dict[str, str]:
    """MLflow tags for the facts one filters by: versions, CUDA, GPU, git; unknown ones left out.

    ``cuda`` and ``gpu`` are ``none`` on a CPU machine: that absence is itself the fact.
    """
    packages = manifest["packages"]
    cuda, git = manifest["cuda"], manifest["git"]
    tags: dict[str, Any] = {
        "torch": packages.get("torch"),
        "sb3": packages.get("stable-baselines3"),
        "gymnasium": packages.get("gymnasium"),
        "mujoco": packages.get("mujoco"),
        "python": manifest["python"]["version"],
        "cuda": cuda["torch_cuda"] or "none",
        "cudnn": cuda["cudnn"],
        "driver": cuda["driver"],
        "gpu": gpu_summary(manifest["hardware"]["gpus"]),
        "kernel": manifest["os"]["kernel"],
        "host": manifest["run"].get("hostname"),
        "git_commit": git["commit"],
        "git_branch": git["branch"],
        "git_dirty": None if git["dirty"] is None else str(git["dirty"]).lower(),
        "git_dirty_files": dirty_summary(git["dirty_files"]) if git.get("dirty_files") else None,
    }
    return {k: str(v) for k, v in tags.items() if v is not None}


def gpu_summary(gpus: Sequence[Mapping[str, Any]]) -> str:
    """``none``, ``NVIDIA H200`` or ``2x NVIDIA H200`` (mixed models joined by commas)."""
    if not gpus:
        return "none"
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[str(gpu["name"])] = counts.get(str(gpu["name"]), 0) + 1
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in counts.items())


def record_manifest(
    client: RunWrites,
    run_id: str,
    run_info: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    root: Path | None = None,
    keep_tags: Sequence[str] = (),
    inputs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Collect the manifest and store it with run ``run_id``; returns it.

    Logs ``manifest.json`` at the artifact root (with the run's ``inputs``), the headline
    tags (except names in ``keep_tags``, which the caller already set on purpose) and
    ``git.diff`` when the work tree has uncommitted changes, so the exact code can be
    recovered.
    """

    root = paths.project_root() if root is None else root
    manifest = collect_manifest(run_info, seed=seed, root=root, run_id=run_id, inputs=inputs)
    client.log_text(run_id, to_json(manifest), MANIFEST_FILE)
    tags = {k: v for k, v in headline_tags(manifest).items() if k not in keep_tags}
    set_tags(client, run_id, tags)
    if manifest["git"]["dirty"]:
        diff = git_diff(root)
        if diff:
            client.log_text(run_id, diff, GIT_DIFF_FILE)
    return manifest


# --------------------------------------------------------------------------- diff


# --------------------------------------------------------------------------- rendering


# --------------------------------------------------------------------------- command line


