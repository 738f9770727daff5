"""A real multi-node Ray cluster on this machine: one ``ray start --block`` process per node.

Each node is its own ``ray start`` process in its own session, with its own temp dir, ports,
CPU budget, custom resource (``node_<name>``, so a test can tell where a task ran) and
environment (team-mode credentials go to a node exactly as a user would export them before
``ray start``). Every process a node starts (GCS, raylet, agents, Ray workers, and the
papermill kernels the workers start in sessions of their own) inherits the marker variable
``WORKBENCH_TEST_RAY=<cluster root>``, so :meth:`RayCluster.processes` finds all of them and
:meth:`RayCluster.stop` leaves no orphan behind, even when a test fails.

(``ray stop`` is never used: it would stop every Ray process on the machine, other users'
clusters too.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.ports import free_port

MARKER = "WORKBENCH_TEST_RAY"
# Ray cannot start from an environment under a path with whitespace (docs/ray-cluster.md).
SPACED_ENV = any(c.isspace() for c in sys.prefix)
SPACED_ENV_REASON = ("Ray's processes do not start from an environment under a path with a "
                     f"space ({sys.prefix}): docs/ray-cluster.md")
NODE_MARKER = "WORKBENCH_TEST_RAY_NODE"  # which node a process belongs to
RAY = str(Path(sys.executable).parent / "ray")
REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0  # a loaded 2-core machine can take a while to start a raylet
# Ray ends a driver whose GCS has been silent this long, and a node's raylet gives up on its
# head after it; the sweep gives up on the head at a third of it. 15 s (Ray's default is 60),
# for the driver and every node, keeps the head-loss tests short.
RECONNECT_15S = {"RAY_gcs_rpc_server_reconnect_timeout_s": "15"}
# Every node of a test cluster waits up to 60 s (Ray's default: 10) for a node's answer to the
# head's health check before counting a failure: on a loaded machine a raylet that is starting
# can answer late, and after 5 late answers the head marks it dead and it exits ("mistakenly
# been marked as dead by the GCS"). A killed node still fails its checks at once (its port is
# closed), so the tests that kill one see it dead as soon as before.
PATIENT_HEALTH_CHECK = {"RAY_health_check_timeout_ms": "60000"}
# A node's processes run at a higher priority than the test workers around them (niceness -15,
# where the user may raise priority: root on CI), so a busy machine does not starve them while
# they start: ``ray start`` gives a raylet a fixed 30 s to register with the head, and a raylet
# exits when its dashboard agent (a Python process importing much) is slow to report its port.
NODE_NICENESS = -15
# Attempts to start a node, each after a longer pause: a busy stretch of the test run (every
# worker starting heavy tests at once) passes within minutes.
START_ATTEMPTS = 6


def marked_processes(marker: str, node: str | None = None) -> list[psutil.Process]:
    """Live processes whose environment carries ``WORKBENCH_TEST_RAY=marker`` (and
    ``WORKBENCH_TEST_RAY_NODE=node``, when given)."""
    found = []
    for proc in psutil.process_iter():
        try:
            environ = proc.environ()
            if (proc.status() != psutil.STATUS_ZOMBIE and environ.get(MARKER) == marker
                    and node in (None, environ.get(NODE_MARKER))):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


# Runs a command that gets SIGTERM (``ray start --block`` then stops its node) when the
# process that started it dies, however it dies (SIGKILL, a pytest-xdist worker ended with its
# controller): no cluster outlives the test run. A wrapper that sets PR_SET_PDEATHSIG (kept
# across exec) and execs the command, not preexec_fn: Python code between fork and exec can
# deadlock in a process with threads, as every pytest-xdist worker is. The wrapper also gives
# the node its NODE_NICENESS.
STOP_WITH_PARENT = [sys.executable, "-c", (
    "import contextlib, ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "with contextlib.suppress(PermissionError):\n"
    f"    os.nice({NODE_NICENESS})\n"
    "os.execv(sys.argv[1], sys.argv[1:])")]


class RayNode:
    """One node: ``ray start [--head] --block`` in its own session."""

    def __init__(self, root: Path, name: str, serial: int, *, num_cpus: int,
                 head_address: str | None, env: Mapping[str, str]) -> None:
        self.name = name
        self.head = head_address is None
        label = f"{name}{serial}"  # its own dir, also when a node of that name starts again
        self.temp_dir = root / label  # short: Ray puts Unix sockets under it (107 characters)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = root / f"{label}.log"
        self.port = free_port() if self.head else None
        self.dashboard_port = free_port() if self.head else None
        args = [*STOP_WITH_PARENT, RAY, "start", "--block", "--node-ip-address=127.0.0.1",
                f"--num-cpus={num_cpus}", f"--resources={json.dumps({f'node_{name}': 1})}",
                f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
                "--object-store-memory=80000000", "--min-worker-port=0", "--max-worker-port=0",
                *(f"--{flag}={free_port()}" for flag in (
                    "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                    "dashboard-agent-grpc-port", "runtime-env-agent-port",
                    "metrics-export-port"))]
        if self.head:
            # The dashboard serves the state API (ray.util.state) the tests read.
            args += ["--head", f"--port={self.port}", "--include-dashboard=true",
                     "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                     f"--ray-client-server-port={free_port()}"]  # not the fixed 10001
        else:
            # One log monitor per machine is enough (the head's); nothing streams logs here.
            args += [f"--address={head_address}", "--include-log-monitor=false"]
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**env, NODE_MARKER: name, "RAY_USAGE_STATS_ENABLED": "0"})

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> bool:
        """True once the node is up; False if it exited (or timed out) while starting."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if "Ray runtime started" in self.log_path.read_text():
                return True
            time.sleep(0.5)
        return False

    def failure(self) -> str:
        """Why the node did not start: the end of its ``ray start`` output and the raylet's
        fatal lines (the end of its log is a stack trace)."""
        raylet = sorted(self.temp_dir.glob("session_*/logs/raylet.out"))
        fatal = [line for line in (raylet[-1].read_text().splitlines() if raylet else [])
                 if any(word in line for word in ("FATAL", "Check failed", "Exiting", "[E "))]
        agent = sorted(self.temp_dir.glob("session_*/logs/dashboard_agent.*"))
        agent_tail = "\n".join(f"{path.name}: {path.read_text()[-1500:]}" for path in agent)
        return ("ray start: " + self.log_path.read_text()[-1200:] + "\nraylet: "
                + ("\n".join(fatal[-5:]) if fatal else "(no fatal line)")
                + "\ndashboard agent: " + (agent_tail or "(no log)"))

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the node's process group at once: ``ray start``, its raylet, its agents, its
        Ray workers; the kernels (own sessions) are left to notice that their worker died."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (``ray start --block`` stops its node), SIGKILL when that is not enough."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:  # SIGTERM is only handled once startup finished
                self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # anything left in its group


class RayCluster:
    """A head (``head_cpus``) plus worker nodes, each a :class:`RayNode`."""

    def __init__(self, workers: Mapping[str, int], *, head_cpus: int = 0,
                 env: Mapping[str, str] | None = None,
                 worker_env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="wbray", dir="/tmp"))
        self.marker = str(self.root)
        base = dict(env if env is not None else os.environ)
        # The repository on every kernel's path: the tests' own env modules (env.id=tests.
        # faulty_envs:...) import there, as they do in the test process.
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
        self.base_env = {**base, **PATIENT_HEALTH_CHECK, MARKER: self.marker}
        self.nodes: dict[str, RayNode] = {}
        self.serial = 0
        try:
            self.head = self.start_node("head", head_cpus, {})
            # One at a time: on a loaded machine, nodes starting together starve each other.
            for name, cpus in workers.items():
                self.start_node(name, cpus, (worker_env or {}).get(name, {}))
        except BaseException:
            self.stop()
            self.remove()
            raise

    def new_node(self, name: str, cpus: int, extra_env: Mapping[str, str]) -> RayNode:
        self.serial += 1
        return RayNode(self.root, name, self.serial, num_cpus=cpus,
                       head_address=None if name == "head" else self.address,
                       env={**self.base_env, **extra_env})

    def start_node(self, name: str, cpus: int, extra_env: Mapping[str, str]) -> RayNode:
        """Start a node, up to START_ATTEMPTS attempts: on a loaded machine a node can fail
        to start (see NODE_NICENESS)."""
        why = []
        for attempt in range(START_ATTEMPTS):
            time.sleep(15 * attempt)  # a busy stretch passes
            node = self.nodes[name] = self.new_node(name, cpus, extra_env)
            if node.wait_started():
                return node
            node.stop()
            why.append(f"attempt {attempt + 1}: {node.failure()}")
        raise RuntimeError(f"Ray node {name} did not start in {START_ATTEMPTS} attempts:\n"
                           + "\n".join(why))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.head.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.head.dashboard_port}"

    def node_ids(self, timeout_s: float = 60.0) -> dict[str, tuple[str, str]]:
        """Ray node id -> (node name, node IP) of the live nodes, from the state API (the name
        is each node's custom resource)."""
        from ray.util.state import list_nodes

        deadline = time.monotonic() + timeout_s
        while True:
            found = {}
            for node in list_nodes(address=self.dashboard, detail=True):
                if node.state != "ALIVE":
                    continue
                names = [r.removeprefix("node_") for r in node.resources_total
                         if r.startswith("node_")]
                found[node.node_id] = (names[0] if names else "?", node.node_ip)
            alive = sum(n.alive for n in self.nodes.values())  # a killed node is not
            if len(found) == alive or time.monotonic() > deadline:
                return found
            time.sleep(1)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster (kernels started by its workers included)."""
        return marked_processes(self.marker)

    def processes_of(self, node: str) -> list[psutil.Process]:
        """Every live process of one node (kernels started by its workers included)."""
        return marked_processes(self.marker, node)

    def state(self, what: str) -> list[Any]:
        """A state API listing (``tasks``, ``jobs``, ``workers``...) with every detail."""
        from ray.util import state

        return list(getattr(state, f"list_{what}")(address=self.dashboard, detail=True,
                                                    limit=10000, raise_on_missing_output=False))

    def stop(self, timeout_s: float = 60.0) -> list[str]:
        """Stop every node; returns the processes still alive afterwards (none expected)."""
        for node in reversed(list(self.nodes.values())):
            node.stop()
        deadline = time.monotonic() + timeout_s
        left = self.processes()
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = self.processes()
        described = []
        for proc in left:  # the test fails on them, but they must not outlive it
            try:
                described.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        return described

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture()
def clusters() -> Iterator[Callable[..., RayCluster]]:
    """Start clusters on demand (a head plus workers ``a`` and ``b`` of 2 CPUs each, or the
    workers given); every one is stopped, and checked to leave no process, when the test ends:
    passed, failed, or interrupted (Ctrl-C, or SIGTERM: tests/conftest.py turns it into the
    same interrupt, so pytest still tears the fixtures down)."""
    if SPACED_ENV:
        pytest.skip(SPACED_ENV_REASON)
    started: list[RayCluster] = []

    def start(workers: Mapping[str, int] | None = None, **kwargs: Any) -> RayCluster:
        started.append(RayCluster({"a": 2, "b": 2} if workers is None else workers, **kwargs))
        return started[-1]

    try:
        yield start
    finally:
        leftovers = []
        for cluster in started:
            leftovers += cluster.stop()
            cluster.remove()
    assert leftovers == [], f"processes left after the cluster stopped: {leftovers}"


class SharedCluster:
    """One cluster for the tests of a module, which may break it: each test asks for it with
    :meth:`get`, which starts a whole new cluster when an earlier test killed the head or a
    worker node (a fresh start of every process costs a minute on a loaded 2-core machine).
    Every cluster started is stopped, and checked to leave no process, at the end
    (:meth:`close`)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.started: list[RayCluster] = []

    def get(self, workers: Mapping[str, int] | None = None) -> RayCluster:
        """A live cluster with at least the given workers (``a`` and ``b`` of 2 CPUs each by
        default): the current one when all of them are alive, else a new one."""
        workers = {"a": 2, "b": 2} if workers is None else workers
        current = self.started[-1] if self.started else None
        if current is not None and current.head.alive and all(
                name in current.nodes and current.nodes[name].alive for name in workers):
            return current
        # A whole new cluster, also when only a worker died: a worker started again into a
        # head that saw it killed can fail every start for many minutes on a loaded machine
        # (its raylet times out waiting for its dashboard agent's port file), while a fresh
        # cluster starts.
        if current is not None:
            current.stop()
        self.started.append(RayCluster(workers, env=self.env))
        return self.started[-1]

    def close(self) -> list[str]:
        """Stop and remove every cluster started; returns the processes left (none expected)."""
        leftovers = []
        for cluster in self.started:
            leftovers += cluster.stop()
            cluster.remove()
        return leftovers


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedCluster]:
    """A module's :class:`SharedCluster`. Its nodes give up on a lost head after 15 s (Ray's
    default is 60: the head-loss tests stay short) and keep what a point writes outside the
    sweep's store in a directory of their own; every point logs to the store its sweep names."""
    if SPACED_ENV:
        pytest.skip(SPACED_ENV_REASON)
    shared = SharedCluster({**os.environ, **RECONNECT_15S, "WORKBENCH_EXPERIMENTS":
                            str(tmp_path_factory.mktemp("cluster-experiments"))})
    try:
        yield shared
    finally:
        leftovers = shared.close()
    assert leftovers == [], f"processes left after the clusters stopped: {leftovers}"
