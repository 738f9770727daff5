"""Shared fixtures: a temporary MLflow store and the real config, shrunk for speed."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import multiprocessing
import os
import resource
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

# Tiny but real: HalfCheetah, 2 envs, 64-step rollouts, 3 PPO iterations (conf/debug/tiny.yaml),
# with its thumbnail rollout video: for the tests of videos and of what shows them (reports,
# notebooks, export replays). On gymnasium's own vector env: importing EnvPool (the backend
# `auto` picks for HalfCheetah) costs a run ~1 CPU-s, a seventh of a tiny run; the EnvPool
# path has tests of its own (test_backends.py, test_calibration.py).
TINY_VIDEO = ["env=halfcheetah", "debug=tiny", "env.vec_env=dummy"]
# The same without the video, for every other test: rendering costs a run ~1.4 CPU-s.
TINY = [*TINY_VIDEO, "video=off"]


# A command as a shell's background job starts (`cmd &` in a script): SIGINT ignored. A shell
# does it, not preexec_fn: Python code between fork and exec can deadlock in a process with
# threads (every pytest-xdist worker has some), and the command then never starts.
AS_BACKGROUND_JOB = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


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
# worker that needs it, so every test that needs an expensive one (directly or through other
# fixtures) joins that fixture's unit of work, which one worker runs. Modules that rely on
# their order (test_server.py's last test searches what the team-server tests left) or that
# measure time (benchmark smokes, calibration: no two at once) are units as a whole. Every
# other test is a unit of its own, so the two workers stay evenly busy.
# (pytest-xdist's own `--dist loadgroup` does not group on pytest 9.2: it renames node ids,
# which pytest no longer reads, so the units are made here, in the scheduler.)
SHARED_FIXTURES = {
    "report_sweep": "report-sweep",  # tests/reportdata.py's sweep
    "finished_run": "trained-runs", "exported_policy": "trained-runs",  # tests/trained_run.py
}
MODULE_UNITS = {
    **dict.fromkeys(("test_server", "test_copy"), "team-server"),
    **dict.fromkeys(("test_bench_quick", "test_calibration"), "timing"),
    "test_sweep_ray_cluster": "ray-cluster",  # one shared cluster, tests in the file's order
}
# The longest work starts first (make test passes --no-loadscope-reorder, so the units are
# handed out in collection order): the multi-node Ray tests, on one worker while the other
# takes the next long unit, then the other long units, then the slow tests, then the rest, so
# no minute-long test starts last while the other worker has nothing to do.
LONG_UNITS = ("ray-cluster", "report-sweep", "trained-runs", "team-server", "timing")


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def fixture_scope(function: ast.FunctionDef) -> str | None:
    """The scope of a ``@pytest.fixture`` function ("function" by default), None if none."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            scope = [k.value for k in getattr(decorator, "keywords", []) if k.arg == "scope"]
            return scope[0].value if scope and isinstance(scope[0], ast.Constant) else "function"
    return None


Fixtures = dict[str, tuple[str, set[str]]]  # name -> (scope, the fixtures it names)


def read_fixtures_and_tests(path: Path) -> tuple[Fixtures, dict[str, set[str]]]:
    """The fixtures and the test functions (name -> the fixtures it names) of one file."""
    fixtures: Fixtures = {}
    tests: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            args = {a.arg for a in node.args.args}
            scope = fixture_scope(node)
            if scope is not None:
                fixtures[node.name] = (scope, args)
            elif node.name.startswith("test_"):
                tests[node.name] = args
    return fixtures, tests


def fixture_closure(names: set[str], fixtures: Fixtures) -> set[str]:
    """``names`` and every fixture they need, directly or through one another."""
    closure: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += fixtures.get(name, ("", set()))[1]
    return closure


@functools.cache
def fixture_units() -> dict[tuple[str, str], str]:
    """(module, test function) -> the unit of the widest fixture it needs, read from the test
    sources (a test needs a fixture it names, or that a fixture it needs names): a shared
    session fixture's unit, else, when it needs a module's own wider-scoped fixture, the unit
    of the module's tests that do (so that fixture is built once, on one worker)."""
    here = Path(__file__).parent
    common: Fixtures = {}
    for path in here.glob("*.py"):
        if not path.stem.startswith("test_"):
            common.update(read_fixtures_and_tests(path)[0])
    units = {}
    for path in here.glob("test_*.py"):
        own, tests = read_fixtures_and_tests(path)
        fixtures = {**common, **own}  # a module's fixture hides a shared one of that name
        for test, args in tests.items():
            closure = fixture_closure(args, fixtures)
            shared = sorted(closure & SHARED_FIXTURES.keys())
            if shared:
                units[(path.stem, test)] = SHARED_FIXTURES[shared[0]]
            elif any(own[f][0] != "function" for f in closure & own.keys()):
                units[(path.stem, test)] = f"{path.stem}::module-fixtures"
    return units


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module's, its shared fixture's, else its own."""
    module = module_of(nodeid)
    function = nodeid.split("::")[-1].split("[")[0]
    return MODULE_UNITS.get(module) or fixture_units().get((module, function), nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {unit: rank for rank, unit in enumerate(LONG_UNITS)}
    slow_units = {work_unit(i.nodeid) for i in items if i.get_closest_marker("slow")}
    # Stable: the tests of one unit keep their order (some modules rely on it).
    items.sort(key=lambda item: (rank.get(work_unit(item.nodeid), len(rank)),
                                 work_unit(item.nodeid) not in slow_units))


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


WORKER_BUSY_S: dict[str, float] = {}  # xdist worker -> seconds spent in tests (controller)


def cpu_times() -> tuple[int, int]:
    """The machine's (busy, total) CPU time so far, in clock ticks (/proc/stat's first line:
    idle and iowait are not busy); (0, 0) where there is no /proc/stat."""
    try:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return 0, 0
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


CPU_AT_START = cpu_times()
TEST_CPU_S: dict[str, float] = {}  # nodeid -> CPU seconds of the test's processes (controller)
CPU_AT_TEST_START: dict[str, float] = {}  # nodeid -> this process's CPU count at its setup
MOST_CPU = 15  # the summary names this many tests that cost the most CPU


def process_cpu_s() -> float:
    """CPU seconds of this process and of every child process it has waited for (a test's
    commands, servers, kernels and their own children, once they exited)."""
    own, children = (resource.getrusage(resource.RUSAGE_SELF),
                     resource.getrusage(resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    CPU_AT_TEST_START[item.nodeid] = process_cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    """The teardown report carries the CPU seconds the test cost (setup to teardown: a
    session fixture counts where it is built), for the summary on the xdist controller."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "teardown" and item.nodeid in CPU_AT_TEST_START:
        report.user_properties.append(
            ("cpu_s", process_cpu_s() - CPU_AT_TEST_START.pop(item.nodeid)))


# WORKBENCH_TEST_TIMES=FILE: one JSON line per test phase (test, phase, worker, start, stop,
# CPU seconds), written by the controller: where a run's minutes and cores went, test by test.
TIMES_FILE = os.environ.get("WORKBENCH_TEST_TIMES")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the xdist controller: add each test phase's time to its worker's busy time."""
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    if node is not None:
        WORKER_BUSY_S[worker] = WORKER_BUSY_S.get(worker, 0.0) + report.duration
    cpu = dict(report.user_properties).get("cpu_s")
    if cpu is not None:
        TEST_CPU_S[report.nodeid] = float(cpu)
    if TIMES_FILE and (node is not None or "PYTEST_XDIST_WORKER" not in os.environ):
        with open(TIMES_FILE, "a") as times:
            times.write(json.dumps({"test": report.nodeid, "phase": report.when,
                                    "worker": worker, "start": report.start,
                                    "stop": report.stop, "cpu_s": cpu}) + "\n")


@pytest.hookimpl(trylast=True)  # after the slowest durations
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How busy each worker was (a worker idle long before the other ends is time lost), how
    busy the machine's cores were, and which tests cost the most CPU."""
    if WORKER_BUSY_S:
        busy = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(WORKER_BUSY_S.items()))
        terminalreporter.write_line(f"time in tests per xdist worker: {busy}")
    (busy_then, total_then), (busy_now, total_now) = CPU_AT_START, cpu_times()
    if total_now > total_then:  # whether more workers could help: idle cores are time to use
        share = (busy_now - busy_then) / (total_now - total_then)
        terminalreporter.write_line(f"machine CPU busy during the run: {share:.0%} of "
                                    f"{os.cpu_count()} cores (every process, not only tests)")
    if TEST_CPU_S:  # where the cores went: what to shrink when the run is too long
        top = sorted(TEST_CPU_S.items(), key=lambda kv: -kv[1])[:MOST_CPU]
        terminalreporter.write_line(f"the {len(top)} tests that cost the most CPU, of "
                                    f"{sum(TEST_CPU_S.values()):.0f} CPU-s in all:")
        for nodeid, cpu in top:
            terminalreporter.write_line(f"{cpu:8.1f} CPU-s  {nodeid}")


@pytest.fixture(autouse=True)
def no_cached_artifact_locations() -> None:
    """Every test starts with MLflow's run-id-keyed artifact locations forgotten (see
    :func:`forget_artifact_locations`): tests use copies of shared stores, same run ids."""
    forget_artifact_locations()


@pytest.fixture(autouse=True)
def unit_tier_stays_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``unit`` fails if it trains, starts a process or opens a connection.

    The unit tier (``make test-unit``) must run in seconds on a loaded machine; whatever needs
    a training, a subprocess, a server or a browser belongs in the default or slow tier.
    """
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(what: str):
        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a unit test must not {what}: mark it for the default tier")
        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(multiprocessing.Process, "start", refuse("start a process"))
    monkeypatch.setattr(socket.socket, "connect", refuse("open a network connection"))
    monkeypatch.setattr(OnPolicyAlgorithm, "learn", refuse("train"))


@pytest.fixture()
def bare_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An embedded MLflow store under tmp_path (MLFLOW_TRACKING_URI and experiments/) of which
    nothing exists yet: for the tests that check a command creates nothing."""
    experiments = tmp_path / "experiments"
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
    return experiments


@pytest.fixture(scope="session")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedded MLflow database with its tables and nothing else, made once per test
    process the way the workbench makes one (a client's first request): a new SQLite store
    runs MLflow's schema migrations, ~2 CPU-s that every test's store would pay again."""
    from mlflow.tracking import MlflowClient

    db = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments(max_results=1)
    return db


@pytest.fixture()
def store(bare_store: Path, empty_mlflow_db: Path) -> Path:
    """A fresh embedded MLflow store under tmp_path (MLFLOW_TRACKING_URI and experiments/):
    ``experiments/`` holding a copy of :func:`empty_mlflow_db`."""
    bare_store.mkdir(parents=True)
    shutil.copyfile(empty_mlflow_db, bare_store / "mlflow.db")
    return bare_store


@contextlib.contextmanager
def embedded_store(experiments: Path) -> Iterator[pytest.MonkeyPatch]:
    """The ``store`` fixture's environment for fixtures wider than one test (module,
    session): an embedded MLflow store under ``experiments``; yields the patch for more."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_EXPERIMENTS", str(experiments))
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{experiments / 'mlflow.db'}")
        yield patch


def forget_artifact_locations() -> None:
    """Empty MLflow's per-process cache of run artifact locations. It is keyed by run id
    alone: after a store is copied (same run ids), a process that wrote a run's artifacts in
    one store would write them into the other. Tests that use a copy in-process call this
    before and after (MLflow's private cache; nothing in the workbench uses two stores with
    the same run ids in one process)."""
    from mlflow.tracking._tracking_service import utils

    utils._artifact_repos_cache.clear()


def copy_store(source: Path, target: Path) -> str:
    """Copy an embedded store (database, artifacts, sweep notebooks) to ``target`` and point
    its runs' artifact locations there, so the copy can be changed without touching the
    source; returns the copy's tracking URI."""
    forget_artifact_locations()
    shutil.copytree(source, target)
    with sqlite3.connect(target / "mlflow.db") as db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            db.execute(f"UPDATE {table} SET {column} = replace({column}, ?, ?)",
                       (str(source), str(target)))
    return f"sqlite:///{target / 'mlflow.db'}"


@contextlib.contextmanager
def embedded_copy(source: Path, factory: pytest.TempPathFactory, name: str
                  ) -> Iterator[tuple[str, Path, pytest.MonkeyPatch]]:
    """A copy of the embedded store ``source`` in a fresh temporary folder ``name``, in the
    environment while the context lasts (for module fixtures): its URI, its folder and the
    patch."""
    target = factory.mktemp(name) / "experiments"
    uri = copy_store(source, target)
    with embedded_store(target) as patch:
        yield uri, target, patch


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
# `mlflow server` per test (tests/mlflowserver.py); one local Ray head per test, multi-node
# clusters per test or per module (tests/raycluster.py); the runs trained once per session
# (tests/trained_run.py) and the sweep of the sweep and report tests (tests/reportdata.py).
from tests.browser import browser  # noqa: E402, F401
from tests.mlflowserver import mlflow_server  # noqa: E402, F401
from tests.raycluster import clusters, shared_cluster  # noqa: E402, F401
from tests.reportdata import report_sweep  # noqa: E402, F401
from tests.teamserver import team_server  # noqa: E402, F401
from tests.trained_run import exported_duck, exported_policy, finished_run  # noqa: E402, F401
