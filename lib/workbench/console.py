"""What the workbench prints for people: aligned ``key: value`` headers, tables, numbers.

Plain printing only (no training or tracking imports), shared by training, sweeps and the
Hub commands: the header says what runs where, the summary table where results went.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any


def format_value(value: Any, fmt: str) -> str:
    """A number for the console; non-finite values are shown as they are."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return fmt.format(number) if math.isfinite(number) else str(number)


def print_header(lines: Mapping[str, Any]) -> None:
    """Print the run's setup once, as aligned ``key: value`` lines."""
    width = max(len(k) for k in lines)
    print("-" * 72)
    for key, value in lines.items():
        print(f"{key:<{width}} : {value}")
    print("-" * 72, flush=True)


def print_table(rows: Sequence[tuple[str, Any]], title: str) -> None:
    """Print a two-column summary table."""
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}")
    print("=" * 72)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("=" * 72, flush=True)


# C0 and C1 controls, DEL, and the characters that reorder or hide text on a terminal
# (bidirectional overrides and isolates, zero-width joiners): ESC starts the sequences that
# write the clipboard (OSC 52), retitle the window or move the cursor.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe to print in one line: every control character as visible ``\\x1b``-style
    text (``\\n`` and ``\\t`` too), so run data (names, tags, manifests) written by anyone with
    access to a store can neither send escape sequences to the terminal nor forge a line."""
    return _CONTROLS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def printable_lines(text: str) -> str:
    """Several lines of run data safe to print: each line through :func:`printable`."""
    return "\n".join(printable(line) for line in text.split("\n"))
