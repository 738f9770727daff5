"""Reports across tasks and configurations: points grouped by config id and labelled by the
grid keys that vary, normalized scores, probability of improvement and its verdict, the bad
input of ``--baseline`` and ``--target-return``; and the real ``workbench report`` on a
synthetic grid of two configurations x two tasks x three seeds."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.config import CONFIG_ID_TAG, ConfigError
from workbench.review import configurations, records, references, statistics
from workbench.review.configurations import GridLayout
from workbench.review.diagnostics import Series
from workbench.review.statistics import Interval

# --------------------------------------------------------------------------- helpers


def record(name: str, tags: dict[str, str], reward: float = math.nan,
           params: dict[str, str] | None = None) -> records.RunRecord:
    """A run as the report holds it, without a store: tags, params, a final return."""
    metrics = {} if math.isnan(reward) else {
        "summary/eval_mean_reward": Series.of([1000], [reward])}
    return records.RunRecord(run_id=name, name=name, experiment_id="0", status="FINISHED",
                             start_ms=0, end_ms=1, tags=tags, params=params or {},
                             metrics=metrics)


def config_id(lr: str, env: str) -> str:
    """A stand-in for ``workbench.config_id``: 12 hex digits that differ per lr and env."""
    return hashlib.sha256(f"{lr}/{env}".encode()).hexdigest()[:12]


def grid_run(lr: str, env: str, seed: int, reward: float = math.nan) -> records.RunRecord:
    """A point run of ``sweep.grid={algo.learning_rate:[...],env:[...]}``: the tags the sweep
    writes (its config id depends on lr and env, not on the seed)."""
    name = f"lr{lr}-{env}-s{seed}"
    return record(name, {
        "env": env, "num_envs": "1", "n_steps": "64", "seed": str(seed),
        "sweep_id": "g", "sweep.role": "child", "sweep.point": name,
        "sweep.grid.algo.learning_rate": lr, "sweep.grid.env": env,
        "sweep.grid.env.num_envs": "1", CONFIG_ID_TAG: config_id(lr, env)},
        reward)


# --------------------------------------------------------------------------- grouping, labels


@pytest.mark.unit
def test_points_are_configurations_labelled_by_the_grid_keys_that_vary() -> None:
    runs = [grid_run(lr, env, seed) for env in ("walker2d", "hopper")
            for lr in ("0.0003", "0.0001") for seed in (0, 1)]
    layout = GridLayout.of({"sweep.grid": "{'algo.learning_rate': [0.0001, 0.0003], "
                                          "'env': ['hopper', 'walker2d']}",
                            "sweep.point_names": str([f"lr{lr}-{env}-s{s}"
                                                      for lr in ("0.0001", "0.0003")
                                                      for env in ("hopper", "walker2d")
                                                      for s in (0, 1)])})
    points = records.group_points(runs, layout)
    assert sorted((p.order, p.label, p.task, p.setting, len(p.runs)) for p in points) == [
        (0, "lr=1e-4 env=hopper", "hopper", "lr=1e-4", 2),
        (2, "lr=1e-4 env=walker2d", "walker2d", "lr=1e-4", 2),
        (4, "lr=3e-4 env=hopper", "hopper", "lr=3e-4", 2),
        (6, "lr=3e-4 env=walker2d", "walker2d", "lr=3e-4", 2)]
    assert configurations.settings_in_order(points) == ["lr=1e-4", "lr=3e-4"]
    # Without the parent's layout: keys sorted, grid order as the runs came (oldest first);
    # the parent's order of keys wins over sorting.
    plain = records.group_points(runs)
    assert sorted(p.label for p in plain) == ["lr=1e-4 env=hopper", "lr=1e-4 env=walker2d",
                                              "lr=3e-4 env=hopper", "lr=3e-4 env=walker2d"]
    assert configurations.settings_in_order(plain) == ["lr=3e-4", "lr=1e-4"]
    env_first = GridLayout(keys=("env", "algo.learning_rate"))
    assert sorted(p.label for p in records.group_points(runs, env_first))[0] == \
        "env=hopper lr=1e-4"


@pytest.mark.unit
def test_todays_sweeps_and_untagged_runs_keep_their_labels() -> None:
    def shorthand(ne: int, seed: int) -> records.RunRecord:
        return record(f"hopper-ne{ne}-ns64-s{seed}", {
            "env": "hopper", "num_envs": str(ne), "n_steps": "64", "seed": str(seed),
            "sweep.grid.env.num_envs": str(ne), "sweep.grid.algo.n_steps": "64",
            CONFIG_ID_TAG: f"id-ne{ne}"})
    points = records.group_points([shorthand(ne, s) for ne in (1, 2) for s in (0, 1)])
    assert sorted((p.label, p.setting, len(p.runs)) for p in points) == [
        ("hopper-ne1-ns64", "ne1-ns64", 2), ("hopper-ne2-ns64", "ne2-ns64", 2)]
    # Older runs: no config id, no grid tags; grouped by params as before.
    older = [record(f"r{i}", {"env": "hopper", "num_envs": "1", "n_steps": "8",
                              "seed": str(i)}, params={"algo.gamma": g})
             for i, g in enumerate(("0.99", "0.99", "0.9"))]
    assert sorted(p.label for p in records.group_points(older)) == [
        "hopper-ne1-ns8  algo.gamma=0.9", "hopper-ne1-ns8  algo.gamma=0.99"]
    # Two configurations that only differ where no label looks: their ids tell them apart.
    twins = [record(f"t{i}", {"env": "hopper", "num_envs": "1", "n_steps": "8",
                              CONFIG_ID_TAG: cid}) for i, cid in enumerate(("aaaa1111bb",
                                                                            "cccc2222dd"))]
    assert sorted(p.label for p in records.group_points(twins)) == [
        "hopper-ne1-ns8 [aaaa1111]", "hopper-ne1-ns8 [cccc2222]"]


# --------------------------------------------------------------------------- references


@pytest.mark.unit
def test_references_published_or_from_the_command_line() -> None:
    ref = references.reference_for
    assert ref("hopper", "Hopper-v5", {}).value == 2410.0
    assert ref("hopper", "Hopper-v5", {}).source == references.PUBLISHED_SOURCE
    assert ref("halfcheetah", None, {}).value == 5819.0
    assert ref("hopper", "Hopper-v5", {"hopper": 2000.0}).value == 2000.0
    assert ref("reacher", "Reacher-v5", {"Reacher-v5": 7.0}).value == 7.0
    # One number for every task is a time-to-target target, not a common scale.
    none = ref("reacher", "Reacher-v5", {"": 950.0})
    assert none.value is None and "--target-return reacher=RETURN" in none.source
    refused = ref("reacher", "Reacher-v5", {"reacher": -3.75})
    assert refused.value is None and "not above 0" in refused.source
    assert references.normalized(1205.0, ref("hopper", None, {})) == 0.5
    assert references.normalized(1.0, none) is None


@pytest.mark.unit
@pytest.mark.parametrize("low, high, verdict", [
    (0.55, 0.9, "better"), (0.1, 0.45, "worse"), (0.3, 0.8, "not distinguishable with 3 seeds"),
    (0.5, 0.9, "not distinguishable with 3 seeds"), (0.1, 0.5, "not distinguishable with 3 "
                                                               "seeds")])
def test_verdict_of_a_probability_of_improvement(low: float, high: float, verdict: str) -> None:
    assert statistics.improvement_verdict(Interval(0.7, low, high, 3), 3) == verdict
    assert statistics.improvement_verdict(Interval(1.0, math.nan, math.nan, 1), 1) == \
        "not distinguishable with 1 seed"


# --------------------------------------------------------------------------- across tasks


def iqm(values: list[float]) -> float:
    """The interquartile mean by its definition: drop int(n/4) runs at each end."""
    ordered, cut = sorted(values), len(values) // 4
    return float(np.mean(ordered[cut:len(ordered) - cut]))


@pytest.mark.unit
def test_across_tasks_normalizes_and_compares_with_the_baseline() -> None:
    scores = {("0.0001", "hopper"): [1000, 1200, 1400], ("0.0003", "hopper"): [2000, 2200, 2400],
              ("0.0001", "reacher"): [-10, -8, -6], ("0.0003", "reacher"): [-5, -4, -3],
              ("0.001", "hopper"): [1100, 1300, 1350]}
    runs = [grid_run(lr, env, seed, reward) for (lr, env), values in scores.items()
            for seed, reward in enumerate(values)]
    points = records.group_points(runs)
    across = configurations.analyse_across(points, {}, None, with_figure=False)
    assert [r.text() for r in across.left_out] == [
        "reacher: none (no published reference; set one with --target-return reacher=RETURN)"]
    rows = {row.setting: row for row in across.rows}
    assert across.baseline == "lr=1e-4" and across.baseline_origin.startswith("the first")
    assert rows["lr=1e-4"].verdict == "baseline" and rows["lr=1e-4"].improvement is None
    # Normalized by hopper's published 2410; reacher has no reference and stays out.
    assert rows["lr=3e-4"].normalized is not None
    assert rows["lr=3e-4"].normalized.estimate == pytest.approx(iqm([2000, 2200, 2400]) / 2410)
    # Every run of lr=3e-4 beats every run of the baseline on both tasks.
    assert rows["lr=3e-4"].improvement == Interval(1.0, 1.0, 1.0, 6)
    assert rows["lr=3e-4"].verdict == "better"
    assert rows["lr=3e-4"].tasks == ("hopper", "reacher") and rows["lr=3e-4"].seeds == \
        "3 per task"
    # lr=1e-3 overlaps the baseline on hopper (P = 5/9): three seeds cannot tell.
    assert rows["lr=1e-3"].improvement is not None
    assert rows["lr=1e-3"].improvement.estimate == pytest.approx(5 / 9)
    assert rows["lr=1e-3"].verdict == "not distinguishable with 3 seeds"
    # Another baseline, by its label or by a prefix of a config id.
    flipped = configurations.analyse_across(points, {"reacher": 10.0}, "lr=3e-4",
                                            with_figure=False)
    assert {r.setting: r.verdict for r in flipped.rows}["lr=1e-4"] == "worse"
    assert not flipped.left_out
    config_id = runs[3].tags[CONFIG_ID_TAG]
    assert configurations.resolve_baseline(points, config_id[:6])[0] == "lr=3e-4"
    assert configurations.resolve_baseline(points, "lr=3e-4 env=hopper")[0] == "lr=3e-4"


@pytest.mark.unit
def test_a_baseline_or_target_task_not_in_the_selection_is_one_line() -> None:
    points = records.group_points([grid_run(lr, "hopper", 0, 1.0) for lr in ("0.1", "0.2")])
    with pytest.raises(ConfigError) as caught:
        configurations.resolve_baseline(points, "lr=0.5")
    assert str(caught.value) == ("--baseline lr=0.5: no configuration of the selection has "
                                 "this label or config id; configurations: lr=0.1, lr=0.2")
    with pytest.raises(ConfigError) as caught:
        configurations.check_targets(points, {"walker2d": 3000.0})
    assert str(caught.value) == ("--target-return walker2d=3000: no run of the selection "
                                 "trained on walker2d; tasks: hopper")
    configurations.check_targets(points, {"": 1.0, "hopper": 2.0})  # every task, or one of it


# --------------------------------------------------------------------------- the real CLI

LEARNING_RATES = ("0.0001", "0.0003")
TASKS = {"hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
FINAL = {("0.0001", "hopper"): [1000.0, 1200.0, 1400.0],
         ("0.0003", "hopper"): [2000.0, 2200.0, 2400.0],
         ("0.0001", "walker2d"): [1500.0, 1700.0, 1900.0],
         ("0.0003", "walker2d"): [3000.0, 3200.0, 3400.0]}


@pytest.fixture(scope="module")
def grid_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding a grid sweep ``sweep.grid={algo.learning_rate:[1e-4,3e-4],
    env:[hopper,walker2d]}`` with three seeds, written with MlflowClient: synthetic runs
    whose final returns are chosen (FINAL), so the statistics are known."""
    root = tmp_path_factory.mktemp("crosstask")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("grid", artifact_location=(root / "artifacts").as_uri())
    names = [f"lr{lr}-{env}-s{seed}" for lr in LEARNING_RATES for env in TASKS
             for seed in range(3)]
    parent = client.create_run(exp, start_time=1000, run_name="g", tags={
        "sweep_id": "g", "sweep.role": "parent", "env": "hopper,walker2d"})
    client.log_batch(parent.info.run_id, params=[
        Param("sweep.grid", "{'algo.learning_rate': [0.0001, 0.0003], "
                            "'env': ['hopper', 'walker2d']}"),
        Param("sweep.point_names", str(names))])
    for i, name in enumerate(names):
        _, lr, env, seed = re.match(r"lr([\d.]+)-(\w+)-s(\d)", name).group(0, 1, 2, 3)
        final = FINAL[(lr, env)][int(seed)]
        run = client.create_run(exp, start_time=2000 + i, run_name=name, tags={
            "env": env, "env_id": TASKS[env], "num_envs": "1", "n_steps": "64", "seed": seed,
            "sweep_id": "g", "sweep.role": "child", "sweep.point": name,
            "sweep.grid.algo.learning_rate": lr, "sweep.grid.env": env,
            CONFIG_ID_TAG: config_id(lr, env)})
        client.log_batch(run.info.run_id, params=[
            Param("env.id", TASKS[env]), Param("algo.learning_rate", lr),
            Param("seed", seed), Param("total_timesteps", "3000")], metrics=[
            *(Metric("eval/mean_reward", final * k / 3, 2000 + i, 1000 * k) for k in (1, 2, 3)),
            *(Metric("rollout/ep_rew_mean", final * k / 4, 2000 + i, 1000 * k)
              for k in (1, 2, 3)),
            Metric("summary/eval_mean_reward", final, 2000 + i, 3000)])
        client.set_terminated(run.info.run_id, "FINISHED", end_time=3000 + i)
    client.set_terminated(parent.info.run_id, "FINISHED", end_time=9000)
    return uri


def test_report_compares_configurations_per_task_and_across_tasks(
        grid_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``workbench report`` on a grid over learning rates and tasks: a section per task (its
    configurations' IQM with intervals, its curves), the normalized IQM across tasks, and
    the probability of improvement over the baseline with its verdict.

    The runs are synthetic (written with MlflowClient, returns chosen) so the statistics are
    known; a real grid sweep, its tags and config ids, is covered by tests/test_sweep.py."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", grid_store)
    assert main(["report", "--sweep", "g", "--out", str(tmp_path), "--name", "r"]) == 0
    assert "12 run(s), 4 point(s)" in capsys.readouterr().err
    out = tmp_path / "r"
    text = (out / "report.md").read_text().replace("\\", "")  # Markdown escapes dropped
    for task in TASKS:
        assert f"## Task: {task}" in text
        assert (out / f"reward_curves-{task}.png").stat().st_size > 0
        for lr, label in zip(LEARNING_RATES, ("lr=1e-4", "lr=3e-4"), strict=True):
            values = FINAL[(lr, task)]
            assert f"| {label} | {iqm(values):.1f} [" in text
    assert (out / "performance_profile-normalized.png").stat().st_size > 0
    normalized = [v / references.PUBLISHED_PPO[task] for task in TASKS
                  for v in FINAL[("0.0003", task)]]
    assert (f"| lr=3e-4 | hopper, walker2d | 3 per task | {iqm(normalized):.2f} [" in text)
    assert re.search(r"\| lr=3e-4 \| .* \| 1\.00 \[1\.00, 1\.00\] \| better \|", text)
    assert re.search(r"\| lr=1e-4 \| .* \| – \| baseline \|", text)
    assert ("Baseline: lr=1e-4 (the first configuration in grid order; --baseline "
            "LABEL_OR_CONFIG_ID picks another)") in text
    assert "hopper: 2410 (rl-baselines3-zoo's published PPO return at 1M steps" in text
    # The points of the ranking are the configurations, labelled by what varies.
    assert "| 1 | lr=3e-4 env=walker2d | 3 |" in text


def test_the_report_carries_workbench_compare_as_a_section(
        grid_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", grid_store)
    a, b = "lr0.0001-hopper", "lr0.0003-hopper"
    assert main(["compare", "--sweep", "g", a, b]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == "B is better than A: PoI 1.00 [1.00, 1.00] over 3 vs 3 seeds"
    assert main(["report", "--sweep", "g", "--compare", a, b, "--out", str(tmp_path),
                 "--name", "r"]) == 0
    capsys.readouterr()
    text = (tmp_path / "r" / "report.md").read_text().replace("\\", "")
    section = text[text.index(f"## Compare A vs B: {said[-1]}"):]
    assert f"A = point g/{a} (3 seeds); B = point g/{b} (3 seeds)." in section
    assert "What changed: algo.learning_rate 0.0001 → 0.0003" in section
    row = f"| final evaluation return | {iqm(FINAL[('0.0001', 'hopper')]):.1f} ["
    assert row in section, section[:3000]
    assert "Compare A vs B" in (tmp_path / "r" / "index.html").read_text()

    # Two tasks are compared, and said to be; the same side twice is one line, exit 2.
    assert main(["report", "--sweep", "g", "--compare", a, "lr0.0001-walker2d", "--out",
                 str(tmp_path), "--name", "tasks"]) == 0
    capsys.readouterr()
    assert "Different tasks (hopper vs walker2d): returns compared as they are" in \
        (tmp_path / "tasks" / "report.md").read_text().replace("\\", "")
    assert main(["report", "--sweep", "g", "--compare", a, a]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: report --compare {a} {a}: A and B are the same point g/{a}; "
        "compare two different runs, configs or sweep points\n")


@pytest.mark.parametrize("argv, message", [
    (["--baseline", "lr=1e-2"], "--baseline lr=1e-2: no configuration of the selection has "
     "this label or config id; configurations: lr=1e-4, lr=3e-4"),
    (["--target-return", "ant=1000"], "--target-return ant=1000: no run of the selection "
     "trained on ant; tasks: hopper, walker2d"),
])
def test_bad_baseline_or_target_task_exits_2_before_loading_runs(
        grid_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", grid_store)

    def never(*args: object) -> None:
        raise AssertionError("runs loaded before the options were checked")

    monkeypatch.setattr(records, "load_run", never)
    assert main(["report", "--sweep", "g", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"workbench: error: {message}\n"
    assert not any(tmp_path.iterdir())
