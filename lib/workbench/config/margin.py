"""A non-inferiority margin as written: ``5%`` of the baseline's IQM, or a return such as ``50``.

``workbench compare --margin`` and a verification sweep (``sweep=verify``,
``sweep.verify.margin``) read it here, before anything loads: a margin at or below 0, or a
percentage at or above 100 %, is a :class:`ConfigError` naming the setting and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.config.errors import ConfigError


@dataclass(frozen=True)
class Margin:
    """How much worse B may be than A and still count as not worse.

    ``relative``: ``value`` is a fraction of A's IQM (0.05 for ``5%``); otherwise it is a
    return (an absolute difference of the scores).
    """

    value: float
    relative: bool

    def text(self) -> str:
        """``5 %``, ``0.1 %``, ``50``."""
        return f"{self.value * 100:g} %" if self.relative else f"{self.value:g}"

    def written(self) -> str:
        """As given on a command line: ``5%``, ``50``."""
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


def parse_margin(text: str | float, setting: str) -> Margin:
    """``5%`` (a share of A's IQM, above 0 and below 100 %) or a positive return (``50``);
    anything else is a :class:`ConfigError` naming ``setting`` (``--margin``,
    ``sweep.verify.margin``)."""
    written = str(text).strip()
    shown = f"{setting}{' ' if setting.split()[-1].startswith('--') else '='}{written}"
    relative = written.endswith("%")
    number = written.removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{shown}: not a margin; give a share of A's IQM such as 5% or a "
                          "return such as 50") from None
    if not math.isfinite(value) or value <= 0 or (relative and value >= 100):
        bounds = "above 0 % and below 100 %" if relative else "above 0"
        raise ConfigError(f"{shown}: a margin must be {bounds}; give e.g. 5% (of A's IQM) or "
                          "a return such as 50")
    return Margin(value / 100 if relative else value, relative)


def parse_percent(text: str | float, setting: str) -> float:
    """A margin that must be a percentage (the time to a target: ``5%``), as a fraction."""
    margin = parse_margin(text, setting)
    if not margin.relative:
        separator = " " if setting.split()[-1].startswith("--") else "="
        raise ConfigError(f"{setting}{separator}{text}: give it as a percentage of A's time, "
                          "e.g. 5%")
    return margin.value
