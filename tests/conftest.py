"""Shared fixtures: a temporary MLflow store and the real config, shrunk for speed."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
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


# make test runs the suite on two pytest-xdist workers (`--dist loadgroup`). A session fixture
# is built once per worker that needs it, so the tests of an expensive one share a group, which
# one worker runs; so do the Ray tests (each starts a cluster of several CPUs) and the tests
# that measure time (benchmark smokes, calibration), so no two of them run at once.
SHARED_FIXTURE_GROUPS = {"report_sweep": "report-sweep", "team_server": "team-server",
                         "finished_run": "trained-runs", "exported_policy": "trained-runs"}
MODULE_GROUPS = {"test_sweep_ray_cluster": "ray", "test_sweep_ray": "ray", "test_tune_ray": "ray",
                 "test_bench_quick": "timing", "test_calibration": "timing"}


def xdist_group(item: pytest.Item) -> str | None:
    """The xdist group of a test: its module's, else that of the shared fixture it uses."""
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    if module in MODULE_GROUPS:
        return MODULE_GROUPS[module]
    names = getattr(item, "fixturenames", ())
    return next((group for name, group in SHARED_FIXTURE_GROUPS.items() if name in names), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


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
