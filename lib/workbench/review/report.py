"""``workbench report``: pick runs, load them from MLflow, write ``reports/<name>/``.

Its options and the checks of their values are :mod:`workbench.review.options`.

``workbench report --sweep ID | --experiment NAME | --runs ID,ID,... | --study NAME`` (no
selector: the latest sweep) loads the runs' metric histories and manifests
(:mod:`workbench.review.records`),
ranks the grid points by final evaluation reward, runs the diagnostics and bottleneck
analysis (:mod:`workbench.review.diagnostics`), draws the figures
(:mod:`workbench.review.figures`) and writes ``index.html`` and ``report.md``
(:mod:`workbench.review.render`). ``notebooks/compare.ipynb`` calls :func:`open_report` and
shows the same figures and tables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from workbench import paths
from workbench.config import load_config
from workbench.console import printable
from workbench.review.compare_request import Ref
from workbench.review.comparison import compare, comparison_section
from workbench.review.diagnostics import Thresholds
from workbench.review.options import (
    DEFAULT_UI_URL,
    check_name,
    compared_sides,
    thresholds_from_args,
)
from workbench.review.records import Report, build_report, open_store
from workbench.review.render import write_report
from workbench.review.selection import Selection
from workbench.review.study import load_study, run_url, study_section
from workbench.review.tradeoff import TradeoffOptions
from workbench.review.verification import verification_section
from workbench.tracking.store import resolve_tracking_uri
from workbench.tuning.storage import storage_url


def options_from_args(args: argparse.Namespace) -> TradeoffOptions:
    """The :class:`TradeoffOptions` the command-line flags give."""
    return TradeoffOptions(targets=dict(args.target_return), min_gain=args.scale_min_gain,
                           memory_budget_mb=args.memory_budget_mb, baseline=args.baseline)


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The :class:`Selection` the command-line flags name."""
    return Selection(args.sweep, args.experiment, args.runs or (), dict(args.tag))


def run_command(args: argparse.Namespace) -> int:
    """``workbench report``: write the report and print the path of its index.html."""
    selection = selection_from_args(args)
    thresholds = thresholds_from_args(args)
    check_name(args.name)
    report = open_report(selection, overrides=args.overrides, thresholds=thresholds,
                         ui_url=args.ui_url, name=args.name, study=args.study,
                         options=options_from_args(args), compared=compared_sides(args))
    fired = sum(len(d) for d in report.diagnostics.values())
    print(f"report: {len(report.runs)} run(s), {len(report.points)} point(s), {fired} "
          f"diagnostic(s) fired ({printable(str(report.selection))})", file=sys.stderr)
    index = write_report(report, (args.out or paths.reports_dir()) / report.name)
    print(index)
    return 0


def open_report(
    selection: Selection = Selection(),  # noqa: B008  (frozen)
    *,
    overrides: Sequence[str] = (),
    thresholds: Thresholds | Mapping[str, Any] | None = None,
    ui_url: str = DEFAULT_UI_URL,
    name: str | None = None,
    study: str | None = None,
    options: TradeoffOptions | None = None,
    compared: tuple[Ref, Ref] | None = None,
) -> Report:
    """Build a report against the configured store (the CLI's and the notebook's entry).

    ``overrides`` are config overrides that locate the store (``tracking.uri=...``, and
    ``tune.storage=...`` for a study); ``MLFLOW_TRACKING_URI`` wins as everywhere.
    ``thresholds`` may be a plain dict. ``study`` reports a tuning study: its trials' runs
    plus its section (:mod:`workbench.review.study`). ``options`` set the target returns and
    the scaling ladder's knee. ``compared`` adds ``workbench compare``'s section for its two
    sides (:mod:`workbench.review.comparison`).
    """
    if thresholds is None or isinstance(thresholds, Mapping):
        thresholds = Thresholds.from_mapping(thresholds or {})
    cfg = load_config(overrides)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    if study is None:
        client = open_store(uri)
        report = build_report(client, selection, store=uri, thresholds=thresholds,
                              ui_url=ui_url, name=name, options=options)
    else:
        optuna_study = load_study(study, storage_url(cfg.tune.storage, uri))
        client = open_store(uri)
        report = build_report(client, Selection(sweep_id=study, tags=selection.tags),
                              store=uri, thresholds=thresholds, ui_url=ui_url,
                              name=name or f"study-{study}", options=options)
        urls = {r.run_id: run_url(ui_url, r.experiment_id, r.run_id) for r in report.runs}
        report.sections.append(study_section(optuna_study, urls))
        report.title = f"Report: study {study}"
    if compared is not None:
        report.sections.append(comparison_section(compare(client, *compared, store=uri,
                                                          allow_different_tasks=True)))
    parents = {r.tags.get("mlflow.parentRunId") for r in report.runs}
    if len(parents) == 1 and None not in parents:  # one sweep's points: its verification
        verified = verification_section(client, str(parents.pop()))
        if verified is not None:
            report.sections.insert(0, verified)
    return report
