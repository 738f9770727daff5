"""What ``workbench report`` is asked for: its command-line options, their defaults and the
checks of their values.

Nothing here loads MLflow, matplotlib, torch or the simulator: the CLI parses and checks a
command line with this module and the config layer alone, so a typo is answered at once;
:mod:`workbench.review.report` builds the report (the same checks, see
:func:`check_arguments`).
"""

from __future__ import annotations

import argparse
import re
import urllib.parse
from dataclasses import fields
from pathlib import Path

from workbench.config import ConfigError, WorkbenchConfig, load_config
from workbench.review.compare_request import Ref, parse_sides
from workbench.review.diagnostics import Thresholds
from workbench.tracking.redaction import redact_uri

DEFAULT_UI_URL = "http://127.0.0.1:5000"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # a report folder's name
MIN_GAIN = 0.10  # the scaling ladder's knee: a doubling that buys less throughput than this


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
                       "reward_threshold in gymnasium's registry. TASK=RETURN also sets the "
                       "task's reference for normalized scores across tasks (default: "
                       "rl-baselines3-zoo's published PPO return, where there is one)")
    trade.add_argument("--scale-min-gain", type=positive, default=MIN_GAIN, metavar="FRACTION",
                       help="the scaling ladder's knee: a doubling of num_envs that buys less "
                       f"throughput than this (default {MIN_GAIN:g})")
    trade.add_argument("--memory-budget-mb", type=positive, default=None, metavar="MIB",
                       help="... or the rung whose process tree needs more memory than this "
                       "(default: 80%% of the smallest machine's memory, from the manifests)")
    across = parser.add_argument_group("configurations across tasks")
    across.add_argument("--baseline", type=non_empty, default=None,
                        metavar="LABEL_OR_CONFIG_ID",
                        help="the configuration the others are compared with (probability of "
                        "improvement): its label as the report shows it, e.g. lr=1e-4, or its "
                        "workbench.config_id; default: the first configuration in grid order")
    across.add_argument("--compare", nargs=2, default=None, metavar=("A", "B"),
                        help="add workbench compare's section for A and B (runs, config ids "
                        "or sweep points, e.g. <sweep_id>/<point>; a point's name alone "
                        "within --sweep): what changed and whether it mattered")
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


def check_arguments(args: argparse.Namespace) -> WorkbenchConfig:
    """The checks of a report's values argparse does not make: the thresholds, the name and
    the overrides (composed and checked by the config layer); returns the config."""
    thresholds_from_args(args)
    check_name(args.name)
    compared_sides(args)
    return load_config(args.overrides)


def compared_sides(args: argparse.Namespace) -> tuple[Ref, Ref] | None:
    """``--compare A B`` as :class:`Ref` (checked), or None."""
    if not args.compare:
        return None
    a, b = args.compare
    return parse_sides("report --compare", a, b, args.sweep)


def thresholds_from_args(args: argparse.Namespace) -> Thresholds:
    """The diagnostic :class:`Thresholds` the command-line flags give (checked)."""
    return Thresholds(**{f.name: getattr(args, f.name) for f in fields(Thresholds)})


def check_name(name: str | None) -> None:
    """``--name``: a folder name of letters, digits, '.', '_' and '-' (or none: the default)."""
    if name is not None and not NAME_PATTERN.match(name):
        raise ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only")


def check_ui_url(url: str) -> str:
    """``url`` if it can be the base of run links: ``http(s)://host[...]``, no credentials.

    Every link of the report starts with it, so another scheme (``javascript:``, ``data:``,
    ``file:``) or a ``user:password@`` part would be written into each one.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--ui-url {url!r}: not an http(s) URL; give the MLflow UI's address, "
                          f"e.g. {DEFAULT_UI_URL}")
    if parts.username or parts.password:
        raise ConfigError(f"--ui-url {redact_uri(url)}: holds a user name or password, which "
                          "every link would carry; give the address without them")
    return url
