"""What the workbench prints for people: aligned ``key: value`` headers, tables, numbers.

Plain printing only (no training or tracking imports), shared by training, sweeps and the
Hub commands: the header says what runs where, the summary table where results went.
:func:`printable` makes a value read from a store or another process safe to print or to
write into a line of a file (no terminal escapes, no line breaks it did not come with).
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

# ECMA-48 escape sequences a terminal acts on: CSI (colours, cursor moves: ESC [ ... final
# byte), OSC (window titles, hyperlinks: ESC ] ... BEL or ESC \\) and the other two-byte
# ESC sequences; the C1 forms (0x9b CSI, 0x9d OSC) too.
ANSI_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[@-Z\\^_]"
)
# C0 and C1 control characters (DEL included; ESC starts the sequences that write the
# clipboard (OSC 52), retitle the window or move the cursor), the Unicode line and paragraph
# separators (str.splitlines, and so pip's requirements parser, breaks lines at those too),
# and the characters that reorder or hide text (bidirectional overrides and isolates,
# zero-width joiners).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colour codes, titles, cursor moves)."""
    return ANSI_ESCAPE.sub("", text)


def printable(text: str, keep_lines: bool = False) -> str:
    """``text`` safe to print: every control character shown as visible ``\\x1b``-style text
    (newlines and tabs too unless ``keep_lines``), so a value from data (names, tags,
    manifests written by anyone with access to a store) can neither drive the terminal nor
    start a line of its own, and a person still sees that it held something odd."""
    keep = "\n\t" if keep_lines else ""

    def escaped(match: re.Match[str]) -> str:
        char = match[0]
        return char if char in keep else char.encode("unicode_escape").decode("ascii")

    return CONTROL.sub(escaped, text)


def printable_lines(text: str) -> str:
    """Several lines of run data safe to print: :func:`printable`, line breaks kept."""
    return printable(text, keep_lines=True)


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


# With output redirected (a log file, CI, nohup) a progress bar is one line every this many
# seconds: a bar's carriage-return refreshes would add thousands of lines an hour to the log.
LOG_PROGRESS_EVERY_S = 60.0


def in_jupyter_kernel() -> bool:
    """True when this process is a Jupyter kernel running cells (JupyterLab, papermill); a
    process that merely imported ipykernel (a test, a tool) is not one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def interactive(stream: IO[str]) -> bool:
    """True for a terminal or a Jupyter kernel's stream, where a live bar redraws in place."""
    if in_jupyter_kernel():
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressLines:
    """A progress bar for a log: ``desc: 3/8 points (37%), 2m10s`` every ``every_s`` seconds
    and when it closes; ``write`` prints a line (tqdm's interface, as the callers use it)."""

    def __init__(self, total: int | None, desc: str, unit: str, file: IO[str],
                 every_s: float = LOG_PROGRESS_EVERY_S) -> None:
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.every_s = every_s
        self.n = 0
        self.started = self.shown_at = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.shown_at >= self.every_s:
            self.show()

    def write(self, text: str, file: IO[str] | None = None) -> None:
        print(text, file=file or self.file, flush=True)

    def show(self) -> None:
        self.shown_at = time.monotonic()
        elapsed = int(self.shown_at - self.started)
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        done = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        print(f"{self.desc}: {done} {self.unit}s{share}, {elapsed // 60}m{elapsed % 60:02d}s",
              file=self.file, flush=True)

    def close(self) -> None:
        self.show()


def progress(total: int | None, desc: str, unit: str, file: IO[str] | None = None,
             leave: bool = True) -> Any:
    """A live tqdm bar on a terminal or in Jupyter; :class:`ProgressLines` otherwise."""
    stream = file or sys.stderr
    if not interactive(stream):
        return ProgressLines(total, desc, unit, stream)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc or None, unit=unit, dynamic_ncols=True, file=stream,
                leave=leave)



def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.2 h``: a span as a person reads it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
