"""SB3's logger forwarded to MLflow: every dump of a PPO iteration becomes one ``log_batch``.

Metrics reach MLflow through SB3's logger extension point: :class:`MlflowWriter` is a
``KVWriter`` added to the model's logger, so every key SB3 records (``rollout/*``, ``train/*``,
``time/*``) and every key our callbacks record arrives in one batched call per PPO iteration,
at ``step = num_timesteps``.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterable, Mapping
from typing import Any

from mlflow.entities import Metric
from stable_baselines3.common.logger import KVWriter

from workbench.tracking.store import RunWrites

# SB3 records train/* inside train(), after the iteration's logs were dumped; they reach the
# logger one dump late. These keys are re-dated to the iteration they belong to.
# The off-policy algorithms' logs are dumped after their update (training/callbacks.py): no key
# is late there.
LATE_PREFIXES = ("train/", "time/update_s", "time/update_cpu_s")


def late_prefixes(off_policy: bool) -> tuple[str, ...]:
    """The keys a writer dates back one dump: PPO's and A2C's ``train/*``; none off-policy."""
    return () if off_policy else LATE_PREFIXES


def numeric_items(values: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    """The (key, float) pairs of a logger dump that MLflow can store as metrics."""
    for key, value in values.items():
        # numpy scalars register with the numbers ABCs; bools are not metrics.
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield key, float(value)


class MlflowWriter(KVWriter):
    """SB3 logger output that sends each dump to MLflow as one ``log_batch`` call.

    SB3's ``learn`` dumps the logger after each rollout and before the update, so the
    ``train/*`` values in dump k belong to the update of iteration k-1. They are logged at the
    previous dump's step so that every key of one iteration shares its ``num_timesteps``; the
    last update's values arrive with the final dump made at training end. ``late`` names the
    keys dated back (:func:`late_prefixes`; none for the off-policy algorithms).
    """

    def __init__(self, client: RunWrites, run_id: str,
                 late: tuple[str, ...] = LATE_PREFIXES) -> None:
        self.client = client
        self.run_id = run_id
        self.late = late
        self.previous_step: int | None = None
        self.calls = 0

    def write(
        self,
        key_values: dict[str, Any],
        key_excluded: dict[str, tuple[str, ...]],
        step: int = 0,
    ) -> None:
        now_ms = int(time.time() * 1000)
        metrics: list[Metric] = []
        for key, value in numeric_items(key_values):
            if key_excluded.get(key) and "mlflow" in key_excluded[key]:
                continue
            late = bool(self.late) and key.startswith(self.late)
            metric_step = self.previous_step if late and self.previous_step is not None else step
            # MLflow stores NaN/inf; they are kept so diagnostics can see a diverged run.
            metrics.append(Metric(key, value, now_ms, int(metric_step)))
        if any(not (self.late and m.key.startswith(self.late)) for m in metrics):
            # A dump with this iteration's own keys: the next late keys belong to this step.
            self.previous_step = step
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
            self.calls += 1

    def close(self) -> None:
        """Nothing to release: the client is owned by the caller."""
