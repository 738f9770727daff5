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
from mlflow.tracking import MlflowClient
from workbench.config import ConfigError, SweepConfig, config_id
from workbench.sweeps import store as store_module
from workbench.sweeps import sweep
from workbench.sweeps.executors import LocalExecutor
from workbench.sweeps.plan import expand_grid, plan_sweep, point_name
from workbench.sweeps.point import (
    PointKernel,
    PointOutcome,
    PointSpec,
    point_environment,
    point_specs,
    run_papermill,
)
from workbench.sweeps.request import check_request
from workbench.training import load_config
from workbench.training.describe import default_run_name

from . import reportdata
from .conftest import AS_BACKGROUND_JOB, ROOT, TINY_VIDEO, copy_store, run_cli
from .support.runs import POINT_TINY, runs_of

CORES_2 = {"WORKBENCH_CPU_BUDGET": "2"}  # the same budget on any CI machine


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
@pytest.mark.parametrize("cell_ran", [False, True])
def test_a_kernel_that_never_answered_is_started_once_more_before_any_cell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cell_ran: bool) -> None:
    """jupyter_client times a new kernel's first answer on the wall clock: a clock step
    fails it at once. Started again when no cell ran; never once a cell has run."""
    import papermill

    plan = plan_sweep(["sweep.num_envs=[1]", "sweep.n_steps=[64]", *POINT_TINY])
    (spec,) = point_specs(plan, plan.points, "parent", "0", cpus_per_point=1)
    output = tmp_path / "point.ipynb"
    calls = []

    def execute_notebook(source: str, out: str, **kw: object) -> None:
        calls.append(out)
        if len(calls) == 1:
            cell = nbformat.v4.new_code_cell("train()")
            if cell_ran:
                cell.metadata["papermill"] = {"start_time": "2026-12-02T10:00:00"}
            nbformat.write(nbformat.v4.new_notebook(cells=[cell]), out)
            raise RuntimeError("Kernel didn't respond in 180 seconds")

    monkeypatch.setattr(papermill, "execute_notebook", execute_notebook)
    error = run_papermill(spec, output, PointKernel({}))
    if cell_ran:
        assert (len(calls), error) == (1, "RuntimeError: Kernel didn't respond in 180 seconds")
    else:
        assert (len(calls), error) == (2, None)


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


# --------------------------------------------------------------------------- grids of any keys


LR_GRID = "sweep.grid={algo.learning_rate:[1e-4,3e-4],env:[hopper,walker2d]}"


@pytest.mark.unit
def test_a_grid_crosses_any_keys_with_seeds_and_names_points_by_what_varies() -> None:
    plan = plan_sweep([LR_GRID, "sweep.seeds=[0,1]", "algo.n_epochs=3"])
    assert [p.name for p in plan.points] == [
        "lr1e-4-hopper-s0", "lr1e-4-hopper-s1", "lr1e-4-walker2d-s0", "lr1e-4-walker2d-s1",
        "lr3e-4-hopper-s0", "lr3e-4-hopper-s1", "lr3e-4-walker2d-s0", "lr3e-4-walker2d-s1"]
    # One key at a time is the same grid (Hydra nests it; the sweep reads it back flat).
    nested = plan_sweep(["sweep.grid.algo.learning_rate=[1e-4,3e-4]",
                         "sweep.grid.env=[hopper,walker2d]", "sweep.seeds=[0,1]",
                         "algo.n_epochs=3"])
    assert [p.name for p in nested.points] == [p.name for p in plan.points]
    assert nested.sweep_id == plan.sweep_id
    assert plan.grid_params()["sweep.grid"] == {"algo.learning_rate": [1e-4, 3e-4],
                                                "env": ["hopper", "walker2d"]}
    specs = {s.point: s for s in point_specs(plan, plan.points, "parent", "0", 1)}
    spec = specs["lr1e-4-walker2d-s1"]
    assert (spec.parameters["env"], spec.parameters["seed"]) == ("walker2d", 1)
    assert spec.parameters["overrides"] == ["algo.n_epochs=3", "algo.learning_rate=0.0001",
                                            "tracking.run_name=lr1e-4-walker2d-s1"]
    # The notebook's composition of those parameters is the point's config.
    walker = load_config(["env=walker2d", f"env.num_envs={spec.parameters['num_envs']}",
                          f"algo.n_steps={spec.parameters['n_steps']}", "seed=1",
                          *spec.parameters["overrides"]])
    assert walker.algo.learning_rate == 1e-4 and walker.tracking.run_name == spec.point
    assert json.loads(spec.env_vars["WORKBENCH_POINT_TAGS"]) == {
        "sweep.grid.algo.learning_rate": "0.0001", "sweep.grid.env": "walker2d"}
    assert spec.tags["workbench.config_id"] == config_id(walker)
    assert specs["lr1e-4-walker2d-s0"].tags["workbench.config_id"] == config_id(walker)
    assert specs["lr3e-4-walker2d-s1"].tags["workbench.config_id"] != config_id(walker)
    assert "algo.learning_rate [1e-4, 3e-4] x env [hopper, walker2d] x seeds [0, 1] = " \
        "8 points" in plan.describe()


@pytest.mark.unit
def test_today_s_grids_keep_their_names_and_ids() -> None:
    """Without sweep.grid, num_envs x n_steps keeps its defaults, names and sweep id, so a
    sweep started before grids of any key resumes; its points get the key tags too."""
    plan = plan_sweep([])
    assert [p.name for p in plan.points] == [
        "halfcheetah-ne1-ns128-s0", "halfcheetah-ne1-ns256-s0", "halfcheetah-ne2-ns128-s0",
        "halfcheetah-ne2-ns256-s0"]
    assert plan.sweep_id == "default-d8925dab"
    (spec, *_) = point_specs(plan, plan.points, "parent", "0", 1)
    assert spec.parameters["overrides"] == []
    assert spec.tags["sweep.grid.env.num_envs"] == "1"


@pytest.mark.unit
def test_each_grid_point_is_composed_with_its_own_group_choices() -> None:
    plan = plan_sweep(["sweep.grid={experiment:[zoo_hopper,zoo_inverted_pendulum]}"])
    for point in plan.points:
        own = load_config([f"experiment={point.name.removesuffix('-s0')}"])
        assert (point.env, point.num_envs, point.n_steps, point.total_timesteps) == (
            own.env.name, own.env.num_envs, own.algo.n_steps, own.total_timesteps)
    assert plan.env == "hopper,inverted_pendulum"
    invalid = plan_sweep(["sweep.grid={algo.batch_size:[32,4096]}", *POINT_TINY]).invalid
    assert list(invalid) == ["bs4096-s0"]
    assert invalid["bs4096-s0"].startswith("algo.batch_size=4096 is larger")


@pytest.mark.unit
def test_the_config_id_ignores_the_seed_and_bookkeeping() -> None:
    base = config_id(load_config(TINY_VIDEO))
    assert config_id(load_config([*TINY_VIDEO, "seed=7"])) == base
    assert config_id(load_config([*TINY_VIDEO, "tracking.run_name=mine", "tracking.experiment=x",
                                  "video=off", "checkpoint.every_steps=0"])) == base
    assert config_id(load_config([*TINY_VIDEO, "algo.learning_rate=1e-4"])) != base
    assert config_id(load_config([*TINY_VIDEO, "env.normalize=false"])) != base


@pytest.mark.unit
@pytest.mark.parametrize(("args", "line"), [
    (["sweep.grid={algo.learnin_rate:[1e-4]}"],
     "sweep.grid: algo.learnin_rate: unknown config key; did you mean algo.learning_rate? "),
    (["sweep.grid={env:[hoper]}"],
     "sweep.grid: env=hoper: unknown env option (did you mean hopper?); choose one of "),
    (["sweep.grid={algo.learning_rate:[]}"],
     "sweep.grid key algo.learning_rate=[]: the axis needs at least one value"),
    ([LR_GRID, "algo.learning_rate=1e-3"],
     "'algo.learning_rate=1e-3' on the command line: algo.learning_rate is also a key of "
     "sweep.grid, which sets it per point; drop one of them"),
    ([LR_GRID, "sweep.overrides=['env=ant']"],
     "'env=ant' in sweep.overrides: env is also a key of sweep.grid"),
    (["sweep.grid={env.num_envs:[1,2]}", "sweep.num_envs=[4]"],
     "sweep.num_envs=[4] with sweep.grid key env.num_envs: both set the same axis"),
    (["sweep=iso_batch", "sweep.grid={algo.n_steps:[64]}"],
     "sweep.grid key algo.n_steps with sweep.iso_batch: "),
    (["sweep.grid={seed:[1,2]}"], "sweep.grid key seed: seed is set per point by the sweep; "
                                  "use sweep.seeds instead"),
    (["sweep.grid={algo.learning_rate:1e-4}"],
     "sweep.grid key algo.learning_rate=0.0001: an axis is a list of values; write "),
    (["sweep.grid={algo.learning_rate:[abc]}"], "sweep.grid: algo.learning_rate=abc: "),
    (["sweep.grid={sweep.workers:[1,2]}"], "sweep.grid key sweep.workers: the sweep's own "),
    (["sweep.grid={algo.learning_rate:[1,2,3,4,5,6,7,8,9]}", "sweep.seeds=[0,1,2,3,4,5,6,7]"],
     "sweep: 72 points (9 algo.learning_rate x 8 seeds) is more than sweep.max_points=64; "
     "pass --yes to run them all, or set sweep.max_points=72"),
    (["sweep.grid={algo.gamma:[0.9],algo.gamma:[0.99]}"],
     "sweep.grid: key algo.gamma is given twice; give it once, with all its values in one "
     "list (e.g. sweep.grid.algo.gamma=[a,b])"),
    (["sweep.grid.algo.gamma=[0.9]", "sweep.grid.algo.gamma=[0.99]"],
     "sweep.grid: key algo.gamma is given twice"),
    (["sweep.grid={algo:{gamma:[0.9]},algo.gamma:[0.99]}"],
     "sweep.grid: key algo.gamma is given twice"),
])
def test_bad_grids_are_refused_in_one_line(args: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_request(args)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


@pytest.mark.unit
def test_a_large_grid_runs_when_confirmed() -> None:
    args = ["sweep.grid={algo.gamma:[0.9,0.95,0.99]}", "sweep.seeds=[0,1]", "sweep.max_points=5"]
    assert len(check_request(args, yes=True).points) == 6
    assert len(check_request([*args, "sweep.max_points=6"]).points) == 6


def test_cli_refuses_a_bad_grid_before_writing(bare_store: Path) -> None:
    proc = run_cli("sweep", "sweep.grid={env:[hoper]}")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("workbench: error: sweep.grid: env=hoper: unknown env option "
                                  "(did you mean hopper?)")
    big = ["sweep", "sweep.grid={algo.gamma:[0.9,0.99]}", "sweep.max_points=1"]
    proc = run_cli(*big)
    assert proc.returncode == 2 and "pass --yes to run them all" in proc.stderr
    assert not bare_store.exists()


def test_a_grid_env_id_naming_a_module_is_refused_before_anything_starts(
        bare_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench import cli

    assert cli.main(["sweep", "sweep.grid.env.id=[Hopper-v5,os:Hopper-v5]"]) == 2
    assert capsys.readouterr().err == (
        "workbench: error: sweep.grid key env.id: 'os:Hopper-v5' names a module to import; a "
        "grid value is never imported: give env.id=os:Hopper-v5 on the command line for every "
        "point (it imports as your own env.id does), or sweep over conf/env options "
        "(sweep.grid.env=[...])\n")
    assert not bare_store.exists()  # no parent run, no notebook folder, no kernel


def test_cli_bad_sweep_input_exits_2_before_writing(bare_store: Path) -> None:
    proc = run_cli("sweep", "sweep.num_envs=[]")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "workbench: error: sweep.num_envs=[]: the grid needs at least one value, "
        "e.g. sweep.num_envs=[1,2,4]"]
    assert not bare_store.exists()


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
        assert run.data.tags["sweep.grid.env.num_envs"] == run.data.params["env.num_envs"]
    # Seeds of one configuration share its id; another rollout shape is another config.
    config_ids: dict[str, set[str]] = {}
    for run in reportdata.sweep_runs(shared.uri, "child"):
        config_ids.setdefault(run.info.run_name[:-3], set()).add(
            run.data.tags["workbench.config_id"])
    assert all(len(ids) == 1 for ids in config_ids.values()), config_ids
    assert len(set.union(*config_ids.values())) == 4
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


@pytest.mark.slow
def test_a_grid_sweep_passes_its_keys_tags_its_runs_and_resumes(store: Path) -> None:
    """Two learning rates: each point's run has its rate, the key tag and its config id
    (the one the pre-check computed); a rerun finds both FINISHED and skips them."""
    args = ["sweep", "sweep.grid={algo.learning_rate:[1e-4,3e-4]}", *POINT_TINY]
    proc = run_cli(*args, env=CORES_2, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    plan = plan_sweep(args[1:])
    runs = {r.info.run_name: r for r in runs_of("child")}
    assert sorted(runs) == ["lr1e-4-s0", "lr3e-4-s0"]
    for point in plan.points:
        run = runs[point.name]
        rate = dict(point.keys)["algo.learning_rate"]
        assert run.info.status == "FINISHED"
        assert float(run.data.params["algo.learning_rate"]) == rate
        assert run.data.tags["sweep.grid.algo.learning_rate"] == str(rate)
        assert run.data.tags["sweep.point"] == point.name
        assert run.data.tags["workbench.config_id"] == point.config_id
    assert len({r.data.tags["workbench.config_id"] for r in runs.values()}) == 2
    again = run_cli(*args, env=CORES_2, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": 0 points (2 FINISHED earlier, skipped)" in again.stdout
    assert len(runs_of("child")) == 2


def test_a_small_rollout_sweep_trains_with_the_points_own_minibatch(store: Path) -> None:
    """A rollout smaller than the base config's minibatch is a valid point of its own (a task
    without tuned values, whose minibatch is half of each point's rollout)."""
    proc = run_cli("sweep", "env=inverted_double_pendulum", "sweep.num_envs=[1]",
                   "sweep.n_steps=[64]", "total_timesteps=64", "tracking.system_metrics=false",
                   "video=off",
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

    def timed_out_at_the_end(spec, output, kernel):
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
    assert again.wall_s == pytest.approx(outcome.wall_s)  # its point time, kernel included


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
    assert "Kernel died while waiting" not in err  # the KILLED line says why, once


@pytest.mark.unit
def test_ctrl_c_reports_each_point_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ctrl-C while a point runs: the points already reported are not reported again (the
    progress read '5/4 points (125%)'), the one in flight is reported when it settles."""
    import threading

    running, settled = threading.Event(), threading.Event()

    def execute(spec: PointSpec, output: Path, kernel: object) -> PointOutcome:
        if spec.point == "first":
            running.wait(timeout=10)  # the second point is in flight when the first ends
            return PointOutcome(spec.point, "FINISHED")
        running.set()
        settled.wait(timeout=10)  # until the interrupt stops its kernel
        return PointOutcome(spec.point, "KILLED")

    class Kernel:
        def __init__(self, *args: object) -> None: ...

        def stop(self, reason: str, grace_s: float) -> None:
            settled.set()

    monkeypatch.setattr("workbench.sweeps.executors.execute_point", execute)
    monkeypatch.setattr("workbench.sweeps.executors.PointKernel", Kernel)
    monkeypatch.setattr("workbench.sweeps.executors.cpu_budget", lambda: 2)  # both run at once
    reported: list[str] = []

    def report(outcome: PointOutcome) -> None:
        reported.append(outcome.point)
        if len(reported) == 1:
            raise KeyboardInterrupt  # Ctrl-C while the first point's line is printed

    specs = [PointSpec("s", name, "p", "0", "sqlite://", {}, {}, {}, None)
             for name in ("first", "second")]
    with pytest.raises(KeyboardInterrupt):
        LocalExecutor(workers=2).run(specs, tmp_path, report)
    assert sorted(reported) == ["first", "second"]


@pytest.mark.unit
def test_hydra_s_own_sweep_syntax_is_the_same_grid() -> None:
    """`key=a,b`, range(), choice() and glob() as every Hydra user writes them: the same
    points and sweep id as the sweep.grid dict they stand for."""
    hydra = check_request(["algo.learning_rate=1e-4,3e-4", "env=hopper,walker2d",
                           "algo.n_epochs=range(3,5)", "sweep.seeds=[0,1]"])
    as_dict = check_request(["sweep.grid={algo.learning_rate:[1e-4,3e-4],env:[hopper,walker2d],"
                             "algo.n_epochs:[3,4]}", "sweep.seeds=[0,1]"])
    assert [p.name for p in hydra.points] == [p.name for p in as_dict.points]
    assert len(hydra.points) == 16 and hydra.sweep_id == as_dict.sweep_id
    globbed = check_request(["env=glob([walker*,hop*])", "algo.gamma=choice(0.99,0.999)"])
    assert sorted({p.env for p in globbed.points}) == ["hopper", "walker2d"]
    with pytest.raises(ConfigError, match=r"^algo.gamma=interval\(0.9,1\): an interval is not"):
        check_request(["algo.gamma=interval(0.9,1)"])
    with pytest.raises(ConfigError, match="seed"):
        check_request(["seed=0,1"])  # seeds are sweep.seeds, as in the dict form
