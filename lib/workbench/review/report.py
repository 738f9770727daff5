"""``workbench report``: pick runs, load them from MLflow, write ``reports/<name>/``.

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
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import paths
from workbench.config import ConfigError, load_config
from workbench.review.diagnostics import Thresholds
from workbench.tracking.redaction import redact_uri
from workbench.tracking.store import check_server, is_embedded, resolve_tracking_uri

if TYPE_CHECKING:  # mlflow and matplotlib load on use: `workbench --help` stays fast
    from mlflow.tracking import MlflowClient
from workbench.review.records import (
    DEFAULT_UI_URL,
    NAME_PATTERN,
    Report,
    build_report,
    check_ui_url,
)
from workbench.review.render import write_report
from workbench.review.scaling import MIN_GAIN
from workbench.review.selection import Selection
from workbench.review.study import load_study, run_url, study_section
from workbench.review.tradeoff import TradeoffOptions
from workbench.tuning.storage import storage_url


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench report``'s selectors, output options, one option per threshold, overrides."""
    select = parser.add_argument_group("which runs (none: the latest sweep)")
    which = select.add_mutually_exclusive_group()
    which.add_argument("--sweep", metavar="ID", type=non_empty,
                       help="a sweep's points (its sweep id)")
    which.add_argument("--experiment", metavar="NAME", type=non_empty,
                       help="every run of an MLflow experiment")
    which.add_argument("--runs", metavar="ID,ID,...", type=run_ids, help="these runs")
    which.add_argument("--study", metavar="NAME", type=non_empty,
                       help="a tuning study's trials, with its Optuna figures (workbench tune)")
    select.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", type=tag,
                        help="only runs with this tag (repeatable)")
    parser.add_argument("--name", help="folder under reports/ (default: from the selection)")
    parser.add_argument("--out", type=Path, help="parent folder (default: reports/)")
    parser.add_argument("--ui-url", default=DEFAULT_UI_URL, type=ui_url,
                        help=f"MLflow UI base for run links (default {DEFAULT_UI_URL})")
    group = parser.add_argument_group("diagnostic thresholds")
    defaults = Thresholds()
    for f in fields(Thresholds):
        kind = int if f.type in ("int", int) else float
        default = getattr(defaults, f.name)
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind,
                           default=default,
                           help=f"{f.metadata['help']} (default {default:g})")
    trade = parser.add_argument_group("time to target, scaling ladder")
    trade.add_argument("--target-return", action="append", default=[], type=target_return,
                       metavar="[TASK=]RETURN",
                       help="target return for the time-to-target column and heatmap, for "
                       "every task or one (env name or id; repeatable); default: the task's "
                       "reward_threshold in gymnasium's registry")
    trade.add_argument("--scale-min-gain", type=positive, default=MIN_GAIN, metavar="FRACTION",
                       help="the scaling ladder's knee: a doubling of num_envs that buys less "
                       f"throughput than this (default {MIN_GAIN:g})")
    trade.add_argument("--memory-budget-mb", type=positive, default=None, metavar="MIB",
                       help="... or the rung whose process tree needs more memory than this "
                       "(default: 80%% of the smallest machine's memory, from the manifests)")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides locating the store, e.g. tracking.uri=...")


def non_empty(text: str) -> str:
    """A selector value, e.g. ``--sweep ID``: not empty."""
    if not text:
        raise argparse.ArgumentTypeError("empty value; give an id or a name")
    return text


def ui_url(text: str) -> str:
    """``--ui-url``: an http(s) address without credentials (:func:`check_ui_url`)."""
    try:
        return check_ui_url(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--ui-url ")) from exc


def target_return(text: str) -> tuple[str, float]:
    """``--target-return 950`` (every task) or ``--target-return hopper=2500``."""
    task, sep, value = text.rpartition("=")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a return, e.g. 950, or TASK=RETURN, e.g. hopper=2500") from None
    if sep and not task:
        raise argparse.ArgumentTypeError(f"{text!r}: name the task before '='")
    return task, number


def positive(text: str) -> float:
    """A number above 0."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return number


def options_from_args(args: argparse.Namespace) -> TradeoffOptions:
    """The :class:`TradeoffOptions` the command-line flags give."""
    return TradeoffOptions(targets=dict(args.target_return), min_gain=args.scale_min_gain,
                           memory_budget_mb=args.memory_budget_mb)


def run_ids(text: str) -> tuple[str, ...]:
    """``--runs a,b,c``: the run ids, none empty."""
    ids = tuple(r.strip() for r in text.split(","))
    if not all(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: give run ids separated by commas")
    return ids


def tag(text: str) -> tuple[str, str]:
    """``--tag KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: write KEY=VALUE, e.g. --tag env=hopper")
    return key, value


def selection_from_args(args: argparse.Namespace) -> Selection:
    """The :class:`Selection` the command-line flags name."""
    return Selection(args.sweep, args.experiment, args.runs or (), dict(args.tag))


def run_command(args: argparse.Namespace) -> int:
    """``workbench report``: write the report and print the path of its index.html."""
    selection = selection_from_args(args)
    thresholds = Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})
    if args.name is not None and not NAME_PATTERN.match(args.name):
        raise ConfigError(f"--name {args.name!r}: use letters, digits, '.', '_' and '-' only")
    report = open_report(selection, overrides=args.overrides, thresholds=thresholds,
                         ui_url=args.ui_url, name=args.name, study=args.study,
                         options=options_from_args(args))
    fired = sum(len(d) for d in report.diagnostics.values())
    print(f"report: {len(report.runs)} run(s), {len(report.points)} point(s), {fired} "
          f"diagnostic(s) fired ({report.selection})", file=sys.stderr)
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
) -> Report:
    """Build a report against the configured store (the CLI's and the notebook's entry).

    ``overrides`` are config overrides that locate the store (``tracking.uri=...``, and
    ``tune.storage=...`` for a study); ``MLFLOW_TRACKING_URI`` wins as everywhere.
    ``thresholds`` may be a plain dict. ``study`` reports a tuning study: its trials' runs
    plus its section (:mod:`workbench.review.study`). ``options`` set the target returns and
    the scaling ladder's knee.
    """
    if thresholds is None or isinstance(thresholds, Mapping):
        thresholds = Thresholds.from_mapping(thresholds or {})
    cfg = load_config(overrides)
    uri = resolve_tracking_uri(cfg.tracking.uri)
    if study is None:
        return build_report(open_store(uri), selection, store=uri, thresholds=thresholds,
                            ui_url=ui_url, name=name, options=options)
    optuna_study = load_study(study, storage_url(cfg.tune.storage, uri))
    client = open_store(uri)
    report = build_report(client, Selection(sweep_id=study, tags=selection.tags), store=uri,
                          thresholds=thresholds, ui_url=ui_url, name=name or f"study-{study}",
                          options=options)
    urls = {r.run_id: run_url(ui_url, r.experiment_id, r.run_id) for r in report.runs}
    report.sections.append(study_section(optuna_study, urls))
    report.title = f"Report: study {study}"
    return report


def open_store(uri: str) -> MlflowClient:
    """A client for an existing store; a missing embedded store or a server that does not
    answer is bad input (nothing created)."""
    from mlflow.tracking import MlflowClient

    if is_embedded(uri):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            raise ConfigError(f"tracking store {redact_uri(uri)}: no such database; train or "
                              "sweep first, or set MLFLOW_TRACKING_URI / tracking.uri to the "
                              "team's store")
    else:
        check_server(uri)
    return MlflowClient(tracking_uri=uri)
