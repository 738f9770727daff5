"""Comparison figures for team review, drawn to be read on a projector.

Every function returns a matplotlib :class:`~matplotlib.figure.Figure` built without pyplot
(no global figure state, no display needed), with labelled axes and units, a legend and a
title; :func:`png_bytes` renders one for files and for embedding in HTML. A notebook shows
the returned figures directly.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from workbench.review import statistics
from workbench.review.diagnostics import Series

# Large type and thick lines: the figures are shown on a projector in team meetings. The one
# place for text sizes (no figure sets its own): a three-panel figure is shown at about 70 % on
# a 1280-px-wide screen, which keeps its tick labels at 16 px and more there.
STYLE: dict[Any, Any] = {  # rcParams keys are Literal-typed in matplotlib's stubs
    "font.size": 17,
    "axes.titlesize": 19,
    "axes.labelsize": 17,
    "legend.fontsize": 16,
    "xtick.labelsize": 17,
    "ytick.labelsize": 17,
    "figure.titlesize": 20,
    "lines.linewidth": 2.4,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
PANEL_SIZE = (5.6, 4.2)  # inches per panel
DPI = 100
# Legend entries and bar labels longer than this are cut with an ellipsis: one long label
# (a point whose params all differ) would otherwise widen the whole figure past any screen.
LABEL_CHARS = 60
LABEL_EM = 0.62  # a legend character's mean width in em (DejaVu Sans, mixed text and digits)


@dataclass(frozen=True)
class Curves:
    """One point's series of one metric: a line per point, a band across seeds."""

    label: str
    color: str
    series: Sequence[Series]  # one per seed (run)


@dataclass(frozen=True)
class TimeSplit:
    """Mean seconds per iteration of one point, by phase."""

    label: str
    rollout_s: float
    update_s: float
    eval_s: float  # evaluation, averaged over all iterations (0 when none ran)


@dataclass(frozen=True)
class GridMetric:
    """One heatmap panel: which cell value, its title, unit and number format."""

    key: str
    title: str
    unit: str
    fmt: str  # e.g. "{:.0f}"
    higher_is_better: bool


NO_VALUE = "#dddddd"  # a heatmap cell without a value
ISO_BATCH_ZORDER = 3  # the dashed lines joining equal samples per update: above the cells,
CELL_TEXT_ZORDER = 4  # below the cells' numbers


# The heatmap panels of a report: keys of the cells report.grid_cells computes.
GRID_METRICS = (
    GridMetric("reward", "Final eval reward", "mean return", "{:.1f}", True),
    GridMetric("fps", "Throughput", "env steps/s", "{:.0f}", True),
    GridMetric("wall", "Training time", "s", "{:.1f}", False),
)


def palette(labels: Sequence[str]) -> dict[str, str]:
    """A stable color per label (tab10, then tab20 for more than ten points)."""
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: matplotlib.colors.to_hex(cmap(i % cmap.N)) for i, label in enumerate(labels)}


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG, every text drawn as written (see :func:`plain_text`)."""
    plain_text(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight", facecolor="white")
    return buffer.getvalue()


def short(label: str, limit: int = LABEL_CHARS) -> str:
    """``label`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return label if len(label) <= limit else label[: limit - 1] + "…"


def plain_text(fig: Figure) -> None:
    """Turn mathtext off for every text of ``fig``.

    Labels, legends and titles carry run names, tags and params: data from the store. With
    mathtext on, a ``$`` in them is parsed as TeX, and a value such as ``$\\undefined{$``
    makes the whole report fail; the figures use no mathtext of their own.
    """
    for text in fig.findobj(matplotlib.text.Text):
        text.set_parse_math(False)


def new_figure(panels: int, rows: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure with ``panels`` axes laid out in ``rows`` rows."""
    cols = -(-panels // rows)
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(PANEL_SIZE[0] * cols, PANEL_SIZE[1] * rows),
                     layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return fig, axes[:panels]


# --------------------------------------------------------------------------- curves


def mean_band(series: Sequence[Series]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) over the runs reaching each step (:func:`statistics.mean_curve`):
    a run stopped early counts up to its last step, and the line goes on with the others."""
    curve = statistics.mean_curve(series)
    return curve.steps, curve.mean, curve.std


def draw_curves(ax: Axes, curves: Sequence[Curves], *, title: str, ylabel: str,
                threshold: float | None = None) -> None:
    """Mean line and ±std band per point on ``ax``; a dashed red line at ``threshold``."""
    with matplotlib.rc_context(STYLE):
        drawn = 0
        for c in curves:
            steps, mean, std = mean_band(c.series)
            if not len(steps):
                continue
            runs = len([s for s in c.series if len(s)])
            label = short(c.label) if runs == 1 else f"{short(c.label)} ({runs} runs)"
            ax.plot(steps, mean, color=c.color, label=label, marker="o" if len(steps) < 8 else "")
            if runs > 1:
                ax.fill_between(steps, mean - std, mean + std, color=c.color, alpha=0.18)
            drawn += 1
        if threshold is not None:  # named in the legend: a label in the panel sits on curves
            ax.axhline(threshold, color="crimson", linestyle="--", linewidth=2,
                       label=f"{title.splitlines()[0]}: threshold {threshold:g}")
        ax.set_title(title)
        ax.set_xlabel("environment steps")
        ax.set_ylabel(ylabel)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # tick labels at 17 pt never touch
        ax.ticklabel_format(axis="y", useOffset=False)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center")


def legend_below(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for all panels, under them (the panels stay free for the curves), in as
    many columns as fit the panels' width: long labels make it taller, never wider than the
    figure, so the page never shrinks the plots to show the legend."""
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        with matplotlib.rc_context(STYLE):
            fig.legend(handles, labels, loc="outside lower center", frameon=False,
                       ncol=legend_columns(labels, fig.get_figwidth()))


def suptitle(fig: Figure, text: str) -> None:
    """The figure's title, wrapped to the figure's width: a title wider than the panels
    would widen the PNG and the page would shrink the plots to show it."""
    em_in = float(STYLE["figure.titlesize"]) / 72
    width = max(20, int(fig.get_figwidth() / (LABEL_EM * em_in)))
    with matplotlib.rc_context(STYLE):
        fig.suptitle(textwrap.fill(text, width))


def legend_columns(labels: Sequence[str], width_in: float) -> int:
    """How many legend entries of these labels fit side by side in ``width_in`` inches (at
    most 4): each entry is its handle and spacing (~4 em) plus its longest label."""
    em_in = float(STYLE["legend.fontsize"]) / 72
    entry_in = (4 + LABEL_EM * max(len(label) for label in labels)) * em_in
    return max(1, min(4, len(labels), int(width_in // entry_in)))


def reward_figure(training: Sequence[Curves], evaluation: Sequence[Curves]) -> Figure:
    """Episode reward vs environment steps per point (mean ± std over runs)."""
    panels = 2 if any(len(s) for c in evaluation for s in c.series) else 1
    fig, axes = new_figure(panels)
    draw_curves(axes[0], training, title="Training episodes\nrollout/ep_rew_mean",
                ylabel="mean episode return")
    if panels == 2:
        draw_curves(axes[1], evaluation, title="Deterministic evaluation\neval/mean_reward",
                    ylabel="mean episode return")
    legend_below(fig, axes)
    suptitle(fig, "Reward vs environment steps per point (line: mean, band: ±1 std over runs)")
    return fig


def signals_figure(entropy: Sequence[Curves], clip_fraction: Sequence[Curves],
                   approx_kl: Sequence[Curves], *, clip_max: float, kl_max: float) -> Figure:
    """Entropy, clip_fraction and approx KL vs steps, thresholds drawn in."""
    fig, axes = new_figure(3)
    draw_curves(axes[0], entropy, title="Policy entropy\ntrain/entropy",
                ylabel="entropy (nats)")
    draw_curves(axes[1], clip_fraction, title="Clip fraction\ntrain/clip_fraction",
                ylabel="fraction clipped", threshold=clip_max)
    draw_curves(axes[2], approx_kl, title="Approximate KL\ntrain/approx_kl",
                ylabel="KL old || new (nats)", threshold=kl_max)
    legend_below(fig, axes)
    suptitle(fig, "PPO update signals vs environment steps (mean ± std over runs)")
    return fig


def off_policy_signals_figure(ent_coef: Sequence[Curves], critic_loss: Sequence[Curves],
                              actor_loss: Sequence[Curves], *, ent_coef_min: float) -> Figure:
    """SAC/TD3/TQC/CrossQ: entropy coefficient (log scale), critic and actor loss vs steps."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = new_figure(3)
    draw_curves(axes[0], ent_coef, title="Entropy coefficient\ntrain/ent_coef",
                ylabel="coefficient (log scale)", threshold=ent_coef_min)
    axes[0].set_yscale("log")  # plain tick labels: the report's style renders no mathtext
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes[0].yaxis.set_minor_formatter(NullFormatter())
    draw_curves(axes[1], critic_loss, title="Critic loss\ntrain/critic_loss", ylabel="loss")
    draw_curves(axes[2], actor_loss, title="Actor loss\ntrain/actor_loss", ylabel="loss")
    legend_below(fig, axes)
    suptitle(fig, "Off-policy update signals vs environment steps (mean ± std over runs)")
    return fig


# --------------------------------------------------------------------------- grid heatmaps


def grid_figure(cells: Mapping[tuple[int, int], Mapping[str, float]],
                metrics: Sequence[GridMetric]) -> Figure:
    """Heatmaps over num_envs x n_steps, one panel per metric, iso-batch diagonals marked.

    ``cells`` maps (num_envs, n_steps) to the cell's values (means over seeds). Cells with
    the same num_envs * n_steps (samples per update) are joined by a dashed line.
    """
    xs = sorted({ne for ne, _ in cells})
    ys = sorted({ns for _, ns in cells})
    fig, axes = new_figure(len(metrics))
    for ax, metric in zip(axes, metrics, strict=True):
        grid = np.full((len(ys), len(xs)), np.nan)
        for (ne, ns), values in cells.items():
            grid[ys.index(ns), xs.index(ne)] = values.get(metric.key, np.nan)
        draw_heatmap(ax, grid, xs, ys, metric)
        draw_iso_batch(ax, cells, xs, ys)
    suptitle(fig, "Final values over the num_envs × n_steps grid "
                  "(mean over seeds; dashed: equal samples per update)")
    return fig


def draw_heatmap(ax: Axes, grid: np.ndarray, xs: Sequence[int], ys: Sequence[int],
                 metric: GridMetric, notes: Mapping[tuple[int, int], str] | None = None) -> None:
    """One annotated heatmap panel with a colorbar; ``notes`` ((row, col) -> text) replace
    the number of a cell (e.g. "not reached")."""
    with matplotlib.rc_context(STYLE):
        cmap = matplotlib.colormaps["viridis" if metric.higher_is_better else "viridis_r"]
        cmap = cmap.with_extremes(bad=NO_VALUE)
        masked = np.ma.masked_invalid(grid)
        image = ax.imshow(masked, cmap=cmap, origin="lower", aspect="auto")
        finite = grid[np.isfinite(grid)]
        if len(finite):  # no scale to show for a grid without values (e.g. all "not reached")
            ax.figure.colorbar(image, ax=ax, label=metric.unit)  # type: ignore[union-attr]
        middle = (finite.min() + finite.max()) / 2 if len(finite) else 0.0
        for (row, col), value in np.ndenumerate(grid):
            text = metric.fmt.format(value) if np.isfinite(value) else "n/a"
            text = (notes or {}).get((row, col), text)
            light = np.isfinite(value) and ((value < middle) == metric.higher_is_better)
            # On a patch of its cell's color, above the iso-batch lines: a line through the
            # cell stops at the number instead of crossing it.
            cell = image.cmap(image.norm(value)) if np.isfinite(value) else NO_VALUE
            ax.text(col, row, text, ha="center", va="center", fontweight="bold",
                    color="white" if light else "black", zorder=CELL_TEXT_ZORDER,
                    bbox={"boxstyle": "round,pad=0.3", "fc": cell, "ec": "none"})
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_yticks(range(len(ys)), [str(y) for y in ys])
        ax.set_xlabel("num_envs (parallel environments)")
        ax.set_ylabel("n_steps (per env)")
        ax.set_title(f"{metric.title} ({metric.unit})")
        ax.grid(False)


def draw_iso_batch(ax: Axes, cells: Mapping[tuple[int, int], object], xs: Sequence[int],
                   ys: Sequence[int]) -> None:
    """Dashed lines through grid cells with equal num_envs * n_steps, labelled by that size.

    No legend: in a heatmap panel it covers cells; the figure's title or caption says what the
    dashed lines are."""
    by_batch: dict[int, list[tuple[int, int]]] = {}
    for ne, ns in cells:
        by_batch.setdefault(ne * ns, []).append((xs.index(ne), ys.index(ns)))
    with matplotlib.rc_context(STYLE):
        for batch, points in sorted(by_batch.items()):
            if len(points) < 2:
                continue
            points.sort()
            cols, rows = zip(*points, strict=True)
            ax.plot(cols, rows, linestyle="--", color="white", linewidth=2.5, alpha=0.9,
                    zorder=ISO_BATCH_ZORDER)
            ax.annotate(f"{batch} samples", (cols[-1], rows[-1]), textcoords="offset points",
                        xytext=(0, -30), ha="center", color="white", fontweight="bold",
                        zorder=CELL_TEXT_ZORDER + 1,
                        bbox={"boxstyle": "round", "fc": "black", "alpha": 0.55, "lw": 0})


# --------------------------------------------------------------------------- time split


def time_split_figure(rows: Sequence[TimeSplit]) -> Figure:
    """Stacked bars per point: seconds per iteration collecting, updating, evaluating."""
    fig, (ax,) = new_figure(1)
    fig.set_size_inches(PANEL_SIZE[0] * 2, max(3.5, 1.0 + 0.75 * len(rows)))
    labels = [short(r.label) for r in rows]
    rollout = np.array([r.rollout_s for r in rows])
    update = np.array([r.update_s for r in rows])
    evaluation = np.array([r.eval_s for r in rows])
    with matplotlib.rc_context(STYLE):
        y = np.arange(len(rows))
        ax.barh(y, rollout, color="#1f77b4", label="rollout (simulation, CPU)")
        ax.barh(y, update, left=rollout, color="#ff7f0e", label="update (PPO epochs)")
        if np.any(evaluation > 0):
            ax.barh(y, evaluation, left=rollout + update, color="#7f7f7f", label="evaluation")
        totals = rollout + update + evaluation
        for i, total in enumerate(totals):
            share = rollout[i] / (rollout[i] + update[i]) if rollout[i] + update[i] else 0.0
            ax.text(total, i, f"  {total:.2f} s ({share:.0%} rollout)", va="center")
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set_xlim(0, float(np.max(totals)) * 1.35 if len(totals) and np.max(totals) > 0 else 1)
        ax.set_xlabel("seconds per iteration (mean over iterations and seeds)")
        ax.set_title("Time split per PPO iteration: rollout vs update")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.2 / max(1, len(rows))),
                  ncol=3, frameon=False)
        ax.grid(axis="y", visible=False)
    return fig


# --------------------------------------------------------------------------- trade-off


TARGET_METRIC = GridMetric("seconds", "Time to target", "training seconds", "{:.1f}", False)


def target_grid_figure(cells: Mapping[tuple[int, int], float],
                       notes: Mapping[tuple[int, int], str], target: float) -> Figure:
    """Heatmap of the training seconds to ``target`` over num_envs x n_steps; ``notes`` per
    (num_envs, n_steps) cell say "not reached" (never drawn as 0) or how many seeds did."""
    xs = sorted({ne for ne, _ in cells})
    ys = sorted({ns for _, ns in cells})
    grid = np.full((len(ys), len(xs)), np.nan)
    for (ne, ns), value in cells.items():
        grid[ys.index(ns), xs.index(ne)] = value
    fig, (ax,) = new_figure(1)
    fig.set_size_inches(PANEL_SIZE[0] * 1.3, PANEL_SIZE[1])
    draw_heatmap(ax, grid, xs, ys, TARGET_METRIC,
                 {(ys.index(ns), xs.index(ne)): text for (ne, ns), text in notes.items()})
    draw_iso_batch(ax, cells, xs, ys)
    with matplotlib.rc_context(STYLE):
        ax.set_title(f"Training seconds to return {target:g} (mean over seeds)")
    return fig


def profile_figure(profiles: Mapping[str, Any], colors: Mapping[str, str], task: str, *,
                   score: str = "final return") -> Figure:
    """Performance profiles (:class:`workbench.review.statistics.Profile` per point label):
    fraction of runs above each score threshold, with bands; ``score`` names the score
    (a normalized score across tasks, say)."""
    fig, (ax,) = new_figure(1)
    fig.set_size_inches(PANEL_SIZE[0] * 1.6, PANEL_SIZE[1])
    with matplotlib.rc_context(STYLE):
        for label, profile in profiles.items():
            ax.plot(profile.taus, profile.fraction, color=colors[label], label=short(label))
            ax.fill_between(profile.taus, profile.low, profile.high, color=colors[label],
                            alpha=0.18)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(f"{score} threshold τ")
        ax.set_ylabel(f"fraction of runs with {score.split()[-1]} > τ")
        ax.set_title(f"Performance profile over seeds ({task})")
        ax.legend(loc="lower left")
    return fig
