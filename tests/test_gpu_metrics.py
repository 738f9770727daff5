"""GPU temperature and clocks: sampled next to MLflow's system metrics, read by the report.

This machine has no GPU, so NVML is a stand-in: a fake ``pynvml`` module in ``sys.modules``
answering like two GPUs, one hot and throttled, one at its power cap. Everything else is
real: MLflow's ``SystemMetricsMonitor`` with the workbench's sampler added, an SQLite store,
the report's loader and the bottleneck verdict.
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

# MLflow's own GPU monitor binds the real pynvml when first imported; import it before the
# fake goes into sys.modules, so that only the workbench's sampler sees the stand-in.
import mlflow.system_metrics.system_metrics_monitor  # noqa: F401
import pytest
from mlflow.tracking import MlflowClient
from workbench.review import records
from workbench.review.diagnostics import Series, Thresholds, analyse_bottleneck
from workbench.review.render import gpu_health_text
from workbench.tracking.system_metrics import (
    GpuThermalMonitor,
    start_system_metrics,
    stop_system_metrics,
)

pytestmark = pytest.mark.unit


class NVMLError(Exception):
    """pynvml's error type."""


def fake_nvml(gpus: list[dict[str, float]]) -> types.ModuleType:
    """A pynvml stand-in: GPU i answers with ``gpus[i]``'s values on every call."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    nvml.nvmlInit = lambda: None  # type: ignore[attr-defined]
    nvml.samples = 0  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]

    def temperature(handle: int, sensor: int) -> float:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        nvml.samples += 1  # type: ignore[attr-defined]
        return gpus[handle]["temperature"]

    def clock(handle: int, kind: int) -> float:
        assert kind == 1  # NVML_CLOCK_SM
        return gpus[handle]["sm_clock"]

    def max_clock(handle: int, kind: int) -> float:
        if "sm_clock_max" not in gpus[handle]:
            raise NVMLError("Not Supported")
        return gpus[handle]["sm_clock_max"]

    nvml.nvmlDeviceGetTemperature = temperature  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetClockInfo = clock  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMaxClockInfo = max_clock  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCurrentClocksEventReasons = (  # type: ignore[attr-defined]
        lambda handle: int(gpus[handle]["reasons"]))
    return nvml


HOT = {"temperature": 87.0, "sm_clock": 1200.0, "sm_clock_max": 1980.0, "reasons": 0x40}
CAPPED = {"temperature": 61.0, "sm_clock": 1800.0, "sm_clock_max": 1980.0, "reasons": 0x04}


def test_sampler_reads_temperature_clocks_and_throttle_reasons(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([HOT, {**CAPPED, "reasons": 0}]))
    monitor = GpuThermalMonitor.create()
    assert monitor is not None and len(monitor.handles) == 2
    for _ in range(3):
        monitor.collect_metrics()
    assert monitor.aggregate_metrics() == {
        "gpu_0_temperature_celsius": 87.0, "gpu_0_sm_clock_mhz": 1200.0,
        "gpu_0_sm_clock_max_mhz": 1980.0, "gpu_0_thermal_throttle_percentage": 100.0,
        "gpu_0_power_throttle_percentage": 0.0,
        "gpu_1_temperature_celsius": 61.0, "gpu_1_sm_clock_mhz": 1800.0,
        "gpu_1_sm_clock_max_mhz": 1980.0, "gpu_1_thermal_throttle_percentage": 0.0,
        "gpu_1_power_throttle_percentage": 0.0,
    }


def test_sampler_skips_what_nvml_refuses_and_is_absent_without_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    no_max = {k: v for k, v in CAPPED.items() if k != "sm_clock_max"}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([no_max]))
    monitor = GpuThermalMonitor.create()
    assert monitor is not None
    monitor.collect_metrics()
    assert "gpu_0_sm_clock_max_mhz" not in monitor.aggregate_metrics()
    assert monitor.aggregate_metrics()["gpu_0_power_throttle_percentage"] == 100.0

    broken = fake_nvml([])

    def no_driver() -> None:
        raise NVMLError("Driver Not Loaded")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert GpuThermalMonitor.create() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert GpuThermalMonitor.create() is None


def test_run_records_gpu_facts_and_the_report_calls_out_throttling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's real monitor with the sampler added, on a real run, read back by the report."""
    nvml = fake_nvml([HOT, CAPPED])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("gpu")).info.run_id
    monitor = start_system_metrics(run_id, uri, interval_s=0.05)
    assert any(isinstance(m, GpuThermalMonitor) for m in monitor.monitors)
    deadline = time.monotonic() + 60
    while nvml.samples == 0 and time.monotonic() < deadline:  # the sampler thread has run
        time.sleep(0.01)
    stop_system_metrics(monitor)  # logs at least the last partial interval
    logged = client.get_run(run_id).data.metrics
    assert logged["system/gpu_0_temperature_celsius"] == 87.0
    assert logged["system/gpu_1_power_throttle_percentage"] == 100.0

    metrics = records.load_run(client, client.get_run(run_id)).metrics
    metrics["time/rollout_s"] = Series.of([1000, 2000], [0.2, 0.2])  # update-bound timing
    metrics["time/update_s"] = Series.of([1000, 2000], [0.8, 0.8])
    found = analyse_bottleneck(metrics, Thresholds())
    assert found.verdicts == ["update-bound", "GPU throttling"]
    assert found.gpu_health is not None
    assert (found.gpu_health.temperature_c, found.gpu_health.temperature_peak_c) == (87.0, 87.0)
    assert found.gpu_health.sm_clock_mhz == 1200.0  # the GPU furthest below its maximum
    assert found.gpu_health.thermal_throttle_percent == 100.0
    assert "cooling" in found.remedy and "nvidia-smi -q -d PERFORMANCE" in found.remedy
    assert gpu_health_text(found.gpu_health) == (
        "87 °C mean, 87 °C peak; SM clock 1200 of 1980 MHz (61%); slowed for heat in 100%, "
        "at the power cap in 100% of samples")
