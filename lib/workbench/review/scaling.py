"""The num_envs scaling ladder: how far doubling the parallel environments pays on a machine.

The practice on a new machine: start at 2-4 envs, double at a fixed number of samples per
update (``sweep=scale``: num_envs × n_steps constant), watch throughput, the time per
iteration, utilization and memory, and back off at the knee. A report finds every such
ladder among its points (one task, one samples-per-update, three or more num_envs) and marks
the knee: the last rung before doubling stops buying ``min_gain`` (10 %) more throughput, or
before the process tree's peak memory crosses the budget, whichever comes first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from workbench.review import figures
from workbench.review.diagnostics import GPU_KEY, Series
from workbench.review.options import MIN_GAIN
from workbench.tracking.metric_keys import PROCESS_MEMORY_KEY

MIN_RUNGS = 3  # fewer num_envs values are a grid, not a ladder
MEMORY_SHARE = 0.8  # default budget: this share of the (smallest) machine's memory
GPU_MEMORY_KEY = "system/gpu_0_memory_usage_megabytes"  # MLflow's GPU monitor, first GPU


@dataclass(frozen=True)
class Rung:
    """One num_envs of a ladder: means over its runs (seeds)."""

    num_envs: int
    n_steps: int
    runs: int
    fps: float  # env steps per training second (summary/fps)
    rollout_s: float  # median seconds per iteration collecting (the first iteration left out)
    update_s: float  # ... updating the policy
    peak_memory_mb: float  # the training process tree's peak (PSS)
    gpu_percent: float | None  # mean GPU utilization; None: not logged
    gpu_memory_mb: float | None  # peak GPU memory in use; None: not logged
    # The spread of throughput over the rung's iterations (the first left out): the quartiles
    # of samples per second of each iteration, scaled to ``fps``; NaN: too few iterations.
    fps_low: float = math.nan
    fps_high: float = math.nan

    def spread_text(self) -> str:
        """``900–950`` (steps/s), or "" when the spread is unknown."""
        if not (math.isfinite(self.fps_low) and math.isfinite(self.fps_high)):
            return ""
        return f"{self.fps_low:.0f}–{self.fps_high:.0f}"


@dataclass(frozen=True)
class Knee:
    """Where doubling stops paying."""

    num_envs: int | None  # the rung to use; None: none (no knee in the ladder, or over budget)
    reason: str  # in words, with the numbers
    gains: tuple[float, ...]  # throughput gain per doubling between consecutive rungs
    by: str  # "throughput" | "memory" | "none" | "unclear" (a dip within the noise)


@dataclass(frozen=True)
class Ladder:
    """The rungs of one task at one samples-per-update, smallest num_envs first."""

    task: str
    samples_per_update: int
    rungs: tuple[Rung, ...]
    knee: Knee
    memory_budget_mb: float | None


def rung(num_envs: int, n_steps: int, runs: Sequence[Mapping[str, Series]]) -> Rung:
    """A rung from its runs' metric histories."""
    def final(key: str) -> float:
        found = [float(m[key].values[-1]) for m in runs if key in m and len(m[key])]
        found = [v for v in found if math.isfinite(v)]
        return float(np.mean(found)) if found else math.nan

    def per_iteration(key: str) -> float:
        found = [float(np.nanmedian(m[key].values[1:] if len(m[key]) > 1 else m[key].values))
                 for m in runs if key in m and len(m[key])]
        return float(np.mean(found)) if found else math.nan

    def peak(keys: Sequence[str]) -> float | None:
        found = [float(np.nanmax(m[k].values)) for m in runs for k in keys
                 if k in m and len(m[k]) and np.isfinite(m[k].values).any()]
        return max(found) if found else None

    gpu = [float(np.nanmean(s.values)) for m in runs for k, s in m.items()
           if GPU_KEY.match(k) and len(s) and np.isfinite(s.values).any()]
    memory = peak(("summary/peak_rss_mb", PROCESS_MEMORY_KEY))
    fps = final("summary/fps")
    low, high = iteration_spread(runs)
    return Rung(num_envs, n_steps, len(runs), fps,
                per_iteration("time/rollout_s"), per_iteration("time/update_s"),
                memory if memory is not None else math.nan,
                float(np.mean(gpu)) if gpu else None, peak((GPU_MEMORY_KEY,)),
                fps * low, fps * high)


def iteration_spread(runs: Sequence[Mapping[str, Series]]) -> tuple[float, float]:
    """The lower and upper quartile of the iterations' speeds (1 / (rollout + update
    seconds), the first iteration left out), relative to their median; NaN with fewer than
    three iterations. The same machine load that makes one rung look slow shows here."""
    speeds: list[float] = []
    for m in runs:
        if "time/rollout_s" not in m or "time/update_s" not in m:
            continue
        rollout, update = m["time/rollout_s"].values, m["time/update_s"].values
        count = min(len(rollout), len(update))
        seconds = rollout[1:count] + update[1:count]
        speeds += [1.0 / t for t in seconds if math.isfinite(t) and t > 0]
    if len(speeds) < 3:
        return math.nan, math.nan
    low, median, high = np.percentile(speeds, [25, 50, 75])
    return float(low / median), float(high / median)


def doubling_gains(rungs: Sequence[Rung]) -> tuple[float, ...]:
    """Throughput gain per doubling of num_envs between consecutive rungs (NaN: unknown).

    Rungs need not be exact doublings: a step of ×4 that buys ×1.44 is 20 % per doubling.
    """
    gains = []
    for small, large in zip(rungs, rungs[1:], strict=False):
        doublings = math.log2(large.num_envs / small.num_envs)
        if small.fps > 0 and large.fps > 0 and doublings > 0:
            gains.append((large.fps / small.fps) ** (1 / doublings) - 1)
        else:
            gains.append(math.nan)
    return tuple(gains)


def find_knee(rungs: Sequence[Rung], *, min_gain: float = MIN_GAIN,
              memory_budget_mb: float | None = None) -> Knee:
    """The knee of a ladder (rungs sorted by num_envs)."""
    gains = doubling_gains(rungs)
    slow = next((i for i, g in enumerate(gains) if math.isfinite(g) and g < min_gain), None)
    over = None
    if memory_budget_mb is not None:
        over = next((i for i, r in enumerate(rungs) if r.peak_memory_mb > memory_budget_mb), None)
    if over is not None and (slow is None or over <= slow):
        heavy = rungs[over]
        text = (f"num_envs={heavy.num_envs} needs {heavy.peak_memory_mb:.0f} MiB, over the "
                f"memory budget of {memory_budget_mb:.0f} MiB")
        if over == 0:
            return Knee(None, text + " already at the smallest rung", gains, "memory")
        return Knee(rungs[over - 1].num_envs, f"{text}: stay at num_envs="
                    f"{rungs[over - 1].num_envs}", gains, "memory")
    if slow is not None:
        small, large = rungs[slow], rungs[slow + 1]
        step = (f"num_envs {small.num_envs} → {large.num_envs}: throughput {small.fps:.0f} → "
                f"{large.fps:.0f} steps/s ({gains[slow]:+.0%} per doubling, below "
                f"{min_gain:.0%})")
        if within_spread(small, large, min_gain):
            return Knee(None, f"no clear knee: {step}, but the iterations' spread "
                        f"({small.spread_text()} and {large.spread_text()} steps/s) covers a "
                        f"gain of {min_gain:.0%}; rerun the ladder on a quiet machine, or "
                        "with more iterations per rung", gains, "unclear")
        text = f"{step}: stay at num_envs={small.num_envs}"
        # A later rung well above the knee's throughput: the flat step was noise (other load
        # on the machine) or a change of regime (e.g. another vec-env backend); say so.
        faster = [r for r in rungs[slow + 2:] if r.fps >= small.fps * (1 + min_gain)]
        if faster:
            text += (f" (but num_envs={faster[0].num_envs} reached {faster[0].fps:.0f} steps/s: "
                     "rerun the ladder on a quiet machine before trusting this knee)")
        return Knee(small.num_envs, text, gains, "throughput")
    last = rungs[-1].num_envs if rungs else 0
    return Knee(None, f"no knee up to num_envs={last}: every doubling bought {min_gain:.0%} "
                f"or more throughput; extend the ladder", gains, "none")


def within_spread(small: Rung, large: Rung, min_gain: float) -> bool:
    """True when the rungs' spreads leave a gain of ``min_gain`` per doubling possible: the
    large rung's upper quartile reaches the small one's lower quartile times that gain."""
    if not (math.isfinite(small.fps_low) and math.isfinite(large.fps_high)):
        return False  # no spread known: the means are all there is
    doublings = math.log2(large.num_envs / small.num_envs)
    return large.fps_high >= small.fps_low * (1 + min_gain) ** doublings


@dataclass(frozen=True)
class LadderRuns:
    """What :func:`ladders` needs of one point: where it sits and its runs' metrics."""

    task: str
    num_envs: int
    n_steps: int
    runs: Sequence[Mapping[str, Series]]


def ladders(points: Sequence[LadderRuns], *, min_gain: float = MIN_GAIN,
            memory_budget_mb: float | None = None) -> list[Ladder]:
    """Every ladder among the points: one task, one num_envs × n_steps, >= 3 num_envs."""
    groups: dict[tuple[str, int], list[LadderRuns]] = {}
    for p in points:
        groups.setdefault((p.task, p.num_envs * p.n_steps), []).append(p)
    found = []
    for (task, batch), members in groups.items():
        counts = [p.num_envs for p in members]
        if len(set(counts)) < MIN_RUNGS or len(set(counts)) != len(counts):
            continue  # too short, or two points at one num_envs (other params differ)
        rungs = tuple(rung(p.num_envs, p.n_steps, p.runs)
                      for p in sorted(members, key=lambda p: p.num_envs))
        found.append(Ladder(task, batch, rungs, find_knee(
            rungs, min_gain=min_gain, memory_budget_mb=memory_budget_mb), memory_budget_mb))
    return sorted(found, key=lambda ladder: (ladder.task, ladder.samples_per_update))


def default_memory_budget(memory_bytes: Sequence[int]) -> float | None:
    """:data:`MEMORY_SHARE` of the smallest machine's memory (MiB), from the runs' manifests."""
    known = [m for m in memory_bytes if m and m > 0]
    return MEMORY_SHARE * min(known) / 2**20 if known else None


# --------------------------------------------------------------------------- figure


def ladder_figure(ladder: Ladder) -> Figure:
    """Throughput, time per iteration, peak memory (and GPU where logged) vs num_envs."""
    gpu = any(r.gpu_percent is not None or r.gpu_memory_mb is not None for r in ladder.rungs)
    fig, axes = figures.new_figure(4 if gpu else 3, rows=2 if gpu else 1)
    x = np.array([r.num_envs for r in ladder.rungs], dtype=float)
    knee = ladder.knee.num_envs
    with matplotlib.rc_context(figures.STYLE):
        fps = np.array([r.fps for r in ladder.rungs])
        axes[0].plot(x, fps, marker="o", color="#1f77b4", label="throughput")
        spread = np.array([[r.fps - r.fps_low, r.fps_high - r.fps] for r in ladder.rungs]).T
        if np.isfinite(spread).all():
            axes[0].errorbar(x, fps, yerr=spread, fmt="none", ecolor="#1f77b4", capsize=5,
                             label="iterations' spread (quartiles)")
            axes[0].legend(loc="lower right", fontsize=12)
        for i, gain in enumerate(ladder.knee.gains):
            if math.isfinite(gain):
                middle = ((x[i] * x[i + 1]) ** 0.5, (fps[i] + fps[i + 1]) / 2)
                axes[0].annotate(f"{gain:+.0%}", middle, textcoords="offset points",
                                 xytext=(0, 8), ha="center")
        axes[0].set(title="Throughput (gain per doubling)", ylabel="env steps per second")
        axes[1].plot(x, [r.rollout_s for r in ladder.rungs], marker="o", color="#1f77b4",
                     label="rollout (simulation)")
        axes[1].plot(x, [r.update_s for r in ladder.rungs], marker="s", color="#ff7f0e",
                     label="update (PPO epochs)")
        axes[1].set(title="Time per iteration (median)", ylabel="seconds per iteration")
        axes[1].legend(loc="best")
        axes[2].plot(x, [r.peak_memory_mb for r in ladder.rungs], marker="o", color="#2ca02c",
                     label="peak memory, process tree")
        peak = max((r.peak_memory_mb for r in ladder.rungs if math.isfinite(r.peak_memory_mb)),
                   default=0.0)
        budget = ladder.memory_budget_mb
        if budget is not None and budget <= 2 * peak:
            axes[2].axhline(budget, color="crimson", linestyle="--",
                            label=f"budget {budget:.0f} MiB")
        elif budget is not None:  # drawn, it would flatten the curve to the axis
            axes[2].plot([], [], " ", label=f"budget {budget:.0f} MiB, far above")
        axes[2].set(title="Peak memory of the training process tree", ylabel="MiB (PSS)")
        for ax in axes[:3]:  # from 0: a rise of a few MiB must not look like a cliff
            ax.set_ylim(bottom=0)
        axes[2].legend(loc="best")
        if gpu:
            draw_gpu(axes[3], ladder)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xticks(x, [str(int(v)) for v in x])
            ax.set_xlabel("num_envs (parallel environments)")
            if knee is not None:
                ax.axvline(knee, color="crimson", linewidth=2.5, alpha=0.7)
        if knee is not None:
            axes[0].annotate(f"knee: num_envs={knee}", (knee, 0.04),
                             xycoords=("data", "axes fraction"), xytext=(6, 0),
                             textcoords="offset points", color="crimson", fontweight="bold")
        fig.suptitle(f"Scaling ladder: {ladder.task}, {ladder.samples_per_update} samples per "
                     f"update (num_envs × n_steps)")
    return fig


def draw_gpu(ax: matplotlib.axes.Axes, ladder: Ladder) -> None:
    """GPU utilization (left axis) and memory (right axis) vs num_envs."""
    x = [r.num_envs for r in ladder.rungs]
    util = [r.gpu_percent if r.gpu_percent is not None else math.nan for r in ladder.rungs]
    memory = [r.gpu_memory_mb if r.gpu_memory_mb is not None else math.nan for r in ladder.rungs]
    ax.plot(x, util, marker="o", color="#9467bd", label="utilization (mean)")
    ax.set(title="GPU", ylabel="utilization (%)")
    twin = ax.twinx()
    twin.plot(x, memory, marker="s", color="#8c564b", label="memory in use (peak)")
    twin.set_ylabel("GPU memory (MB)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [str(h.get_label()) for h in handles], loc="best")
