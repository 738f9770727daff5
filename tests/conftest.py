"""Shared fixtures: a temporary MLflow store and the real config, shrunk for speed."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

# glfw (imported by gymnasium's MuJoCo renderer with the first MuJoCo env) probes its library's
# version in a subprocess on import: imported here, before any unit test's guard is active.
with contextlib.suppress(ImportError):
    import glfw  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

# Tiny but real: HalfCheetah, 2 envs, 64-step rollouts, 3 PPO iterations (conf/debug/tiny.yaml).
TINY = ["env=halfcheetah", "debug=tiny"]


def stop_as_if_interrupted(signum: int, frame: object) -> None:
    """SIGTERM handler: raise KeyboardInterrupt, as Ctrl-C does."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI time-out, a scheduler, ``kill``) stops the run as Ctrl-C does: pytest
    then still tears down every fixture, so the clusters, servers and kernels that fixtures
    started are stopped instead of outliving the run (by default SIGTERM ends the process at
    once, and nothing after the fixtures' ``yield`` runs)."""
    signal.signal(signal.SIGTERM, stop_as_if_interrupted)


# make test runs the suite on two pytest-xdist workers. A session fixture is built once per
# worker that needs it, so the modules of an expensive one form one unit of work, which one
# worker runs (the team server's modules also rely on their order: test_server.py's last test
# searches what the others left); so do the modules that measure time (benchmark smokes,
# calibration), so no two of them run at once. Every other test is a unit of its own.
# (pytest-xdist's own `--dist loadgroup` does not group on pytest 9.2: it renames node ids,
# which pytest no longer reads, so the units are made here, by module, in the scheduler.)
MODULE_UNITS = {
    **dict.fromkeys(("test_report", "test_tradeoff", "test_report_browser", "test_sweep"),
                    "report-sweep"),  # tests/reportdata.py's sweep
    **dict.fromkeys(("test_bad_input", "test_checkpoint", "test_manifest",
                     "test_security_bundles", "test_export", "test_hub"),
                    "trained-runs"),  # tests/trained_run.py's runs
    **dict.fromkeys(("test_server", "test_copy"), "team-server"),
    **dict.fromkeys(("test_bench_quick", "test_calibration"), "timing"),
}
# The longest work starts first (make test passes --no-loadscope-reorder, so the units are
# handed out in collection order): the multi-node Ray tests, one at a time between the units
# of several modules, so the two workers do not start two clusters at once.
LONG_MODULE = "test_sweep_ray_cluster"
LONG_UNITS = ("report-sweep", "trained-runs", "team-server", "timing")


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's, else the test alone."""
    return MODULE_UNITS.get(module_of(nodeid), nodeid)


def start_order(nodeids: list[str]) -> dict[str, int]:
    """Rank of each long unit: Ray cluster tests alternate with the units of modules."""
    cluster_tests = [nodeid for nodeid in nodeids if module_of(nodeid) == LONG_MODULE]
    order: list[str] = []
    for i in range(max(len(cluster_tests), len(LONG_UNITS))):
        order += cluster_tests[i:i + 1] + list(LONG_UNITS[i:i + 1])
    return {unit: rank for rank, unit in enumerate(order)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = start_order([item.nodeid for item in items])
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable


@pytest.hookimpl(tryfirst=True)  # before xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``--dist loadscope``: xdist's scope scheduler over :func:`work_unit`."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleUnits(config, log)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def unit_tier_stays_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``unit`` fails if it trains, starts a process or opens a connection.

    The unit tier (``make test-unit``) must run in seconds on a loaded machine; whatever needs
    a training, a subprocess, a server or a browser belongs in the default or slow tier.
    """
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(what: str):  # noqa: ANN202
        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a unit test must not {what}: mark it for the default tier")
        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(multiprocessing.Process, "start", refuse("start a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("open a network connection"))
    monkeypatch.setattr(OnPolicyAlgorithm, "learn", refuse("train"))


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh embedded MLflow store under tmp_path (MLFLOW_TRACKING_URI and experiments/)."""
    experiments = tmp_path / "experiments"
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
    return experiments


@contextlib.contextmanager
def embedded_store(experiments: Path) -> Iterator[pytest.MonkeyPatch]:
    """The ``store`` fixture's environment for fixtures wider than one test (module,
    session): an embedded MLflow store under ``experiments``; yields the patch for more."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
        yield patch


def copy_store(source: Path, target: Path) -> str:
    """Copy an embedded store (database, artifacts, sweep notebooks) to ``target`` and point
    its runs' artifact locations there, so the copy can be changed without touching the
    source; returns the copy's tracking URI."""
    shutil.copytree(source, target)
    with sqlite3.connect(target / "mlflow.db") as db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            db.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)",
                       (str(source), str(target)))
    return f"sqlite:///{target / 'mlflow.db'}"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
            **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``python -m workbench ARGS`` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {})}, **kwargs,
    )


# Shared fixtures, registered here once: a fixture imported into a test module is a new
# fixture of that module (a session-scoped one is then built once per importing module), so
# no test module imports a fixture. Pages in a real headless chromium (tests/browser.py);
# team mode: one PostgreSQL + MLflow server per session (tests/teamserver.py); a real
# `mlflow server` per test (tests/mlflowserver.py); one local Ray head per test
# (tests/raycluster.py); the runs trained once per session (tests/trained_run.py) and the
# sweep of the sweep and report tests (tests/reportdata.py).
from tests.browser import browser  # noqa: E402, F401
from tests.mlflowserver import mlflow_server  # noqa: E402, F401
from tests.raycluster import clusters, ray_head  # noqa: E402, F401
from tests.reportdata import report_sweep  # noqa: E402, F401
from tests.teamserver import team_server  # noqa: E402, F401
from tests.trained_run import exported_policy, finished_run  # noqa: E402, F401
