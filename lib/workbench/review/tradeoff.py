"""The trade-off a num_envs × n_steps sweep exists to show, and honest statistics over seeds.

For the points of a report (:mod:`workbench.review.records` groups them) this module works
out, per point, the IQM of the final evaluation return with its stratified bootstrap 95 %
interval and which other points' intervals it overlaps, the training seconds to a target
return, and finds the num_envs scaling ladders (:mod:`workbench.review.scaling`); and it
draws the figures for them: return vs training seconds beside return vs steps, the time to
target over the grid, the IQM intervals, performance profiles (3 seeds or more), the ladders.

A task's default target is its ``reward_threshold`` in gymnasium's registry (e.g. 950 for
InvertedPendulum-v5, 4800 for HalfCheetah-v5); ``workbench report --target-return`` sets
one for every task or per task. Only ids already registered are looked up: an id from the
store never makes anything import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium
import matplotlib
import numpy as np
from matplotlib.figure import Figure

from workbench.review import figures, scaling, statistics
from workbench.review.diagnostics import Series
from workbench.review.statistics import Interval, PointTarget


class RunLike(Protocol):
    """What is read of a run (:class:`workbench.review.records.RunRecord`)."""

    metrics: dict[str, Series]
    params: dict[str, str]
    tags: dict[str, str]
    manifest: dict[str, Any] | None

    @property
    def num_envs(self) -> int | None: ...

    @property
    def n_steps(self) -> int | None: ...

    @property
    def final_reward(self) -> float: ...


class PointLike(Protocol):
    """What is read of a grid point (:class:`workbench.review.records.Point`)."""

    label: str

    @property
    def runs(self) -> Sequence[RunLike]: ...

    @property
    def scored(self) -> Sequence[RunLike]: ...  # FINISHED runs, one per seed

    @property
    def plotted(self) -> Sequence[RunLike]: ...  # what figures draw


@dataclass(frozen=True)
class TradeoffOptions:
    """Report options of this module (``workbench report --help``)."""

    # task (env tag or gymnasium id) -> target return; the key "" applies to every task
    targets: Mapping[str, float] = field(default_factory=dict)
    min_gain: float = scaling.MIN_GAIN  # throughput gain per doubling that still pays
    memory_budget_mb: float | None = None  # None: 80 % of the smallest machine's memory
    # the configuration the others are compared with across tasks (review.configurations):
    # a label, a setting or a config id; None: the first configuration in grid order
    baseline: str | None = None


@dataclass
class Tradeoff:
    """What the report shows of this module, by point label."""

    targets: dict[str, float | None] = field(default_factory=dict)  # task -> target
    target_origins: dict[str, str] = field(default_factory=dict)  # task -> where it came from
    intervals: dict[str, Interval] = field(default_factory=dict)
    overlaps: dict[str, list[str]] = field(default_factory=dict)  # label -> overlapping labels
    times: dict[str, PointTarget] = field(default_factory=dict)
    ladders: list[scaling.Ladder] = field(default_factory=list)

    @property
    def seeds_compared(self) -> bool:
        """Some point has an interval (two seeds or more)."""
        return any(i.known for i in self.intervals.values())


def task_of(run: RunLike) -> str:
    """The task a run trained on: its ``env`` tag, else its env id (as points_by_env)."""
    return run.tags.get("env") or run.params.get("env.id") or "unknown"


def default_target(env_id: str | None) -> float | None:
    """The task's ``reward_threshold`` in gymnasium's registry (None: none, or not registered;
    nothing is imported for an id that is not)."""
    spec = gymnasium.envs.registration.registry.get(env_id or "")
    threshold = getattr(spec, "reward_threshold", None)
    return float(threshold) if threshold is not None else None


def target_for(run: RunLike, options: TradeoffOptions) -> tuple[float | None, str]:
    """A run's target and where it came from: the option for its task, else the option for
    all, else the task's default."""
    env_id = run.params.get("env.id")
    for key in (run.tags.get("env"), env_id, ""):
        if key is not None and key in options.targets:
            return options.targets[key], "--target-return"
    target = default_target(env_id)
    if target is None:
        return None, "no reward_threshold in gymnasium's registry; --target-return sets one"
    return target, f"reward_threshold of {env_id} in gymnasium's registry"


def analyse(points: Sequence[PointLike], options: TradeoffOptions) -> Tradeoff:
    """Intervals, overlaps, times to target and ladders of the points (in rank order)."""
    result = Tradeoff()
    for point in points:
        first = point.runs[0]
        target, origin = target_for(first, options)
        result.targets.setdefault(task_of(first), target)
        result.target_origins.setdefault(task_of(first), origin)
        rewards = [r.final_reward for r in point.scored if math.isfinite(r.final_reward)]
        if rewards:
            result.intervals[point.label] = statistics.iqm_interval([rewards])
        result.times[point.label] = statistics.point_target([r.metrics for r in point.scored],
                                                            target)
    labels = list(result.intervals)
    for i, others in enumerate(statistics.overlapping([result.intervals[k] for k in labels])):
        result.overlaps[labels[i]] = [labels[j] for j in others]
    budget = options.memory_budget_mb
    if budget is None:
        budget = scaling.default_memory_budget(
            [int(((r.manifest or {}).get("hardware") or {}).get("memory_bytes") or 0)
             for p in points for r in p.runs])
    result.ladders = scaling.ladders(ladder_points(points), min_gain=options.min_gain,
                                     memory_budget_mb=budget)
    return result


def ladder_points(points: Sequence[PointLike]) -> list[scaling.LadderRuns]:
    """The points that can sit on a ladder (num_envs and n_steps known)."""
    found = []
    for p in points:
        first = p.runs[0]
        if first.num_envs is not None and first.n_steps is not None:
            found.append(scaling.LadderRuns(task_of(first), first.num_envs, first.n_steps,
                                            [r.metrics for r in p.scored]))
    return found


# --------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Drawn:
    """A figure of this module: file name, title, caption, section of the report, figure."""

    filename: str
    title: str
    caption: str
    section: str  # "figures" (the report's figure list) or "scaling"
    figure: Figure


def suffix(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def curve_figures(points: Sequence[PointLike], colors: Mapping[str, str]) -> list[Drawn]:
    """Return vs environment steps beside return vs training seconds (mean ± std band)."""
    steps = [figures.Curves(p.label, colors[p.label],
                            [s for r in p.plotted if (s := statistics.reward_series(r.metrics))])
             for p in points]
    seconds = [figures.Curves(p.label, colors[p.label], seconds_curves(p)) for p in points]
    if not any(c.series for c in seconds):
        return []
    fig, axes = figures.new_figure(2)
    figures.draw_curves(axes[0], steps, title="Return vs environment steps",
                        ylabel="mean episode return")
    figures.draw_curves(axes[1], seconds, title="Return vs training seconds",
                        ylabel="mean episode return")
    with matplotlib.rc_context(figures.STYLE):
        axes[1].set_xlabel("training seconds (rollouts + updates)")
        axes[1].ticklabel_format(axis="x", style="plain")
    figures.legend_below(fig, axes)
    figures.suptitle(fig, "Which setting gets there first: deterministic evaluation return vs "
                          "steps and vs seconds (line: mean, band: ±1 std over seeds)")
    return [Drawn("reward_vs_time.png", "Return vs training seconds",
                  "Left: return vs environment steps; right: the same curves against the "
                  "seconds the run spent training (time/rollout_s + time/update_s; "
                  "evaluations left out). Deterministic evaluation where logged, else training "
                  "episodes; the band is ±1 std over seeds.", "figures", fig)]


def seconds_curves(point: PointLike) -> list[Series]:
    """The point's return curves against training seconds, on one time axis.

    Seeds of a point evaluate at the same steps but not at the same seconds; averaged over
    the range every seed covers, the curve would end where the fastest seed ended. So the
    k-th evaluation of every seed is placed at the seeds' mean training seconds at that
    evaluation (seeds that evaluated at other steps keep their own clock).
    """
    pairs = [(r, c) for r in point.plotted if (c := statistics.reward_vs_seconds(r.metrics))]
    found = [statistics.reward_series(r.metrics) for r, _ in pairs]
    steps = [s for s in found if s is not None]
    if len(pairs) < 2 or len(steps) < len(found) or any(
            not np.array_equal(s.steps, steps[0].steps) for s in steps):
        return [c for _, c in pairs]
    clock = np.mean([c.steps for _, c in pairs], axis=0)
    return [Series(steps=clock, values=c.values) for _, c in pairs]


def target_figures(points_by_task: Mapping[str, Sequence[PointLike]],
                   tradeoff: Tradeoff) -> list[Drawn]:
    """Time to target over the num_envs × n_steps grid, one figure per task with a target."""
    out = []
    for task, task_points in points_by_task.items():
        target = tradeoff.targets.get(task)
        cells: dict[tuple[int, int], float] = {}
        notes: dict[tuple[int, int], str] = {}
        for p in task_points:
            first = p.runs[0]
            if first.num_envs is None or first.n_steps is None:
                continue
            cell, time = (first.num_envs, first.n_steps), tradeoff.times[p.label]
            cells[cell] = time.rank_value() if math.isfinite(time.rank_value()) else math.nan
            if time.reached == 0:
                notes[cell] = "not reached"
            elif time.reached < len(time.hits):
                notes[cell] = f"{time.seconds:.1f} s\n{time.reached} of {len(time.hits)} seeds"
        if target is None or len(cells) < 2:  # one cell is not a grid (the ranking has it)
            continue
        name = f"time_to_target-{suffix(task)}.png" if len(points_by_task) > 1 \
            else "time_to_target.png"
        out.append(Drawn(
            name, f"Time to target return {target:g} over the grid, {task}",
            f"Training seconds until the deterministic evaluation first reached {target:g} "
            "(mean over seeds); 'not reached' where no seed got there, 'k of n seeds' where "
            "only some did; dashed lines join cells with equal samples per update.",
            "figures", figures.target_grid_figure(cells, notes, target)))
    return out


def interval_figure(points: Sequence[PointLike], tradeoff: Tradeoff,
                    colors: Mapping[str, str]) -> list[Drawn]:
    """IQM and its 95 % interval per point (points with two seeds or more)."""
    shown = [p for p in points if p.label in tradeoff.intervals
             and tradeoff.intervals[p.label].known]
    if not shown:
        return []
    fig, (ax,) = figures.new_figure(1)
    fig.set_size_inches(figures.PANEL_SIZE[0] * 2, max(3.5, 1.2 + 0.7 * len(shown)))
    with matplotlib.rc_context(figures.STYLE):
        for y, p in enumerate(shown):
            i = tradeoff.intervals[p.label]
            ax.errorbar(i.estimate, y, xerr=[[i.estimate - i.low], [i.high - i.estimate]],
                        fmt="o", color=colors[p.label], capsize=8, markersize=10, linewidth=3)
            ax.text(i.high, y, f"  {i.estimate:.1f} [{i.low:.1f}, {i.high:.1f}], "
                    f"{i.runs} seeds", va="center")
        ax.set_yticks(range(len(shown)), [figures.short(p.label) for p in shown])
        ax.invert_yaxis()
        ax.margins(x=0.35)
        ax.set_xlabel("final deterministic evaluation return")
        ax.set_title("IQM over seeds with stratified bootstrap 95 % intervals")
        ax.grid(axis="y", visible=False)
    return [Drawn("iqm_intervals.png", "IQM of the final return with 95 % intervals",
                  "Interquartile mean of the final evaluation return over each point's seeds; "
                  "bars: stratified bootstrap 95 % confidence interval (percentile, "
                  f"{statistics.BOOTSTRAP_REPS} resamples). Overlapping bars: the seeds do "
                  "not separate the points.", "figures", fig)]


def profile_figures(points_by_task: Mapping[str, Sequence[PointLike]],
                    colors: Mapping[str, str]) -> list[Drawn]:
    """Performance profiles per task, of the points with >= 3 seeds."""
    out = []
    for task, task_points in points_by_task.items():
        scores = {p.label: [r.final_reward for r in p.scored if math.isfinite(r.final_reward)]
                  for p in task_points}
        scores = {k: v for k, v in scores.items() if len(v) >= statistics.MIN_PROFILE_RUNS}
        if not scores:
            continue
        every = np.concatenate([np.asarray(v) for v in scores.values()])
        taus = np.linspace(every.min(), every.max(), 60)
        profiles = {k: statistics.performance_profile([v], taus) for k, v in scores.items()}
        name = f"performance_profile-{suffix(task)}.png" if len(points_by_task) > 1 \
            else "performance_profile.png"
        out.append(Drawn(name, f"Performance profile, {task}",
                         "Fraction of a point's runs whose final return exceeds τ, for every "
                         "τ; bands: stratified bootstrap 95 % intervals. A curve above another "
                         "over the whole range dominates it.", "figures",
                         figures.profile_figure(profiles, colors, task)))
    return out


def ladder_figures(tradeoff: Tradeoff) -> list[Drawn]:
    """One figure per scaling ladder."""
    many = len(tradeoff.ladders) > 1
    return [Drawn(f"scaling-{suffix(lad.task)}-{lad.samples_per_update}.png" if many
                  else "scaling.png",
                  f"Scaling ladder: {lad.task}, {lad.samples_per_update} samples per update",
                  "Throughput, seconds per iteration, peak memory of the process tree (and GPU "
                  "utilization and memory where logged) against num_envs; red line: the knee.",
                  "scaling", scaling.ladder_figure(lad)) for lad in tradeoff.ladders]
