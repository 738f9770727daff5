"""What ``workbench compare A B`` is asked for: its options, and what A and B name.

A side is written one of three ways, told apart by its spelling alone:

- ``SWEEP_ID/POINT``: a point of a sweep, its name with or without the seed
  (``tiny-grid/halfcheetah-ne1-ns64`` is every seed of that point,
  ``tiny-grid/halfcheetah-ne1-ns64-s0`` one run); with ``--sweep ID``, ``POINT`` alone;
- ``run:ID`` or ``config:ID``: a run id, or a config id (the tag ``workbench.config_id``:
  every seed of that configuration);
- a bare ``ID``: a run id or a config id, whichever the store has (both: ambiguous, and the
  prefix says which).

Nothing here loads MLflow, numpy, torch or the simulator: the CLI checks the command line
with this module and the config layer alone, so a typo is answered at once; looking the
sides up in the store is :mod:`workbench.review.comparison`'s.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Literal

from workbench.config import ConfigError, WorkbenchConfig, load_config
from workbench.config.margin import Margin, parse_margin, parse_percent

RefKind = Literal["run", "config", "point", "any"]
PREFIXES: dict[str, RefKind] = {"run:": "run", "config:": "config"}
SYNTAX = "a run id, a config id (run:ID or config:ID to say which) or SWEEP_ID/POINT"


@dataclass(frozen=True)
class Ref:
    """One side of a comparison as written: what kind of id, the id, and the sweep of a point."""

    side: str  # how the side is named in messages: "compare A", the notebook's "compare_a"
    text: str  # as written on the command line
    kind: RefKind  # "any": a bare id, a run or a config
    value: str  # the run id, the config id or the point name
    sweep: str | None = None  # the sweep of a point

    def describe(self) -> str:
        """``run 0f3a...``, ``config 1a2b3c4d5e6f``, ``point tiny-grid/halfcheetah-ne1-ns64``."""
        if self.kind == "point":
            return f"point {self.sweep}/{self.value}"
        return f"{'id' if self.kind == 'any' else self.kind} {self.value}"


def parse_ref(side: str, text: str, sweep: str | None = None) -> Ref:
    """What ``text`` names (see the module's docstring); a malformed one is a
    :class:`ConfigError` naming the side."""
    for prefix, kind in PREFIXES.items():
        if text.startswith(prefix):
            value = text.removeprefix(prefix)
            if not value or "/" in value:
                raise ConfigError(f"{side} {text!r}: no {kind} id after {prefix!r}; "
                                  f"write {prefix}ID")
            return Ref(side, text, kind, value)
    if "/" in text:
        sweep_id, _, point = text.rpartition("/")
        if not sweep_id or not point:
            raise ConfigError(f"{side} {text!r}: a sweep point is SWEEP_ID/POINT with "
                              "both parts; e.g. tiny-grid/halfcheetah-ne1-ns64")
        return Ref(side, text, "point", point, sweep_id)
    if not text.strip():
        raise ConfigError(f"{side}: empty; give {SYNTAX}")
    if sweep:
        return Ref(side, text, "point", text, sweep)
    return Ref(side, text, "any", text)


def target(text: str) -> float:
    """``--target R``: a finite return."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a return, e.g. 950") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite return, e.g. 950")
    return value


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """``workbench compare A B [--sweep ID] [--target R] [--margin M [--time-margin P]]
    [--allow-different-tasks] [--json]``."""
    parser.add_argument("a", metavar="A", help=f"the baseline: {SYNTAX}")
    parser.add_argument("b", metavar="B", help="the change, written as A is")
    parser.add_argument("--sweep", metavar="ID",
                        help="a sweep id: A and B may then be its point names alone")
    parser.add_argument("--target", type=target, metavar="R",
                        help="a target return: how long each side took to reach it "
                        "(a negative one as --target=-50)")
    parser.add_argument("--margin", metavar="M",
                        help="is B not worse than A by more than M? a share of A's IQM "
                        "(5%%) or a return (50): not worse, worse, or undecided with the "
                        "seeds it would take")
    parser.add_argument("--time-margin", metavar="P",
                        help="with --margin and --target: is B no slower to reach the target "
                        "than A by more than P (default 5%%)?")
    parser.add_argument("--allow-different-tasks", action="store_true",
                        help="compare runs of different tasks (their returns as they are)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                        help="Hydra overrides locating the store, e.g. tracking.uri=...")


def check_arguments(args: argparse.Namespace) -> tuple[Ref, Ref, WorkbenchConfig]:
    """A and B as :class:`Ref`, and the config (its overrides composed and checked): the
    checks that need no store. The same text on both sides is one selection compared with
    itself."""
    if args.sweep is not None and not args.sweep.strip():
        raise ConfigError("compare --sweep: empty; give a sweep id (workbench report names "
                          "the latest)")
    margins(args)
    a, b = parse_sides("compare", args.a, args.b, args.sweep)
    return a, b, load_config(args.overrides)


DEFAULT_TIME_MARGIN = "5%"


def margins(args: argparse.Namespace) -> tuple[Margin | None, float | None]:
    """``--margin`` and, with ``--target``, the time margin (a fraction; ``--time-margin``,
    5 % by default): (None, None) without ``--margin``. A margin at or below 0, a percentage
    at or above 100 %, or ``--time-margin`` without ``--margin`` and ``--target`` is a
    :class:`ConfigError`."""
    if args.time_margin is not None and (args.margin is None or args.target is None):
        raise ConfigError(f"compare --time-margin {args.time_margin}: it judges the time to "
                          "--target next to --margin's verdict; give both, e.g. --margin 5% "
                          "--target 3000")
    if args.margin is None:
        return None, None
    margin = parse_margin(args.margin, "compare --margin")
    if args.target is None:
        return margin, None
    return margin, parse_percent(args.time_margin or DEFAULT_TIME_MARGIN,
                                 "compare --time-margin")


def parse_sides(command: str, a_text: str, b_text: str, sweep: str | None
                ) -> tuple[Ref, Ref]:
    """A and B of ``command`` (``compare``, ``report --compare``) as :class:`Ref`; the same
    text on both sides is one selection compared with itself: :class:`ConfigError`."""
    a = parse_ref(f"{command} A", a_text, sweep)
    b = parse_ref(f"{command} B", b_text, sweep)
    if (a.kind, a.value, a.sweep) == (b.kind, b.value, b.sweep):
        raise ConfigError(f"{command} {a_text} {b_text}: A and B are the same "
                          f"{a.describe()}; compare two different runs, configs or sweep "
                          "points")
    return a, b
