"""``workbench compare A B``: how the sides are written, what changed, the verdict rules, and
the command on the shared sweep (two points; two seeds of one point; ids that name nothing)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from workbench.cli import main
from workbench.config import (
    CONFIG_ID_TAG,
    DERIVED_FROM,
    ConfigError,
    derive,
    interpolation_sources,
    load_config,
)
from workbench.envs.calibration import VecEnvChoice
from workbench.review import verdict
from workbench.review.compare_request import parse_ref
from workbench.review.diagnostics import Series
from workbench.review.statistics import Interval, probability_of_improvement
from workbench.tracking.manifest_diff import MISSING
from workbench.training.describe import run_params

from . import reportdata

NAN = math.nan


# --------------------------------------------------------------------------- the sides


@pytest.mark.unit
@pytest.mark.parametrize(("text", "sweep", "kind", "value", "sweep_id"), [
    ("0f3a", None, "any", "0f3a", None),
    ("run:0f3a", None, "run", "0f3a", None),
    ("config:1a2b3c4d5e6f", None, "config", "1a2b3c4d5e6f", None),
    ("tiny-grid/halfcheetah-ne1-ns64", None, "point", "halfcheetah-ne1-ns64", "tiny-grid"),
    ("halfcheetah-ne1-ns64-s0", "tiny-grid", "point", "halfcheetah-ne1-ns64-s0", "tiny-grid"),
    ("other/p", "tiny-grid", "point", "p", "other"),  # SWEEP_ID/POINT wins over --sweep
    ("run:0f3a", "tiny-grid", "run", "0f3a", None),
])
def test_a_side_is_told_by_its_spelling(text: str, sweep: str | None, kind: str, value: str,
                                        sweep_id: str | None) -> None:
    ref = parse_ref("compare A", text, sweep)
    assert (ref.kind, ref.value, ref.sweep) == (kind, value, sweep_id)


@pytest.mark.unit
@pytest.mark.parametrize(("text", "line"), [
    ("run:", "compare A 'run:': no run id after 'run:'; write run:ID"),
    ("config:", "compare A 'config:': no config id after 'config:'; write config:ID"),
    ("tiny-grid/", "compare A 'tiny-grid/': a sweep point is SWEEP_ID/POINT with both parts; "
                   "e.g. tiny-grid/halfcheetah-ne1-ns64"),
    ("/p", "compare A '/p': a sweep point is SWEEP_ID/POINT with both parts; "
           "e.g. tiny-grid/halfcheetah-ne1-ns64"),
    (" ", "compare A: empty; give a run id, a config id (run:ID or config:ID to say which) or "
          "SWEEP_ID/POINT"),
])
def test_a_malformed_side_is_one_line(text: str, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_ref("compare A", text)
    assert str(info.value) == line


@pytest.mark.unit
def test_the_same_side_twice_is_refused_before_any_store(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert main(["compare", "--sweep", "s", "p", "s/p"]) == 2
    assert capsys.readouterr().err == (
        "workbench: error: compare p s/p: A and B are the same point s/p; compare two different "
        "runs, configs or sweep points\n")


# --------------------------------------------------------------------------- what changed


@pytest.mark.unit
def test_changed_config_lists_the_keys_that_differ_without_seeds() -> None:
    a = {"seed": "0", "derived.env_seeds": "[0, 1]", "env.num_envs": "1", "algo.n_steps": "64",
         "algo.gamma": "0.99", "derived.rollout_size": "64"}
    b = {**a, "seed": "1", "derived.env_seeds": "[1, 2]", "env.num_envs": "2",
         "algo.n_steps": "128", "derived.rollout_size": "256", "algo.ent_coef": "0.01"}
    changed = [(d.section, d.key, d.a, d.b) for d in verdict.changed_config(a, b)]
    assert changed == [  # by key name, then B's own keys (A lacks them: MISSING, shown "-")
        ("config", "algo.n_steps", "64", "128"),
        ("config", "derived.rollout_size", "64", "256"),
        ("config", "env.num_envs", "1", "2"),
        ("config", "algo.ent_coef", MISSING, "0.01"),
    ]
    assert verdict.changed_config(a, {**a, "seed": "7", "derived.env_seeds": "[7, 8]"}) == []
    # What follows from the keys set comes after them, named with its sources.
    marked = verdict.mark_derived(verdict.changed_config(a, b), {
        **DERIVED_FROM, **interpolation_sources()})
    assert [(d.section, d.key) for d in marked] == [
        ("config", "algo.n_steps"), ("config", "env.num_envs"), ("config", "algo.ent_coef"),
        ("derived", "derived.rollout_size <- env.num_envs, algo.n_steps, algo.train_freq")]


@pytest.mark.unit
def test_every_logged_derived_param_names_its_sources() -> None:
    cfg = load_config([])
    logged = {k for k in run_params(cfg, derive(cfg), 1) if k.startswith("derived.")}
    assert logged | set(VecEnvChoice("dummy", "").params()) == set(DERIVED_FROM)


@pytest.mark.unit
def test_the_ppo_minibatch_follows_from_the_rollout() -> None:
    assert interpolation_sources()["algo.batch_size"] == ("env.num_envs", "algo.n_steps")
    assert "algo.batch_size" not in interpolation_sources(["env=inverted_pendulum"])  # set


# --------------------------------------------------------------------------- verdict rules


@pytest.mark.unit
@pytest.mark.parametrize(("poi", "seeds", "line"), [
    (Interval(0.92, 0.75, 1.0, 3), (3, 3),
     "B is better than A: PoI 0.92 [0.75, 1.00] over 3 vs 3 seeds"),
    (Interval(0.08, 0.0, 0.25, 3), (3, 4),
     "B is worse than A: PoI 0.08 [0.00, 0.25] over 3 vs 4 seeds"),
    (Interval(0.5, 0.0, 1.0, 2), (2, 2),
     "not distinguishable with 2 vs 2 seeds (PoI 0.50 [0.00, 1.00])"),
    (Interval(0.75, 0.5, 1.0, 2), (2, 2),  # 0.5 inside the interval (its edge): no verdict
     "not distinguishable with 2 vs 2 seeds (PoI 0.75 [0.50, 1.00])"),
    (Interval(1.0, NAN, NAN, 1), (1, 1), "not distinguishable with 1 vs 1 seeds: run more seeds"),
    (None, (1, 1), "not distinguishable with 1 vs 1 seeds: run more seeds"),
    (Interval(0.0, NAN, NAN, 1), (1, 3), "not distinguishable with 1 vs 3 seeds: run more seeds"),
    (None, (0, 2), "no verdict: A has no finished run with a return; compare runs that logged "
                   "one"),
    (None, (0, 0), "no verdict: A and B have no finished run with a return; compare runs that "
                   "logged one"),
])
def test_verdict_rules(poi: Interval | None, seeds: tuple[int, int], line: str) -> None:
    assert verdict.verdict(poi, *seeds) == line


@dataclass
class FakeRun:
    """A run as the verdict reads it."""

    run_id: str
    seed: int | None
    final_reward: float
    metrics: dict[str, Series] = field(default_factory=dict)


def evaluated(run_id: str, seed: int, values: list[float], step: int = 1000,
              seconds: float = 1.0) -> FakeRun:
    """A run evaluated every ``step`` steps, each iteration (of ``step`` steps) taking
    ``seconds`` to collect and as long to update."""
    steps = [step * (i + 1) for i in range(len(values))]
    ones = [seconds] * len(steps)
    return FakeRun(run_id, seed, values[-1], {
        verdict.EVAL_KEY: Series.of(steps, values),
        "time/rollout_s": Series.of(steps, ones), "time/update_s": Series.of(steps, ones)})


@pytest.mark.unit
def test_measures_score_each_seed_at_equal_steps_and_equal_seconds() -> None:
    a = [evaluated("a0", 0, [0.0, 10.0, 20.0]), evaluated("a1", 1, [0.0, 20.0, 40.0])]
    b = [evaluated("b0", 0, [5.0, 50.0], seconds=0.5)]  # stopped at 2000 steps, twice as fast
    final, at_step, at_second = verdict.measures(a, b)
    assert (final.name, final.a, final.b) == ("final evaluation return", (20.0, 40.0), (50.0,))
    assert (at_step.name, at_step.a, at_step.b) == ("eval/mean_reward at 2,000 steps",
                                                    (10.0, 20.0), (50.0,))
    # Evaluation at step s sees the clock after the earlier iterations and this rollout:
    # A's evaluations at 1 s, 3 s, 5 s; B's at 0.5 s and 1.5 s. Both reach 1.5 s.
    assert at_second.name == "eval/mean_reward at 1.5 s of training"
    assert at_second.a == pytest.approx((2.5, 5.0)) and at_second.b == (50.0,)
    assert final.improvement is None  # one seed on B: no probability of improvement


@pytest.mark.unit
def test_equal_seconds_need_a_time_every_run_has_a_return_at() -> None:
    slow = evaluated("a0", 0, [1.0, 2.0], seconds=2.0)  # evaluations at 2 s and 6 s
    fast = evaluated("b0", 0, [1.0, 2.0], seconds=0.5)  # at 0.5 s and 1.5 s: none in common
    assert [m.name for m in verdict.measures([slow], [fast])] == [
        "final evaluation return", "eval/mean_reward at 2,000 steps"]


@pytest.mark.unit
def test_a_rerun_seed_counts_once() -> None:
    runs = [FakeRun("r1", 0, 10.0), FakeRun("r2", 0, 20.0), FakeRun("r3", 1, 40.0),
            FakeRun("r4", None, NAN)]
    assert verdict.seed_scores(runs, lambda r: r.final_reward) == [15.0, 40.0]


@pytest.mark.unit
def test_training_returns_judge_when_a_run_has_no_evaluation() -> None:
    trained = FakeRun("t", 0, NAN, {verdict.TRAINING_KEY: Series.of([100, 200], [1.0, 3.0])})
    runs = [evaluated("e", 0, [2.0, 4.0]), trained]
    assert verdict.reward_key(runs) == verdict.TRAINING_KEY
    name, score = verdict.final_score(runs, verdict.TRAINING_KEY)
    assert name == "last rollout/ep_rew_mean" and score(trained) == 3.0


# --------------------------------------------------------------------------- on a real sweep


@pytest.fixture(scope="module")
def sweep(report_sweep: reportdata.Sweep) -> reportdata.Sweep:
    """The session's shared sweep (tests/reportdata.py): 4 points x 2 seeds."""
    return report_sweep


@pytest.fixture
def in_store(sweep: reportdata.Sweep, monkeypatch: pytest.MonkeyPatch) -> reportdata.Sweep:
    for key, value in sweep.env().items():
        monkeypatch.setenv(key, value)
    return sweep


def point_runs(sweep: reportdata.Sweep, point: str) -> list[str]:
    """Run ids of a point of the shared sweep, seed 0 first."""
    client = reportdata.client_for(sweep)
    found = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               f"tags.sweep_id = '{sweep.sweep_id}'")
    runs = [r for r in found if re.sub(r"-s\d+$", "", r.data.tags.get("sweep.point", "")) == point]
    return [r.info.run_id for r in sorted(runs, key=lambda r: int(r.data.tags["seed"]))]


def final_returns(sweep: reportdata.Sweep, run_ids: list[str]) -> list[float]:
    client = reportdata.client_for(sweep)
    return [client.get_run(i).data.metrics["summary/eval_mean_reward"] for i in run_ids]


def test_compare_two_points_prints_the_changed_keys_and_a_verdict(
        in_store: reportdata.Sweep, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = "tiny-grid/halfcheetah-ne1-ns64", "tiny-grid/halfcheetah-ne2-ns128"
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "A: point tiny-grid/halfcheetah-ne1-ns64 (2 seeds)" in lines
    assert "B: point tiny-grid/halfcheetah-ne2-ns128 (2 seeds)" in lines
    changed = {m[0]: m[1:] for m in re.findall(r"^config +(\S+) +(\S+) +(\S+)$", out, re.M)}
    assert changed["env.num_envs"] == ("1", "2") and changed["algo.n_steps"] == ("64", "128")
    assert "seed" not in changed and "derived.env_seeds" not in changed
    expected = probability_of_improvement(
        [final_returns(in_store, point_runs(in_store, "halfcheetah-ne2-ns128"))],
        [final_returns(in_store, point_runs(in_store, "halfcheetah-ne1-ns64"))])
    assert lines[-1] == verdict.verdict(expected, 2, 2)
    assert re.search(r"^final evaluation return +\S", out, re.M)
    assert re.search(r"^\S+ at [\d,]+ steps +\S", out, re.M)  # the largest step both reach

    # The same with --sweep and point names alone, as JSON.
    assert main(["compare", "--sweep", "tiny-grid", "--json", "halfcheetah-ne1-ns64",
                 "halfcheetah-ne2-ns128"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == lines[-1]
    assert {d["key"]: (d["a"], d["b"]) for d in data["config"]}["env.num_envs"] == ("1", "2")
    assert data["measures"][0]["improvement"]["estimate"] == pytest.approx(expected.estimate)


def test_a_margin_gives_the_non_inferiority_verdict_of_two_points(
        in_store: reportdata.Sweep, capsys: pytest.CaptureFixture[str]) -> None:
    """``--margin`` ends the output with "not worse", "worse" or "undecided", its interval
    Yuen's trimmed t on the final returns as scipy computes it."""
    from scipy import stats

    a, b = "tiny-grid/halfcheetah-ne1-ns64", "tiny-grid/halfcheetah-ne2-ns128"
    ra = final_returns(in_store, point_runs(in_store, "halfcheetah-ne1-ns64"))
    rb = final_returns(in_store, point_runs(in_store, "halfcheetah-ne2-ns128"))
    assert main(["compare", a, b, "--margin", "0.5"]) == 0
    out = capsys.readouterr().out.splitlines()
    found = stats.ttest_ind(rb, ra, trim=0.25, equal_var=False)
    diff = stats.trim_mean(rb, 0.25) - stats.trim_mean(ra, 0.25)
    spread = stats.t.ppf(0.975, found.df) * diff / found.statistic
    low, high = diff - spread, diff + spread
    verdict_words = ("B is not worse than A by more than 0.5" if low > -0.5 else
                     "B is worse than A by more than 0.5" if high < -0.5 else "undecided: ")
    assert out[-2].startswith("Not worse? (the final return's IQM against the margin")
    assert out[-1].startswith(verdict_words)
    assert f"95 % interval of B - A: {low:+.1f} to {high:+.1f}" in out[-1]
    assert out[-1].endswith("2 vs 2 seeds)") or "; B is better" in out[-1]
    # A margin in % of A's IQM, with the time to a target too.
    assert main(["compare", a, b, "--margin", "5%", "--target=-1e9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    if stats.trim_mean(ra, 0.25) <= 0:
        assert lines[-2] == ("undecided (2 vs 2 seeds): a margin in % needs A's IQM above 0 (it "
                             f"is {stats.trim_mean(ra, 0.25):,.1f}); give the margin as a "
                             "return, e.g. 50")
    else:
        assert re.match(r"(B is|undecided)", lines[-2]) and "of A's IQM" in lines[-2]
    assert lines[-1].startswith("B reaches -1e+09 in ") and "× A's time [" in lines[-1]


def test_two_seeds_of_one_point_are_not_distinguishable(
        in_store: reportdata.Sweep, capsys: pytest.CaptureFixture[str]) -> None:
    seed0, seed1 = point_runs(in_store, "halfcheetah-ne1-ns64")
    config = reportdata.client_for(in_store).get_run(seed0).data.tags[CONFIG_ID_TAG]
    assert main(["compare", seed0, seed1, "--target=-1e9"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"^config ", out, re.M)  # one configuration: only the seed differs
    assert re.search(r"^time to -1e\+09 +\S", out, re.M)
    assert out.splitlines()[-1] == "not distinguishable with 1 vs 1 seeds: run more seeds"
    assert re.search(r"^final evaluation return +\S+ +\S+ +n/a$", out, re.M)  # no P(B > A)
    # The config id is both seeds: the same runs as their sweep point.
    assert main(["compare", config, "tiny-grid/halfcheetah-ne1-ns64"]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: compare {config} tiny-grid/halfcheetah-ne1-ns64: both name the "
        "same runs; compare two different runs, configs or sweep points\n")


def test_an_id_that_names_nothing_is_one_line(in_store: reportdata.Sweep,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    store = in_store.uri
    cases = [
        (["0123456789ab", "tiny-grid/halfcheetah-ne1-ns64"],
         f"compare A '0123456789ab': no run or config id 0123456789ab in {store}; give a run id, "
         "a config id (run:ID or config:ID to say which) or SWEEP_ID/POINT (workbench train "
         f"prints a run id; the tag {CONFIG_ID_TAG} is a config id)"),
        (["tiny-grid/halfcheetah-ne1-ns64", "tiny-grid/nope"],
         "compare B 'tiny-grid/nope': no point nope in sweep tiny-grid; its points: "
         "halfcheetah-ne1-ns128, halfcheetah-ne1-ns64, halfcheetah-ne2-ns128, "
         "halfcheetah-ne2-ns64"),
        (["nosweep/p", "tiny-grid/halfcheetah-ne1-ns64"],
         f"compare A 'nosweep/p': no sweep nosweep in {store}; sweeps (latest first): tiny-grid"),
        ([in_store.parent_id, "tiny-grid/halfcheetah-ne1-ns64"],
         f"compare A '{in_store.parent_id}': the parent run of sweep tiny-grid, which trained "
         "nothing; compare its points: SWEEP_ID/POINT"),
    ]
    for argv, line in cases:
        assert main(["compare", *argv]) == 2, argv
        assert capsys.readouterr().err == f"workbench: error: {line}\n"


# --------------------------------------------------------------------------- ambiguous, tasks


def test_an_ambiguous_id_and_different_tasks_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("toy", artifact_location=(tmp_path / "a").as_uri())
    hopper = client.create_run(exp, tags={"env": "hopper"}).info.run_id
    cheetah = client.create_run(exp, tags={"env": "halfcheetah"}).info.run_id
    client.create_run(exp, tags={"env": "hopper", CONFIG_ID_TAG: hopper})  # a config id clash
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["compare", hopper, cheetah]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: compare A '{hopper}': both a run id and a config id in {uri}; "
        f"write run:{hopper} or config:{hopper}\n")
    assert main(["compare", f"run:{hopper}", cheetah]) == 2
    assert capsys.readouterr().err == (
        f"workbench: error: compare run:{hopper} {cheetah}: A trained on hopper, B on "
        "halfcheetah, and returns of different tasks are not comparable; compare the same "
        "task, or pass --allow-different-tasks\n")
