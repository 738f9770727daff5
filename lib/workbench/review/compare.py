"""What ``notebooks/compare.ipynb`` calls: its selection's report, told in the notebook's words.

The notebook's parameters are ``sweep_id``, ``experiment``, ``run_ids``, ``tags`` and
``study``, not the CLI's flags: a selection that matches nothing stops the cell with one line
naming the parameter and what to set it to (with :func:`workbench.notebook.short_errors`,
no traceback). The summary under the title says how many seeds each point really has and
which runs stopped before the others, the facts a plain run count hides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workbench.config import ConfigError
from workbench.review.records import Point, Report, RunRecord
from workbench.review.report import open_report
from workbench.review.selection import Selection, SelectionError
from workbench.review.tradeoff import TradeoffOptions


def open_compare(
    *,
    sweep_id: str = "",
    study: str = "",
    experiment: str = "",
    run_ids: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    thresholds: Mapping[str, Any] | None = None,
    target_returns: Mapping[str, float] | None = None,
    overrides: Sequence[str] = (),
) -> Report:
    """The report of the notebook's parameters (all empty: the latest sweep).

    A sweep or experiment the store lacks is a :class:`ConfigError` naming the notebook's
    parameter: ``sweep_id='x': no such sweep in <store>; set sweep_id to one of a, b``.
    """
    try:
        selection = Selection(sweep_id or None, experiment or None, tuple(run_ids),
                              dict(tags or {}))
        return open_report(selection, overrides=overrides, thresholds=thresholds,
                           study=study or None,
                           options=TradeoffOptions(dict(target_returns or {})))
    except SelectionError as exc:
        raise ConfigError(exc.notebook_line()) from None


def summary_markdown(report: Report) -> str:
    """The title line, then points whose runs repeat a seed and runs that stopped early."""
    lines = [f"**{report.title}**: {len(report.runs)} run(s) at {len(report.points)} "
             f"point(s), store `{report.store}`"]
    repeated = [f"{p.label} ({p.runs_text})" for p in report.points if p.seeds < len(p.runs)]
    if repeated:
        lines.append("Seeds repeated (each seed counts once): " + "; ".join(repeated))
    stopped = [text for p in report.points for text in stopped_early(p)]
    if stopped:
        lines.append("Curves average the runs that reach each step; stopped before the "
                     "others: " + "; ".join(stopped))
    return "\n\n".join(lines)


def last_step(run: RunRecord) -> int:
    """The last environment step ``run`` logged any metric at (0 when none)."""
    return max((int(s.steps[-1]) for s in run.metrics.values() if len(s)), default=0)


def stopped_early(point: Point) -> list[str]:
    """``<point> <run> (KILLED at 5,000 of 10,000 steps)`` for each run of ``point`` that
    logged fewer steps than the point's longest run."""
    ends = {run.run_id: last_step(run) for run in point.runs}
    longest = max(ends.values(), default=0)
    return [f"{point.label} {run.name} ({run.status} at {ends[run.run_id]:,} of {longest:,} "
            "steps)" for run in point.runs if ends[run.run_id] < longest]
