"""MLflow's built-in system metrics sampler (CPU, memory, GPU when present) for one run.

MLflow's own GPU monitor logs utilization, memory and power. :class:`GpuThermalMonitor`
adds what shows thermal throttling, from the same NVML library (``nvidia-ml-py``) and at the
same samples: temperature, SM clock against its maximum, and how often the driver slowed the
clocks for heat or power (``system/gpu_<i>_temperature_celsius``, ``..._sm_clock_mhz``,
``..._sm_clock_max_mhz``, ``..._thermal_throttle_percentage``,
``..._power_throttle_percentage``). The report's "Where the time goes" reads them
(``workbench/review/diagnostics.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

# NVML's clocks-event reason bits (nvmlClocksEventReason*; stable across driver versions).
THERMAL_REASONS = 0x20 | 0x40  # software and hardware thermal slowdown
POWER_REASONS = 0x04 | 0x80  # software power cap, hardware power brake
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1


class GpuThermalMonitor(BaseMetricsMonitor):
    """Temperature, SM clocks and throttle reasons of every NVIDIA GPU, one value per sample.

    A sampler of MLflow's ``SystemMetricsMonitor``: it calls :meth:`collect_metrics` at each
    sample and logs :meth:`aggregate_metrics` (means over the samples of one interval) as
    ``system/<name>``. A reading NVML refuses (a GPU without a sensor, an old driver) is left
    out; it never fails a run.
    """

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        super().__init__()
        self.nvml = nvml
        self.handles = handles
        # Newer NVML calls them clocks-event reasons; drivers before 535 only know the old name.
        self.reasons: Callable[[Any], int] | None = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))

    @classmethod
    def create(cls) -> GpuThermalMonitor | None:
        """A monitor over every GPU NVML sees; None without NVML, a driver or a GPU."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                       for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:
            return None
        return cls(pynvml, handles) if handles else None

    def collect_metrics(self) -> None:
        nvml = self.nvml
        for i, handle in enumerate(self.handles):
            readings = {
                "temperature_celsius": (nvml.nvmlDeviceGetTemperature, NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": (nvml.nvmlDeviceGetClockInfo, NVML_CLOCK_SM),
                "sm_clock_max_mhz": (nvml.nvmlDeviceGetMaxClockInfo, NVML_CLOCK_SM),
            }
            for name, (read, kind) in readings.items():
                value = self._read(read, handle, kind)
                if value is not None:
                    self._metrics[f"gpu_{i}_{name}"].append(float(value))
            reasons = self._read(self.reasons, handle) if self.reasons else None
            if reasons is not None:
                # 100 or 0 per sample: the interval's mean is the share of samples throttled.
                self._metrics[f"gpu_{i}_thermal_throttle_percentage"].append(
                    100.0 if int(reasons) & THERMAL_REASONS else 0.0)
                self._metrics[f"gpu_{i}_power_throttle_percentage"].append(
                    100.0 if int(reasons) & POWER_REASONS else 0.0)

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items() if v}

    def _read(self, read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except self.nvml.NVMLError:  # not supported on this GPU or driver: leave it out
            return None


def start_system_metrics(run_id: str, uri: str, interval_s: float, *, resume: bool = False
                         ) -> Any:
    """Start MLflow's sampler for ``run_id``, one sample every ``interval_s`` seconds.

    On resume it continues the run's ``system/*`` steps (MLflow's ``resume_logging``).
    """
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    # The monitor's own tracking_uri: mlflow.set_tracking_uri would also export
    # MLFLOW_TRACKING_URI for the whole process, and the next run of a notebook (or of any
    # caller) would then log into this run's store whatever its tracking.uri says.
    monitor = SystemMetricsMonitor(
        run_id,
        sampling_interval=interval_s,
        samples_before_logging=1,
        resume_logging=resume,
        tracking_uri=uri,
    )
    # The monitor samples, aggregates, logs and clears every entry of its `monitors` list:
    # one more there is logged with MLflow's own system metrics, at the same steps.
    thermal = GpuThermalMonitor.create()
    if thermal is not None:
        monitor.monitors.append(thermal)
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
