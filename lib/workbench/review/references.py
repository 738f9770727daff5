"""Reference returns that put tasks on one scale: a run's normalized score is its final
return divided by its task's reference.

The one table of published figures is :data:`PUBLISHED_PPO`: rl-baselines3-zoo's PPO results
at 1M steps (its ``benchmark.md``, mean over its evaluation episodes), kept with the tasks'
other references in :mod:`workbench.envs.returns`; the benchmarks that hold the default
configurations to them (``benchmarks/final_return.py``, ``benchmarks/time_to_reward.py``)
read them here. ``workbench report --target-return
TASK=RETURN`` sets a task's reference (and its time-to-target target); a task with neither is
left out of the cross-task aggregate, and the report says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from workbench.envs.returns import PUBLISHED_PPO as PUBLISHED_PPO
from workbench.envs.returns import PUBLISHED_PPO_STD as PUBLISHED_PPO_STD
from workbench.envs.returns import PUBLISHED_SOURCE as PUBLISHED_SOURCE


@dataclass(frozen=True)
class Reference:
    """A task's reference return and where it came from; ``value`` None: none, and ``source``
    says why."""

    task: str
    value: float | None
    source: str

    def text(self) -> str:
        """``hopper: 2410 (rl-baselines3-zoo's ...)`` or ``reacher: none (why)``."""
        shown = f"{self.value:g}" if self.value is not None else "none"
        return f"{self.task}: {shown} ({self.source})"


def reference_for(task: str, env_id: str | None, targets: Mapping[str, float]) -> Reference:
    """The reference of ``task``: ``--target-return`` for the task (env name or id), else the
    published figure, else none.

    A bare ``--target-return RETURN`` (key ``""``, every task's time-to-target target) sets no
    reference: one number for several tasks puts nothing on a common scale. A reference at or
    below 0 is refused (dividing by it would reverse or break the order of returns).
    """
    for key in (task, env_id):
        if key and key in targets:
            value = float(targets[key])
            if value <= 0:
                return Reference(task, None, f"--target-return {key}={value:g} is not above 0, "
                                             "so return / reference would not order runs as "
                                             "their returns do")
            return Reference(task, value, f"--target-return {key}={value:g}")
    if task in PUBLISHED_PPO:
        return Reference(task, PUBLISHED_PPO[task], PUBLISHED_SOURCE)
    return Reference(task, None, "no published reference; set one with --target-return "
                                 f"{task}=RETURN")


def normalized(score: float, reference: Reference) -> float | None:
    """``score / reference`` (None when the task has no reference)."""
    return score / reference.value if reference.value is not None else None
