"""MLflow's built-in system metrics sampler (CPU, memory, GPU when present) for one run."""

from __future__ import annotations

import sys
from typing import Any


def start_system_metrics(run_id: str, uri: str, interval_s: float, *, resume: bool = False
                         ) -> Any:
    """Start MLflow's sampler for ``run_id``, one sample every ``interval_s`` seconds.

    On resume it continues the run's ``system/*`` steps (MLflow's ``resume_logging``).
    """
    import mlflow
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    mlflow.set_tracking_uri(uri)  # the monitor logs through the fluent client
    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=interval_s,
        samples_before_logging=1,
        resume_logging=resume,
    )
    monitor.start()
    return monitor


def stop_system_metrics(monitor: Any) -> None:
    """Stop the sampler and log its last, partial interval.

    MLflow's monitor drops the samples collected since its last publish when it is stopped,
    so a run shorter than one sampling interval would otherwise have no ``system/*`` at all.
    """
    if monitor is None:
        return
    monitor.finish()
    try:
        pending = monitor.aggregate_metrics()
        if pending:
            monitor.publish_metrics(pending)
            monitor.mlflow_logger.flush()
    except Exception as exc:  # system metrics never fail a run
        print(f"warning: last system metrics sample not logged: {exc}", file=sys.stderr)
