"""What a study optimizes, computed from a trial's evaluations, and what it reports to the
pruner while the trial trains.

A trial's curve is its deterministic evaluations during training: (training seconds at the
evaluation, evaluation steps, mean return), the clock counting training only (evaluations
excluded), as ``benchmarks/time_to_reward.py`` measures.

- ``final_return``: the final evaluation's mean return (maximize). Report k is the evaluation
  after k x ``tune.eval_every_steps`` env steps, its value that evaluation's return.
- ``time_to_target``: training seconds at the first evaluation that reaches ``tune.target``
  (minimize). A trial that never does scores more than the budget, by how far its best
  evaluation fell short: ``budget_s x (1 + (target - best) / max(|target|, 1))``. Every
  reaching trial ranks before every other, and among the others the closer ranks first, so a
  hard target still gives the sampler something to learn from (scoring all of them the
  budget left TPE a flat landscape: a Swimmer study's first trials all scored exactly 100 s).
  Report k is at k x ``report_every_s`` training seconds, its value the shortfall
  ``target - return`` of the latest evaluation by then (lower is better, like the objective).
- ``auc``: the area under the return-vs-training-seconds curve over ``[0, budget_s]`` divided
  by ``budget_s``: the mean return over the budget (maximize). The curve is a step function
  (each evaluation's return holds until the next; the first also before it; the last until
  the budget). Report k is the partial area up to k x ``report_every_s``, divided by the budget.

Pure functions of plain values: the driver scores a finished trial with them, and the trial's
kernel computes its reports with them (``workbench.tuning.trial``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

MAXIMIZE, MINIMIZE = "maximize", "minimize"
DIRECTIONS = {"final_return": MAXIMIZE, "time_to_target": MINIMIZE, "auc": MAXIMIZE}
UNITS = {"final_return": "return", "time_to_target": "s", "auc": "mean return"}


class Evaluation(NamedTuple):
    """One deterministic evaluation during training."""

    train_s: float  # training seconds when it started (evaluations excluded)
    steps: int  # env steps trained by then
    mean_return: float


@dataclass(frozen=True)
class Objective:
    """An objective with its settings (stored in the study, read back by each trial)."""

    name: str
    target: float | None = None
    budget_s: float | None = None
    eval_every_steps: int = 10_000
    report_every_s: float | None = None

    @property
    def direction(self) -> str:
        return DIRECTIONS[self.name]

    @property
    def timed(self) -> bool:
        """True when it is measured on training seconds (reports on the clock)."""
        return self.name != "final_return"

    @property
    def report_interval_s(self) -> float:
        """Training seconds between reports of a time objective."""
        if self.report_every_s:
            return self.report_every_s
        return (self.budget_s or 0.0) / 10.0

    def describe(self) -> str:
        """``time_to_target (target 900, budget 60 s)``."""
        parts = []
        if self.target is not None:
            parts.append(f"target {self.target:g}")
        if self.budget_s is not None:
            parts.append(f"budget {self.budget_s:g} s")
        return self.name + (f" ({', '.join(parts)})" if parts else "")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Objective:
        return cls(**{k: values[k] for k in ("name", "target", "budget_s", "eval_every_steps",
                                             "report_every_s") if k in values})

    # ------------------------------------------------------------------- scoring

    def score(self, curve: Sequence[Evaluation], final_return: float | None) -> float:
        """The finished trial's value (NaN when it cannot be scored: no evaluation)."""
        if self.name == "final_return":
            return math.nan if final_return is None else float(final_return)
        if self.name == "time_to_target":
            if not curve:
                return math.nan
            target = self.target_value()
            reached = time_reached(curve, target)
            if reached is not None:
                return reached
            best = max(point.mean_return for point in curve)
            return self.budget() * (1.0 + (target - best) / max(abs(target), 1.0))
        return area(curve, self.budget()) / self.budget() if curve else math.nan

    def unreached_note(self, value: float) -> str | None:
        """What a ``time_to_target`` value over the budget means, or None for any other value.

        Such a trial never reached the target, and the value is ``score``'s shortfall formula;
        inverted, it gives the best evaluation's return behind it, so a reader sees how far from
        the target it stayed. Over seeds the value is their aggregate (a mean may mix seeds that
        reached with seeds that did not), and so is the return it stands for.
        """
        if self.name != "time_to_target" or not math.isfinite(value) or value <= self.budget():
            return None
        target = self.target_value()
        best = target - (value / self.budget() - 1.0) * max(abs(target), 1.0)
        return (f"{value:.4g} is over the {self.budget():g} s budget: target {target:g} not "
                f"reached (over seeds: by their aggregate); it stands for a best evaluation's "
                f"return of {best:.4g}")

    def settled(self, curve: Sequence[Evaluation]) -> bool:
        """True once more training cannot change the value (the target is reached)."""
        if self.name != "time_to_target":
            return False
        return time_reached(curve, self.target_value()) is not None

    def reports(self, curve: Sequence[Evaluation], now_s: float, done: int
                ) -> list[tuple[int, float]]:
        """The reports due now after report ``done``: ``(k, value)``, k counting from 1."""
        if not curve:
            return []
        due: list[tuple[int, float]] = []
        if not self.timed:
            for point in curve:
                k = point.steps // self.eval_every_steps
                if k > done and (not due or k > due[-1][0]):
                    due.append((k, point.mean_return))
            return due
        interval = self.report_interval_s
        if interval <= 0:
            return []
        k = done + 1
        while k * interval <= now_s:
            at = k * interval
            known = [p for p in curve if p.train_s <= at]
            if known:
                due.append((k, self.partial(known, at)))
            k += 1
        return due

    def partial(self, known: Sequence[Evaluation], at_s: float) -> float:
        """A time objective's report value at ``at_s`` from the evaluations made by then."""
        if self.name == "time_to_target":
            return self.target_value() - known[-1].mean_return
        return area(known, at_s) / self.budget()

    def target_value(self) -> float:
        assert self.target is not None, "time_to_target needs tune.target (checked in the plan)"
        return self.target

    def budget(self) -> float:
        assert self.budget_s is not None, "time objectives need tune.budget_s (plan checks)"
        return self.budget_s


def time_reached(curve: Sequence[Evaluation], target: float) -> float | None:
    """Training seconds at the first evaluation whose return reaches ``target``."""
    for point in curve:
        if point.mean_return >= target:
            return point.train_s
    return None


def area(curve: Sequence[Evaluation], until_s: float) -> float:
    """The area under the step-function curve over ``[0, until_s]``."""
    if not curve or until_s <= 0:
        return 0.0
    total, held, since = 0.0, curve[0].mean_return, 0.0
    for point in curve:
        at = min(max(point.train_s, since), until_s)
        total += held * (at - since)
        held, since = point.mean_return, at
        if since >= until_s:
            return total
    return total + held * (until_s - since)


def curve_from_metrics(train_s: Mapping[int, float], returns: Mapping[int, float]
                       ) -> list[Evaluation]:
    """The curve from two metric histories keyed by step (``trial/eval_train_s``,
    ``eval/mean_reward``): the steps where both were logged, in order."""
    return [Evaluation(train_s[s], s, returns[s]) for s in sorted(train_s) if s in returns]


def aggregate_seeds(values: Sequence[float], how: str) -> float:
    """A trial's value from its per-seed values (``tune.aggregate``): the median, the mean
    or the interquartile mean (scipy's 25 % trimmed mean, rliable's IQM); NaN if any is."""
    import numpy as np  # here: the request's checks (this module) import no numpy

    if not values or any(not math.isfinite(v) for v in values):
        return math.nan
    if how == "mean":
        return float(np.mean(values))
    if how == "iqm":
        from scipy import stats

        return float(stats.trim_mean(values, proportiontocut=0.25))
    return float(np.median(values))
