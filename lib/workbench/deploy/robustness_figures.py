"""Figures of a robustness matrix: return against each factor, and a heatmap per pair.

Built on matplotlib's object API (no pyplot, no display needed). Cells that fail are drawn in
red and the holding threshold as a dashed line, so where a policy breaks is seen at a glance.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from workbench.config.robustness import FACTORS
from workbench.deploy.robustness import Matrix, make_cell

HOLDS, FAILS, NOMINAL = "#2a7fb8", "#d62728", "#444444"
PANEL = (4.2, 3.2)


def draw(matrix: Matrix, directory: Path) -> list[str]:
    """Every figure of ``matrix`` as PNG in ``directory``; their file names."""
    names = []
    if matrix.profile.factors:
        save(factors_figure(matrix), directory / "factors.png")
        names.append("factors.png")
    for a, b in matrix.profile.pairs:
        name = f"heatmap_{a}_{b}.png"
        save(heatmap_figure(matrix, a, b), directory / name)
        names.append(name)
    return names


def save(fig: Figure, path: Path) -> None:
    """PNG with every text drawn as written (no mathtext: labels come from data)."""
    for text in fig.findobj(matplotlib.text.Text):
        text.set_parse_math(False)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight", facecolor="white")


def factors_figure(matrix: Matrix) -> Figure:
    """One panel per factor: mean return (error bar: std over episodes) against its value."""
    factors = list(matrix.profile.factors)
    cols = min(3, len(factors))
    rows = -(-len(factors) // cols)
    fig = Figure(figsize=(PANEL[0] * cols, PANEL[1] * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for extra in axes[len(factors):]:
        extra.set_visible(False)
    for ax, factor in zip(axes, factors, strict=False):
        points = matrix.factor_results(factor)
        values = [v for v, _ in points]
        means = [r.mean for _, r in points]
        ax.plot(values, means, color=NOMINAL, linewidth=1, zorder=1)
        for value, result in points:
            ax.errorbar([value], [result.mean], yerr=[result.std], fmt="o", capsize=3,
                        color=HOLDS if result.holds else FAILS, zorder=2)
        ax.axhline(matrix.threshold, color=FAILS, linestyle="--", linewidth=1,
                   label=f"holds above {matrix.threshold:,.0f}")
        ax.axvline(matrix.nominal_values[factor], color=NOMINAL, linestyle=":", linewidth=1)
        ax.set_title(factor)
        ax.set_xlabel(FACTORS[factor].help, fontsize=7, wrap=True)
        ax.set_ylabel("mean return")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{matrix.env_id}: return under each perturbation alone "
                 f"(dotted: nominal; red: fails)")
    return fig


def heatmap_figure(matrix: Matrix, a: str, b: str) -> Figure:
    """Mean return over every combination of two factors; failing cells marked ✗."""
    xs = sorted({*matrix.profile.factors[a], matrix.nominal_values[a]})
    ys = sorted({*matrix.profile.factors[b], matrix.nominal_values[b]})
    grid = np.full((len(ys), len(xs)), np.nan)
    holds = np.ones_like(grid, dtype=bool)
    for col, va in enumerate(xs):
        for row, vb in enumerate(ys):
            found = matrix.result(make_cell({a: va, b: vb}, matrix.nominal_values,
                                            matrix.profile.backend))
            if found is not None:
                grid[row, col], holds[row, col] = found.mean, found.holds
    fig = Figure(figsize=(1.2 * len(xs) + 2.5, 0.8 * len(ys) + 1.8), layout="constrained")
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, origin="lower", aspect="auto")
    fig.colorbar(image, ax=ax, label="mean return")
    for (row, col), value in np.ndenumerate(grid):
        text = "n/a" if not np.isfinite(value) else f"{value:,.0f}"
        if np.isfinite(value) and not holds[row, col]:
            text += " ✗"
        ax.text(col, row, text, ha="center", va="center", fontsize=8, fontweight="bold",
                color=FAILS if not holds[row, col] else "black",
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.7})
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    ax.set_xlabel(a)
    ax.set_ylabel(b)
    ax.set_title(f"{a} x {b}: mean return (✗: below {matrix.threshold:,.0f})")
    return fig
