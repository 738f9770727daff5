#!/usr/bin/env python3
"""Which torch build to install, and from where: the install route of ``make setup``.

The Makefile runs this with the system Python before the virtual environment exists, so it
uses the standard library only. It prints the pip arguments that install the pinned torch
release in the chosen build on stdout, and one line saying which build and why on stderr::

    python3 scripts/torch_build.py pip-args auto     # nvidia-smi decides (make setup's default)
    python3 scripts/torch_build.py pip-args cu126    # a named build
    python3 scripts/torch_build.py build auto        # just the build's name
    python3 scripts/torch_build.py requirement cpu   # torch==VERSION+cpu (make lock)

Builds: ``cpu``, ``cu126``, ``cu128``, ``cu130`` from PyTorch's own package index
(https://download.pytorch.org/whl/<build>), and ``pypi``, PyPI's default wheel (on Linux
x86_64 the CUDA 13.0 build). ``auto`` reads the driver's CUDA level from ``nvidia-smi``
("CUDA Version: 12.8" in its header; else the driver version from
``--query-gpu=driver_version``) and takes the newest build at or below that level: a driver
runs CUDA builds up to its own level. No driver, or a driver older than every build: the CPU
build, said so in the line. docs/gpu-servers.md explains the routes.

Exit codes: 0; 2 for an unknown build name (one ``workbench: error:`` line).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The torch release the project is tested with (every route installs exactly this one).
TORCH_VERSION = "2.13.0"
# A candidate stack's release instead (make candidate UPGRADE=torch==VERSION sets it).
TORCH_VERSION = os.environ.get("WORKBENCH_TORCH_VERSION") or TORCH_VERSION
PYTORCH_INDEX = "https://download.pytorch.org/whl"
# PyTorch's CUDA builds of TORCH_VERSION -> the CUDA level each needs from the driver.
CUDA_BUILDS: dict[str, tuple[int, int]] = {"cu126": (12, 6), "cu128": (12, 8), "cu130": (13, 0)}
# What PyPI's default Linux x86_64 wheel of TORCH_VERSION is built with.
PYPI_CUDA = (13, 0)
ROUTES = ("auto", "cpu", *CUDA_BUILDS, "pypi")
# Lowest Linux driver of each CUDA release (NVIDIA's CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions"), used only when nvidia-smi prints no "CUDA Version".
DRIVER_CUDA: tuple[tuple[tuple[int, ...], tuple[int, int]], ...] = (
    ((580, 65, 6), (13, 0)),
    ((575, 51, 3), (12, 9)),
    ((570, 26), (12, 8)),
    ((565, 57, 1), (12, 7)),
    ((560, 28, 3), (12, 6)),
    ((555, 42, 2), (12, 5)),
    ((550, 54, 14), (12, 4)),
    ((545, 23, 6), (12, 3)),
    ((535, 54, 3), (12, 2)),
    ((530, 30, 2), (12, 1)),
    ((525, 60, 13), (12, 0)),
)
NVIDIA_SMI_TIMEOUT_S = 60  # a driver without persistence mode can take seconds to answer


@dataclass(frozen=True)
class Driver:
    """What nvidia-smi told: the driver version and the highest CUDA level it runs."""

    version: str | None
    cuda: tuple[int, int] | None
    problem: str | None = None  # why nothing usable was read (no driver, nvidia-smi failed)


@dataclass(frozen=True)
class Choice:
    """The build to install and the one line that explains it."""

    build: str  # cpu | cu126 | cu128 | cu130 | pypi
    reason: str


# --------------------------------------------------------------------------- nvidia-smi


def parse_cuda_version(smi_output: str) -> tuple[int, int] | None:
    """``CUDA Version: 12.4`` from nvidia-smi's header, or None ("N/A" or absent)."""
    match = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", smi_output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def parse_driver_version(query_output: str) -> str | None:
    """The first GPU's driver from ``--query-gpu=driver_version --format=csv,noheader``."""
    for line in query_output.splitlines():
        if re.fullmatch(r"\d+(\.\d+)+", line.strip()):
            return line.strip()
    match = re.search(r"Driver Version\s*:\s*(\d+(?:\.\d+)+)", query_output)
    return match.group(1) if match else None


def cuda_of_driver(driver: str) -> tuple[int, int] | None:
    """The CUDA level a Linux driver version runs (DRIVER_CUDA), None if older than 12.0."""
    number = tuple(int(part) for part in driver.split("."))
    for lowest, cuda in DRIVER_CUDA:
        if number >= lowest:
            return cuda
    return None


def read_driver(run: Callable[[Sequence[str]], str | None]) -> Driver:
    """Ask nvidia-smi (through ``run``, which returns its stdout or None when it failed)."""
    header = run(["nvidia-smi"])
    if header is None:
        return Driver(None, None, "nvidia-smi failed (is the NVIDIA driver loaded?)")
    query = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    driver = parse_driver_version(query or "") or parse_driver_version(header)
    cuda = parse_cuda_version(header) or (cuda_of_driver(driver) if driver else None)
    if cuda is None and driver is None:
        return Driver(None, None, "nvidia-smi printed neither a CUDA nor a driver version")
    return Driver(driver, cuda)


def run_nvidia_smi(command: Sequence[str]) -> str | None:
    """stdout of an nvidia-smi call, None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False,
                              timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def detect_driver() -> Driver | None:
    """This machine's driver; None when there is no nvidia-smi at all (no NVIDIA driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    return read_driver(run_nvidia_smi)


# --------------------------------------------------------------------------- the choice


def level(cuda: tuple[int, int]) -> str:
    return f"{cuda[0]}.{cuda[1]}"


def choose(route: str, driver: Driver | None) -> Choice:
    """The build for ``route`` (``auto`` decides from ``driver``; None: no NVIDIA driver)."""
    if route != "auto":
        return Choice(route, f"chosen by TORCH={route}{driver_note(route, driver)}")
    if driver is None:
        return Choice("cpu", "no NVIDIA driver (nvidia-smi not found)")
    if driver.cuda is None:
        return Choice("cpu", f"{driver.problem}; make setup TORCH=cu126 (or cu128, cu130) "
                             "picks a CUDA build by hand")
    fitting = [b for b, needs in CUDA_BUILDS.items() if needs <= driver.cuda]
    about = f"driver {driver.version or '?'} runs CUDA up to {level(driver.cuda)}"
    if not fitting:
        oldest = min(CUDA_BUILDS, key=CUDA_BUILDS.__getitem__)
        return Choice("cpu", f"{about}, older than every CUDA build of torch {TORCH_VERSION} "
                             f"({', '.join(CUDA_BUILDS)}); update the driver to CUDA "
                             f"{level(CUDA_BUILDS[oldest])} or later for the GPU, or try "
                             f"TORCH={oldest} (docs/gpu-servers.md)")
    best = max(fitting, key=CUDA_BUILDS.__getitem__)
    return Choice(best, f"{about}, the newest build for it")


def driver_note(build: str, driver: Driver | None) -> str:
    """A warning when a named CUDA build needs more than this machine's driver runs."""
    needs = CUDA_BUILDS.get(build) or (PYPI_CUDA if build == "pypi" else None)
    if needs is None or driver is None or driver.cuda is None or needs <= driver.cuda:
        return ""
    return (f"; warning: it needs CUDA {level(needs)}, this driver runs up to "
            f"{level(driver.cuda)} (torch.cuda.is_available() may be False)")


def requirement(build: str, system: str | None = None) -> str:
    """The exact requirement: ``torch==VERSION+BUILD`` from PyTorch's index on Linux.

    The local version label makes pip take torch from PyTorch's index only: plain
    ``torch==VERSION`` is also on PyPI, where on Linux it is the multi-GB CUDA 13 build. On
    macOS PyPI's wheel is the CPU build and PyTorch publishes no labelled one.
    """
    system = system or platform.system()
    if build == "pypi" or (build == "cpu" and system == "Darwin"):
        return f"torch=={TORCH_VERSION}"
    return f"torch=={TORCH_VERSION}+{build}"


def index_url(build: str, index: str | None = None, system: str | None = None) -> str | None:
    """PyTorch's index for ``build`` (``index`` replaces its base, e.g. a mirror; "none":
    pip's own configuration only), None where the wheel comes from PyPI."""
    if requirement(build, system) == f"torch=={TORCH_VERSION}" or index == "none":
        return None
    return f"{(index or PYTORCH_INDEX).rstrip('/')}/{build}"


def pip_args(build: str, index: str | None = None, system: str | None = None) -> list[str]:
    """What ``pip install`` gets: the exact torch and, where needed, its index.

    ``--index-url``, as PyTorch documents it: torch and the CUDA libraries it pins (nvidia-*,
    triton) come from PyTorch's index alone. pip's own configuration (find-links, a local
    wheel directory) still applies.
    """
    url = index_url(build, index, system)
    return [requirement(build, system), *(["--index-url", url] if url else [])]


# --------------------------------------------------------------------------- command line


class Parser(argparse.ArgumentParser):
    """Errors in one line with exit code 2, like the workbench's own commands."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"workbench: error: {message}\n")
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("pip-args", "build", "requirement", "index-url"))
    parser.add_argument("route", metavar="TORCH")
    parser.add_argument("--index", metavar="URL",
                        help="base URL replacing https://download.pytorch.org/whl (a mirror); "
                        "'none': pip's configuration only (a local wheel directory)")
    args = parser.parse_args(argv)
    if args.route not in ROUTES:
        parser.error(f"TORCH={args.route}: unknown torch build; choose one of "
                     f"{', '.join(ROUTES)} (docs/gpu-servers.md)")
    if args.what == "requirement":
        if args.route == "auto":
            parser.error("requirement needs a build, not auto (e.g. requirement cpu)")
        print(requirement(args.route))
        return 0
    driver = None if args.route == "cpu" else detect_driver()  # named builds: warn if too new
    choice = choose(args.route, driver)
    url = index_url(choice.build, args.index)
    source = url or ("pip's configured sources" if args.index == "none" else "PyPI")
    print(f"torch {TORCH_VERSION}: {choice.build} build from {source}; {choice.reason}",
          file=sys.stderr)
    if args.what == "build":
        print(choice.build)
    elif args.what == "index-url":
        print(url or "")
    else:
        print(" ".join(pip_args(choice.build, args.index)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
