"""What the workbench prints for people: aligned ``key: value`` headers, tables, numbers.

Plain printing only (no training or tracking imports), shared by training, sweeps and the
Hub commands: the header says what runs where, the summary table where results went.
"""

from __future__ import annotations

import math
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
