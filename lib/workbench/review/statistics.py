"""Statistics over seeds and the time a run needed: what a report says beside plain means.

- **IQM with stratified bootstrap confidence intervals**, the method of Agarwal et al.,
  "Deep RL at the Edge of the Statistical Precipice" (NeurIPS 2021) as the ``rliable`` package
  implements it: the interquartile mean (25 % trimmed mean over all runs) and a percentile
  interval from resampling the runs *within* each task (stratum) with replacement. ``rliable``
  itself is not a dependency: it pins ``arch < 8``, whose releases fail to import with the
  pandas the workbench installs, and it draws seaborn and statsmodels in; the functions below
  are checked against its definitions (tests/test_statistics.py).
- **Performance profiles** (rliable's score distributions): the fraction of runs whose score
  exceeds a threshold τ, for every τ, with the same bootstrap's pointwise intervals.
- **Probability of improvement** of one configuration over another (rliable's P(X > Y)),
  with its interval: whether a change mattered, or is not distinguishable with these seeds.
- **Training seconds** at each logged step (the sum of ``time/rollout_s`` and
  ``time/update_s``: the time the run spent training, evaluations left out) and the **time to
  a target return**.

Everything here is plain numpy/scipy on values already loaded: no MLflow, no matplotlib.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from workbench.review.diagnostics import Series

BOOTSTRAP_REPS = 2000  # rliable's default for profiles; ample for a percentile interval
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0  # a report is reproducible: the same runs give the same intervals
MIN_PROFILE_RUNS = 3  # performance profiles need at least this many seeds per point
EVAL_KEY = "eval/mean_reward"
TRAINING_KEY = "rollout/ep_rew_mean"  # when a run logged no periodic evaluation
FINAL_KEY = "summary/eval_mean_reward"
CHANCE = 0.5  # P(X > Y) of two configurations that do not differ


# --------------------------------------------------------------------------- mean curves


@dataclass(frozen=True)
class MeanCurve:
    """A point's metric over its runs: mean and std at each step, and how many runs reach it."""

    steps: np.ndarray
    mean: np.ndarray
    std: np.ndarray  # population std over the runs at that step (0 with one)
    runs: np.ndarray  # int: runs that logged up to (at least) that step

    def __len__(self) -> int:
        return len(self.steps)


def mean_curve(series: Sequence[Series]) -> MeanCurve:
    """Mean ± std of ``series`` (one per run) at every logged step, over the runs reaching it.

    A run stopped early (killed, failed, a smaller budget) counts up to its last step and
    not after: the curve goes on with the others instead of ending where the shortest run
    ended. Runs logging at different steps are interpolated within their own range; the
    ``runs`` count says where fewer runs make the mean.
    """
    usable = [s for s in series if len(s)]
    if not usable:
        empty = np.zeros(0)
        return MeanCurve(empty, empty, empty, np.zeros(0, dtype=int))
    grid = np.unique(np.concatenate([s.steps for s in usable])).astype(float)
    stacked = np.full((len(usable), len(grid)), np.nan)
    for row, s in zip(stacked, usable, strict=True):
        steps = np.asarray(s.steps, dtype=float)
        inside = (grid >= steps[0]) & (grid <= steps[-1])
        row[inside] = np.interp(grid[inside], steps, np.asarray(s.values, dtype=float))
    runs = np.sum(~np.isnan(stacked), axis=0)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no finite value reached
        return MeanCurve(grid, np.nanmean(stacked, axis=0), np.nanstd(stacked, axis=0), runs)


# --------------------------------------------------------------------------- IQM, bootstrap


def iqm(scores: np.ndarray) -> np.ndarray | float:
    """Interquartile mean over the last axis (rliable's ``aggregate_iqm``: scipy's 25 %
    trimmed mean, which cuts ``int(0.25 n)`` values at each end)."""
    return stats.trim_mean(scores, proportiontocut=0.25, axis=-1)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval, over ``runs`` runs."""

    estimate: float
    low: float
    high: float
    runs: int

    @property
    def known(self) -> bool:
        """An interval needs two runs or more; one run has an estimate only."""
        return self.runs >= 2 and math.isfinite(self.low) and math.isfinite(self.high)

    def overlaps(self, other: Interval) -> bool:
        """The two intervals share at least one value (neither point is shown better)."""
        return self.known and other.known and self.low <= other.high and other.low <= self.high


def resample(strata: Sequence[np.ndarray], reps: int, seed: int) -> np.ndarray:
    """``reps`` stratified bootstrap samples, shape (reps, total runs): each stratum's runs
    drawn with replacement from that stratum only, as rliable's ``StratifiedBootstrap``."""
    rng = np.random.default_rng(seed)
    parts = [s[rng.integers(0, len(s), size=(reps, len(s)))] for s in strata]
    return np.concatenate(parts, axis=1)


def bootstrap_interval(strata: Sequence[Sequence[float]],
                       statistic: Callable[[np.ndarray], np.ndarray | float], *,
                       reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE,
                       seed: int = BOOTSTRAP_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) of ``statistic`` with a stratified percentile bootstrap.

    ``strata`` holds one array of scores per task (the runs of that task); ``statistic`` maps
    an array of shape (..., runs) to a value per leading index (vectorized over samples).
    """
    arrays = [np.asarray(s, dtype=float) for s in strata if len(s)]
    if not arrays:
        raise ValueError("no scores to bootstrap")
    estimate = np.asarray(statistic(np.concatenate(arrays)))
    samples = np.asarray(statistic(resample(arrays, reps, seed)))
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail], axis=0)
    return estimate, low, high


def iqm_interval(strata: Sequence[Sequence[float]], *, reps: int = BOOTSTRAP_REPS,
                 confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED) -> Interval:
    """IQM over all runs with its stratified bootstrap interval (NaN bounds for one run)."""
    runs = sum(len(s) for s in strata)
    estimate, low, high = bootstrap_interval(strata, iqm, reps=reps, confidence=confidence,
                                             seed=seed)
    if runs < 2:
        return Interval(float(estimate), math.nan, math.nan, runs)
    return Interval(float(estimate), float(low), float(high), runs)


@dataclass(frozen=True)
class Profile:
    """A performance profile: fraction of runs scoring above each τ, with its interval."""

    taus: np.ndarray
    fraction: np.ndarray
    low: np.ndarray
    high: np.ndarray


def performance_profile(strata: Sequence[Sequence[float]], taus: np.ndarray, *,
                        reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE,
                        seed: int = BOOTSTRAP_SEED) -> Profile:
    """rliable's score distribution: mean over runs of ``score > τ`` for each τ, with
    stratified bootstrap pointwise intervals."""
    taus = np.asarray(taus, dtype=float)

    def above(scores: np.ndarray) -> np.ndarray:
        return np.mean(scores[..., :, None] > taus, axis=-2)

    fraction, low, high = bootstrap_interval(strata, above, reps=reps, confidence=confidence,
                                             seed=seed)
    return Profile(taus, fraction, low, high)


def probability_of_improvement(x_strata: Sequence[Sequence[float]],
                               y_strata: Sequence[Sequence[float]], *,
                               reps: int = BOOTSTRAP_REPS, confidence: float = CONFIDENCE,
                               seed: int = BOOTSTRAP_SEED) -> Interval:
    """P(X > Y), rliable's probability of improvement: the chance that a run of X scores
    above a run of Y on the same task (ties count half: the Mann-Whitney U over ``n x m``),
    averaged over the tasks, with a percentile interval from resampling the runs of X and of
    Y independently within each task (rliable's ``StratifiedIndependentBootstrap``).

    ``x_strata[i]`` and ``y_strata[i]`` hold one task's scores; a task either side lacks is
    left out. ``runs`` is the smaller side's runs, summed over the tasks: one run a side
    gives an estimate and no interval.
    """
    pairs = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
             for x, y in zip(x_strata, y_strata, strict=True) if len(x) and len(y)]
    if not pairs:
        raise ValueError("no task with scores on both sides")
    rng = np.random.default_rng(seed)

    def beats(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # (..., n), (..., m) -> (...)
        diff = x[..., :, None] - y[..., None, :]
        return np.mean((diff > 0) + 0.5 * (diff == 0), axis=(-2, -1))

    estimate = np.mean([beats(x, y) for x, y in pairs])
    samples = np.mean([beats(x[rng.integers(0, len(x), size=(reps, len(x)))],
                             y[rng.integers(0, len(y), size=(reps, len(y)))])
                       for x, y in pairs], axis=0)
    runs = sum(min(len(x), len(y)) for x, y in pairs)
    if runs < 2:
        return Interval(float(estimate), math.nan, math.nan, runs)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(samples, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high), runs)


def improvement_direction(poi: Interval) -> str | None:
    """``better`` when the whole interval of a probability of improvement P(X > Y) lies
    above 0.5 (chance), ``worse`` when it lies below; None when it holds 0.5 or there is no
    interval (one seed)."""
    if poi.known and poi.low > CHANCE:
        return "better"
    if poi.known and poi.high < CHANCE:
        return "worse"
    return None


def judge_over_seeds(x: Sequence[float], y: Sequence[float]) -> tuple[str | None, Interval]:
    """P(X > Y) over one task's seeds and its reading (:func:`improvement_direction`): how
    ``workbench tune`` judges its best trials against the defaults."""
    poi = probability_of_improvement([x], [y])
    return improvement_direction(poi), poi


def improvement_verdict(poi: Interval, seeds: int) -> str:
    """The plain reading of P(X > Y): :func:`improvement_direction`, else ``not
    distinguishable with N seeds``."""
    return improvement_direction(poi) or \
        f"not distinguishable with {seeds} seed{'' if seeds == 1 else 's'}"


def overlapping(intervals: Sequence[Interval]) -> list[list[int]]:
    """For each interval, the indices of the others it overlaps."""
    return [[j for j, other in enumerate(intervals) if j != i and mine.overlaps(other)]
            for i, mine in enumerate(intervals)]


# --------------------------------------------------------------------------- training time


def training_clock(metrics: Mapping[str, Series]) -> Series | None:
    """Training seconds elapsed at each iteration's end, by step; None without timings.

    An iteration ending at step s collects a rollout, is evaluated (when due), then updates
    the policy; ``time/rollout_s`` and ``time/update_s`` are both logged at s. The clock at s
    is therefore every earlier iteration's rollout and update plus this one's rollout: the
    moment its evaluation saw the policy. Evaluation time is not training and is left out.
    """
    rollout = metrics.get("time/rollout_s")
    if rollout is None or not len(rollout):
        return None
    update = metrics.get("time/update_s")
    updates = dict(zip(update.steps.tolist(), update.values.tolist(), strict=True)) \
        if update is not None else {}
    seconds, elapsed = [], 0.0
    for step, spent in zip(rollout.steps.tolist(), rollout.values.tolist(), strict=True):
        elapsed += spent if math.isfinite(spent) else 0.0
        seconds.append(elapsed)
        done = updates.get(step, 0.0)
        elapsed += done if math.isfinite(done) else 0.0
    total = elapsed
    steps = [*rollout.steps.tolist(), int(rollout.steps[-1]) + 1]  # after the last update
    return Series.of(steps, [*seconds, total])


def seconds_at(clock: Series, steps: Sequence[int] | np.ndarray) -> np.ndarray:
    """Training seconds at ``steps`` (interpolated between iteration ends; 0 before the
    first)."""
    return np.interp(np.asarray(steps, dtype=float), np.concatenate([[0.0], clock.steps]),
                     np.concatenate([[0.0], clock.values]))


def reward_series(metrics: Mapping[str, Series]) -> Series | None:
    """The return a run is judged by over time: periodic evaluation, else training episodes."""
    for key in (EVAL_KEY, TRAINING_KEY):
        s = metrics.get(key)
        if s is not None and len(s):
            return s
    return None


def reward_vs_seconds(metrics: Mapping[str, Series]) -> Series | None:
    """The run's return curve with training seconds instead of steps (None without both)."""
    rewards, clock = reward_series(metrics), training_clock(metrics)
    if rewards is None or clock is None:
        return None
    # Series.of would round the seconds to integer steps: built directly (already ordered).
    return Series(steps=seconds_at(clock, rewards.steps), values=rewards.values.astype(float))


@dataclass(frozen=True)
class TargetHit:
    """When one run first reached the target return."""

    step: int
    seconds: float


def time_to_target(metrics: Mapping[str, Series], target: float) -> TargetHit | None:
    """Steps and training seconds at the first return >= ``target`` (evaluation, else
    training episodes; the final evaluation counts at the end of training); None: never."""
    clock = training_clock(metrics)
    rewards = reward_series(metrics)
    if rewards is not None:
        reached = np.flatnonzero(np.isfinite(rewards.values) & (rewards.values >= target))
        if len(reached):
            step = int(rewards.steps[reached[0]])
            seconds = float(seconds_at(clock, [step])[0]) if clock is not None else math.nan
            return TargetHit(step, seconds)
    final = metrics.get(FINAL_KEY)
    if final is not None and len(final) and math.isfinite(final.values[-1]) \
            and final.values[-1] >= target:
        seconds = float(clock.values[-1]) if clock is not None else math.nan
        return TargetHit(int(final.steps[-1]), seconds)
    return None


@dataclass(frozen=True)
class PointTarget:
    """Time to target over a point's seeds."""

    target: float | None  # None: no target for this task
    hits: tuple[TargetHit | None, ...]  # one per run

    @property
    def reached(self) -> int:
        return sum(h is not None for h in self.hits)

    @property
    def seconds(self) -> float:
        """Mean training seconds over the seeds that reached it (NaN: none did)."""
        found = [h.seconds for h in self.hits if h is not None and math.isfinite(h.seconds)]
        return float(np.mean(found)) if found else math.nan

    @property
    def steps(self) -> float:
        found = [h.step for h in self.hits if h is not None]
        return float(np.mean(found)) if found else math.nan

    def text(self) -> str:
        """``12.3 s (8192 steps)``, ``12.3 s (1 of 2 seeds)``, ``not reached``, ``no target``."""
        if self.target is None:
            return "no target"
        if not self.reached:
            return "not reached"
        if math.isnan(self.seconds):
            where = f"{self.steps:.0f} steps"
        else:
            where = f"{self.seconds:.1f} s ({self.steps:.0f} steps)"
        if self.reached < len(self.hits):
            where += f", {self.reached} of {len(self.hits)} seeds"
        return where

    def rank_value(self) -> float:
        """Seconds when every seed reached the target, else inf (for sorting)."""
        return self.seconds if self.reached == len(self.hits) and self.hits else math.inf


def point_target(runs_metrics: Sequence[Mapping[str, Series]], target: float | None
                 ) -> PointTarget:
    """Time to ``target`` for each run of a point."""
    if target is None:
        return PointTarget(None, tuple(None for _ in runs_metrics))
    return PointTarget(target, tuple(time_to_target(m, target) for m in runs_metrics))
