"""Whether a change mattered: two sides' returns compared seed by seed, and one verdict.

A side is the runs one id names (a run, a configuration's seeds, a sweep point's seeds:
:mod:`workbench.review.comparison` finds them). Each measure is one score per seed (a rerun of
a seed is not another seed: its runs are averaged): the final return, the return at the
largest step every run reached, the return at the longest training time every run reached.
Each side is summarised by its IQM with a stratified bootstrap interval, and B is compared with
A by the probability of improvement P(B > A) with its interval (rliable's, as
:mod:`workbench.review.statistics` implements it).

The verdict reads the final return's probability of improvement: B is better when its whole
interval lies above 0.5, worse when it lies below, and not distinguishable when it holds 0.5;
with one seed on a side there is no interval, and no verdict but "run more seeds".

Plain numpy on values already loaded: no MLflow, no matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from workbench.review.diagnostics import Series
from workbench.review.statistics import (
    EVAL_KEY,
    TRAINING_KEY,
    Interval,
    improvement_direction,
    iqm_interval,
    probability_of_improvement,
    seconds_at,
    training_clock,
)
from workbench.tracking.manifest_diff import Difference, diff_configs

MIN_SEEDS = 2  # per side, for P(B > A): with one seed it only restates two runs' order
# Params that differ between the seeds of one configuration (a grid point's run name ends
# with its seed): never "what changed".
SEED_KEYS = ("seed", "derived.env_seeds", "tracking.run_name")


class RunLike(Protocol):
    """What is read of a run (:class:`workbench.review.records.RunRecord`)."""

    run_id: str
    metrics: dict[str, Series]

    @property
    def seed(self) -> int | None: ...

    @property
    def final_reward(self) -> float: ...


# --------------------------------------------------------------------------- what changed


def changed_config(a: Mapping[str, str], b: Mapping[str, str]) -> list[Difference]:
    """The config keys whose values differ between two runs' params, seeds left out
    (``workbench.tracking.manifest_diff.diff_configs``: ``derived.*`` when both have them)."""
    return diff_configs(without_seeds(a), without_seeds(b))


def without_seeds(params: Mapping[str, str]) -> dict[str, str]:
    """``params`` without :data:`SEED_KEYS`."""
    return {k: v for k, v in params.items() if k not in SEED_KEYS}


def mark_derived(diffs: Sequence[Difference], sources: Mapping[str, Sequence[str]]
                 ) -> list[Difference]:
    """The differences with those that follow from other keys (a ``derived.*`` param, an
    interpolated key: ``sources`` maps each to the keys it reads) moved after the keys that
    were set, in section ``derived`` and named with what they follow from:
    ``algo.batch_size <- env.num_envs, algo.n_steps``."""
    set_keys, followed = [], []
    for d in diffs:
        origin = sources.get(d.key) if d.section == "config" else None
        if origin:
            followed.append(replace(d, section="derived",
                                    key=f"{d.key} <- {', '.join(origin)}"))
        else:
            set_keys.append(d)
    return set_keys + followed


# --------------------------------------------------------------------------- scores per seed


def seed_scores(runs: Sequence[RunLike], score: Callable[[RunLike], float]) -> list[float]:
    """One score per seed: the mean of that seed's finite scores (a seed without one is left
    out; a run without a seed counts as a seed of its own)."""
    by_seed: dict[object, list[float]] = {}
    for run in runs:
        value = score(run)
        if math.isfinite(value):
            by_seed.setdefault(run.seed if run.seed is not None else run.run_id, []).append(value)
    return [float(np.mean(values)) for values in by_seed.values()]


def reward_key(runs: Sequence[RunLike]) -> str:
    """The return every run is judged by: periodic evaluation when each run that logged a
    return logged it, else the training episodes' (one key for both sides)."""
    logged = [r for r in runs if any(len(r.metrics.get(k, ())) for k in (EVAL_KEY, TRAINING_KEY))]
    if logged and all(len(r.metrics.get(EVAL_KEY, ())) for r in logged):
        return EVAL_KEY
    return TRAINING_KEY


def final_score(runs: Sequence[RunLike], key: str) -> tuple[str, Callable[[RunLike], float]]:
    """What "final return" means for these runs, and how to read it: the final deterministic
    evaluation when every run that logged ``key`` has one, else the last value of ``key``."""
    logged = [r for r in runs if len(r.metrics.get(key, ()))]
    if logged and all(math.isfinite(r.final_reward) for r in logged):
        return "final evaluation return", lambda r: r.final_reward
    return f"last {key}", lambda r: last_value(r.metrics.get(key))


def last_value(series: Series | None) -> float:
    """The series' last value (NaN when empty or missing)."""
    return float(series.values[-1]) if series is not None and len(series) else math.nan


def value_at(series: Series | None, x: float) -> float:
    """``series`` at ``x``, interpolated within its logged range; NaN outside it."""
    if series is None or not len(series) or not series.steps[0] <= x <= series.steps[-1]:
        return math.nan
    return float(np.interp(x, np.asarray(series.steps, dtype=float), series.values))


def common_end(series: Sequence[Series | None]) -> float | None:
    """The largest x inside every logged series' range: the smallest of their last xs, when
    no series starts after it (a run that logged none, e.g. one that failed at start, has no
    say; None: no run logged any, or the ranges do not overlap)."""
    logged = [s for s in series if s is not None and len(s)]
    if not logged:
        return None
    end = min(float(s.steps[-1]) for s in logged)
    return end if end >= max(float(s.steps[0]) for s in logged) else None


def reward_by_seconds(metrics: Mapping[str, Series], key: str) -> Series | None:
    """``key``'s values with training seconds instead of steps (as
    :func:`workbench.review.statistics.reward_vs_seconds`, for a chosen key)."""
    rewards, clock = metrics.get(key), training_clock(metrics)
    if rewards is None or not len(rewards) or clock is None:
        return None
    return Series(steps=seconds_at(clock, rewards.steps), values=rewards.values.astype(float))


# --------------------------------------------------------------------------- measures


@dataclass(frozen=True)
class Measure:
    """One way to score the seeds: its name and each side's scores (one per seed)."""

    name: str
    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def a_iqm(self) -> Interval | None:
        return iqm_interval([self.a]) if self.a else None

    @property
    def b_iqm(self) -> Interval | None:
        return iqm_interval([self.b]) if self.b else None

    @property
    def improvement(self) -> Interval | None:
        """P(B > A) with its interval (None: a side has fewer than two seeds' scores, where a
        probability would only restate the order of two runs)."""
        if min(len(self.a), len(self.b)) < MIN_SEEDS:
            return None
        return probability_of_improvement([self.b], [self.a])


def measures(a: Sequence[RunLike], b: Sequence[RunLike]) -> list[Measure]:
    """Final return, return at equal steps and at equal training seconds (the largest every
    run of both sides reached), each side's scores one per seed."""
    runs = [*a, *b]
    key = reward_key(runs)
    name, final = final_score(runs, key)
    found = [Measure(name, tuple(seed_scores(a, final)), tuple(seed_scores(b, final)))]
    by_step = {r.run_id: r.metrics.get(key) for r in runs}
    step = common_end(list(by_step.values()))
    if step is not None:
        found.append(scored_at(f"{key} at {step:,.0f} steps", a, b, by_step, step))
    by_second = {r.run_id: reward_by_seconds(r.metrics, key) for r in runs}
    second = common_end(list(by_second.values()))
    if second is not None and second > 0:
        found.append(scored_at(f"{key} at {second:,.1f} s of training", a, b, by_second, second))
    return found


def scored_at(name: str, a: Sequence[RunLike], b: Sequence[RunLike],
              series: Mapping[str, Series | None], x: float) -> Measure:
    """Each seed's value at ``x`` of its run's series (by run id)."""
    def score(run: RunLike) -> float:
        return value_at(series[run.run_id], x)

    return Measure(name, tuple(seed_scores(a, score)), tuple(seed_scores(b, score)))


# --------------------------------------------------------------------------- verdict


def verdict(improvement: Interval | None, seeds_a: int, seeds_b: int) -> str:
    """One line: whether B is better or worse than A, or not distinguishable with these
    seeds (``improvement`` is P(B > A) of the final return; None: a side has no score)."""
    counted = f"{seeds_a} vs {seeds_b} seeds"
    if not (seeds_a and seeds_b):
        lacking = [side for side, seeds in (("A", seeds_a), ("B", seeds_b)) if not seeds]
        has = "A and B have" if len(lacking) != 1 else f"{lacking[0]} has"
        return f"no verdict: {has} no finished run with a return; compare runs that logged one"
    if improvement is None or not improvement.known:
        return f"not distinguishable with {counted}: run more seeds"
    shown = poi_text(improvement)
    direction = improvement_direction(improvement)
    if direction is not None:
        return f"B is {direction} than A: {shown} over {counted}"
    return f"not distinguishable with {counted} ({shown})"


def poi_text(improvement: Interval) -> str:
    """``PoI 0.92 [0.75, 1.00]`` (``PoI 1.00`` without an interval)."""
    if not improvement.known:
        return f"PoI {improvement.estimate:.2f}"
    return f"PoI {improvement.estimate:.2f} [{improvement.low:.2f}, {improvement.high:.2f}]"


def interval_text(interval: Interval | None) -> str:
    """``1234.5 [1100.2, 1300.0]`` (IQM over two seeds or more), ``1234.5`` (one), ``-``."""
    if interval is None:
        return "-"
    if not interval.known:
        return f"{interval.estimate:.1f}"
    return f"{interval.estimate:.1f} [{interval.low:.1f}, {interval.high:.1f}]"
