"""``checkpoint.keep=best``: each checkpoint is evaluated and becomes an MLflow logged model,
retention keeps the best one besides the newest, and ``workbench export --checkpoint`` exports
it. A run whose return collapses late (tests/faulty_envs.py's CollapsingCheetah) still has its
best policy; bad settings and choices are one line, exit 2, before anything exists."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.envs.robot_files import robot_files
from workbench.envs.spec import EnvSpec
from workbench.tracking import logged_models, runs
from workbench.tracking.inputs import log_run_inputs
from workbench.tracking.logged_models import (
    BEST_STEP_TAG,
    BEST_TAG,
    BEST_VALUE_KEY,
    EVAL_MEAN_KEY,
    EVAL_STD_KEY,
    PATH_PARAM,
    STEP_PARAM,
    STORED_TAG,
    CheckpointEvaluation,
    CheckpointModels,
)
from workbench.tracking.outbox import RunWriter, fast_fail_http
from workbench.training import callbacks, load_config
from workbench.training.checkpoint import checkpoint_path, retention_victims

from . import faulty_envs
from .conftest import TINY
from .support.runs import down_url, new_run
from .trained_run import FinishedRun

# A tiny PPO run on the collapsing task: 8 iterations of 128 steps, a checkpoint at each,
# evaluated (one 50-step episode), the newest two kept; the periodic evaluation every 256.
# Counting every step of the process, the evaluations of the checkpoints at 128, 256 and
# 384 end before the collapse (step 700 of the count), every later one after it.
COLLAPSING_RUN = [*TINY, f"env.id={faulty_envs.COLLAPSING}", "env.vec_env=dummy",
                  "total_timesteps=1024", "checkpoint.every_steps=128", "checkpoint.keep_last=2",
                  "checkpoint.keep=best", "eval.every_steps=256", "tracking.system_metrics=false",
                  "console.iteration_lines=false"]
BEST_STEP = 384
WRITTEN = list(range(128, 1025, 128))


def assert_one_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("workbench: error: ") and len(err.strip().splitlines()) == 1, err
    assert expected in err, err
    return err


# --------------------------------------------------------------------------- units


@pytest.mark.unit
def test_retention_keeps_the_best_and_the_newest() -> None:
    saved = [128, 256, 384, 512, 640]
    assert retention_victims(saved, 2, None) == [128, 256, 384]  # keep=last: newest two
    assert retention_victims(saved, 2, 256) == [128, 384]  # ... and the best
    assert retention_victims(saved, 2, 640) == [128, 256, 384]  # the best is among the newest
    assert retention_victims(saved, 0, 256) == []  # keep_last=0 keeps all
    assert retention_victims([128], 1, 128) == []


@pytest.mark.unit
def test_a_periodic_evaluation_of_the_same_weights_is_reused() -> None:
    class Model:  # what policy_version reads of an SB3 model
        num_timesteps, _n_updates = 256, 40

    class EvalEnv:  # a key of the registry (an evaluation env)
        pass

    model, env = Model(), EvalEnv()
    callbacks.remember(env, callbacks.Evaluation((256, 40), 3, 12.5, 1.5))  # type: ignore[arg-type]
    made, reused = callbacks.evaluate_version(model, None, env, 3)  # type: ignore[arg-type]
    assert reused and (made.mean, made.std) == (12.5, 1.5)
    # PPO's update between the periodic evaluation and the checkpoint: other weights.
    model._n_updates = 50
    assert callbacks.recall(env, model) is None  # type: ignore[arg-type]


@pytest.mark.unit
def test_best_checkpoint_is_read_from_the_runs_record() -> None:
    best = logged_models.best_checkpoint({BEST_STEP_TAG: "384"}, {BEST_VALUE_KEY: 7.25})
    assert best is not None and (best.step, best.value) == (384, 7.25)
    assert logged_models.best_checkpoint({}, {BEST_VALUE_KEY: 7.25}) is None
    assert logged_models.best_checkpoint({BEST_STEP_TAG: "x"}, {BEST_VALUE_KEY: 1.0}) is None
    assert logged_models.is_better(1.0, None) and not logged_models.is_better(math.nan, None)
    assert not logged_models.is_better(1.0, 1.0)  # a tie keeps the earlier checkpoint


@pytest.mark.unit
def test_the_reports_runs_table_shows_the_best_checkpoint() -> None:
    from types import SimpleNamespace

    from workbench.review.diagnostics import Series
    from workbench.review.records import RunRecord
    from workbench.review.render import run_blocks

    def record(run_id: str, best: tuple[int, float] | None) -> RunRecord:
        metrics = {"summary/eval_mean_reward": Series.of([1024], [-5000.0])}
        tags = {}
        if best is not None:
            metrics[BEST_VALUE_KEY] = Series.of([128, best[0]], [1.0, best[1]])
            tags[BEST_STEP_TAG] = str(best[0])
        return RunRecord(run_id, run_id, "1", "FINISHED", 0, None, tags, {}, metrics)

    def table(*runs: RunRecord) -> dict[str, str]:
        report = SimpleNamespace(runs=list(runs), run_url=lambda r: "")
        block = run_blocks(report)[1]  # type: ignore[arg-type]
        if "best checkpoint" not in block.headers:
            return {}
        column = block.headers.index("best checkpoint")
        return {str(row[1]): str(row[column]) for row in block.rows}

    assert table(record("a", (384, 7.25)), record("b", None)) == {
        "a": "7.2 at step 384", "b": "-"}
    assert table(record("b", None)) == {}  # no keep=best run: no column


@pytest.mark.unit
@pytest.mark.parametrize(("overrides", "expected"), [
    (["checkpoint.keep=worst"], "checkpoint.keep='worst': not a valid choice; choose one of "
                                "last, best"),
    (["checkpoint.keep=best", "checkpoint.every_steps=0"],
     "checkpoint.keep=best: checkpoint.every_steps=0 writes no checkpoint during training"),
    (["checkpoint.keep=best", "checkpoint.every_steps=384"],
     "checkpoint.every_steps=384 is not below total_timesteps=384"),
])
def test_bad_checkpoint_settings_stop_before_any_run(
        overrides: list[str], expected: str, bare_store: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line(["train", *TINY, *overrides], expected, capsys)
    assert not bare_store.exists()  # no store, no run, nothing written


@pytest.mark.unit
@pytest.mark.parametrize(("argv", "expected"), [
    (["--run", "0" * 32, "--checkpoint", "newest"], "--checkpoint 'newest': not best, last or "
                                                    "a step"),
    (["--run", "0" * 32, "--checkpoint", "-5"], "not best, last or a step"),
    (["--bundle", "somewhere", "--checkpoint", "best"], "--checkpoint best: only with --run"),
])
def test_bad_checkpoint_choices_stop_before_the_store(
        argv: list[str], expected: str, bare_store: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line(["export", *argv], expected, capsys)
    assert not bare_store.exists()


# --------------------------------------------------------------------------- the store


def test_inputs_and_logged_models_reach_a_store_that_was_down(store: Path) -> None:
    """The store is down while the run records: its run inputs and its checkpoints' logged
    models are journaled like every other write, and `workbench runs sync` delivers them
    (models made, evaluated, READY, the best moved off the older one; the robot linked)."""
    live = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id, origin = new_run(live, store)
    experiment_id = live.get_run(run_id).info.experiment_id
    robot = robot_files(EnvSpec.from_config(load_config(["env=halfcheetah"])))
    assert robot is not None
    with fast_fail_http():
        down = RunWriter(down_url(), run_id, origin=origin, drain_timeout_s=0.5)
        log_run_inputs(down, run_id, {"robot": robot.to_manifest(), "dataset": None},
                       robot.location)
        models = CheckpointModels(lambda state: down.logged_models(run_id, state))
        for step, mean in ((128, 5.0), (256, 9.0)):
            evaluation = CheckpointEvaluation(step, mean, mean / 10, 1_000 * step)
            down.log_batch(run_id, metrics=evaluation.metrics())  # as the checkpoint does
            models.add(step, checkpoint_path(step), evaluation)
            models.set_best(step)
            models.publish()
        models.set_deleted(128)
        models.publish()
        assert down.close() == 6  # inputs, two metric batches, three states of the models
    result = runs.sync_outbox(live, store / "outbox" / run_id)
    assert (result.left, result.dropped) == (0, 0)
    found = {int(m.params[STEP_PARAM]): m for m in live.search_logged_models(
        [experiment_id], filter_string=f"source_run_id = '{run_id}'")}
    assert sorted(found) == [128, 256]
    assert {m.key: m.value for m in found[256].metrics} == {EVAL_MEAN_KEY: 9.0, EVAL_STD_KEY: 0.9}
    assert (found[128].tags[BEST_TAG], found[128].tags[STORED_TAG]) == ("false", "false")
    assert (found[256].tags[BEST_TAG], found[256].tags[STORED_TAG]) == ("true", "true")
    assert {str(m.status) for m in found.values()} == {"READY"}
    # The model-linked rows are the run's rows too, once each.
    assert [m.step for m in live.get_metric_history(run_id, EVAL_MEAN_KEY)] == [128, 256]
    (dataset,) = live.get_run(run_id).inputs.dataset_inputs
    assert dataset.dataset.name.endswith("half_cheetah.xml")
    assert [t.value for t in dataset.tags] == ["robot"]
    # Delivered twice (a sync after a crash that came between delivery and its record), the
    # same state makes nothing new.
    logged_models.sync_logged_models(live, run_id, {"checkpoints": {}, "stored": [256]})
    assert len(live.search_logged_models([experiment_id], filter_string=(
        f"source_run_id = '{run_id}'"))) == 2


def test_a_collapsing_run_keeps_and_exports_its_best_checkpoint(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.deploy.export import REPORT_NAME, export_run
    from workbench.training import load_config, train

    faulty_envs.reset_collapse()
    result = train(load_config(COLLAPSING_RUN))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(result.run_id)
    evaluations = {m.step: m.value for m in client.get_metric_history(result.run_id,
                                                                       EVAL_MEAN_KEY)}
    assert sorted(evaluations) == WRITTEN  # every checkpoint was evaluated once
    assert max(evaluations, key=lambda s: evaluations[s]) == BEST_STEP
    assert evaluations[1024] < evaluations[BEST_STEP] - 1000  # it collapsed late
    assert run.data.tags[BEST_STEP_TAG] == str(BEST_STEP)
    assert run.data.metrics[BEST_VALUE_KEY] == evaluations[BEST_STEP]
    assert result.best_checkpoint is not None and result.best_checkpoint.step == BEST_STEP
    assert result.eval_mean_reward < evaluations[BEST_STEP]  # the final policy is worse
    # Retention: the best checkpoint and the newest two.
    stored = sorted(int(a.path.rsplit("-", 1)[1])
                    for a in client.list_artifacts(result.run_id, "checkpoints"))
    assert stored == [BEST_STEP, 896, 1024]

    # Every written checkpoint is a logged model of the run, with its evaluation.
    models = client.search_logged_models([run.info.experiment_id],
                                         filter_string=f"source_run_id = '{result.run_id}'")
    by_step = {int(m.params[STEP_PARAM]): m for m in models}
    assert sorted(by_step) == WRITTEN
    for step, model in by_step.items():
        assert model.params[PATH_PARAM] == checkpoint_path(step)
        assert {m.key: m.value for m in model.metrics}[EVAL_MEAN_KEY] == evaluations[step]
        assert model.tags[STORED_TAG] == str(step in stored).lower()
        assert str(model.status) == "READY"
    assert [s for s, m in by_step.items() if m.tags[BEST_TAG] == "true"] == [BEST_STEP]
    best_models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"tags.`{BEST_TAG}` = 'true'",
        order_by=[{"field_name": f"metrics.{EVAL_MEAN_KEY}", "ascending": False}])
    assert [m.params[STEP_PARAM] for m in best_models] == [str(BEST_STEP)]
    linked = {o.model_id: o.step for o in run.outputs.model_outputs}
    assert sorted(linked.values()) == WRITTEN

    # A step the run does not have: one line naming what it has.
    capsys.readouterr()
    assert_one_line(["export", "--run", result.run_id, "--checkpoint", "512"],
                    f"checkpoints of steps {BEST_STEP} (best), 896, 1024 (last)", capsys)

    # The export of the best checkpoint says where it came from.
    faulty_envs.reset_collapse()
    exported = export_run(result.run_id, checkpoint_choice="best", observations=16, episodes=1,
                          warmup=0, allowed_modules=["tests.faulty_envs"])
    assert exported.passed
    assert exported.report["checkpoint"] == {
        "choice": "best", "step": BEST_STEP, "path": checkpoint_path(BEST_STEP),
        "eval_mean_reward": evaluations[BEST_STEP],
        "eval_std_reward": client.get_metric_history(result.run_id, EVAL_STD_KEY)[2].value}
    assert "--checkpoint best" in exported.report["source"]
    logged = Path(client.download_artifacts(result.run_id, f"export/{REPORT_NAME}",
                                            str(store / "download")))
    assert json.loads(logged.read_text())["checkpoint"]["step"] == BEST_STEP


def test_best_on_a_run_without_one_names_its_checkpoints(
        finished_run: FinishedRun, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    finished_run.use(monkeypatch)
    assert_one_line(["export", "--run", finished_run.run_id, "--checkpoint", "best"],
                    "--checkpoint best: the run records no best checkpoint (it was not trained "
                    "with checkpoint.keep=best); it has checkpoints of steps 256, 384 (last): "
                    "--checkpoint last|STEP", capsys)


@pytest.mark.slow
def test_a_resumed_keep_best_run_equals_the_uninterrupted_one(store: Path, tmp_path: Path
                                                              ) -> None:
    """The checkpoint evaluations run before the snapshot is taken, so a resumed run logs
    what the uninterrupted one did (evaluations, best, periodic evaluations), and its best
    checkpoint from before the interruption is kept by the resumed run's retention."""
    from .support.runs import assert_same_training, interrupt_and_resume

    overrides = [*TINY, "total_timesteps=768", "eval.every_steps=192",
                 "console.iteration_lines=false", "tracking.system_metrics=false",
                 "checkpoint.every_steps=128", "checkpoint.keep_last=1", "checkpoint.keep=best"]
    client, full, killed, resumed = interrupt_and_resume(overrides)
    got = assert_same_training(client, full, resumed, tmp_path)
    assert [s for s, _ in got[EVAL_MEAN_KEY]] == list(range(128, 769, 128))
    best = client.get_run(full.run_id).data.tags[BEST_STEP_TAG]
    assert client.get_run(resumed.run_id).data.tags[BEST_STEP_TAG] == best
    for run_id in (full.run_id, resumed.run_id):
        stored = {a.path for a in client.list_artifacts(run_id, "checkpoints")}
        assert stored == {checkpoint_path(int(best)), checkpoint_path(768)}
