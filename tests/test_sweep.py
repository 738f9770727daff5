"""Sweeps: grid and plan (unit), then real sweeps through the CLI: papermill kernels, MuJoCo,
a temporary SQLite MLflow store, parallel points, resume, and failure isolation."""

from __future__ import annotations

import getpass
import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from workbench.config import ConfigError, SweepConfig
from workbench.sweeps import store as store_module
from workbench.sweeps import sweep
from workbench.sweeps.executors import LocalExecutor
from workbench.sweeps.plan import expand_grid, plan_sweep, point_name
from workbench.sweeps.point import PointOutcome, point_environment, point_specs
from workbench.training import load_config
from workbench.training.describe import default_run_name

from . import reportdata
from .conftest import AS_BACKGROUND_JOB, ROOT, TINY, copy_store, run_cli

# TINY without the keys the grid sets; no system-metrics thread in each kernel.
GRID_SET = ("env.num_envs", "algo.n_steps")
POINT_TINY = [o for o in TINY if o.split("=")[0] not in GRID_SET] + [
    "tracking.system_metrics=false"]
CORES_2 = {"WORKBENCH_CPU_BUDGET": "2"}  # the same budget on any CI machine


def runs_of(role: str) -> list[Run]:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("workbench")
    return client.search_runs([experiment.experiment_id], f"tags.`sweep.role` = '{role}'")


# --------------------------------------------------------------------------- grid and plan


@pytest.mark.unit
def test_grid_is_the_product_in_order_without_duplicates() -> None:
    grid = SweepConfig(num_envs=[1, 2], n_steps=[128, 256, 128], seeds=[0, 1])
    names = [p.name for p in expand_grid(grid, "hopper")]
    assert names == [
        "hopper-ne1-ns128-s0", "hopper-ne1-ns128-s1", "hopper-ne1-ns256-s0",
        "hopper-ne1-ns256-s1", "hopper-ne2-ns128-s0", "hopper-ne2-ns128-s1",
        "hopper-ne2-ns256-s0", "hopper-ne2-ns256-s1",
    ]


@pytest.mark.unit
def test_iso_batch_keeps_samples_per_update_constant() -> None:
    grid = SweepConfig(num_envs=[1, 2, 4, 8], n_steps=[999], seeds=[0], iso_batch=2048)
    points = expand_grid(grid, "ant")
    assert [(p.num_envs, p.n_steps) for p in points] == [(1, 2048), (2, 1024), (4, 512),
                                                         (8, 256)]
    with pytest.raises(ConfigError, match=r"^sweep.iso_batch=2048 is not a multiple of "
                                          r"num_envs=3"):
        expand_grid(SweepConfig(num_envs=[3], iso_batch=2048), "ant")


@pytest.mark.unit
def test_point_name_is_the_run_name_train_gives() -> None:
    cfg = load_config(["env=walker2d", "env.num_envs=8", "algo.n_steps=256", "seed=3"])
    assert point_name("walker2d", 8, 256, 3) == default_run_name(cfg)


@pytest.mark.unit
def test_plan_id_is_stable_and_follows_points_and_overrides() -> None:
    base = ["sweep.num_envs=[1,2]", "sweep.n_steps=[64]", *POINT_TINY]
    plan = plan_sweep(base)
    assert plan.sweep_id == plan_sweep([*base, "sweep.workers=1"]).sweep_id
    assert plan.sweep_id.startswith("default-") and len(plan.sweep_id) == len("default-") + 8
    assert plan.sweep_id != plan_sweep([*base, "algo.n_epochs=3"]).sweep_id
    assert plan_sweep([*base, "sweep.id=mine"]).sweep_id == "mine"
    assert plan.point_overrides == POINT_TINY  # sweep.* settings are not passed to points
    assert plan.grid_params()["sweep.num_envs"] == [1, 2]


@pytest.mark.unit
def test_grid_keys_cannot_be_overridden_for_the_whole_sweep() -> None:
    with pytest.raises(ConfigError) as info:
        plan_sweep(["env.num_envs=4"])
    assert str(info.value) == ("'env.num_envs=4' on the command line: env.num_envs is set per "
                               "point by the sweep; use sweep.num_envs instead, e.g. "
                               "sweep.num_envs=[4]")
    with pytest.raises(ConfigError, match="in sweep.overrides: seed is set per point"):
        plan_sweep(["sweep.overrides=['seed=3']"])


@pytest.mark.unit
def test_plan_reports_invalid_points_and_refuses_an_all_invalid_grid() -> None:
    plan = plan_sweep(["sweep.num_envs=[1,2]", "sweep.n_steps=[64]", *POINT_TINY,
                             "algo.batch_size=128"])
    assert list(plan.invalid) == ["halfcheetah-ne1-ns64-s0"]
    assert plan.invalid["halfcheetah-ne1-ns64-s0"].startswith("algo.batch_size=128 is larger")
    with pytest.raises(ConfigError, match="^every point of the sweep is invalid"):
        plan_sweep(["sweep.num_envs=[1]", "sweep.n_steps=[64]", "algo.batch_size=128"])


@pytest.mark.unit
@pytest.mark.parametrize("grid", [
    ["env=inverted_pendulum", "sweep.num_envs=[1,2]", "sweep.n_steps=[64,128]"],
    ["sweep=scale", "sweep.iso_batch=256"],  # the small ladder the duck practice starts with
])
def test_each_point_is_checked_with_its_own_minibatch(grid: list[str]) -> None:
    """``algo.batch_size`` follows each point's rollout (half of it by default): a point is
    checked with its own, not with the base config's."""
    assert plan_sweep(grid).invalid == {}


@pytest.mark.unit
def test_workers_never_oversubscribe_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_CPU_BUDGET", "2")
    four = LocalExecutor(workers=4)
    assert (four.workers, four.cpus_per_point) == (2, 1)
    monkeypatch.setenv("WORKBENCH_CPU_BUDGET", "8")
    two = LocalExecutor(workers=2)
    assert (two.workers, two.cpus_per_point) == (2, 4)


@pytest.mark.unit
def test_point_environment_sets_the_budget_and_drops_mlflow_run_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_RUN_ID", "the-parent")
    plan = plan_sweep(["sweep.num_envs=[2]", "sweep.n_steps=[64]", *POINT_TINY])
    (spec,) = point_specs(plan, plan.points, "parent", "0", cpus_per_point=3)
    env = point_environment(spec)
    assert "MLFLOW_RUN_ID" not in env
    assert (env["WORKBENCH_CPU_BUDGET"], env["OMP_NUM_THREADS"]) == ("3", "3")
    assert spec.parameters["parent_run_id"] == "parent"
    assert spec.parameters["point"] == "halfcheetah-ne2-ns64-s0"


@pytest.mark.unit
def test_results_table() -> None:
    table = sweep.results_table([
        PointOutcome("hopper-ne1-ns64-s0", "FINISHED", final_reward=12.345, fps=321.4,
                     wall_s=20.2, train_s=15.66),
        PointOutcome("hopper-ne2-ns64-s0", "FAILED", error="boom"),
    ])
    assert table.splitlines() == [
        "point               status    final reward  fps  training  point (kernel incl.)",
        "-------------------------------------------------------------------------------",
        "hopper-ne1-ns64-s0  FINISHED          12.3  321    15.7 s                  20 s",
        "hopper-ne2-ns64-s0  FAILED               -    -         -                     -",
    ]


def test_cli_bad_sweep_input_exits_2_before_writing(store: Path) -> None:
    proc = run_cli("sweep", "sweep.num_envs=[]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "workbench: error: sweep.num_envs=[]: the grid needs at least one value, "
        "e.g. sweep.num_envs=[1,2,4]"]
    assert not store.exists()


def test_a_resumed_parent_runs_again_without_the_last_invocations_error(store: Path) -> None:
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    experiment_id = client.create_experiment("resumed-parent")
    run = client.create_run(experiment_id, tags={"error": "the Ray head stopped answering"})
    client.set_terminated(run.info.run_id, "FAILED")
    store_module.reopen_parent(client, client.get_run(run.info.run_id))
    reopened = client.get_run(run.info.run_id)
    assert reopened.info.status == "RUNNING"
    assert "error" not in reopened.data.tags
    store_module.reopen_parent(client, reopened)  # no error tag to remove: still fine
    assert client.get_run(run.info.run_id).info.status == "RUNNING"


# --------------------------------------------------------------------------- real sweeps


def test_two_by_two_sweep_with_two_workers_then_resume(
        report_sweep: reportdata.Sweep, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The session's shared sweep (tests/reportdata.py): its first invocation is this 2x2 grid
    # with two workers on the command line, seed 0; a second one added seed 1 afterwards.
    shared = report_sweep
    proc, parent = shared.first, shared.first_parent
    client = MlflowClient(shared.uri)
    sweep_id = parent.data.tags["sweep_id"]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["sweep.num_envs"] == "[1, 2]"
    assert parent.data.params["sweep.n_steps"] == "[64, 128]"
    children = [r for r in reportdata.sweep_runs(shared.uri, "child")
                if r.data.params["seed"] == "0"]
    names = sorted(r.info.run_name for r in children)
    assert names == ["halfcheetah-ne1-ns128-s0", "halfcheetah-ne1-ns64-s0",
                     "halfcheetah-ne2-ns128-s0", "halfcheetah-ne2-ns64-s0"]
    for run in children:
        assert run.info.status == "FINISHED"
        assert run.data.tags["sweep_id"] == sweep_id
        assert run.data.tags["sweep.point"] == run.info.run_name
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["derived.torch_threads"] == "1"  # 2 cores / 2 workers
    out_dir = shared.experiments / "sweeps" / sweep_id
    assert sorted(p.name for p in out_dir.glob("*-s0.ipynb")) == [f"{n}.ipynb" for n in names]
    executed = nbformat.read(out_dir / "halfcheetah-ne2-ns64-s0.ipynb", as_version=4)
    assert executed.metadata["papermill"]["parameters"]["parent_run_id"] == parent.info.run_id
    run = next(r for r in children if r.info.run_name == "halfcheetah-ne2-ns64-s0")
    manifest = json.loads(Path(client.download_artifacts(
        run.info.run_id, "manifest.json", str(tmp_path_factory.mktemp("manifest")))).read_text())
    assert manifest["run"]["notebook"] == str(out_dir / "halfcheetah-ne2-ns64-s0.ipynb")
    assert manifest["run"]["papermill_parameters"]["point"] == "halfcheetah-ne2-ns64-s0"
    # Reviewers on another machine open the executed notebook and the kernel's log from the
    # run itself; MLflow's "Source" and "Created by" columns say what ran and who ran it.
    attached = {a.path for a in client.list_artifacts(run.info.run_id, "point")}
    assert attached == {"point/halfcheetah-ne2-ns64-s0.ipynb", "point/halfcheetah-ne2-ns64-s0.log"}
    assert run.data.tags["mlflow.source.name"] == str(out_dir / "halfcheetah-ne2-ns64-s0.ipynb")
    assert run.data.tags["mlflow.source.type"] == "NOTEBOOK"
    assert run.data.tags["mlflow.user"] == getpass.getuser()
    assert parent.data.tags["mlflow.source.name"].startswith("workbench sweep ")
    assert parent.data.tags["mlflow.note.content"].startswith("Sweep ")
    assert ("on halfcheetah: num_envs [1, 2] x n_steps [64, 128] x seeds [0] = 4 points"
            in parent.data.tags["mlflow.note.content"])
    for path in [*out_dir.glob("*.ipynb"), *out_dir.glob("*.log")]:
        assert "database is locked" not in path.read_text(), path
    with sqlite3.connect(shared.experiments / "mlflow.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert "halfcheetah-ne2-ns128-s0  FINISHED" in proc.stdout  # the result table
    assert "| training " in proc.stderr and "| point " in proc.stderr  # the two times, named
    first = parent.data.metrics
    assert first["sweep/wall_time_s"] == first["sweep/attempt_wall_time_s"]

    # An attempt that was hard-killed left a point's run RUNNING with a stale heartbeat:
    # resuming reaps it (KILLED) before skipping the finished points. On a copy of the store,
    # so the shared sweep stays as the report tests expect it.
    copy = tmp_path_factory.mktemp("resumed") / "experiments"
    uri = copy_store(shared.experiments, copy)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("WORKBENCH_EXPERIMENTS", str(copy))
    client = MlflowClient(uri)
    dead = client.create_run(parent.info.experiment_id, tags={
        "sweep_id": sweep_id, "sweep.role": "child", "sweep.point": "halfcheetah-ne1-ns64-s0",
        "workbench.heartbeat": f"{time.time() - 3600:.3f}"})
    before = client.get_run(parent.info.run_id).data.metrics
    again = run_cli(*reportdata.first_sweep_args(), env=CORES_2, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": 0 points (4 FINISHED earlier, skipped)" in again.stdout
    assert f"1 point run(s) of a killed attempt marked KILLED (no heartbeat): {dead.info.run_id}" \
        in again.stdout
    assert client.get_run(dead.info.run_id).info.status == "KILLED"
    assert sorted(r.info.status for r in runs_of("child")) == ["FINISHED"] * 8 + ["KILLED"]
    assert [r.info.run_id for r in runs_of("parent")] == [parent.info.run_id]
    # The resume that had nothing to run adds its seconds to the sweep's wall time.
    resumed = client.get_run(parent.info.run_id).data.metrics
    assert resumed["sweep/wall_time_s"] == pytest.approx(
        before["sweep/wall_time_s"] + resumed["sweep/attempt_wall_time_s"])
    shared_children = reportdata.sweep_runs(shared.uri, "child")  # the source is untouched
    assert sorted(r.info.status for r in shared_children) == ["FINISHED"] * 8


def test_a_small_rollout_sweep_trains_with_the_points_own_minibatch(store: Path) -> None:
    """A rollout smaller than the base config's minibatch is a valid point of its own."""
    proc = run_cli("sweep", "env=inverted_pendulum", "sweep.num_envs=[1]", "sweep.n_steps=[64]",
                   "total_timesteps=64", "tracking.system_metrics=false", "video=off",
                   env=CORES_2, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "will fail" not in proc.stdout
    assert "\r" not in proc.stderr  # a log gets progress lines, not a redrawn bar
    (run,) = runs_of("child")
    assert (run.info.status, run.data.params["algo.batch_size"]) == ("FINISHED", "32")


def test_a_point_with_a_bad_parameter_fails_alone(store: Path) -> None:
    # One point's rollout (1 env x 64 steps) is smaller than the batch size: that point's
    # notebook fails at composition; the other point trains.
    args = ["sweep", "sweep.num_envs=[1,2]", "sweep.n_steps=[64]", *POINT_TINY,
            "algo.batch_size=128"]
    proc = run_cli(*args, env=CORES_2, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "warning: point halfcheetah-ne1-ns64-s0 will fail: algo.batch_size=128" in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench: 1 of 2 points did not finish: halfcheetah-ne1-ns64-s0 "
                           "(ConfigError: algo.batch_size=128 is larger than one rollout")
    # Said when it happens and in the last line, not a third time under the table.
    assert (proc.stdout + proc.stderr).count("ConfigError: algo.batch_size=128") == 2

    runs = {r.info.run_name: r for r in runs_of("child")}
    assert runs["halfcheetah-ne2-ns64-s0"].info.status == "FINISHED"
    bad = runs["halfcheetah-ne1-ns64-s0"]
    assert bad.info.status == "FAILED"
    assert bad.data.tags["error"].startswith("ConfigError: algo.batch_size=128 is larger")
    assert bad.data.tags["mlflow.parentRunId"] == runs_of("parent")[0].info.run_id
    (parent,) = runs_of("parent")
    assert parent.info.status == "FAILED"
    notebook = nbformat.read(store / "sweeps" / parent.data.tags["sweep_id"]
                             / "halfcheetah-ne1-ns64-s0.ipynb", as_version=4)
    failed = [c.id for c in notebook.cells
              if c.get("metadata", {}).get("papermill", {}).get("exception")]
    assert failed == ["compose"]
    assert "An Exception was encountered" in notebook.cells[0].source  # papermill's banner

    # Resume: the FINISHED point is skipped, the failed one is tried again.
    again = run_cli(*args, env=CORES_2, timeout=600)
    assert again.returncode == 1
    names = sorted(r.info.run_name for r in runs_of("child"))
    assert names == ["halfcheetah-ne1-ns64-s0", "halfcheetah-ne1-ns64-s0",
                     "halfcheetah-ne2-ns64-s0"]


@pytest.mark.slow
def test_a_point_whose_training_finished_before_the_timeout_is_finished(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sweep.timeout firing after training ended (a later cell cut short): the point is
    FINISHED in the console, the result table and MLflow, and a rerun skips it, all agreeing.
    The timing is made deterministic: papermill runs the real notebook, then the watchdog is
    taken to have fired just as it ended."""
    from workbench.sweeps import point as point_module

    real = point_module.run_papermill

    def timed_out_at_the_end(spec, output, kernel):  # noqa: ANN001, ANN202
        real(spec, output, kernel)
        kernel.stop_reason = "timeout"
        return "KeyboardInterrupt: "

    monkeypatch.setattr(point_module, "run_papermill", timed_out_at_the_end)
    plan = plan_sweep(["sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY,
                       "sweep.timeout=600"])
    client, experiment_id = store_module.prepare_store(plan.tracking_uri, plan.experiment)
    parent = store_module.start_parent_run(client, experiment_id, plan)
    (spec,) = point_specs(plan, plan.points, parent, experiment_id, cpus_per_point=2)
    output = store / "point.ipynb"
    outcome = point_module.execute_point(spec, output)
    (run,) = runs_of("child")
    assert (outcome.status, run.info.status) == ("FINISHED", "FINISHED")
    assert outcome.ok and outcome.error is None and "error" not in run.data.tags
    assert outcome.note == ("training finished, then the notebook stopped: timed out after "
                            "600 s (sweep.timeout); the kernel was stopped")
    assert outcome.final_reward is not None and outcome.train_s is not None
    again = point_module.execute_point(spec, output)  # a resumed sweep sees the same
    assert again.status == "SKIPPED" and again.run_id == run.info.run_id


def kernels_of(pid: int) -> list[psutil.Process]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if "ipykernel_launcher" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_timeout_marks_the_point_failed_and_stops_its_kernel(store: Path) -> None:
    args = ["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", "sweep.timeout=20",
            *POINT_TINY, "total_timesteps=10000000"]
    proc = run_cli(*args, env=CORES_2, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (run,) = runs_of("child")
    assert run.info.status == "FAILED"
    assert run.data.tags["error"] == (
        "timed out after 20 s (sweep.timeout); the kernel was stopped")
    sweep_id = runs_of("parent")[0].data.tags["sweep_id"]
    notebook = nbformat.read(store / "sweeps" / sweep_id / f"{run.info.run_name}.ipynb",
                             as_version=4)
    assert "An Exception was encountered" in notebook.cells[0].source


@pytest.mark.slow
def test_dead_kernel_fails_its_point_and_closes_its_run(store: Path) -> None:
    args = ["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY,
            "total_timesteps=10000000"]
    proc = psutil.Popen([sys.executable, "-m", "workbench", *args], cwd=ROOT,
                        env={**os.environ, **CORES_2}, stdout=-1, stderr=-1, text=True)
    try:
        wait_for_a_training_point(proc)
        for kernel in kernels_of(proc.pid):
            kernel.kill()  # SIGKILL: no chance for train() to mark its run
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    (run,) = runs_of("child")
    assert run.info.status == "FAILED"  # not left RUNNING
    assert run.data.tags["error"].startswith("DeadKernelError: Kernel died")
    sweep_id = runs_of("parent")[0].data.tags["sweep_id"]
    notebook = nbformat.read(store / "sweeps" / sweep_id / f"{run.info.run_name}.ipynb",
                             as_version=4)
    failed = [c.id for c in notebook.cells
              if c.get("metadata", {}).get("papermill", {}).get("exception")]
    assert failed == ["train"]
    assert kernels_of(proc.pid) == []


def running_child() -> bool:
    if "MLFLOW_TRACKING_URI" not in os.environ:
        return False
    try:
        return any(r.info.status == "RUNNING" for r in runs_of("child"))
    except Exception:  # the store or experiment does not exist yet
        return False


def wait_for_a_training_point(proc: psutil.Popen, limit_s: float = 600) -> None:
    """Until the sweep's point has a RUNNING run; fails at once, with the sweep's output,
    when the sweep exits first (no point ever trains then)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not running_child():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the sweep exited {proc.returncode} before its point trained:\n"
                        f"{out[-2000:]}\n{err[-3000:]}")
        time.sleep(1)
    assert running_child(), f"no point trained within {limit_s:.0f} s"


@pytest.mark.slow
def test_a_background_sweep_stops_on_sigint(store: Path) -> None:
    """A shell starts `workbench sweep ... &` with SIGINT ignored (POSIX job control); the
    sweep still stops on SIGINT: its point and parent KILLED, no kernel left."""
    args = ["sweep", "sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY,
            "total_timesteps=10000000"]
    proc = psutil.Popen([*AS_BACKGROUND_JOB, sys.executable, "-m", "workbench", *args],
                        cwd=ROOT, env={**os.environ, **CORES_2}, stdout=-1, stderr=-1,
                        text=True)
    try:
        wait_for_a_training_point(proc)
        kernels = kernels_of(proc.pid)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    (run,) = runs_of("child")
    (parent,) = runs_of("parent")
    assert (run.info.status, parent.info.status) == ("KILLED", "KILLED")
    assert not [k for k in kernels if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
