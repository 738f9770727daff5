"""Building blocks of the schema's fields: declared ranges, layer sizes and shared enums.

A field made with :func:`ranged` or :func:`sizes` carries its valid range in its metadata;
:mod:`workbench.config.checks` checks every such field of a composed config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Activation(StrEnum):
    """Hidden-layer activation of the actor and critic (``algo.policy.activation``)."""

    tanh = "tanh"
    relu = "relu"
    elu = "elu"


class Schedule(StrEnum):
    """How a value evolves over training (``algo.lr_schedule``, ``algo.clip_range_schedule``).

    ``linear`` is rl-baselines3-zoo's ``lin_<value>``: from the configured value down to 0
    at the end of ``total_timesteps``.
    """

    constant = "constant"
    linear = "linear"



@dataclass(frozen=True)
class Range:
    """The valid values of a number field, checked by :mod:`workbench.config.checks`."""

    low: float | None = None
    high: float | None = None
    above: bool = False  # ``low`` itself is not valid (``> low`` rather than ``>= low``)
    example: str = ""  # a valid value for the error message

    def contains(self, value: float) -> bool:
        """True for a finite ``value`` inside the range."""
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return False
        return self.high is None or value <= self.high

    def describe(self) -> str:
        """``>= 1``, ``> 0``, ``in [0, 1]``, ``finite``."""
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.above else '['}{low}, {high}]"
        if self.low is not None:
            return f"{'>' if self.above else '>='} {low}"
        return "finite" if self.high is None else f"<= {high}"


def _number(value: float | None) -> str:
    """``1``, ``0.5``, ``4294927295``: integers without a decimal point or an exponent."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def ranged(default: Any, low: float | None = None, high: float | None = None, *,
           above: bool = False, example: Any) -> Any:
    """A field with a default and the range its values must lie in (``None`` always passes)."""
    return field(default=default,
                 metadata={"range": Range(low, high, above, str(example))})


def sizes(*default: int, example: str) -> Any:
    """A list-of-layer-sizes field; each size must be >= 1."""
    return field(default_factory=lambda: list(default),
                 metadata={"each": Range(1, example=example)})

