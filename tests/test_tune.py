"""``workbench tune``: search spaces, objectives and plans (unit), the trial callback in a real
tiny training, bad input through the CLI, then real studies (slow tier): papermill trials on
InvertedPendulum, pruning, resume, two workers on one study, Ctrl-C, the report."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from workbench.config import ConfigError
from workbench.training import load_config, train
from workbench.training.callbacks import CONTINUE, PRUNE, TrialCallback
from workbench.tuning.objectives import Evaluation, Objective, area
from workbench.tuning.plan import plan_tune
from workbench.tuning.space import parse_space
from workbench.tuning.storage import counts, storage_url

from .conftest import AS_BACKGROUND_JOB, ROOT, run_cli
from .support.runs import TINY_STUDY, study_trials, tune_runs

CORES_2 = {"WORKBENCH_CPU_BUDGET": "2"}


def curve(*points: tuple[float, float]) -> list[Evaluation]:
    return [Evaluation(t, int(t * 100), r) for t, r in points]


# --------------------------------------------------------------------------- unit


@pytest.mark.unit
def test_the_ppo_space_parses_with_types_from_the_config_keys() -> None:
    space = plan_tune(["env=hopper"]).space
    assert space.names == ["learning_rate", "n_steps", "num_envs", "batch_size", "n_epochs",
                           "gamma", "gae_lambda", "ent_coef", "net_width"]
    assert (space["learning_rate"].kind, space["learning_rate"].log) == ("float", True)
    assert space["n_epochs"].kind == "int"
    assert space["n_steps"].choices == (64, 128, 256, 512)
    assert space.overrides({"net_width": 128, "gamma": 0.99}) == [
        "algo.gamma=0.99", "env.norm_gamma=0.99", "algo.policy.pi=[128,128]",
        "algo.policy.vf=[128,128]"]


@pytest.mark.unit
@pytest.mark.parametrize(("params", "message"), [
    ({"lr": {"low": 1e-5, "high": 1e-3}},
     "search.params.lr: unknown search key; valid keys: learning_rate,"),
    ({"learning_rate": {"low": 1e-3, "high": 1e-5}},
     "search.params.learning_rate: empty range [0.001, 1e-05] (low > high)"),
    ({"n_steps": {"choices": []}}, "search.params.n_steps.choices=[]: empty"),
    ({"learning_rate": {"low": 0.0, "high": 1e-3, "log": True}},
     "search.params.learning_rate.low=0: a log range needs low > 0"),
    ({"n_epochs": {"low": 1.5, "high": 4}}, "search.params.n_epochs: algo.n_epochs is an integer"),
    ({"gamma": {"low": 0.9, "high": 1.5}}, "search.params.gamma: 1.5 is outside algo.gamma's"),
    ({"gamma": {"lo": 0.9}}, "search.params.gamma.lo: unknown field; valid fields: low, high"),
    ({"activation": {"low": 1, "high": 2}}, "search.params.activation: algo.policy.activation"),
    ({}, "search.params is empty"),
])
def test_bad_search_spaces_are_one_line(params: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_space("mine", params)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.unit
def test_a_dotted_config_key_is_a_search_key() -> None:
    space = parse_space("mine", {"env.max_episode_steps": {"choices": [50, 2]}})
    assert space.overrides({"env.max_episode_steps": 2}) == ["env.max_episode_steps=2"]


@pytest.mark.unit
def test_time_to_target_ranks_unreached_trials_by_their_shortfall() -> None:
    objective = Objective("time_to_target", target=100.0, budget_s=60.0, report_every_s=10.0)
    assert objective.direction == "minimize"
    assert objective.score(curve((5, 20), (15, 120), (25, 90)), None) == 15
    # Never reached: past the budget by the best evaluation's shortfall (60 of 100: 40 %).
    assert objective.score(curve((5, 20), (15, 60)), None) == pytest.approx(84.0)
    assert objective.score(curve((5, 20), (15, 90)), None) == pytest.approx(66.0)  # closer
    assert math.isnan(objective.score([], None))  # nothing evaluated: cannot be scored
    assert objective.settled(curve((15, 120))) and not objective.settled(curve((15, 99)))
    # Reports every 10 training seconds: the shortfall of the latest evaluation by then.
    assert objective.reports(curve((5, 20), (15, 60)), now_s=21, done=0) == [(1, 80), (2, 40)]
    assert objective.reports(curve((5, 20), (15, 60)), now_s=21, done=1) == [(2, 40)]
    assert objective.reports(curve((15, 60)), now_s=12, done=0) == []  # nothing known at 10 s
    # A value over the budget says so, with the best return behind it (score's inverse).
    assert objective.unreached_note(15.0) is None and objective.unreached_note(60.0) is None
    assert objective.unreached_note(84.0) == (
        "84 is over the 60 s budget: target 100 not reached (over seeds: by their aggregate); "
        "it stands for a best evaluation's return of 60")
    assert Objective("auc", budget_s=60.0).unreached_note(84.0) is None


@pytest.mark.unit
def test_a_best_trial_that_never_reached_the_target_says_so() -> None:
    """The tuned preset's header states it: a value over the budget is not seconds."""
    from workbench.tuning.best import best_config_text

    objective = Objective("time_to_target", target=2000.0, budget_s=160.0)
    cfg = load_config(["env=walker2d"])
    unreached = best_config_text("s", objective, 9, 238.8, None, cfg, {"n_epochs": 16})
    assert "#   238.8 is over the 160 s budget: target 2000 not reached (over seeds: by their " \
        "aggregate); it stands for a best evaluation's return of 1015\n" in unreached
    assert "not reached" not in best_config_text("s", objective, 9, 61.0, None, cfg, {})


@pytest.mark.unit
@pytest.mark.parametrize(("values", "message"), [
    ("[{lr:1}]", "tune.enqueue[0].lr: not in search=ppo_suite; its keys: learning_rate,"),
    ("[{n_steps:100}]", "tune.enqueue[0].n_steps=100: not one of {64, 128, 256, 512, 1024}"),
    ("[{n_steps:64},{learning_rate:1.0}]",
     "tune.enqueue[1].learning_rate=1.0: outside [1e-05, 0.002] log"),
    ("[{}]", "tune.enqueue[0]={}: give search keys and values"),
])
def test_enqueued_trials_are_checked_against_the_space(values: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        plan_tune(["env=swimmer", "search=ppo_suite", f"tune.enqueue={values}"])
    plain = plan_tune(["env=swimmer", "search=ppo_suite"])
    started = plan_tune(["env=swimmer", "search=ppo_suite", "tune.enqueue=[{n_steps:1024}]"])
    assert started.enqueue == ({"n_steps": 1024},) and plain.enqueue == ()
    assert started.study != plain.study  # another starting point, another study


@pytest.mark.unit
def test_a_run_no_trial_follows_still_keeps_the_study_clock() -> None:
    # One seed of a study over seeds, or a run of the re-check: the objective's budget, a stop
    # once the target is reached, and the curve the driver scores, with no Optuna trial.
    from workbench.training.callbacks import STOP
    from workbench.tuning.trial import ClockReporter

    reporter = ClockReporter(Objective("time_to_target", target=100.0, budget_s=60.0,
                                       report_every_s=10.0))
    assert reporter.budget_s == 60.0
    assert reporter.progress(5.0, 500, 20.0) == CONTINUE
    assert reporter.progress(9.0, 900, None) == CONTINUE
    assert reporter.progress(15.0, 1500, 120.0) == STOP
    assert [(p.train_s, p.mean_return) for p in reporter.curve] == [(5.0, 20.0), (15.0, 120.0)]


@pytest.mark.unit
def test_area_under_the_return_vs_time_curve() -> None:
    # 10 until 20 s (the first evaluation's return also before it), 30 until the budget
    points = curve((10, 10), (20, 30))
    assert area(points, 40) == 10 * 20 + 30 * 20
    objective = Objective("auc", budget_s=40.0, report_every_s=20.0)
    assert objective.score(points, None) == pytest.approx(20.0)
    assert objective.reports(points, now_s=25, done=0) == [(1, pytest.approx(200 / 40))]
    assert math.isnan(objective.score([], None))


@pytest.mark.unit
def test_final_return_reports_each_scheduled_evaluation() -> None:
    objective = Objective("final_return", eval_every_steps=100)
    points = [Evaluation(1, 128, 5.0), Evaluation(2, 256, 7.0)]
    assert objective.reports(points, now_s=2, done=0) == [(1, 5.0), (2, 7.0)]
    assert objective.score(points, 9.0) == 9.0


@pytest.mark.unit
@pytest.mark.parametrize(("overrides", "message"), [
    (["tune.objective=time_to_target", "tune.target=100", "tune.budget_s=10"],
     "tune.target=100: InvertedPendulum-v5 cannot return more than 50 per episode by "
     "definition (at most 1 per step x 50 steps); choose a target <= 50"),
    (["tune.objective=speed"], "tune.objective"),
    (["tune.objective=time_to_target", "tune.budget_s=10"],
     "tune.objective=time_to_target needs tune.target=RETURN"),
    (["tune.objective=auc"], "tune.objective=auc needs tune.budget_s=SECONDS"),
    (["algo.n_epochs=3"], "'algo.n_epochs=3' on the command line: algo.n_epochs is sampled "
                          "per trial by search.params.n_epochs"),
    (["tune.sampler=grid"], "tune.sampler=grid: search.params.learning_rate is a range"),
    (["eval.every_steps=64"], "'eval.every_steps=64' on the command line: eval.every_steps is "
                              "set per trial by the study; use tune.eval_every_steps instead"),
    (["tune.pruner=wilcoxon"], "tune.pruner=wilcoxon compares trials seed by seed: add "
                               "tune.seeds=[0,1,2]"),
    (["tune.seeds=[]"], "tune.seeds=[]: give at least one seed"),
    (["tune.seeds=[0,1,0]"], "tune.seeds=[0, 1, 0]: a seed is repeated"),
    (["tune.seeds=[0,1]", "tune.recheck_seeds=[1,2]"],
     "tune.recheck_seeds=[1, 2]: seeds [1] are also in tune.seeds; the check needs fresh seeds"),
    (["tune.seeds=[0,1]", "tune.recheck_seeds=[7]"], "tune.recheck_seeds=[7]: one seed gives "
                                                      "no interval"),
    (["tune.recheck_seeds=[7,8]"], "tune.recheck_seeds: the check against the defaults runs "
                                   "only with tune.seeds"),
    (["tune.seeds=[0,1]", "seed=4"], "'seed=4' on the command line: with tune.seeds every trial "
                                     "trains on each of them"),
    # (10,000 seeds are refused the same way; Hydra takes ~20 s to parse such a list)
    ([f"tune.seeds=[{','.join(map(str, range(1000)))}]"],
     "tune.seeds: 1,000 seeds is more than tune.max_seeds=20 (1,000 trainings per trial, "
     "3,000 more for the check against the defaults); pass --yes to run them all, or set "
     "tune.max_seeds=1000"),
    (["tune.seeds=[0,1]", f"tune.recheck_seeds=[{','.join(map(str, range(5, 30)))}]"],
     "tune.recheck_seeds: 25 seeds is more than tune.max_seeds=20 (2 trainings per trial, 75 "
     "more for the check"),
])
def test_bad_tuning_requests_are_refused_in_the_plan(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_tune([*TINY_STUDY, *overrides])
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.unit
def test_many_seeds_run_when_confirmed() -> None:
    from workbench.tuning.request import check_request

    seeds = f"tune.seeds=[{','.join(map(str, range(25)))}]"
    assert len(check_request([*TINY_STUDY, seeds], yes=True).seeds) == 25
    assert len(check_request([*TINY_STUDY, seeds, "tune.max_seeds=25"]).seeds) == 25


@pytest.mark.unit
def test_plan_names_the_study_from_what_it_searches(store: Path) -> None:
    plan = plan_tune(TINY_STUDY)
    assert plan.study.startswith("inverted_pendulum-final-return-")
    assert plan.study == plan_tune([*TINY_STUDY, "tune.workers=2"]).study  # not part of it
    assert plan.study != plan_tune([*TINY_STUDY, "algo.ent_coef=0.01"]).study
    assert plan_tune([*TINY_STUDY, "tune.study=mine"], n_trials=4).n_trials == 4
    assert plan.point_overrides[0] == "eval.every_steps=128"  # debug=tiny's tune.eval_every
    assert plan.storage == f"sqlite:///{store / 'optuna.db'}"  # beside the MLflow store


@pytest.mark.unit
def test_a_study_over_seeds_is_another_study_with_fresh_seeds_for_its_check() -> None:
    plan = plan_tune([*TINY_STUDY, "tune.seeds=[0,1,2]"])
    assert plan.seeds == (0, 1, 2) and plan.recheck_seeds == (3, 4, 5) and plan.rechecks
    assert plan.study != plan_tune(TINY_STUDY).study
    assert plan.study != plan_tune([*TINY_STUDY, "tune.seeds=[0,1,2]", "tune.aggregate=iqm"]).study
    assert not plan_tune([*TINY_STUDY, "tune.seeds=[0,1]", "tune.recheck_top=0"]).rechecks
    assert plan_tune(TINY_STUDY).seeds == ()


@pytest.mark.unit
def test_seed_values_aggregate_and_the_recheck_verdict_reads_plainly() -> None:
    from workbench.review.statistics import judge_over_seeds
    from workbench.tuning.objectives import aggregate_seeds
    from workbench.tuning.recheck import Recheck, seed_range

    assert aggregate_seeds([1.0, 9.0, 2.0], "median") == 2.0
    assert aggregate_seeds([1.0, 9.0, 2.0], "mean") == 4.0
    assert aggregate_seeds([0.0, 1.0, 2.0, 3.0, 100.0, 4.0, 5.0, 6.0], "iqm") == 3.5
    assert math.isnan(aggregate_seeds([1.0, math.nan], "median"))
    assert seed_range([12, 10, 11, 14, 13]) == "10-14" and seed_range([5, 6]) == "5, 6"

    direction, poi = judge_over_seeds([10.0, 11, 12, 13, 14], [1.0, 2, 3, 4, 5])
    assert direction == "better" and poi.estimate == 1.0
    check = Recheck(trial=3, trials=[3, 1], seeds=[10, 11, 12, 13, 14], direction=direction,
                    poi=poi.estimate, low=poi.low, high=poi.high, scores={}, failed=[])
    assert check.verdict == "better than the defaults: PoI 1.00 [1.00, 1.00] on seeds 10-14"
    direction, poi = judge_over_seeds([1.0, 5, 3], [2.0, 4, 3])
    assert direction is None
    assert Recheck(3, [3], [7, 8, 9], None, poi.estimate, poi.low, poi.high, {}, []).verdict\
        .startswith("not distinguishable from the defaults: PoI 0.50 [")
    assert Recheck(3, [3], [7, 8], None, math.nan, math.nan, math.nan, {}, ["recheck-x"])\
        .verdict == "not checked: 1 run(s) of the check on seeds 7, 8 did not finish (recheck-x)"


@pytest.mark.unit
def test_a_server_store_without_a_team_server_here_needs_tune_storage(store: Path) -> None:
    with pytest.raises(ConfigError, match="no team server runs on this machine: give"):
        storage_url(None, "http://10.0.0.5:5050")
    assert storage_url("postgresql://u@h/optuna", "http://h:5050") == "postgresql://u@h/optuna"


# --------------------------------------------------------------------------- callback


class ScriptedReporter:
    """A reporter that prunes at its second evaluation (the interface training talks to)."""

    budget_s = None

    def __init__(self) -> None:
        self.calls: list[tuple[float, int, float | None]] = []

    def progress(self, train_s: float, steps: int, mean_return: float | None) -> str:
        self.calls.append((train_s, steps, mean_return))
        evaluations = [c for c in self.calls if c[2] is not None]
        return PRUNE if len(evaluations) >= 2 else CONTINUE


def test_trial_callback_stops_a_pruned_training_and_records_its_clock(store: Path) -> None:
    cfg = load_config(["env=inverted_pendulum", "debug=tiny", "total_timesteps=1280",
                       "tracking.system_metrics=false"])
    reporter = ScriptedReporter()
    callback = TrialCallback(reporter)
    result = train(cfg, callbacks=[callback])
    assert callback.pruned
    assert result.status == "FINISHED"  # stopped early, not a crash
    assert result.num_timesteps < 1280
    evaluated = [c for c in reporter.calls if c[2] is not None]
    assert [c[1] for c in evaluated] == [128, 256]
    clocks = [c[0] for c in reporter.calls]
    assert clocks == sorted(clocks) and clocks[0] > 0
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    history = client.get_metric_history(result.run_id, "trial/eval_train_s")
    assert [m.step for m in history] == [128, 256]
    assert [m.value for m in history] == pytest.approx([c[0] for c in evaluated])


# --------------------------------------------------------------------------- CLI bad input


# Two cases through a real process (each starts Python, MLflow and MuJoCo); the plan tests
# above cover every message.
@pytest.mark.parametrize(("overrides", "message"), [
    (["+search.params.lr={low:1e-5,high:1e-3}"], "search.params.lr: unknown search key"),
    (["tune.objective=time_to_target", "tune.target=2000", "tune.budget_s=5"],
     "tune.target=2000: InvertedPendulum-v5 cannot return more than 50"),
])
def test_cli_bad_input_exits_2_with_one_line_and_creates_nothing(
        bare_store: Path, overrides: list[str], message: str) -> None:
    proc = run_cli("tune", *TINY_STUDY, *overrides)
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"workbench: error: {message}"), line
    assert not bare_store.exists()


# --------------------------------------------------------------------------- real studies


@pytest.mark.slow
def test_four_trial_study_prunes_resumes_and_writes_a_best_config(store: Path,
                                                                  tmp_path: Path) -> None:
    # Built to prune: episode length is searched too, and the first trials are enqueued
    # (Optuna's enqueue_trial, into the study the command then joins): 50 steps, then 2 steps,
    # whose return (at most 2) is below the median of the completed 50-step trial at every
    # report, so the median pruner stops it (one completed trial before pruning).
    import optuna

    study = optuna.create_study(study_name="pendulum", direction="maximize",
                                storage=f"sqlite:///{store / 'optuna.db'}")
    for steps in (50, 2, 50, 2):
        study.enqueue_trial({"env.max_episode_steps": steps})
    args = ["tune", "--n-trials", "4", *TINY_STUDY, "tune.study=pendulum", "tune.seed=3",
            "tune.startup_trials=1", "tune.workers=1",
            "+search.params={env.max_episode_steps:{choices:[50,2]}}"]
    proc = run_cli(*args, env=CORES_2, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = study_trials(store, "pendulum")
    states = [t.state.name for t in trials]
    assert len(trials) == 4 and "FAIL" not in states, states
    assert states[:2] == ["COMPLETE", "PRUNED"], states
    (parent,) = tune_runs("study")
    children = tune_runs("trial")
    assert parent.info.status == "FINISHED"
    assert sorted(int(r.data.tags["tune.trial"]) for r in children) == list(range(4))
    for run in children:
        trial = trials[int(run.data.tags["tune.trial"])]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.tags["tune.state"] == trial.state.name
        assert run.data.tags["tune.param.learning_rate"]
        assert run.data.tags["mlflow.note.content"].startswith(
            f"Trial {trial.number} of study pendulum: sampled learning_rate=")
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
        assert trials[1].params["env.max_episode_steps"] == 2  # the enqueued short episodes
        if trial.state.name == "PRUNED":
            assert run.data.tags["tune.pruned_at"].startswith("report ")
            assert "PRUNED by the median pruner" in run.data.tags["mlflow.note.content"]
    notebooks = sorted(p.name for p in (store / "tuning" / "pendulum").glob("*.ipynb"))
    assert notebooks == [f"trial-{n:03d}.ipynb" for n in range(4)]

    best = store / "conf" / "experiment" / "tuned" / "pendulum.yaml"
    text = best.read_text()
    assert "# Best trial of study pendulum" in text and "objective final_return" in text
    best_trial = max((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: t.value)
    composed = run_cli("train", "--cfg", "job", "experiment=tuned/pendulum")
    assert composed.returncode == 0, composed.stderr
    cfg = yaml.safe_load(composed.stdout)
    assert cfg["experiment_name"] == "tuned/pendulum"
    assert cfg["env"]["id"] == "InvertedPendulum-v5"
    assert cfg["env"]["num_envs"] == best_trial.params["num_envs"]
    assert cfg["algo"]["learning_rate"] == pytest.approx(best_trial.params["learning_rate"])
    assert cfg["algo"]["n_epochs"] == best_trial.params["n_epochs"]

    again = run_cli(*args, env=CORES_2, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "4 in total, 4 done earlier, 0 to run" in again.stdout
    assert len(study_trials(store, "pendulum")) == 4  # no duplicate trials
    assert len(tune_runs("trial")) == 4 and len(tune_runs("study")) == 1

    reports = tmp_path / "reports"
    shown = run_cli("report", "--study", "pendulum", env={"WORKBENCH_REPORTS": str(reports)})
    assert shown.returncode == 0, shown.stderr[-3000:]
    folder = reports / "study-pendulum"
    for name in ("study-history.png", "study-importances.png", "study-parallel.png",
                 "study-slice.png"):
        assert (folder / name).stat().st_size > 1000, name
    markdown = (folder / "report.md").read_text()
    assert "## Study pendulum" in markdown
    assert f"/runs/{best_trial.user_attrs['mlflow_run_id']})" in markdown  # linked top trial


@pytest.mark.slow
def test_a_study_over_seeds_rechecks_its_best_trial_against_the_defaults(store: Path) -> None:
    # A trial on 2 seeds, then it and the defaults on 2 fresh seeds: 6 trainings, 2 at a time,
    # each on the study's clock: time to a return of 1, which the first evaluation reaches.
    timed = ["tune.objective=time_to_target", "tune.target=1", "tune.budget_s=600"]
    args = ["tune", "--n-trials", "1", *TINY_STUDY, "tune.study=seeded", "tune.seed=1",
            "tune.seeds=[0,1]", "tune.recheck_top=1", "tune.recheck_seeds=[5,6]",
            "tune.pruner=wilcoxon", "tune.workers=2", *timed,
            "tune.enqueue=[{n_steps:128,num_envs:2}]"]  # the trial starts from these
    proc = run_cli(*args, env=CORES_2, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "each trial on seeds 0, 1 (median); the best 1 then against the defaults on seeds " \
           "5, 6" in proc.stdout
    trials = study_trials(store, "seeded")
    assert [t.state.name for t in trials] == ["COMPLETE"]
    assert (trials[0].params["n_steps"], trials[0].params["num_envs"]) == (128, 2)  # enqueued
    runs = tune_runs("trial")
    for trial in trials:  # one run per seed; the trial's value is their median
        mine = [r for r in runs if r.data.tags["tune.trial"] == str(trial.number)]
        assert sorted(r.data.params["seed"] for r in mine) == ["0", "1"]
        assert trial.value == pytest.approx(
            sum(float(r.data.tags["tune.seed_value"]) for r in mine) / 2)
        assert {r.data.tags["tune.state"] for r in mine} == {"COMPLETE"}
        assert sorted(trial.intermediate_values) == [0, 1]  # reported seed by seed
        for run in mine:  # timed on the kernel's clock, stopped once the target was reached
            assert float(run.data.tags["tune.seed_value"]) < 600
            assert run.data.metrics["trial/eval_train_s"] < 600
            assert run.data.metrics["time/total_timesteps"] < 384
    best = min(trials, key=lambda t: t.value)
    checked = tune_runs("recheck")
    for run in checked:  # the check's runs train on the study's clock too
        assert run.data.metrics["trial/eval_train_s"] < 600
        assert run.data.metrics["time/total_timesteps"] < 384
    assert sorted((r.data.tags["tune.recheck"], r.data.params["seed"]) for r in checked) == [
        ("defaults", "5"), ("defaults", "6"), (f"trial-{best.number:03d}", "5"),
        (f"trial-{best.number:03d}", "6")]
    assert {r.info.status for r in checked} == {"FINISHED"}
    # The check's runs of the trial share its seed-free configuration id.
    config_ids = {r.data.tags["workbench.config_id"] for r in checked
                  if r.data.tags["tune.recheck"] != "defaults"}
    assert config_ids == {r.data.tags["workbench.config_id"] for r in runs
                          if r.data.tags["tune.trial"] == str(best.number)}

    (parent,) = tune_runs("study")
    verdict = parent.data.tags["tune.verdict"]
    assert re.fullmatch(r"(better than|worse than|not distinguishable from) the defaults: "
                        r"PoI \d\.\d\d \[\d\.\d\d, \d\.\d\d\] on seeds 5, 6", verdict), verdict
    assert parent.data.tags["tune.recheck_trial"] == str(best.number)
    assert f"re-check           : trial {best.number} is {verdict}" in proc.stdout
    preset = (store / "conf" / "experiment" / "tuned" / "seeded.yaml").read_text()
    assert f"#   re-checked: {verdict}\n" in preset
    assert f"trial {best.number} scored" in preset and "over seeds 0, 1" in preset

    again = run_cli(*args, env=CORES_2, timeout=600)  # the stored verdict, no training
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 in total, 1 done earlier, 0 to run" in again.stdout
    assert f"is {verdict}" in again.stdout
    assert len(tune_runs("recheck")) == 4 and len(tune_runs("trial")) == 2

    other = run_cli("tune", "--n-trials", "1", *TINY_STUDY, "tune.study=seeded", *timed,
                    "tune.seeds=[0,1,2]")
    assert other.returncode == 2
    assert "tune.study=seeded: this study's trials train on seeds [0, 1], not [0, 1, 2]" \
        in other.stderr


@pytest.mark.slow
def test_two_tune_workers_share_one_study(store: Path) -> None:
    args = [sys.executable, "-m", "workbench", "tune", "--n-trials", "3", *TINY_STUDY,
            "tune.study=shared"]
    env = {**os.environ, "WORKBENCH_CPU_BUDGET": "1"}
    workers = [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=1800) for w in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, out[-2000:] + err[-2000:]
    trials = study_trials(store, "shared")
    assert [t.number for t in trials] == [0, 1, 2]  # the total, never overshot
    assert all(t.state.name == "COMPLETE" for t in trials)
    children = tune_runs("trial")
    assert sorted(r.data.tags["tune.trial"] for r in children) == ["0", "1", "2"]
    assert {t.user_attrs["mlflow_run_id"] for t in trials} == {r.info.run_id for r in children}
    (parent,) = tune_runs("study")  # both workers nest under one parent
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert parent.info.status == "FINISHED"
    ran = [out.count("COMPLETE trial") + err.count("COMPLETE trial") for out, err in outputs]
    assert sum(ran) == 3 and min(ran) >= 1, ran  # both took part


@pytest.mark.slow
def test_ctrl_c_kills_the_trial_and_the_parent_and_the_trial_does_not_count(
        store: Path) -> None:
    args = [*AS_BACKGROUND_JOB, sys.executable, "-m", "workbench", "tune", "--n-trials", "2",
            *TINY_STUDY, "tune.study=stopped", "total_timesteps=10000000"]
    # Started as a shell starts a background job, with SIGINT ignored: the study still
    # stops on SIGINT (the workbench re-enables it).
    proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, **CORES_2},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
                r.info.status == "RUNNING" for r in safe_runs("trial")):
            time.sleep(1)
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    (run,) = tune_runs("trial")
    (parent,) = tune_runs("study")
    assert (run.info.status, parent.info.status) == ("KILLED", "KILLED")
    (trial,) = study_trials(store, "stopped")
    assert trial.state.name == "FAIL" and not counts(trial)  # a resume replaces it


def safe_runs(role: str) -> list:
    try:
        return tune_runs(role)
    except Exception:  # the store or experiment does not exist yet
        return []


@pytest.mark.slow
def test_team_mode_keeps_the_study_in_the_servers_postgresql(team_server) -> None:
    """On the server's machine a study of a server-tracked tune lives in the team
    PostgreSQL's ``optuna`` database (a real server: tests/teamserver.py)."""
    from tests.support.runs import psql
    from tests.teamserver import ALICE, logged_in

    done = team_server.cli(
        "tune", "--n-trials", "2", *TINY_STUDY, "tune.study=team", "tracking=server",
        f"tracking.uri={team_server.url}", "tracking.experiment=team-tune", timeout=1800,
        extra_env={"WORKBENCH_EXPERIMENTS": str(team_server.root), **CORES_2})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "storage   : postgresql+psycopg2://workbench@/optuna?host=" in done.stdout
    assert psql(team_server, "optuna", "SELECT study_name FROM studies") == ["team"]
    assert psql(team_server, "optuna", "SELECT state FROM trials") == ["COMPLETE"] * 2
    with logged_in(ALICE, team_server.alice_password):
        client = MlflowClient(team_server.url)
        experiment = client.get_experiment_by_name("team-tune")
        children = client.search_runs([experiment.experiment_id], "tags.`tune.role` = 'trial'")
        (parent,) = client.search_runs([experiment.experiment_id],
                                       "tags.`tune.role` = 'study'")
    assert sorted(r.data.tags["tune.trial"] for r in children) == ["0", "1"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    for secret in (team_server.alice_password, team_server.admin_password):
        assert secret not in done.stdout + done.stderr


@pytest.mark.slow
def test_a_crashing_trial_fails_alone_and_counts(store: Path) -> None:
    # A dotted search key is taken as it is (no batch-size adjustment): 4096 is larger than
    # any tiny rollout, so that enqueued trial's notebook stops at composition; the other trains.
    import optuna

    study = optuna.create_study(study_name="crash", direction="maximize",
                                storage=f"sqlite:///{store / 'optuna.db'}")
    for size in (64, 4096):
        study.enqueue_trial({"algo.batch_size": size})
    args = ["tune", "--n-trials", "2", *TINY_STUDY, "tune.study=crash",
            "+search.params={algo.batch_size:{choices:[64,4096]}}"]
    proc = run_cli(*args, env=CORES_2, timeout=1200)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench: 1 of 2 trials failed: ")
    assert "ConfigError: algo.batch_size=4096 is larger than one rollout" in last
    trials = study_trials(store, "crash")
    by_size = {t.params["algo.batch_size"]: t for t in trials}
    assert by_size[64].state.name == "COMPLETE"
    assert by_size[4096].state.name == "FAIL" and counts(by_size[4096])
    runs = {r.data.tags["tune.trial"]: r for r in tune_runs("trial")}
    failed = runs[str(by_size[4096].number)]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["error"].startswith("ConfigError: algo.batch_size=4096")
    (parent,) = tune_runs("study")
    assert parent.info.status == "FAILED"
    again = run_cli(*args, env=CORES_2, timeout=600)  # the failure counts: nothing left to run
    assert "2 in total, 2 done earlier, 0 to run" in again.stdout
    assert len(study_trials(store, "crash")) == 2
