"""Install routes: the torch build ``make setup`` picks, the lock it installs, and how.

No network and no GPU: ``scripts/torch_build.py`` is fed nvidia-smi outputs written in the
format of the driver each file is named after (``tests/data/nvidia-smi/``; this machine has
no GPU to record them from), and the Makefile runs against a stand-in Python that only logs
what it was asked to install (PyTorch's package index is unreachable from here). The real
installation from the lock is checked by hand in a throwaway venv (docs/gpu-servers.md).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import ROOT

SMI = ROOT / "tests" / "data" / "nvidia-smi"
LOCK = ROOT / "requirements" / "lock.txt"


def load_torch_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_build", ROOT / "scripts" /
                                                  "torch_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_build"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


tb = load_torch_build()


def recorded(name: str):
    """nvidia-smi as the file ``name`` says: the header, the driver query, or a failure."""
    text = (SMI / name).read_text()
    driver = re.search(r"Driver Version: (\S+)", text)

    def run(command: list[str]) -> str | None:
        if "NVIDIA-SMI has failed" in text:
            return None  # nvidia-smi exits 9 without a driver
        if any(arg.startswith("--query-gpu") for arg in command):
            return f"{driver.group(1)}\n" if driver else ""
        return text

    return run


# --------------------------------------------------------------------------- the choice


@pytest.mark.unit
@pytest.mark.parametrize(("fixture", "cuda", "build"), [
    ("535.183.01.txt", (12, 2), "cpu"),  # a RHEL 8 long-term driver: older than every build
    ("550.54.15.txt", (12, 4), "cpu"),
    ("560.35.03.txt", (12, 6), "cu126"),
    ("570.86.15.txt", (12, 8), "cu128"),
    ("575.57.08.txt", (12, 9), "cu128"),  # no cu129 build: the newest at or below 12.9
    ("580.82.07.txt", (13, 0), "cu130"),
    ("570.86.15-cuda-na.txt", (12, 8), "cu128"),  # no CUDA level printed: from the driver
])
def test_auto_takes_the_newest_build_the_driver_runs(fixture: str, cuda: tuple[int, int],
                                                     build: str) -> None:
    driver = tb.read_driver(recorded(fixture))
    assert driver.cuda == cuda
    assert driver.version == fixture.split("-")[0].removesuffix(".txt")
    choice = tb.choose("auto", driver)
    assert choice.build == build
    assert "\n" not in choice.reason
    if build == "cpu":
        assert f"runs CUDA up to {cuda[0]}.{cuda[1]}" in choice.reason
        assert "older than every CUDA build" in choice.reason and "TORCH=cu126" in choice.reason


@pytest.mark.unit
def test_no_driver_or_a_failing_one_gives_the_cpu_build() -> None:
    assert tb.choose("auto", None) == tb.Choice("cpu", "no NVIDIA driver (nvidia-smi not found)")
    failed = tb.choose("auto", tb.read_driver(recorded("no-driver.txt")))
    assert failed.build == "cpu" and failed.reason.startswith("nvidia-smi failed")


@pytest.mark.unit
def test_named_builds_are_taken_as_given_with_a_warning_when_too_new() -> None:
    old = tb.read_driver(recorded("550.54.15.txt"))
    choice = tb.choose("cu128", old)
    assert choice.build == "cu128"
    assert "warning: it needs CUDA 12.8, this driver runs up to 12.4" in choice.reason
    assert tb.choose("cu126", tb.read_driver(recorded("560.35.03.txt"))).reason == (
        "chosen by TORCH=cu126")
    assert tb.choose("cpu", None).build == "cpu"


@pytest.mark.unit
def test_driver_table_and_parsers() -> None:
    assert tb.cuda_of_driver("550.54.14") == (12, 4)
    assert tb.cuda_of_driver("550.54.13") == (12, 3)
    assert tb.cuda_of_driver("580.65.06") == (13, 0)
    assert tb.cuda_of_driver("470.256.02") is None
    assert tb.parse_cuda_version("| NVIDIA-SMI 550 | CUDA Version: N/A |") is None
    assert tb.parse_driver_version("550.54.15\n550.54.15\n") == "550.54.15"  # one line per GPU


# --------------------------------------------------------------------------- pip arguments


@pytest.mark.unit
def test_pip_arguments_pin_torch_exactly_per_route() -> None:
    version = tb.TORCH_VERSION
    assert tb.pip_args("cu128", system="Linux") == [
        f"torch=={version}+cu128", "--index-url", "https://download.pytorch.org/whl/cu128"]
    assert tb.pip_args("cpu", system="Linux") == [
        f"torch=={version}+cpu", "--index-url", "https://download.pytorch.org/whl/cpu"]
    # PyPI's default wheel; on macOS the CPU build is PyPI's own wheel, without a label.
    assert tb.pip_args("pypi", system="Linux") == [f"torch=={version}"]
    assert tb.pip_args("cpu", system="Darwin") == [f"torch=={version}"]
    # A mirror of PyTorch's index, or pip's configuration alone (a local wheel directory).
    assert tb.pip_args("cu126", "https://mirror.example/pytorch/", "Linux") == [
        f"torch=={version}+cu126", "--index-url", "https://mirror.example/pytorch/cu126"]
    assert tb.pip_args("cpu", "none", "Linux") == [f"torch=={version}+cpu"]
    for build in tb.CUDA_BUILDS:  # never an unpinned torch: that would be PyPI's CUDA build
        assert tb.requirement(build, "Linux") == f"torch=={version}+{build}"


@pytest.mark.unit
def test_unknown_build_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        tb.main(["pip-args", "cu118"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("workbench: error: TORCH=cu118: unknown torch build; choose one of "
                          "auto, cpu, cu126, cu128, cu130, pypi")
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- the Makefile


def stand_ins(tmp_path: Path, smi: str | None) -> tuple[dict[str, str], Path, Path]:
    """A venv whose python only logs its arguments, and nvidia-smi answering from ``smi``."""
    log = tmp_path / "calls.log"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    tools = tmp_path / "tools"
    tools.mkdir()
    if smi is not None:
        text = (SMI / smi).read_text()
        driver = re.search(r"Driver Version: (\S+)", text)
        (tools / "header.txt").write_text(text)
        failing = "NVIDIA-SMI has failed" in text
        (tools / "nvidia-smi").write_text(
            "#!/bin/sh\n" + (f"cat {tools / 'header.txt'}; exit 9\n" if failing else
                             f'case "$*" in *query-gpu*) echo {driver.group(1)};; '
                             f"*) cat {tools / 'header.txt'};; esac\n"))
    for tool in (python, tools / "nvidia-smi"):
        if tool.exists():
            tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
           # Not a git work tree: make setup's git-filter step (tests/test_manifest.py runs
           # it in a scratch repository) must not point this checkout's filter at the stand-in.
           "GIT_DIR": str(tmp_path / "no-repository")}
    return env, venv, log


def make_setup(tmp_path: Path, smi: str | None, *args: str
               ) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    env, venv, log = stand_ins(tmp_path, smi)
    # The interpreter under a path with a space and non-ASCII characters, as in a checkout
    # cloned into "新 实验/": every recipe must quote it.
    python = tmp_path / "新 实验" / "python3"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    proc = subprocess.run(
        ["make", "--no-print-directory", "setup", f"VENV={venv}", f"PYTHON={python}",
         *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_make_setup_installs_lock_then_the_chosen_torch_then_the_project(tmp_path: Path
                                                                         ) -> None:
    proc, calls = make_setup(tmp_path, "570.86.15.txt")
    assert proc.returncode == 0, proc.stderr
    version = tb.TORCH_VERSION
    assert calls == [
        "-m pip install -q --no-compile --no-deps -r requirements/lock.txt",
        f"-m pip install -q --no-compile torch=={version}+cu128 --index-url "
        "https://download.pytorch.org/whl/cu128",
        f"-m compileall -qq -j 0 {tmp_path / 'venv' / 'lib'}",  # bytecode, every core
        "-m pip install -q --no-compile -e .[dev,team,ray,fast,zoo]",
        "-m pip check",
        "-m ipykernel install --sys-prefix --name workbench --display-name Python (workbench)",
        "-m workbench.notebook_errors",  # papermill's one-line errors (a .pth file)
    ]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("torch ")]
    assert lines == [f"torch {version}: cu128 build from https://download.pytorch.org/whl/cu128; "
                     "driver 570.86.15 runs CUDA up to 12.8, the newest build for it"]


def test_make_setup_on_an_old_driver_says_so_and_takes_the_cpu_build(tmp_path: Path) -> None:
    proc, calls = make_setup(tmp_path, "550.54.15.txt", "LOCK=")
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == (f"-m pip install -q --no-compile torch=={tb.TORCH_VERSION}+cpu --index-url "
                        "https://download.pytorch.org/whl/cpu")  # LOCK=: no lock step
    assert "driver 550.54.15 runs CUDA up to 12.4, older than every CUDA build" in proc.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_make_setup_without_a_driver_takes_the_cpu_build(tmp_path: Path) -> None:
    proc, calls = make_setup(tmp_path, None, "TORCH_INDEX=none")
    assert proc.returncode == 0, proc.stderr
    assert calls[1] == f"-m pip install -q --no-compile torch=={tb.TORCH_VERSION}+cpu"
    assert "no NVIDIA driver (nvidia-smi not found)" in proc.stderr


def test_make_setup_refuses_an_unknown_build_before_installing(tmp_path: Path) -> None:
    proc, calls = make_setup(tmp_path, "570.86.15.txt", "TORCH=cuda")
    assert proc.returncode != 0
    assert calls == []
    assert "workbench: error: TORCH=cuda: unknown torch build" in proc.stderr


# --------------------------------------------------------------------------- the lock


def locked() -> dict[str, str]:
    """name -> version of requirements/lock.txt."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#", "-")):
            name, _, version = line.partition("==")
            assert version and " " not in version, line  # exact pins only
            pins[canonicalize_name(name)] = version
    return pins


def project_requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and those of the extras make setup installs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = makefile_extras()
    lines = [*project["dependencies"]]
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def makefile_extras() -> list[str]:
    match = re.search(r"^EXTRAS := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match
    return match.group(1).split(",")


@pytest.mark.unit
def test_lock_covers_every_requirement_at_a_version_it_allows() -> None:
    pins = locked()
    linux = {**default_environment(), "sys_platform": "linux", "platform_machine": "x86_64",
             "platform_system": "Linux", "python_version": "3.11"}
    for req in project_requirements():
        name = canonicalize_name(req.name)
        if name == "torch" or (req.marker and not req.marker.evaluate(linux)):
            continue
        assert name in pins, f"{req} is not in requirements/lock.txt: run make lock"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])


@pytest.mark.unit
def test_lock_leaves_torch_and_its_cuda_libraries_to_the_route() -> None:
    pins = locked()
    assert "torch" not in pins
    build_specific = [n for n in pins if n.startswith(("nvidia-", "triton", "cuda-"))
                      and n != "nvidia-ml-py"]  # NVML's bindings are the project's own
    assert build_specific == []
    header = LOCK.read_text()
    assert "#    make lock\n" in header
    assert "--index-url" not in header and "--find-links" not in header  # machine-neutral


@pytest.mark.unit
def test_torch_pin_is_the_one_the_environment_file_and_container_use() -> None:
    version = tb.TORCH_VERSION
    environment = (ROOT / "environment.yml").read_text()
    assert f"torch=={version}+cu126" in environment
    assert "--extra-index-url https://download.pytorch.org/whl/cu126" in environment
    assert f"-e .[{','.join(makefile_extras())}]" in environment
    assert "-r requirements/lock.txt" in environment
    assert "make kernel git-filter VENV=$CONDA_PREFIX" in environment
    assert "  - python=3.11\n" in environment  # the lock's Python
    assert "by pip-compile with Python 3.11\n" in LOCK.read_text()


# --------------------------------------------------------------------------- the container
# No container engine runs here: the recipe's parts are checked instead (its sources, its
# install commands, the stages it builds in), never faked as a build.


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Containerfile").read_text())
    steps = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            steps.append((word.upper(), " ".join(rest.split())))
    return steps


def make_call(word: str, args: str) -> re.Match[str] | None:
    """``make TARGET ARGS`` when a RUN instruction is one (after its --mount options)."""
    command = re.sub(r"^(--\S+\s+)*", "", args) if word == "RUN" else ""
    return re.fullmatch(r"make (\w+) (.*)", command)


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context (last match wins)."""
    from fnmatch import fnmatch

    verdict = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        if not pattern.strip() or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch(p, pattern) or fnmatch(p, pattern.removeprefix("**/")) for p in prefixes):
            verdict = not keep
    return verdict


def copies() -> list[tuple[int, list[str], str]]:
    """(instruction index, sources, destination) of every COPY."""
    found = []
    for i, (word, args) in enumerate(instructions()):
        if word == "COPY":
            *sources, destination = args.split()
            found.append((i, sources, destination))
    return found


@pytest.mark.unit
def test_container_copies_only_what_exists_and_is_in_the_context() -> None:
    for _, sources, _ in copies():
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
    assert ignored(".venv") and ignored("experiments/mlflow.db") and ignored(".git")
    assert not ignored("experiments/README.md")


@pytest.mark.unit
def test_container_installs_with_the_makefile_from_the_lock_and_a_named_build() -> None:
    steps = instructions()
    runs = [(i, args) for i, (word, args) in enumerate(steps) if word == "RUN"]
    assert not [a for _, a in runs if "pip install" in a or "pip3 install" in a]  # make only
    makes = [(i, m) for i, a in runs if (m := make_call("RUN", a))]
    targets = [m.group(1) for _, m in makes]
    assert targets == ["deps", "setup"]
    makefile = (ROOT / "Makefile").read_text()
    for (_, match), target in zip(makes, targets, strict=True):
        assert re.search(rf"^{target}:", makefile, re.M), target
        assert match.group(2).split() == ["VENV=/opt/venv", "PYTHON=python3.11",
                                          "TORCH=${TORCH}"]
    arg = next(a for word, a in steps if word == "ARG" and a.startswith("TORCH="))
    default = arg.removeprefix("TORCH=")
    assert default in tb.ROUTES and default != "auto"  # a build has no GPU to ask
    copied_before = {s for i, sources, _ in copies() if i < makes[0][0] for s in sources}
    assert {"requirements/", "scripts/", "Makefile"} <= copied_before  # the lock and the route
    assert "lib/" not in copied_before  # a code change keeps the torch layer cached
    user = max(i for i, (word, _) in enumerate(steps) if word == "USER")
    assert user > makes[-1][0] and steps[user][1] not in ("root", "0")
    env = " ".join(a for word, a in steps if word == "ENV")
    assert "PATH=/opt/venv/bin:$PATH" in env and "NVIDIA_DRIVER_CAPABILITIES=compute" in env


def project_files(stage: Path) -> list[str]:
    """What ``pip install -e .`` and the installed workbench read from the checkout, missing
    from ``stage``: pyproject.toml's readme and package folder (setuptools builds without
    complaint from an empty one, and the image would hold no code), and the folders the
    workbench opens at run time (config groups, the notebooks a sweep executes)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (where,) = project["tool"]["setuptools"]["packages"]["find"]["where"]
    needed = [project["project"]["readme"], f"{where}/workbench/__init__.py",
              "conf/config.yaml", "notebooks/train.ipynb"]
    return [path for path in needed if not (stage / path).is_file()]


def test_container_stages_have_what_their_make_targets_need(tmp_path: Path) -> None:
    """Each RUN make in a folder holding only what the COPY lines before it brought in: make
    finds its prerequisites there, and `make setup` the project's own files."""
    steps = instructions()
    for i, (word, args) in enumerate(steps):
        match = make_call(word, args)
        if not match:
            continue
        stage = tmp_path / f"stage{i}"
        stage.mkdir()
        for _, sources, _ in (c for c in copies() if c[0] < i):
            for source in sources:
                target = stage / source
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, target)
        command = match.group(2).replace("${TORCH}", "cu126").split()
        dry = subprocess.run(["make", "-n", match.group(1), *command], cwd=stage,
                             capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, (match.group(0), dry.stderr)
        if match.group(1) == "setup":
            assert project_files(stage) == [], match.group(0)
    # The check fails where it should: a stage without the package's code.
    assert project_files(tmp_path) == ["README.md", "lib/workbench/__init__.py",
                                       "conf/config.yaml", "notebooks/train.ipynb"]
