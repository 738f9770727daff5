"""Environment manifest: which software and hardware produced a run, recorded with every run.

Field practice (FIELD_NOTES.md, "Reproducibility"): write down kernel, driver, CUDA, cuDNN,
PyTorch and framework versions before training and keep them with the results; months later
that is the only way to know which environment produced a curve. ``train()`` does it for
every run (:func:`record_manifest`): ``manifest.json`` at the run's artifact root and in
``model/``, headline facts as MLflow tags, and the uncommitted code as ``git.diff``.

Schema (DESIGN.md "Manifest"; ``tests/test_manifest.py:assert_manifest_schema`` checks it)::

    created_at    ISO 8601 UTC timestamp
    python        version, implementation, executable
    packages      name -> version (null when not installed) for HEADLINE_PACKAGES
    pip_freeze    ["name==version", ...] of every installed distribution, sorted
    os            system, kernel, kernel_version, machine, distribution, libc
    hardware      cpu_model, logical_cores, physical_cores, available_cores, memory_bytes,
                  board (device-tree model, e.g. a Jetson), gpus [{index, name, memory_bytes,
                  driver, uuid, compute_capability}] ([] without a GPU)
    cuda          torch_cuda, cudnn, driver, driver_cuda, available, device_count
    git           commit, branch, dirty, remote (all null outside a git work tree)
    run           started_by, command, argv, notebook, papermill_parameters, overrides, seed,
                  hostname, user, cwd, deterministic, environment, run_id, plus whatever else
                  the caller passed as ``run_info``

Secrets never reach a manifest, param, tag or artifact (:func:`scrub`): environment variables
whose names look like credentials are never recorded and their values are masked wherever
they appear; URIs lose their password; ``name=value`` pairs with credential-like names lose
their value.

Collection costs tens of milliseconds on a warm machine (``benchmarks/manifest_cost.py``):
package versions are read from the distributions' metadata headers, not parsed as e-mail
messages, and git is asked once with ``status --porcelain=v2 --branch``.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import paths
from workbench.config import ConfigError, flatten, load_config
from workbench.tracking.redaction import (
    is_secret_name,
    redact_uri,
    remote_without_credentials,
    scrub,
    scrub_text,
)
from workbench.tracking.store import is_embedded, resolve_tracking_uri, set_tags

if TYPE_CHECKING:
    import argparse

    from mlflow.tracking import MlflowClient

MANIFEST_FILE = "manifest.json"
GIT_DIFF_FILE = "git.diff"
TOP_LEVEL_KEYS = (
    "created_at", "python", "packages", "pip_freeze", "os", "hardware", "cuda", "git", "run",
)
# Versions every manifest lists by name (DESIGN.md), then the project's other key pieces.
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
) -> dict[str, Any]:
    """This machine's manifest, secrets removed; ``root`` is the checkout git describes."""
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
    """Commit, branch, dirty state and remote of the checkout at ``root``; nulls outside one.

    ``dirty`` covers tracked files only (like ``git describe --dirty``); untracked files are
    not code that ran unless imported, and ``git.diff`` could not carry them safely anyway.
    """
    status = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:
        return {"commit": None, "branch": None, "dirty": None, "remote": None}
    commit = branch = None
    dirty = False
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.split()[2]
            commit = None if oid == "(initial)" else oid
        elif line.startswith("# branch.head "):
            head = line.split()[2]
            branch = None if head == "(detached)" else head
        elif line and not line.startswith("#"):
            dirty = True
    remote = _git(root, "config", "--get", f"branch.{branch}.remote") if branch else None
    url = _git(root, "remote", "get-url", (remote or "origin").strip())
    return {
        "commit": commit,
        "branch": branch,
        "dirty": dirty,
        "remote": remote_without_credentials(url.strip()) if url else None,
    }


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


def _git(root: Path, *args: str) -> str | None:
    """Output of a read-only git command in ``root``, or None when git cannot answer."""
    env = {k: v for k, v in os.environ.items() if k not in GIT_LOCATION_VARS}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    try:
        # --no-optional-locks: a background query must not take index.lock from the user's git.
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), *args],
            capture_output=True, text=True, timeout=10, env=env, check=False,
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
    client: MlflowClient,
    run_id: str,
    run_info: Mapping[str, Any] | None = None,
    *,
    seed: int | None = None,
    root: Path | None = None,
    keep_tags: Sequence[str] = (),
) -> dict[str, Any]:
    """Collect the manifest and store it with run ``run_id``; returns it.

    Logs ``manifest.json`` at the artifact root, the headline tags (except names in
    ``keep_tags``, which the caller already set on purpose) and ``git.diff`` when the work
    tree has uncommitted changes, so the exact code can be recovered.
    """

    root = paths.project_root() if root is None else root
    manifest = collect_manifest(run_info, seed=seed, root=root, run_id=run_id)
    client.log_text(run_id, to_json(manifest), MANIFEST_FILE)
    tags = {k: v for k, v in headline_tags(manifest).items() if k not in keep_tags}
    set_tags(client, run_id, tags)
    if manifest["git"]["dirty"]:
        diff = git_diff(root)
        if diff:
            client.log_text(run_id, diff, GIT_DIFF_FILE)
    return manifest


# --------------------------------------------------------------------------- reproducibility


def configure_determinism(deterministic: bool) -> None:
    """Switch torch's deterministic algorithms on or off for this process (``repro.*``).

    On CUDA, cuBLAS needs a fixed workspace to be deterministic; it reads
    ``CUBLAS_WORKSPACE_CONFIG`` when its handle is created, so this runs before the model
    exists (https://docs.pytorch.org/docs/stable/notes/randomness.html). Called for every run
    so a notebook that ran a deterministic run does not silently keep the setting.
    """
    import torch

    if deterministic and torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)


# --------------------------------------------------------------------------- diff


class _Missing:
    """Marks a fact one side of a diff does not have (distinct from a recorded null)."""

    def __repr__(self) -> str:
        return "-"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Difference:
    """One fact that differs between two runs (``MISSING`` where one side lacks it)."""

    section: str
    key: str
    a: Any
    b: Any


@dataclass
class ManifestSource:
    """A manifest to compare, with the resolved config it ran (flattened, values as text)."""

    label: str
    manifest: dict[str, Any]
    config: dict[str, str] | None


def comparable(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's environment facts as ``{"section.key": value}`` for comparison.

    ``created_at`` and the per-invocation run details (command, cwd, run id) are left out;
    ``pip_freeze`` is compared per package, without repeating the headline ``packages``.
    """
    flat: dict[str, Any] = {}
    for section in ("python", "packages", "os", "hardware", "cuda", "git"):
        flat.update(_flatten(manifest.get(section, {}), f"{section}."))
    headline = {normalize_name(p) for p in manifest.get("packages", {})}
    for line in manifest.get("pip_freeze", []):
        name, _, version = line.partition("==")
        if normalize_name(name) not in headline:
            flat[f"pip_freeze.{normalize_name(name)}"] = version
    run = manifest.get("run", {})
    for key in RUN_KEYS_COMPARED:
        flat.update(_flatten({key: run.get(key)}, "run."))
    return flat


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}{k}."))
        return flat
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        flat = {}
        for i, v in enumerate(value):
            flat.update(_flatten(v, f"{prefix}{i}."))
        return flat
    return {prefix.rstrip("."): value}


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Environment differences between two manifests, in schema order."""
    return _diff_flat(comparable(a), comparable(b), section_of=lambda k: k.split(".", 1)[0])


def diff_configs(a: Mapping[str, str], b: Mapping[str, str]) -> list[Difference]:
    """Differences of two flattened configs by key name (``derived.*`` only when both sides
    have them: a manifest file's sibling config.yaml has none, a run's params do)."""
    if not (_has_derived(a) and _has_derived(b)):
        a = {k: v for k, v in a.items() if not k.startswith("derived.")}
        b = {k: v for k, v in b.items() if not k.startswith("derived.")}
    return _diff_flat(dict(sorted(a.items())), dict(sorted(b.items())),
                      section_of=lambda k: "config")


def _has_derived(flat: Mapping[str, str]) -> bool:
    return any(k.startswith("derived.") for k in flat)


def _diff_flat(
    a: dict[str, Any], b: dict[str, Any], section_of: Callable[[str], str]
) -> list[Difference]:
    keys = list(a) + [k for k in b if k not in a]
    out = []
    for key in keys:
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va != vb:
            section = section_of(key)
            short = key[len(section) + 1 :] if key.startswith(f"{section}.") else key
            out.append(Difference(section, short, va, vb))
    return out


def diff_sources(a: ManifestSource, b: ManifestSource) -> list[Difference]:
    """Environment and, where both sides carry one, config differences."""
    diffs = diff_manifests(a.manifest, b.manifest)
    if a.config is not None and b.config is not None:
        diffs += diff_configs(a.config, b.config)
    return diffs


def flat_config_text(tree: Mapping[str, Any]) -> dict[str, str]:
    """A nested config as ``{"dotted.key": str(value)}``, comparable with MLflow params."""
    return {k: str(v) for k, v in flatten(tree).items()}


def load_source(ref: str, store_uri: Callable[[], str]) -> ManifestSource:
    """A manifest from a path (file, or a folder holding manifest.json) or a run id.

    A file's sibling ``config.yaml`` (run artifact folders and ``model/`` have one) gives its
    config; a run's config comes from its params. Raises ``ConfigError`` (exit 2) on a ref
    that is neither.
    """
    path = Path(ref)
    if path.is_dir():
        path = path / MANIFEST_FILE
    if path.is_file():
        return _source_from_file(path)
    if path.suffix == ".json" or os.sep in ref:
        raise ConfigError(f"{ref}: no such manifest file; pass a run id or a manifest.json path")
    return _source_from_run(ref, store_uri())


def _source_from_file(path: Path) -> ManifestSource:
    import yaml

    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not readable as JSON ({exc}); pass a manifest.json") from exc
    _check_is_manifest(manifest, str(path))
    config_file = path.with_name("config.yaml")
    config = None
    if config_file.is_file():
        tree = yaml.safe_load(config_file.read_text())
        config = flat_config_text(tree) if isinstance(tree, dict) else None
    return ManifestSource(str(path), manifest, config)


def _check_is_manifest(manifest: Any, label: str) -> None:

    missing = [k for k in TOP_LEVEL_KEYS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise ConfigError(
            f"{label}: not a workbench manifest (missing {', '.join(missing)}); "
            "pass a run's manifest.json"
        )


def _source_from_run(run_id: str, uri: str) -> ManifestSource:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    shown = redact_uri(uri)
    if is_embedded(uri) and not Path(uri.removeprefix("sqlite:///")).is_file():
        # Asking a missing SQLite store would create an empty one: refuse before touching it.
        raise ConfigError(
            f"{run_id}: not a file, and there is no MLflow store at {shown}; pass a "
            "manifest.json path, or point MLFLOW_TRACKING_URI / tracking.uri at the store"
        )
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "UNAUTHENTICATED":  # a team server without a valid login
            raise ConfigError(
                f"tracking server {shown}: the login is missing or was refused (401); export "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD of your account"
            ) from None
        raise ConfigError(
            f"{run_id}: no such run in {shown} and no such file; pass a run id "
            "(workbench train prints it) or a manifest.json path"
        ) from exc
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = client.download_artifacts(run_id, MANIFEST_FILE, tmp)
        except (MlflowException, OSError) as exc:
            raise ConfigError(
                f"run {run_id} has no {MANIFEST_FILE} (recorded before manifests existed?); "
                "diff needs a manifest on both sides"
            ) from exc
        manifest = json.loads(Path(local).read_text())
    _check_is_manifest(manifest, f"run {run_id}")
    label = f"run {run_id} ({run.info.run_name})"
    return ManifestSource(label, manifest, dict(run.data.params))


# --------------------------------------------------------------------------- rendering


def _cell(value: Any) -> str:
    if value is MISSING:
        return "-"
    if value is None:
        return "null"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_markdown(manifest: Mapping[str, Any]) -> str:
    """A readable Markdown page: one table per section (pip freeze only counted)."""
    lines = [f"# Environment manifest ({manifest['created_at']})", ""]
    titles = {"python": "Python", "packages": "Packages", "os": "Operating system",
              "cuda": "CUDA", "git": "Git", "run": "Run"}
    for section in ("python", "packages", "os"):
        lines += [f"## {titles[section]}", "", *_md_table(("key", "value"),
                  list(manifest[section].items())), ""]
    hardware = {k: v for k, v in manifest["hardware"].items() if k != "gpus"}
    if hardware.get("memory_bytes"):
        hardware["memory_bytes"] = f"{hardware['memory_bytes'] / 2**30:.1f} GiB"
    lines += ["## Hardware", "", *_md_table(("key", "value"), list(hardware.items())), ""]
    gpus = manifest["hardware"]["gpus"]
    gpu_rows = [(g["index"], g["name"], f"{g['memory_bytes'] / 2**30:.1f} GiB", g["driver"],
                 g["compute_capability"]) for g in gpus]
    lines += ["### GPUs", ""]
    lines += (_md_table(("#", "name", "memory", "driver", "compute capability"), gpu_rows)
              if gpus else ["none"])
    lines.append("")
    for section in ("cuda", "git", "run"):
        rows = [(k, v) for k, v in manifest[section].items()]
        lines += [f"## {titles[section]}", "", *_md_table(("key", "value"), rows), ""]
    lines.append(f"pip freeze: {len(manifest['pip_freeze'])} distributions (in the JSON form).")
    return "\n".join(lines) + "\n"


def render_diff_text(diffs: Sequence[Difference], a: str, b: str) -> str:
    """Aligned columns for a terminal; the last line counts differences per section."""
    head = [f"A: {a}", f"B: {b}"]
    if not diffs:
        return "\n".join([*head, "identical: no differences in packages, OS, hardware, CUDA, "
                          "git or config"]) + "\n"
    rows = [("section", "key", "A", "B")] + [
        (d.section, d.key, _cell(d.a), _cell(d.b)) for d in diffs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    body = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    counts: dict[str, int] = {}
    for d in diffs:
        counts[d.section] = counts.get(d.section, 0) + 1
    summary = ", ".join(f"{s} {n}" for s, n in counts.items())
    return "\n".join([*head, "", *body, "", f"{len(diffs)} differences: {summary}"]) + "\n"


def render_diff_markdown(diffs: Sequence[Difference], a: str, b: str) -> str:
    """The differences as a Markdown table (for reports)."""
    lines = [f"A: {_cell(a)}  ", f"B: {_cell(b)}", ""]
    if not diffs:
        return "\n".join([*lines, "identical"]) + "\n"
    rows = [(d.section, d.key, d.a, d.b) for d in diffs]
    return "\n".join([*lines, *_md_table(("section", "key", "A", "B"), rows)]) + "\n"


def diff_to_json(diffs: Sequence[Difference], a: str, b: str) -> str:
    """The differences as JSON (``null`` for a missing side)."""
    def plain(v: Any) -> Any:
        return None if v is MISSING else v

    items = [{"section": d.section, "key": d.key, "a": plain(d.a), "b": plain(d.b)}
             for d in diffs]
    return json.dumps({"a": a, "b": b, "identical": not diffs, "differences": items},
                      indent=2, default=str) + "\n"


# --------------------------------------------------------------------------- command line


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench manifest [--format json|md]`` and ``workbench manifest diff A B``."""
    parser.add_argument("--format", choices=("json", "md"), default="json",
                        help="json (default) or md, a readable table")
    sub = parser.add_subparsers(dest="manifest_command", metavar="diff")
    diff = sub.add_parser(
        "diff", help="what differs between two runs (exit 0 identical, 1 different)",
        description="Compare two runs' manifests and configs. RUN is a run id in the "
        "configured store or a path to a manifest.json (or the folder holding one). "
        "Exit codes: 0 identical, 1 different, 2 bad id/path.",
    )
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    diff.add_argument("--format", choices=("text", "json", "md"), default="text")
    diff.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                      help="Hydra overrides selecting the store, e.g. tracking.uri=...")


def run_command(args: argparse.Namespace) -> int:
    """``workbench manifest``: print this machine's manifest, or diff two runs."""
    if args.manifest_command != "diff":
        manifest = collect_manifest()
        print(render_markdown(manifest) if args.format == "md" else to_json(manifest), end="")
        return 0

    @functools.cache
    def store_uri() -> str:  # resolved only when a ref is a run id, and only once

        if os.environ.get("MLFLOW_TRACKING_URI") and not args.overrides:
            return os.environ["MLFLOW_TRACKING_URI"]  # it wins anyway; skip composing
        return resolve_tracking_uri(load_config(args.overrides).tracking.uri)

    a = load_source(args.run_a, store_uri)
    b = load_source(args.run_b, store_uri)
    diffs = diff_sources(a, b)
    render = {"text": render_diff_text, "json": diff_to_json, "md": render_diff_markdown}
    print(render[args.format](diffs, a.label, b.label), end="")
    return 1 if diffs else 0
