"""Sweeps (and a tuning study) on a real multi-node Ray cluster on this machine, under node
failures.

Each cluster (tests/raycluster.py) is a head with no CPUs plus two worker nodes ``a`` and
``b`` of 2 CPUs each, every node its own ``ray start --block`` process with its own temp dir,
ports, custom resource and environment; a test tells where a point ran from the node id the
point's run records (``ray.node_id``) and the state API's node listing. The sweeps are the
tests' tiny real trainings (``debug=tiny``) through the real CLI; a node is killed the way a
machine dies (SIGKILL of its whole process group). Every Ray process, and every kernel the
Ray workers started, is gone when a test ends, failed or not (the fixture checks).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from .conftest import ROOT, run_cli
from .raycluster import RayCluster
from .teamserver import ALICE, TeamServer, logged_in
from .test_sweep import POINT_TINY, runs_of
from .test_tune import TINY_STUDY, study_trials, tune_runs

ray = pytest.importorskip("ray", reason="the ray extra: pip install -e '.[ray]'")

# A loaded 2-core machine can take many minutes for what takes one on an idle one.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NODE_ID, NODE_IP, HOSTNAME = "ray.node_id", "ray.node_ip", "ray.hostname"
# Ray ends a driver whose GCS has been silent this long; the sweep gives up on the head at a
# third of it. 30 s (Ray's default is 60) keeps the head-loss test short.
RECONNECT_30S = {"RAY_gcs_rpc_server_reconnect_timeout_s": "30"}


@pytest.fixture()
def clusters() -> Iterator[Callable[..., RayCluster]]:
    """Start clusters on demand; every one is stopped, and checked to leave no process."""
    started: list[RayCluster] = []

    def start(**kwargs: object) -> RayCluster:
        started.append(RayCluster({"a": 2, "b": 2}, **kwargs))  # type: ignore[arg-type]
        return started[-1]

    yield start
    leftovers = []
    for cluster in started:
        leftovers += cluster.stop()
        cluster.remove()
    assert leftovers == [], f"processes left after the cluster stopped: {leftovers}"


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


def start_sweep(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "workbench", *args], cwd=ROOT, text=True,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


# --------------------------------------------------------------------------- placement


def test_points_spread_over_the_workers_and_record_their_node(
        store: Path, clusters: Callable[..., RayCluster]) -> None:
    cluster = clusters()
    args = sweep_args(cluster, "sweep.num_envs=[1,2]", "sweep.n_steps=[64,128]",
                      "sweep.seeds=[0,1]", "sweep.workers=4")
    proc = run_cli(*args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "up to 4 points at a time x 1 CPU each, cluster CPUs 4" in proc.stdout

    nodes = cluster.node_ids()
    children = runs_of("child")
    assert len(children) == 8
    assert all(len(runs) == 1 for runs in children_by_point(children).values())
    assert {r.info.status for r in children} == {"FINISHED"}
    show("8 points on 2 workers x 2 CPUs", children, nodes)
    where = {r.info.run_name: nodes[r.data.tags[NODE_ID]][0] for r in children}
    assert sorted(set(where.values())) == ["a", "b"], where  # both workers, never the head
    for run in children:
        assert run.data.tags[NODE_IP] == nodes[run.data.tags[NODE_ID]][1]
        assert run.data.tags[HOSTNAME] == socket.gethostname()
    sweep_id = runs_of("parent")[0].data.tags["sweep_id"]
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
        store: Path, clusters: Callable[..., RayCluster]) -> None:
    cluster = clusters()
    nodes = cluster.node_ids()
    node_a = next(node_id for node_id, (name, _) in nodes.items() if name == "a")
    # Long enough that node a's points are still training when it dies.
    args = sweep_args(cluster, "sweep.num_envs=[1,2]", "sweep.n_steps=[64]",
                      "sweep.seeds=[0,1]", "sweep.workers=4", "total_timesteps=4096")
    sweep = start_sweep(args)
    try:
        wait_for(lambda: any(r.info.status == "RUNNING" and r.data.tags.get(NODE_ID) == node_a
                             for r in child_runs_or_none()), "a point training on node a")
        cluster.nodes["a"].kill()  # the machine dies: raylet, agents, Ray workers at once
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
    assert len(by_point) == 4
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


# --------------------------------------------------------------------------- the head dies


def test_the_head_dying_ends_the_sweep_with_one_line_and_a_new_head_resumes(
        store: Path, clusters: Callable[..., RayCluster]) -> None:
    cluster = clusters()
    nodes = cluster.node_ids()  # the state API lives on the head: ask before it dies
    # Long enough (about 40 s idle) that the running point is still training when the sweep
    # gives up on the head, 10 s after it stopped answering.
    args = ["sweep.num_envs=[2]", "sweep.n_steps=[64]", "sweep.seeds=[0,1,2]",
            "sweep.workers=2", "total_timesteps=32768"]
    sweep = start_sweep(sweep_args(cluster, *args), env=RECONNECT_30S)

    def second_wave_training() -> bool:
        """A point FINISHED, and one that started after it is running: it has its whole
        budget ahead when the head dies."""
        runs = child_runs_or_none()
        ends = [r.info.end_time for r in runs if r.info.status == "FINISHED"]
        return bool(ends) and any(r.info.status == "RUNNING" and r.info.start_time > min(ends)
                                  for r in runs)

    try:
        wait_for(second_wave_training, "a point FINISHED and the next one running",
                 timeout_s=900)
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
    # head after Ray's reconnect timeout (30 s here) and each kernel exits with its Ray worker.
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

    assert cluster.stop() == []  # the old workers gave up on their head, or were stopped
    fresh = clusters()
    again = run_cli(*sweep_args(fresh, *args), env=RECONNECT_30S, timeout=900)
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


# --------------------------------------------------------------------------- team mode


def test_team_mode_points_log_with_each_nodes_login_that_ray_never_sees(
        team_server: TeamServer, clusters: Callable[..., RayCluster]) -> None:
    env = team_server.env(ALICE)  # the login, exported on every node before `ray start`
    cluster = clusters(env=env)
    experiment = f"ray-team-{os.getpid()}"
    args = sweep_args(cluster, "sweep.num_envs=[1,2]", "sweep.n_steps=[64]",
                      "sweep.workers=2", "tracking=server", f"tracking.experiment={experiment}")
    done = team_server.cli(*args, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    with logged_in(ALICE, team_server.alice_password):
        client = MlflowClient(team_server.url)
        exp = client.get_experiment_by_name(experiment)
        children = client.search_runs([exp.experiment_id], "tags.`sweep.role` = 'child'")
    nodes = cluster.node_ids()
    show("team mode", children, nodes)
    assert sorted(r.info.status for r in children) == ["FINISHED", "FINISHED"]
    assert {nodes[r.data.tags[NODE_ID]][0] for r in children} <= {"a", "b"}

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


# --------------------------------------------------------------------------- a study


def test_a_study_on_the_cluster_keeps_one_storage_when_a_worker_node_dies(
        store: Path, clusters: Callable[..., RayCluster]) -> None:
    # Trials are sweep points to Ray (the same task, tags and retries); the Optuna storage is
    # the driver's SQLite file, which every node of this one-machine cluster reaches.
    cluster = clusters()
    nodes = cluster.node_ids()
    node_a = next(node_id for node_id, (name, _) in nodes.items() if name == "a")
    args = ["tune", "--n-trials", "4", *TINY_STUDY, "tune.study=on-cluster",
            "tune.executor=ray", f"tune.ray.address={cluster.address}", "tune.workers=4",
            "tune.pruner=none", "total_timesteps=4096"]
    study = start_sweep(args)

    def trial_training_on_a() -> bool:
        return any(r.info.status == "RUNNING" and r.data.tags.get(NODE_ID) == node_a
                   for r in trial_runs_or_none())

    try:
        wait_for(trial_training_on_a, "a trial training on node a", timeout_s=900)
        cluster.nodes["a"].kill()
        out, err = study.communicate(timeout=1200)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 0, out[-3000:] + err[-3000:]
    assert cluster.processes_of("a") == []

    trials = study_trials(store, "on-cluster")  # one storage: every trial is in it, once
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
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
    assert notebooks == [f"trial-{n:03d}.ipynb" for n in range(4)]


def test_the_head_dying_ends_a_study_with_one_line_and_a_new_head_resumes_it(
        store: Path, clusters: Callable[..., RayCluster]) -> None:
    cluster = clusters()
    # Long enough that the first trials are still training when the study gives up on the
    # head, 10 s after it stopped answering.
    args = ["tune", "--n-trials", "2", *TINY_STUDY, "tune.study=lost-head", "tune.executor=ray",
            "tune.workers=2", "tune.pruner=none", "total_timesteps=32768"]
    study = start_sweep([*args, f"tune.ray.address={cluster.address}"], env=RECONNECT_30S)

    def trials_training() -> bool:
        return any(r.info.status == "RUNNING" for r in trial_runs_or_none())

    try:
        wait_for(trials_training, "a trial training", timeout_s=900)
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
    fresh = clusters()
    again = run_cli(*args, f"tune.ray.address={fresh.address}", env=RECONNECT_30S, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    states = [t.state.name for t in study_trials(store, "lost-head")]
    assert states.count("COMPLETE") == 2 and states.count("FAIL") == len(killed), states
    (resumed,) = tune_runs("study")
    assert resumed.info.run_id == parent.info.run_id and resumed.info.status == "FINISHED"
    assert "error" not in resumed.data.tags
