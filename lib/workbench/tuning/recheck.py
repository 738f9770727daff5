"""Is the tuned setting really better? The best trials of a study over seeds, trained again
on fresh seeds next to the shipped defaults.

A study picks its best trial by the value its seeds gave, so that value is biased upwards
(the winner's curse of every search: rl-baselines3-zoo users report best trials that "cannot
be as good as reported"). With ``tune.seeds``, once every trial is in, the ``tune.recheck_top``
best trials and the defaults (the study's shared overrides without any sampled value) each
train on ``tune.recheck_seeds``, seeds no trial saw; the candidate with the best mean there
is compared with the defaults by the probability of improvement P(candidate > defaults) and
its bootstrap interval (the report's statistic, given by the caller as a :data:`Judge`: this
layer computes no statistics). The verdict goes into the preset's header, the study run's
tags and the console:

    better than the defaults: PoI 0.83 [0.61, 0.97] on seeds 10-14

The verdict is stored in the study, so running the same command again reprints it instead
of training again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from mlflow.tracking import MlflowClient

from workbench import console
from workbench.sweeps.point import FINISHED, SKIPPED, PointOutcome, PointSpec
from workbench.tracking.store import MAX_TAG_VALUE_LENGTH, truncate
from workbench.tuning.executors import TrialBackend
from workbench.tuning.objectives import aggregate_seeds
from workbench.tuning.plan import TunePlan

RECHECK_ATTR = "workbench.recheck"  # study user attr: the stored Recheck
DEFAULTS = "defaults"
CANDIDATE_TAG = "tune.recheck"  # a run of the check: "defaults" or "trial-003"


class Probability(Protocol):
    """P(X > Y) with its interval (``workbench.review.statistics.Interval``)."""

    @property
    def estimate(self) -> float: ...

    @property
    def low(self) -> float: ...

    @property
    def high(self) -> float: ...


# (candidate's scores, defaults' scores, both "higher is better") -> ("better" | "worse" |
# None, P(candidate > defaults))
Judge = Callable[[Sequence[float], Sequence[float]], tuple[str | None, Probability]]
# a finished point's run id -> its value (the study's objective)
Scorer = Callable[[str], float]


@dataclass(frozen=True)
class Recheck:
    """The check's result: which trial, its verdict against the defaults, every score."""

    trial: int  # the candidate with the best mean on the fresh seeds
    trials: list[int]  # the candidates, best study value first
    seeds: list[int]
    direction: str | None  # better | worse | None (not distinguishable)
    poi: float
    low: float
    high: float
    scores: dict[str, list[float]]  # "defaults" / "trial-003" -> a score per fresh seed
    failed: list[str]  # points of the check that did not finish

    @property
    def verdict(self) -> str:
        """``better than the defaults: PoI 0.83 [0.61, 0.97] on seeds 10-14``."""
        seeds = seed_range(self.seeds)
        if self.failed:
            return (f"not checked: {len(self.failed)} run(s) of the check on seeds {seeds} "
                    f"did not finish ({', '.join(self.failed[:3])})")
        poi = f"PoI {self.poi:.2f} [{self.low:.2f}, {self.high:.2f}] on seeds {seeds}"
        if self.direction is None:
            return f"not distinguishable from the defaults: {poi}"
        return f"{self.direction} than the defaults: {poi}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def seed_range(seeds: Sequence[int]) -> str:
    """``10-14`` for consecutive seeds, else ``10, 12, 15``."""
    ordered = sorted(seeds)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ", ".join(str(s) for s in ordered)


def candidates(plan: TunePlan, study: Any) -> list[Any]:
    """The ``tune.recheck_top`` best COMPLETE trials, best first."""
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    maximize = plan.objective.direction == "maximize"
    complete.sort(key=lambda t: t.value, reverse=maximize)
    return complete[:plan.settings.recheck_top]


def stored_recheck(plan: TunePlan, study: Any, trials: Sequence[int]) -> Recheck | None:
    """The check a previous run of this command made of the same trials and seeds."""
    stored = study.user_attrs.get(RECHECK_ATTR)
    if (not stored or stored.get("trials") != list(trials)
            or stored.get("seeds") != list(plan.recheck_seeds)):
        return None
    return Recheck(**stored)


def run_recheck(plan: TunePlan, study: Any, backend: TrialBackend, client: MlflowClient,
                specs: Callable[[str, dict[str, Any], int], PointSpec], score: Scorer,
                judge: Judge) -> Recheck | None:
    """Train the best trials and the defaults on the fresh seeds, judge, store the result.

    ``specs(name, values, seed)`` makes a point of candidate ``name`` (its sampled
    ``values``; none for the defaults) on ``seed``; ``score`` reads a finished run's value.
    """
    top = candidates(plan, study)
    if not top:
        return None
    numbers = [t.number for t in top]
    found = stored_recheck(plan, study, numbers)
    if found is not None:
        return found
    values = {DEFAULTS: {}} | {
        trial_name(t.number): {**t.params, **t.user_attrs.get("workbench.adjusted", {})}
        for t in top}
    points = [specs(name, v, seed) for name, v in values.items() for seed in plan.recheck_seeds]
    print(f"re-checking trial(s) {', '.join(map(str, numbers))} against the defaults on fresh "
          f"seeds {seed_range(plan.recheck_seeds)}: {len(points)} trainings", flush=True)
    outcomes = train_points(plan, backend, points)
    scores: dict[str, list[float]] = {name: [] for name in values}
    failed = []
    for spec, outcome in zip(points, outcomes, strict=True):
        finished = outcome.status in (FINISHED, SKIPPED)
        value = score(outcome.run_id) if finished and outcome.run_id else math.nan
        if outcome.run_id:
            tag_run(client, outcome.run_id, spec.tags, value)
        if math.isfinite(value):
            scores[spec.tags[CANDIDATE_TAG]].append(value)
        else:
            failed.append(spec.point)
    sign = 1.0 if plan.objective.direction == "maximize" else -1.0
    best = max(numbers, key=lambda n: sign * aggregate_seeds(scores[trial_name(n)], "mean")
               if scores[trial_name(n)] else -math.inf)
    direction, poi = (None, None) if failed else judge(
        [sign * v for v in scores[trial_name(best)]], [sign * v for v in scores[DEFAULTS]])
    result = Recheck(
        trial=best, trials=numbers, seeds=list(plan.recheck_seeds), direction=direction,
        poi=poi.estimate if poi else math.nan, low=poi.low if poi else math.nan,
        high=poi.high if poi else math.nan, scores=scores, failed=failed)
    if not failed:  # a check with holes is made again by the next run of the command
        study.set_user_attr(RECHECK_ATTR, result.as_dict())
    return result


def tag_run(client: MlflowClient, run_id: str, tags: dict[str, str], value: float) -> None:
    """A run of the check: its role and candidate, MLflow's UI shows and filters them."""
    for key in ("tune.study", "tune.role", CANDIDATE_TAG):
        client.set_tag(run_id, key, tags[key])
    if math.isfinite(value):
        client.set_tag(run_id, "tune.value", f"{value:.6g}")


def trial_name(number: int) -> str:
    """``trial-003``: a candidate's name in the check."""
    return f"trial-{number:03d}"


def train_points(plan: TunePlan, backend: TrialBackend, points: Sequence[PointSpec]
                 ) -> list[PointOutcome]:
    """Every point through the backend, ``backend.workers`` at a time, in order of ``points``."""
    outcomes: dict[str, PointOutcome] = {}
    waiting = list(points)
    inflight: dict[Any, PointSpec] = {}
    bar = console.progress(len(points), "re-check", "run")
    try:
        while waiting or inflight:
            while waiting and len(inflight) < backend.workers:
                spec = waiting.pop(0)
                inflight[backend.submit(spec, plan.out_dir / f"{spec.point}.ipynb")] = spec
            for handle in backend.wait(list(inflight)):
                spec = inflight.pop(handle)
                outcomes[spec.point] = backend.result(handle)
                bar.update(1)
    except KeyboardInterrupt:
        backend.interrupt()
        raise
    finally:
        bar.close()
    return [outcomes[spec.point] for spec in points]


def tag_study(client: MlflowClient, parent_id: str, recheck: Recheck) -> None:
    """The verdict on the study's MLflow run: tags MLflow's UI lists, metrics to compare."""
    client.set_tag(parent_id, "tune.verdict", truncate(recheck.verdict, MAX_TAG_VALUE_LENGTH))
    client.set_tag(parent_id, "tune.recheck_trial", str(recheck.trial))
    client.set_tag(parent_id, "tune.recheck_seeds", seed_range(recheck.seeds))
    for key, value in (("poi", recheck.poi), ("poi_low", recheck.low),
                       ("poi_high", recheck.high)):
        if math.isfinite(value):
            client.log_metric(parent_id, f"tune/recheck_{key}", value)
    for name, values in recheck.scores.items():
        if values:
            client.log_metric(parent_id, f"tune/recheck_mean/{name}",
                              aggregate_seeds(values, "mean"))
