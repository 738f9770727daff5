"""Report statistics on known values: IQM and its stratified bootstrap, performance profiles,
training seconds and time to target, the knee of a num_envs scaling ladder."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats
from workbench.review import scaling, statistics
from workbench.review.diagnostics import Series

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- IQM, bootstrap


def test_iqm_is_the_25_percent_trimmed_mean() -> None:
    assert statistics.iqm(np.arange(1.0, 9.0)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert statistics.iqm(np.array([1.0, 2.0, 3.0, 1000.0])) == pytest.approx(2.5)  # no outlier
    assert statistics.iqm(np.array([3.0, 5.0])) == pytest.approx(4.0)  # two runs: their mean
    rows = np.array([[1.0, 2.0, 3.0, 1000.0], [4.0, 4.0, 4.0, 4.0]])
    assert statistics.iqm(rows) == pytest.approx([2.5, 4.0])  # one value per bootstrap sample


def test_two_seeds_give_the_interval_between_them() -> None:
    # The bootstrap distribution of two runs {a, b}: a (1/4), (a+b)/2 (1/2), b (1/4), so the
    # 2.5th and 97.5th percentiles are a and b exactly.
    interval = statistics.iqm_interval([[100.0, 300.0]])
    assert (interval.estimate, interval.low, interval.high, interval.runs) == (
        200.0, 100.0, 300.0, 2)
    assert interval.known


def test_the_bootstrap_resamples_within_each_task_only() -> None:
    # One run per task: stratified resampling can only redraw that run, so the interval
    # collapses onto the estimate (pooled resampling would spread it over [1, 9]).
    estimate, low, high = statistics.bootstrap_interval([[1.0], [9.0]], statistics.iqm)
    assert float(estimate) == float(low) == float(high) == 5.0
    sample = statistics.resample([np.array([1.0, 2.0]), np.array([10.0, 20.0, 30.0])], 500, 0)
    assert sample.shape == (500, 5)
    assert set(np.unique(sample[:, :2])) <= {1.0, 2.0}
    assert set(np.unique(sample[:, 2:])) <= {10.0, 20.0, 30.0}


def test_one_task_agrees_with_scipys_percentile_bootstrap() -> None:
    scores = np.random.default_rng(3).normal(100.0, 20.0, size=12)
    mine = statistics.iqm_interval([scores], reps=20000)
    reference = scipy_stats.bootstrap(
        (scores,), lambda x, axis: scipy_stats.trim_mean(x, 0.25, axis=axis),
        method="percentile", n_resamples=20000, random_state=1).confidence_interval
    width = reference.high - reference.low
    assert mine.low == pytest.approx(reference.low, abs=0.1 * width)
    assert mine.high == pytest.approx(reference.high, abs=0.1 * width)
    assert mine.low < mine.estimate < mine.high


def test_one_run_has_no_interval_and_overlaps_nothing() -> None:
    single = statistics.iqm_interval([[50.0]])
    assert single.estimate == 50.0 and not single.known
    wide = statistics.Interval(10.0, 0.0, 20.0, 3)
    near = statistics.Interval(25.0, 19.0, 30.0, 3)
    far = statistics.Interval(60.0, 50.0, 70.0, 3)
    assert wide.overlaps(near) and near.overlaps(wide) and not wide.overlaps(far)
    assert not single.overlaps(wide)
    assert statistics.overlapping([wide, near, far, single]) == [[1], [0], [], []]


def test_performance_profile_counts_runs_above_each_threshold() -> None:
    profile = statistics.performance_profile([[1.0, 2.0, 3.0]], np.array([0.0, 1.5, 2.5, 3.0]))
    assert profile.fraction == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    assert np.all(profile.low <= profile.fraction) and np.all(profile.fraction <= profile.high)
    assert profile.low[0] == profile.high[0] == 1.0  # every resample is above 0
    assert profile.low[-1] == profile.high[-1] == 0.0


# --------------------------------------------------------------------------- time to target


def metrics(eval_rewards: list[float], final: float | None = None) -> dict[str, Series]:
    """Three iterations of 128 steps: 1 s rollout and 0.5 s update each, an evaluation after
    each rollout."""
    steps = [128, 256, 384]
    found = {"time/rollout_s": Series.of(steps, [1.0, 1.0, 1.0]),
             "time/update_s": Series.of(steps, [0.5, 0.5, 0.5]),
             "eval/mean_reward": Series.of(steps, eval_rewards)}
    if final is not None:
        found["summary/eval_mean_reward"] = Series.of([384], [final])
    return found


def test_probability_of_improvement_is_the_mann_whitney_u_averaged_over_tasks() -> None:
    rng = np.random.default_rng(4)
    x = [rng.normal(1.0, 1.0, 5), rng.normal(0.0, 1.0, 4)]
    y = [rng.normal(0.0, 1.0, 6), rng.normal(0.0, 1.0, 3)]
    poi = statistics.probability_of_improvement(x, y)
    per_task = [scipy_stats.mannwhitneyu(a, b).statistic / (len(a) * len(b))
                for a, b in zip(x, y, strict=True)]
    assert poi.estimate == pytest.approx(np.mean(per_task))
    assert poi.low <= poi.estimate <= poi.high and poi.runs == 5 + 3
    # Ties count half; a task one side lacks is left out.
    tie = statistics.probability_of_improvement([[1.0, 2.0], [5.0]], [[1.0, 2.0], []])
    assert tie.estimate == pytest.approx(0.5)


def test_probability_of_improvement_interval_separates_only_clear_gaps() -> None:
    better = statistics.probability_of_improvement([[10.0, 11.0, 12.0]], [[1.0, 2.0, 3.0]])
    assert (better.estimate, better.low, better.high) == (1.0, 1.0, 1.0)
    rng = np.random.default_rng(0)
    same = statistics.probability_of_improvement([rng.normal(0, 1, 5)], [rng.normal(0, 1, 5)])
    assert same.low < 0.5 < same.high  # one configuration against itself: not distinguishable
    one = statistics.probability_of_improvement([[3.0]], [[1.0]])
    assert one.estimate == 1.0 and not one.known  # one run a side: no interval
    with pytest.raises(ValueError, match="no task with scores on both sides"):
        statistics.probability_of_improvement([[1.0]], [[]])


def test_training_clock_counts_rollouts_and_updates_up_to_each_evaluation() -> None:
    clock = statistics.training_clock(metrics([0.0, 0.0, 0.0]))
    assert clock is not None
    # Evaluation at step 256 saw 2 rollouts and 1 update; training ended after 3 of each.
    assert list(statistics.seconds_at(clock, [128, 256, 384])) == [1.0, 2.5, 4.0]
    assert clock.values[-1] == 4.5
    curve = statistics.reward_vs_seconds(metrics([1.0, 2.0, 3.0]))
    assert curve is not None and list(curve.steps) == [1.0, 2.5, 4.0]
    assert statistics.training_clock({}) is None


def test_time_to_target_first_crossing_and_not_reached() -> None:
    run = metrics([10.0, 50.0, 100.0])
    assert statistics.time_to_target(run, 40.0) == statistics.TargetHit(256, 2.5)
    assert statistics.time_to_target(run, 10.0) == statistics.TargetHit(128, 1.0)
    assert statistics.time_to_target(run, 1000.0) is None
    # Only the final evaluation reached it: the whole training time.
    assert statistics.time_to_target(metrics([10.0, 20.0, 30.0], final=45.0), 40.0) == (
        statistics.TargetHit(384, 4.5))
    nan_run = metrics([math.nan, 50.0, 100.0])
    assert statistics.time_to_target(nan_run, 40.0) == statistics.TargetHit(256, 2.5)


def test_point_target_text_says_not_reached_never_zero() -> None:
    fast, slow, never = metrics([50.0, 50.0, 50.0]), metrics([0.0, 50.0, 50.0]), metrics(
        [0.0, 0.0, 0.0])
    both = statistics.point_target([fast, slow], 40.0)
    assert both.text() == "1.8 s (192 steps)" and both.rank_value() == pytest.approx(1.75)
    half = statistics.point_target([fast, never], 40.0)
    assert half.text() == "1.0 s (128 steps), 1 of 2 seeds" and half.rank_value() == math.inf
    none = statistics.point_target([never, never], 40.0)
    assert none.text() == "not reached" and math.isnan(none.seconds)
    assert statistics.point_target([fast], None).text() == "no target"


# --------------------------------------------------------------------------- knee


def ladder(fps: list[float], memory: list[float] | None = None,
           num_envs: list[int] | None = None) -> list[scaling.Rung]:
    num_envs = num_envs or [2 * 2**i for i in range(len(fps))]
    memory = memory or [500.0] * len(fps)
    return [scaling.Rung(n, 4096 // n, 1, f, 0.1, 0.1, m, None, None)
            for n, f, m in zip(num_envs, fps, memory, strict=True)]


def test_knee_where_doubling_stops_buying_ten_percent() -> None:
    knee = scaling.find_knee(ladder([1000, 1900, 3500, 3700, 3800]))
    assert (knee.num_envs, knee.by) == (8, "throughput")
    assert knee.gains == pytest.approx((0.9, 3500 / 1900 - 1, 3700 / 3500 - 1, 3800 / 3700 - 1))
    assert "num_envs 8 → 16" in knee.reason and "stay at num_envs=8" in knee.reason
    assert "quiet machine" not in knee.reason
    # A later rung much faster than the knee: the flat step is flagged as doubtful.
    noisy = scaling.find_knee(ladder([1000, 1050, 1900]))
    assert noisy.num_envs == 2 and "num_envs=8 reached 1900 steps/s" in noisy.reason
    # A 9 % gain is below the 10 % bar; 10 % itself still pays.
    assert scaling.find_knee(ladder([1000, 1090, 1200])).num_envs == 2
    assert scaling.find_knee(ladder([1000, 1100, 1210])).num_envs is None


def test_a_dip_within_the_iterations_spread_is_no_clear_knee() -> None:
    """A noisy machine: 506, 929, 714, 867 steps/s. When the iterations of the rungs spread
    over more than the dip, there is no clear knee, and the report says why; with a tight
    spread the same dip is a knee."""
    def noisy(fps: list[float], spread: float) -> list[scaling.Rung]:
        return [dataclasses.replace(r, fps_low=r.fps * (1 - spread), fps_high=r.fps * (1 + spread))
                for r in ladder(fps)]

    unclear = scaling.find_knee(noisy([506, 929, 714, 867], spread=0.25))
    assert (unclear.num_envs, unclear.by) == (None, "unclear")
    assert unclear.reason.startswith("no clear knee: num_envs 4 → 8: throughput 929 → 714 "
                                     "steps/s (-23% per doubling, below 10%), but the "
                                     "iterations' spread (697–1161 and 536–892 steps/s)")
    assert "rerun the ladder on a quiet machine" in unclear.reason
    assert scaling.find_knee(noisy([506, 929, 714, 867], spread=0.02)).num_envs == 4
    assert scaling.find_knee(ladder([506, 929, 714, 867])).num_envs == 4  # spread unknown


def test_the_spread_is_the_iterations_quartiles_around_the_rungs_fps() -> None:
    timings = {"summary/fps": Series.of([1], [1000.0]),
               "time/rollout_s": Series.of([1, 2, 3, 4, 5], [9.0, 0.1, 0.1, 0.3, 0.1]),
               "time/update_s": Series.of([1, 2, 3, 4, 5], [0.1, 0.1, 0.1, 0.1, 0.1])}
    low, high = scaling.iteration_spread([timings])  # speeds 5, 5, 2.5, 5: first left out
    assert (low, high) == pytest.approx((4.375 / 5, 1.0))
    measured = scaling.rung(4, 1024, [timings])
    assert (measured.fps_low, measured.fps_high) == pytest.approx((875.0, 1000.0))
    assert measured.spread_text() == "875–1000"
    assert scaling.iteration_spread([{"summary/fps": Series.of([1], [1.0])}]) == (
        pytest.approx(float("nan"), nan_ok=True), pytest.approx(float("nan"), nan_ok=True))


def test_knee_by_memory_budget_before_throughput() -> None:
    rungs = ladder([1000, 1900, 3500, 3700], memory=[400, 700, 1300, 2500])
    knee = scaling.find_knee(rungs, memory_budget_mb=1000)
    assert (knee.num_envs, knee.by) == (4, "memory")
    assert "num_envs=8 needs 1300 MiB, over the memory budget of 1000 MiB" in knee.reason
    # A budget above every rung leaves the throughput knee.
    assert scaling.find_knee(rungs, memory_budget_mb=4000).num_envs == 8
    assert scaling.find_knee(rungs, memory_budget_mb=100).num_envs is None


def test_no_knee_on_a_ladder_that_keeps_scaling() -> None:
    knee = scaling.find_knee(ladder([1000, 2000, 4000, 8000]))
    assert (knee.num_envs, knee.by) == (None, "none")
    assert "no knee up to num_envs=16" in knee.reason


def test_gain_per_doubling_when_rungs_skip_a_doubling() -> None:
    gains = scaling.doubling_gains(ladder([1000, 1440], num_envs=[2, 8]))
    assert gains == pytest.approx((0.2,))


def test_ladders_are_found_per_task_and_samples_per_update() -> None:
    def point(task: str, num_envs: int, n_steps: int, fps: float) -> scaling.LadderRuns:
        return scaling.LadderRuns(task, num_envs, n_steps, [{
            "summary/fps": Series.of([1], [fps]),
            "summary/peak_rss_mb": Series.of([1], [300.0 + num_envs]),
            "time/rollout_s": Series.of([1, 2, 3], [9.0, 0.2, 0.4]),  # first: start-up
            "time/update_s": Series.of([1, 2, 3], [0.1, 0.1, 0.1])}])

    found = scaling.ladders([
        point("hopper", 2, 512, 100.0), point("hopper", 4, 256, 150.0),
        point("hopper", 8, 128, 160.0), point("hopper", 8, 256, 999.0),  # another batch size
        point("walker", 2, 512, 100.0), point("walker", 4, 256, 150.0),  # too short
    ], memory_budget_mb=None)
    assert [(lad.task, lad.samples_per_update) for lad in found] == [("hopper", 1024)]
    rungs = found[0].rungs
    assert [r.num_envs for r in rungs] == [2, 4, 8]
    assert rungs[0].rollout_s == pytest.approx(0.3) and rungs[0].update_s == pytest.approx(0.1)
    assert rungs[2].peak_memory_mb == 308.0 and rungs[0].gpu_percent is None
    assert found[0].knee.num_envs == 4
    assert scaling.default_memory_budget([0, 2 * 2**30, 4 * 2**30]) == pytest.approx(0.8 * 2048)
    assert scaling.default_memory_budget([]) is None
