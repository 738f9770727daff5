"""Sweeps (and tuning studies) on a real multi-node Ray cluster on this machine, under node
failures.

Each cluster (tests/raycluster.py) is a head with no CPUs plus worker nodes of 2 CPUs each
(``a`` and ``b`` where a worker dies or points spread; ``a`` alone elsewhere), every node its
own ``ray start --block`` process with its own temp dir, ports, custom resource and
environment; a test tells where a point ran from the node id the point's run records
(``ray.node_id``) and the state API's node listing. The tests share one cluster, in the order
that restarts least of it: a test that finds a worker node or the head killed by the one
before gets a whole new cluster (``shared_cluster``); team mode
and the fixture's own test start clusters of their own. The sweeps are the tests' tiny real
trainings (``debug=tiny``) through the real CLI; where a node or the head is killed (the way a
machine dies: SIGKILL of its whole process group), the points hold mid-training until the test
releases them (tests/faulty_envs.py), so they are certainly running when it happens. Every Ray
process, and every kernel the Ray workers started, is gone when a test ends, failed or not
(the fixture checks).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
import psutil
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .conftest import ROOT, run_cli
from .faulty_envs import HELD, held_points, release
from .raycluster import (
    RECONNECT_15S,
    SPACED_ENV,
    SPACED_ENV_REASON,
    RayCluster,
    SharedCluster,
    marked_processes,
)
from .support.runs import POINT_TINY, runs_of, study_trials, tune_runs
from .teamserver import ALICE, TeamServer, logged_in

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

# A loaded 2-core machine can take many minutes for what takes one on an idle one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NODE_ID, NODE_IP, HOSTNAME = "ray.node_id", "ray.node_ip", "ray.hostname"
# Points that hold mid-training until the test releases them (tests/faulty_envs.py), so a node
# or head dies while a point is certainly training, without long trainings.
HELD_POINT = [f"env.id={HELD}", "env.vec_env=dummy"]
# Where no worker dies, one worker of 2 CPUs is enough (the head has none): a node fewer to
# start on a loaded machine.
ONE_WORKER = {"a": 2}
# The worker the node-loss tests above leave alive (they kill node a): the first head-loss test
# runs on their cluster instead of starting one more (a cluster start costs ~30 CPU-s).
SURVIVOR = {"b": 2}
HELD_STUDY = ["env=halfcheetah", "debug=tiny", "search=tiny", "tracking.system_metrics=false",
              *HELD_POINT]


def sweep_args(cluster: RayCluster, *grid: str) -> list[str]:
    return ["sweep", "sweep.executor=ray", f"sweep.ray.address={cluster.address}", *grid,
            *POINT_TINY]


def children_by_point(runs: list[Run]) -> dict[str, list[Run]]:
    found: dict[str, list[Run]] = {}
    for run in runs:
        found.setdefault(run.data.tags["sweep.point"], []).append(run)
    return found


def show(title: str, runs: list[Run], nodes: dict[str, tuple[str, str]]) -> None:
    """What a scenario did, for the test log (pytest -s): each run, its status and node."""
    print(f"\n{title}:")
    for run in sorted(runs, key=lambda r: r.info.start_time):
        node = nodes.get(run.data.tags.get(NODE_ID, ""), ("-",))[0]
        wall = ((run.info.end_time or run.info.start_time) - run.info.start_time) / 1000
        train = run.data.metrics.get("summary/wall_time_s")
        print(f"  {run.info.run_name:<26} {run.info.status:<9} node {node:<2} run {wall:5.1f} s"
              f"  train {'-' if train is None else f'{train:.1f} s':<7}"
              f"  {run.data.tags.get('error', '')[:110]}")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def child_runs_or_none() -> list[Run]:
    try:
        return runs_of("child")
    except Exception:  # the store or its experiment does not exist yet
        return []


def trial_runs_or_none() -> list[Run]:
    try:
        return tune_runs("trial")
    except Exception:  # the store or its experiment does not exist yet
        return []


def trial_name(run: Run) -> str:
    """The name of a trial run's notebook (and of its hold file): ``trial-000``."""
    return f"trial-{int(run.data.tags['tune.trial']):03d}"


def gone_with_node_a(cluster: RayCluster) -> None:
    """Wait until node a's kernels have exited with its Ray workers (each polls its parent):
    one released before it noticed would finish its training as though its node had lived."""
    wait_for(lambda: cluster.processes_of("a") == [], "node a's kernels to exit", timeout_s=120)


def start_sweep(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "workbench", *args], cwd=ROOT, text=True,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


# --------------------------------------------------------------------------- placement


def test_points_spread_over_the_workers_and_record_their_node(
        store: Path, shared_cluster: SharedCluster) -> None:
    cluster = shared_cluster.get()
    # Two points in flight together, each asking for a whole worker's 2 CPUs: one per worker.
    args = sweep_args(cluster, "sweep.num_envs=[1,2]", "sweep.n_steps=[64]", "sweep.workers=2")
    proc = run_cli(*args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "up to 2 points at a time x 2 CPU each, cluster CPUs 4" in proc.stdout

    nodes = cluster.node_ids()
    children = runs_of("child")
    assert len(children) == 2
    assert all(len(runs) == 1 for runs in children_by_point(children).values())
    assert {r.info.status for r in children} == {"FINISHED"}
    (parent,) = runs_of("parent")
    assert parent.info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    show("2 points on 2 workers x 2 CPUs", children, nodes)
    where = {r.info.run_name: nodes[r.data.tags[NODE_ID]][0] for r in children}
    assert sorted(set(where.values())) == ["a", "b"], where  # both workers, never the head
    for run in children:
        assert run.data.tags[NODE_IP] == nodes[run.data.tags[NODE_ID]][1]
        assert run.data.tags[HOSTNAME] == socket.gethostname()
    sweep_id = parent.data.tags["sweep_id"]
    out_dir = store / "sweeps" / sweep_id
    assert sorted(p.stem for p in out_dir.glob("*.ipynb")) == sorted(where)
    assert sorted(p.stem for p in out_dir.glob("*.log")) == sorted(where)  # kernel output too

    # The report selects one node's points and shows the node in its run table.
    node_a = next(node_id for node_id, (name, _) in nodes.items() if name == "a")
    report = run_cli("report", "--sweep", sweep_id, "--tag", f"{NODE_ID}={node_a}",
                     "--out", str(store.parent / "reports"), "--name", "node-a", timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    table = (store.parent / "reports" / "node-a" / "report.md").read_text()
    assert "Ray node" in table
    shown = {n for n in where if f"[{n}]" in table}
    assert shown == {n for n, node in where.items() if node == "a"}
    grouped = table[table.index("Runs per Ray node"):]  # one node: one group, its runs
    assert f"| {len(shown)} | {len(shown)} FINISHED |" in grouped
    assert grouped.count(node_a) == 1


# --------------------------------------------------------------------------- a worker dies


def test_a_worker_node_dying_mid_sweep_loses_and_duplicates_nothing(
        store: Path, shared_cluster: SharedCluster) -> None:
    cluster = shared_cluster.get()
    nodes = cluster.node_ids()
    node_a = next(node_id for node_id, (name, _) in nodes.items() if name == "a")
    # Each point takes a whole worker (2 CPUs): one holds on node a, the other on node b.
    args = sweep_args(cluster, "sweep.num_envs=[1,2]", "sweep.n_steps=[64]", "sweep.workers=2",
                      *HELD_POINT)
    sweep = start_sweep(args)
    try:
        def held_on_a() -> bool:  # a point of node a holds mid-training
            return any(r.info.status == "RUNNING" and r.data.tags.get(NODE_ID) == node_a
                       and r.data.tags["sweep.point"] in held_points(store)
                       for r in child_runs_or_none())

        wait_for(held_on_a, "a point training on node a")
        cluster.nodes["a"].kill()  # the machine dies: raylet, agents, Ray workers at once
        gone_with_node_a(cluster)
        release(store)  # the other points, and the retries, train to the end
        out, err = sweep.communicate(timeout=900)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, out[-3000:] + err[-3000:]
    # The kernels of node a exited with their Ray workers: nothing of node a is left.
    assert cluster.processes_of("a") == []

    children = runs_of("child")
    show("node a killed mid-sweep", children, nodes)
    by_point = children_by_point(children)
    assert len(by_point) == 2
    killed = [r for r in children if r.info.status == "KILLED"]
    assert killed, "no point was caught running on node a"
    for run in killed:  # the dead attempt, closed by its retry with the reason
        assert run.data.tags[NODE_ID] == node_a
        assert run.data.tags["error"].startswith(
            "killed: the Ray worker or node that ran this attempt died (node ")
        assert node_a in run.data.tags["error"]
    for point, runs in by_point.items():
        finished = [r for r in runs if r.info.status == "FINISHED"]
        assert len(finished) == 1, (point, [r.info.status for r in runs])
        assert not [r for r in runs if r.info.status == "RUNNING"]
    retried = {r.data.tags["sweep.point"] for r in killed}
    for point in retried:  # ... and finished on the surviving node
        (finished,) = [r for r in by_point[point] if r.info.status == "FINISHED"]
        assert nodes[finished.data.tags[NODE_ID]][0] == "b"
    out_dir = store / "sweeps" / runs_of("parent")[0].data.tags["sweep_id"]
    for point in by_point:
        executed = nbformat.read(out_dir / f"{point}.ipynb", as_version=4)
        assert executed.metadata["papermill"]["parameters"]["point"] == point
    assert runs_of("parent")[0].info.status == "FINISHED"


def test_a_study_on_the_cluster_keeps_one_storage_when_a_worker_node_dies(
        store: Path, shared_cluster: SharedCluster) -> None:
    # Trials are sweep points to Ray (the same task, tags and retries); the Optuna storage is
    # the driver's SQLite file, which every node of this one-machine cluster reaches.
    cluster = shared_cluster.get()
    nodes = cluster.node_ids()
    node_a = next(node_id for node_id, (name, _) in nodes.items() if name == "a")
    # Each trial takes a whole worker (2 CPUs): one holds on node a, the other on node b.
    args = ["tune", "--n-trials", "2", *HELD_STUDY, "tune.study=on-cluster",
            "tune.executor=ray", f"tune.ray.address={cluster.address}", "tune.workers=2",
            "tune.pruner=none"]
    study = start_sweep(args)

    def trial_held_on_a() -> bool:
        return any(r.info.status == "RUNNING" and r.data.tags.get(NODE_ID) == node_a
                   and trial_name(r) in held_points(store) for r in trial_runs_or_none())

    try:
        wait_for(trial_held_on_a, "a trial training on node a", timeout_s=900)
        cluster.nodes["a"].kill()
        gone_with_node_a(cluster)
        release(store)  # the other trials, and the retries, train to the end
        out, err = study.communicate(timeout=1200)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 0, out[-3000:] + err[-3000:]
    assert f"ray at {cluster.address}: up to 2 trials at a time x 2 CPU each" in out
    assert cluster.processes_of("a") == []

    trials = study_trials(store, "on-cluster")  # one storage: every trial is in it, once
    assert [t.state.name for t in trials] == ["COMPLETE"] * 2
    runs = tune_runs("trial")
    show("a study, node a killed", runs, nodes)
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert killed, "no trial was caught running on node a"
    for run in killed:
        assert run.data.tags[NODE_ID] == node_a
        assert run.data.tags["error"].startswith("killed: the Ray worker or node that ran")
    for trial in trials:
        mine = [r for r in runs if r.data.tags["tune.trial"] == str(trial.number)]
        (finished,) = [r for r in mine if r.info.status == "FINISHED"]
        assert trial.user_attrs["mlflow_run_id"] == finished.info.run_id
        assert nodes[finished.data.tags[NODE_ID]][0] in ("a", "b")
    assert {nodes[r.data.tags[NODE_ID]][0] for r in runs} == {"a", "b"}  # both nodes used
    notebooks = sorted(p.name for p in (store / "tuning" / "on-cluster").glob("*.ipynb"))
    assert notebooks == [f"trial-{n:03d}.ipynb" for n in range(2)]


# --------------------------------------------------------------------------- the head dies


def test_the_head_dying_ends_the_sweep_with_one_line_and_a_new_head_resumes(
        store: Path, shared_cluster: SharedCluster) -> None:
    cluster = shared_cluster.get(SURVIVOR)
    nodes = cluster.node_ids()  # the state API lives on the head: ask before it dies
    args = ["sweep.num_envs=[2]", "sweep.n_steps=[64]", "sweep.seeds=[0,1,2]",
            "sweep.workers=2", *HELD_POINT]
    sweep = start_sweep(sweep_args(cluster, *args), env=RECONNECT_15S)
    point_0, point_1, point_2 = (f"halfcheetah-ne2-ns64-s{seed}" for seed in range(3))
    try:
        # The first wave holds; one of its points finishes, the next point starts and holds:
        # a point FINISHED and two training when the head dies.
        wait_for(lambda: held_points(store) >= {point_0, point_1}, "the first wave to hold")
        release(store, point_0)
        wait_for(lambda: point_2 in held_points(store), "the third point to hold")
        cluster.nodes["head"].kill()
        killed_at = time.monotonic()
        out, err = sweep.communicate(timeout=300)  # bounded: a hang fails here
        took = time.monotonic() - killed_at
    finally:
        if sweep.poll() is None:
            sweep.send_signal(signal.SIGKILL)
    assert sweep.returncode == 1, out[-3000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("workbench: the Ray head at "), err[-3000:]
    assert "stopped answering" in last
    assert last.endswith("restart the cluster and run the same command again to resume "
                         "(FINISHED points are skipped)")
    assert "Traceback" not in err and "Failed to connect to GCS" not in err, err[-3000:]
    print(f"\nthe sweep exited {took:.0f} s after the head died; its last line:\n{last}")
    assert not [r for r in runs_of("child") if r.info.status == "RUNNING"]  # closed at exit

    # No orphan: a cancelled task stops its kernel; where the cancel cannot arrive (the
    # driver's raylet may be the head's, gone with it), the worker nodes give up on their
    # head after Ray's reconnect timeout (15 s here) and each kernel exits with its Ray worker.
    def kernels() -> list[str]:
        return [" ".join(p.cmdline()) for p in cluster.processes()
                if "ipykernel" in " ".join(p.cmdline())]

    wait_for(lambda: not kernels(), "the kernels of the dead head's cluster to exit",
             timeout_s=180)

    first = runs_of("child")
    show("when the head died", first, nodes)
    assert first and not [r for r in first if r.info.status == "RUNNING"]  # closed
    (parent,) = runs_of("parent")
    assert parent.info.status == "FAILED"
    stopped = [r for r in first if r.info.status == "KILLED"]
    assert stopped, "no point was running when the head died"
    for run in stopped:
        assert "Ray head" in run.data.tags.get("error", "") or \
            "interrupted" in run.data.tags.get("error", "")
    finished_before = {r.data.tags["sweep.point"] for r in first if r.info.status == "FINISHED"}
    assert finished_before == {point_0}

    assert cluster.stop() == []  # the old workers gave up on their head, or were stopped
    release(store)  # the rerun trains every point to the end
    fresh = shared_cluster.get(ONE_WORKER)  # a new head
    again = run_cli(*sweep_args(fresh, *args), env=RECONNECT_15S, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"({len(finished_before)} FINISHED earlier, skipped)" in again.stdout
    show("after the rerun on a new head", runs_of("child"), {**nodes, **fresh.node_ids()})
    by_point = children_by_point(runs_of("child"))
    assert len(by_point) == 3
    for point, runs in by_point.items():
        assert [r.info.status for r in runs].count("FINISHED") == 1, point
    (resumed,) = runs_of("parent")
    assert resumed.info.run_id == parent.info.run_id and resumed.info.status == "FINISHED"
    assert "error" not in resumed.data.tags  # the lost head's error went with its invocation


def test_the_head_dying_ends_a_study_with_one_line_and_a_new_head_resumes_it(
        store: Path, shared_cluster: SharedCluster) -> None:
    cluster = shared_cluster.get(ONE_WORKER)
    # The first trials hold mid-training: they are certainly running when the head dies.
    args = ["tune", "--n-trials", "2", *HELD_STUDY, "tune.study=lost-head", "tune.executor=ray",
            "tune.workers=2", "tune.pruner=none"]
    study = start_sweep([*args, f"tune.ray.address={cluster.address}"], env=RECONNECT_15S)

    def trials_held() -> bool:
        return any(r.info.status == "RUNNING" and trial_name(r) in held_points(store)
                   for r in trial_runs_or_none())

    try:
        wait_for(trials_held, "a trial training", timeout_s=900)
        cluster.nodes["head"].kill()
        out, err = study.communicate(timeout=300)  # bounded: a hang fails here
    finally:
        if study.poll() is None:
            study.send_signal(signal.SIGKILL)
    assert study.returncode == 1, out[-3000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("workbench: the Ray head at "), err[-3000:]
    assert last.endswith("restart the cluster and run the same command again to resume the "
                         "study"), last
    assert "Traceback" not in err, err[-3000:]
    print(f"\nthe study's last line when the head died:\n{last}")

    runs = tune_runs("trial")
    assert runs and not [r for r in runs if r.info.status == "RUNNING"]  # closed at exit
    killed = [r for r in runs if r.info.status == "KILLED"]
    assert killed, "no trial was running when the head died"
    (parent,) = tune_runs("study")
    assert parent.info.status == "FAILED"
    assert parent.data.tags["error"].startswith("the Ray head at ")
    abandoned = [t for t in study_trials(store, "lost-head") if t.state.name == "FAIL"]
    assert len(abandoned) == len(killed)  # ... and not counted against the 2

    assert cluster.stop() == []
    release(store)  # the trials of the rerun train to the end
    fresh = shared_cluster.get(ONE_WORKER)  # a new head
    again = run_cli(*args, f"tune.ray.address={fresh.address}", env=RECONNECT_15S, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    states = [t.state.name for t in study_trials(store, "lost-head")]
    assert states.count("COMPLETE") == 2 and states.count("FAIL") == len(killed), states
    (resumed,) = tune_runs("study")
    assert resumed.info.run_id == parent.info.run_id and resumed.info.status == "FINISHED"
    assert "error" not in resumed.data.tags


# --------------------------------------------------------------------------- team mode


def test_team_mode_points_log_with_each_nodes_login_that_ray_never_sees(
        team_server: TeamServer, clusters: Callable[..., RayCluster]) -> None:
    env = team_server.env(ALICE)  # the login, exported on every node before `ray start`
    cluster = clusters(ONE_WORKER, env=env)
    experiment = f"ray-team-{os.getpid()}"
    args = sweep_args(cluster, "sweep.num_envs=[2]", "sweep.n_steps=[64]",
                      "tracking=server", f"tracking.experiment={experiment}")
    done = team_server.cli(*args, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    with logged_in(ALICE, team_server.alice_password):
        client = MlflowClient(team_server.url)
        exp = client.get_experiment_by_name(experiment)
        children = client.search_runs([exp.experiment_id], "tags.`sweep.role` = 'child'")
    nodes = cluster.node_ids()
    show("team mode", children, nodes)
    assert [r.info.status for r in children] == ["FINISHED"]
    assert {nodes[r.data.tags[NODE_ID]][0] for r in children} == {"a"}  # never the head

    # What Ray keeps and shows: every file of every node's session (logs, events, specs),
    # the state API's tasks (with their details), jobs, workers and nodes.
    password = team_server.alice_password
    listings = {what: repr(cluster.state(what)) for what in ("tasks", "jobs", "workers",
                                                             "nodes")}
    assert "workbench-sweep:halfcheetah-ne2-ns64-s0" in listings["tasks"]  # the scan sees them
    for what, text in listings.items():
        assert password not in text, f"the password is in Ray's {what} listing"
    files = [p for p in cluster.root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name.startswith("worker-") for p in files)  # the workers' own logs
    leaking = [str(p) for p in files if password.encode() in p.read_bytes()]
    assert leaking == []
    out_dir = Path(env["WORKBENCH_EXPERIMENTS"]) / "sweeps"
    for path in out_dir.rglob("*"):
        if path.is_file():
            assert password not in path.read_text(errors="replace"), path
    assert password not in done.stdout + done.stderr


# --------------------------------------------------------------------------- the fixture


# A cluster test as the ones above: a sweep on a cluster, its point held mid-training; it says
# where its cluster and driver are, then waits to be stopped from outside.
INNER_TEST = '''
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.faulty_envs import HELD, held_points


@pytest.mark.timeout(1500)  # the cluster's nodes may need several attempts on a busy machine
def test_held_sweep_on_a_cluster(store, clusters):
    cluster = clusters({"a": 1})
    sweep = subprocess.Popen(
        [sys.executable, "-m", "workbench", "sweep", "sweep.executor=ray",
         f"sweep.ray.address={cluster.address}", "sweep.num_envs=[1]", "sweep.n_steps=[64]",
         "env=halfcheetah", "debug=tiny", "tracking.system_metrics=false",
         f"env.id={HELD}", "env.vec_env=dummy"], cwd=ROOT)
    try:
        while not held_points(store):
            assert sweep.poll() is None, "the sweep ended before its point held"
            time.sleep(0.5)
        with open(os.environ["READY"], "w") as ready:
            ready.write(f"{cluster.marker}\\n{sweep.pid}\\n")
        time.sleep(600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
'''


@pytest.mark.skipif(SPACED_ENV, reason=SPACED_ENV_REASON)
def test_sigterm_to_pytest_mid_cluster_test_leaves_no_process(tmp_path: Path) -> None:
    """A CI time-out or a ``kill`` stops pytest with SIGTERM in the middle of a cluster test:
    the cluster (head, worker, Ray workers), the point's kernel and the sweep's driver are all
    gone afterwards (tests/conftest.py turns SIGTERM into an interrupt, and the ``clusters``
    fixture stops what it started)."""
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    ready = tmp_path / "ready"
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(ROOT), "-p", "no:cacheprovider", "-q", "-s",
         str(tmp_path / "test_inner.py")],
        cwd=ROOT, env={**os.environ, "READY": str(ready)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: ready.exists() and ready.read_text().count("\n") == 2 or
                 inner.poll() is not None, "the inner test's point to hold", timeout_s=1200)
        assert inner.poll() is None, inner.communicate()[0][-3000:]
        marker, driver = ready.read_text().split()
        assert marked_processes(marker), "the inner test's cluster is not running"
        assert any("ipykernel" in " ".join(p.cmdline()) for p in marked_processes(marker))
        inner.send_signal(signal.SIGTERM)
        out, _ = inner.communicate(timeout=300)
    finally:
        if inner.poll() is None:
            inner.kill()
    left = [" ".join(p.cmdline()) for p in marked_processes(marker)]
    assert left == [], out[-3000:]
    assert not psutil.pid_exists(int(driver)) or \
        psutil.Process(int(driver)).status() == psutil.STATUS_ZOMBIE, out[-3000:]
    assert inner.returncode != 0  # interrupted, not passed
