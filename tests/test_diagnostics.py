"""Diagnostics and bottleneck verdicts on synthetic runs with exactly known series.

Each synthetic run is logged to a real (temporary) MLflow SQLite store and read back through
the report's loader, so NaN/inf and step ordering go through MLflow exactly as in a report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from workbench.config import ConfigError
from workbench.review import records
from workbench.review.diagnostics import (
    Series,
    Thresholds,
    analyse_bottleneck,
    diagnose,
    longest_streak,
)

ITERATIONS = 20
STEP = 1000
BUDGET = ITERATIONS * STEP
Values = dict[str, list[float]]


def healthy() -> Values:
    """A run that learns steadily: every check must stay silent on it."""
    k = np.arange(1, ITERATIONS + 1, dtype=float)
    return {
        "rollout/ep_rew_mean": list(-100 + 50 * k),
        "eval/mean_reward": list(-90 + 50 * k),
        "train/clip_fraction": [0.1] * ITERATIONS,
        "train/approx_kl": [0.01] * ITERATIONS,
        "train/std": list(1.0 - 0.01 * k),
        "train/entropy": list(8.5 - 0.06 * k),
        "train/value_loss": [10.0] * ITERATIONS,
        "time/rollout_s": [1.0] * ITERATIONS,
        "time/update_s": [0.5] * ITERATIONS,
    }


def with_values(**changes: Callable[[list[float]], list[float]]) -> Values:
    """The healthy series with some of them replaced (keys use '__' for '/')."""
    series = healthy()
    for key, change in changes.items():
        name = key.replace("__", "/")
        series[name] = change(list(series[name]))
    return series


def put(index_to_value: dict[int, float]) -> Callable[[list[float]], list[float]]:
    """Set iteration k (1-based) to a value."""
    def change(values: list[float]) -> list[float]:
        for k, v in index_to_value.items():
            values[k - 1] = v
        return values
    return change


def const(value: float) -> Callable[[list[float]], list[float]]:
    return lambda values: [value] * len(values)


STD_COLLAPSE = [1.0, 0.5, 0.2, 0.1] + [0.1] * (ITERATIONS - 4)

# name -> (series, expected check, expected triggering numbers)
FIRING = {
    # Large updates fire when the return stops improving with them (from iteration 6 / 8).
    "clip_fraction": (
        with_values(train__clip_fraction=put({k: 0.45 for k in range(6, 11)}),
                    rollout__ep_rew_mean=lambda v: v[:5] + [v[5]] * 15),
        {"iterations": 5.0, "peak": 0.45, "first_step": 6000.0},
    ),
    "approx_kl": (
        with_values(train__approx_kl=put({8: 0.12, 12: 0.06, 15: 0.07}),
                    rollout__ep_rew_mean=lambda v: v[:7] + [v[7]] * 13),
        {"iterations": 3.0, "max": 0.12, "max_step": 8000.0},
    ),
    "entropy_collapse": (
        with_values(train__std=lambda _: list(STD_COLLAPSE),
                    train__entropy=lambda _: [8.5 + 6 * math.log(s) for s in STD_COLLAPSE]),
        {"ratio": 0.1, "step": 4000.0, "start": 1.0, "low": 0.1},
    ),
    "reward_flat": (
        with_values(rollout__ep_rew_mean=const(-100.0)),
        {"first": -100.0, "last": -100.0, "change": 0.0},
    ),
    "iteration_time": (
        with_values(time__rollout_s=lambda v: [1.0] * 10 + [2.5] * 10),
        {"first_s": 1.5, "last_s": 3.0, "growth": 2.0, "trend": 0.75 ** 0.5},
    ),
    "nonfinite": (
        with_values(train__value_loss=put({12: math.nan})),
        {"metrics": 1.0, "first_step": 12000.0},
    ),
}
# Near misses that must stay silent as well as the healthy run.
SILENT = {
    "healthy": healthy(),
    "clip_fraction_two_iterations": with_values(train__clip_fraction=put({6: 0.45, 7: 0.45})),
    "approx_kl_at_threshold": with_values(train__approx_kl=put({8: 0.05, 9: 0.05, 10: 0.05})),
    "approx_kl_two_spikes": with_values(train__approx_kl=put({8: 0.12, 12: 0.06})),
    # Large updates while the return keeps climbing: how healthy PPO runs often look.
    "clip_fraction_high_while_learning": with_values(
        train__clip_fraction=put({k: 0.45 for k in range(6, 21)})),
    "approx_kl_high_while_learning": with_values(train__approx_kl=const(0.08)),
    "entropy_falls_late": with_values(train__std=lambda v: v[:10] + [0.1] * 10),
    "reward_rises_6_percent": with_values(rollout__ep_rew_mean=lambda v: [100.0] * 10
                                          + [106.0] * 10),
    "iteration_time_grows_40_percent": with_values(
        time__rollout_s=lambda v: [1.0] * 10 + [1.6] * 10),
    # Other load on a shared machine: slow iterations come and go (x1.5 between the thirds'
    # medians, no trend) ...
    "iteration_time_spiky": with_values(
        time__rollout_s=lambda v: [2.0, 0.5, 2.0, 0.5, 0.5, 2.0, 0.5, 2.0, 2.0, 0.5] * 2),
    # ... or stretch the wall clock while the run's own CPU time per iteration stays flat.
    "iteration_wall_time_grows_cpu_time_flat": {
        **with_values(time__rollout_s=lambda v: [1.0] * 10 + [2.5] * 10),
        "time/rollout_cpu_s": [0.9] * ITERATIONS, "time/update_cpu_s": [0.45] * ITERATIONS},
}


def log_run(client: MlflowClient, experiment_id: str, name: str, series: Values) -> str:
    run = client.create_run(experiment_id, run_name=name,
                            tags={"env": "synthetic", "num_envs": "1", "n_steps": str(STEP)})
    client.log_param(run.info.run_id, "total_timesteps", BUDGET)
    metrics = [Metric(key, value, 1_000_000 + k, k * STEP)
               for key, values in series.items()
               for k, value in enumerate(values, start=1)]
    for start in range(0, len(metrics), 500):
        client.log_batch(run.info.run_id, metrics=metrics[start:start + 500])
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, records.RunRecord]:
    """Every synthetic run, logged to one store and read back with the report's loader."""
    db = tmp_path_factory.mktemp("diagnostics") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{db}")
    experiment_id = client.create_experiment("synthetic")
    runs = {name: series for name, (series, _) in FIRING.items()} | SILENT
    runs["infinite"] = with_values(train__value_loss=put({12: math.inf}))
    ids = {name: log_run(client, experiment_id, name, series) for name, series in runs.items()}
    return {name: records.load_run(client, client.get_run(i)) for name, i in ids.items()}


@pytest.mark.unit
@pytest.mark.parametrize("check", sorted(FIRING))
def test_diagnostic_fires_with_its_numbers(logged: dict[str, records.RunRecord], check: str
                                          ) -> None:
    run = logged[check]
    found = diagnose(run.metrics, run.budget, Thresholds())
    assert [d.check for d in found] == [check]
    assert dict(found[0].values) == pytest.approx(FIRING[check][1], rel=1e-12)
    assert found[0].evidence and found[0].remedy


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(SILENT))
def test_diagnostics_silent_on_healthy_runs(logged: dict[str, records.RunRecord], name: str
                                           ) -> None:
    run = logged[name]
    assert diagnose(run.metrics, run.budget, Thresholds()) == []


@pytest.mark.unit
def test_inf_survives_the_sql_store_and_fires(logged: dict[str, records.RunRecord]) -> None:
    run = logged["infinite"]
    assert run.metrics["train/value_loss"].values[11] == math.inf
    found = diagnose(run.metrics, run.budget, Thresholds())
    assert [(d.check, dict(d.values)) for d in found] == [
        ("nonfinite", {"metrics": 1.0, "first_step": 12000.0})]


@pytest.mark.unit
def test_evidence_names_the_numbers(logged: dict[str, records.RunRecord]) -> None:
    run = logged["approx_kl"]
    (found,) = diagnose(run.metrics, run.budget, Thresholds())
    assert found.evidence == ("approx_kl > 0.05 in 3 of 20 iterations, max 0.120 at step "
                              "8000, and the return stopped improving from the first of them")
    (clip,) = diagnose(logged["clip_fraction"].metrics, BUDGET, Thresholds())
    assert clip.evidence == ("clip_fraction > 0.3 for 5 consecutive iterations "
                             "(steps 6000-10000), peak 0.450, and the return stopped improving "
                             "from there")


@pytest.mark.unit
def test_thresholds_are_configurable(logged: dict[str, records.RunRecord]) -> None:
    run = logged["approx_kl"]
    assert diagnose(run.metrics, run.budget, Thresholds(approx_kl_max=0.2)) == []
    loose = Thresholds.from_mapping({"clip_fraction_iterations": "6"})
    assert loose.clip_fraction_iterations == 6
    assert diagnose(logged["clip_fraction"].metrics, BUDGET, loose) == []


@pytest.mark.unit
@pytest.mark.parametrize("given, message", [
    ({"approx_kl": 0.1}, "threshold 'approx_kl': unknown; valid thresholds: clip_fraction_max"),
    ({"approx_kl_max": "high"}, "threshold approx_kl_max='high': expected float"),
    ({"approx_kl_max": -1}, "threshold approx_kl_max=-1.0: must be > 0"),
    ({"bound_share": 1.5}, "threshold bound_share=1.5: must be a fraction in (0, 1]"),
])
def test_bad_thresholds_fail_in_one_line(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Thresholds.from_mapping(given)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------------- bottlenecks


def series(values: list[float]) -> Series:
    return Series.of([(k + 1) * STEP for k in range(len(values))], values)


def timing(rollout: float, update: float, **system: list[float]) -> dict[str, Series]:
    metrics = {"time/rollout_s": series([rollout] * 10), "time/update_s": series([update] * 10)}
    for key, values in system.items():
        metrics[f"system/{key}"] = series(values)
    return metrics


CPU_BUSY = {"cpu_utilization_percentage": [90.0] * 8}
CPU_IDLE = {"cpu_utilization_percentage": [20.0] * 8}
GPU_IDLE = {"gpu_0_utilization_percentage": [5.0] * 8}
GPU_BUSY = {"gpu_0_utilization_percentage": [95.0] * 8}


@pytest.mark.unit
@pytest.mark.parametrize("metrics, verdict, share", [
    (timing(1.6, 0.4, **CPU_BUSY), "sampling-bound", 0.8),
    (timing(1.6, 0.4, **CPU_BUSY, **GPU_IDLE), "sampling-bound", 0.8),
    (timing(1.6, 0.4, **CPU_IDLE), "neither busy", 0.8),
    (timing(1.6, 0.4, **CPU_IDLE, **GPU_BUSY), "sampling-bound", 0.8),
    (timing(0.4, 1.6, **CPU_BUSY), "update-bound", 0.2),
    (timing(0.4, 1.6, **CPU_IDLE, **GPU_BUSY), "update-bound", 0.2),
    (timing(1.0, 1.0, **CPU_BUSY), "balanced", 0.5),
    (timing(1.0, 1.0, **CPU_IDLE, **GPU_IDLE), "neither busy", 0.5),
    (timing(1.6, 0.4), "sampling-bound", 0.8),  # no system metrics: the split decides
])
def test_bottleneck_verdicts(metrics: dict[str, Series], verdict: str, share: float) -> None:
    found = analyse_bottleneck(metrics, Thresholds())
    assert found.verdict == verdict
    assert found.rollout_share == pytest.approx(share)
    assert found.verdicts == [verdict]
    assert not found.memory_creeping


@pytest.mark.unit
def test_update_bound_remedy_names_what_the_workbench_offers() -> None:
    remedy = analyse_bottleneck(timing(0.4, 1.6, **CPU_BUSY), Thresholds()).remedy
    for offered in ("algo.batch_size", "algo.n_epochs", "algo.policy.pi", "device=cuda"):
        assert offered in remedy
    assert "mixed precision" not in remedy  # SB3's PPO has no autocast hook to offer it


@pytest.mark.unit
def test_gpu_temperature_clocks_and_throttling_from_synthetic_series() -> None:
    # GPU 0: warm, full clocks, throttled in 1 of 8 samples (12.5%); GPU 1: hot, slow clocks,
    # never throttled. The verdict reads the worst GPU of each fact.
    found = analyse_bottleneck(timing(
        0.4, 1.6, **CPU_BUSY,
        gpu_0_temperature_celsius=[60.0] * 7 + [68.0], gpu_0_sm_clock_mhz=[1980.0] * 8,
        gpu_0_sm_clock_max_mhz=[1980.0] * 8,
        gpu_0_thermal_throttle_percentage=[0.0] * 7 + [100.0],
        gpu_1_temperature_celsius=[84.0] * 8, gpu_1_sm_clock_mhz=[1485.0] * 8,
        gpu_1_sm_clock_max_mhz=[1980.0] * 8, gpu_1_thermal_throttle_percentage=[0.0] * 8,
    ), Thresholds())
    health = found.gpu_health
    assert health is not None
    assert (health.temperature_c, health.temperature_peak_c) == (84.0, 84.0)
    assert (health.sm_clock_mhz, health.sm_clock_max_mhz, health.clock_ratio) == (
        1485.0, 1980.0, 0.75)
    assert health.thermal_throttle_percent == 12.5 and health.power_throttle_percent is None
    assert found.verdicts == ["update-bound", "GPU throttling"]  # 12.5% >= 10%
    assert "cooling" in found.remedy
    lenient = analyse_bottleneck(timing(0.4, 1.6, gpu_0_thermal_throttle_percentage=[12.5]),
                                 Thresholds(gpu_throttle_percent=20))
    assert lenient.verdicts == ["update-bound"] and not lenient.gpu_throttled
    without = analyse_bottleneck(timing(0.4, 1.6, **GPU_BUSY), Thresholds())
    assert without.gpu_health is None and not without.gpu_throttled


@pytest.mark.unit
def test_iteration_time_is_judged_on_cpu_time_when_logged() -> None:
    metrics = {key: series(values) for key, values in with_values(
        time__rollout_s=const(1.0)).items()}
    rising = [0.5 + 0.05 * k for k in range(ITERATIONS)]  # a leak: steadily more work
    metrics |= {"time/rollout_cpu_s": series(rising), "time/update_cpu_s": series(
        [0.4] * ITERATIONS)}
    (found,) = diagnose(metrics, BUDGET, Thresholds())
    assert found.check == "iteration_time" and found.evidence.startswith("median CPU time")
    assert found.values["trend"] == pytest.approx(1.0)


@pytest.mark.unit
def test_cpu_mean_needs_samples_after_mlflows_first() -> None:
    short = analyse_bottleneck(timing(1.0, 1.0, cpu_utilization_percentage=[0.0, 85.0]),
                               Thresholds())
    assert short.cpu_percent is None and short.cpu_samples == 1
    assert short.verdict == "balanced"  # never "neither busy" from one 0 % sample
    long = analyse_bottleneck(timing(1.0, 1.0, cpu_utilization_percentage=[0.0] + [80.0] * 3),
                              Thresholds())
    assert long.cpu_percent == 80.0 and long.cpu_samples == 3


@pytest.mark.unit
def test_bottleneck_without_timings_is_unknown() -> None:
    assert analyse_bottleneck({}, Thresholds()).verdict == "unknown"


@pytest.mark.unit
def test_memory_creeping_up_is_flagged_with_numbers() -> None:
    memory = [2000.0, 2010.0, 2300.0, 2500.0, 2700.0, 2900.0, 3000.0, 3100.0]
    found = analyse_bottleneck(timing(1.6, 0.4, **CPU_BUSY, system_memory_usage_megabytes=memory),
                               Thresholds())
    assert (found.memory_start_mb, found.memory_end_mb) == (2005.0, 3050.0)
    assert found.memory_rise_mb == 1045.0
    assert found.verdicts == ["sampling-bound", "memory creeping up"]
    assert "leak" in found.remedy
    steady = analyse_bottleneck(
        timing(1.6, 0.4, system_memory_usage_megabytes=[2000.0, 2400.0] * 4), Thresholds())
    assert steady.memory_rise_mb == 0.0 and not steady.memory_creeping
    # A one-off jump (another job starting) rises as much but not steadily: not a leak.
    jump = [2000.0, 2000.0, 3100.0, 3100.0, 2500.0, 2500.0, 3100.0, 3100.0]
    found = analyse_bottleneck(timing(1.6, 0.4, system_memory_usage_megabytes=jump),
                               Thresholds())
    assert found.memory_rise_mb == 1100.0 and not found.memory_creeping
    too_short = analyse_bottleneck(timing(1.6, 0.4, system_memory_usage_megabytes=memory[:7]),
                                   Thresholds())
    assert too_short.memory_rise_mb is None and not too_short.memory_creeping


@pytest.mark.unit
def test_gpu_metrics_logged_by_mlflow_are_read(tmp_path: Path) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("gpu"))
    metrics = [Metric("system/gpu_0_utilization_percentage", 10.0 * k, 0, k) for k in range(5)]
    metrics += [Metric("system/gpu_1_utilization_percentage", 40.0, 0, k) for k in range(5)]
    client.log_batch(run.info.run_id, metrics=metrics)
    record = records.load_run(client, client.get_run(run.info.run_id))
    assert analyse_bottleneck(record.metrics).gpu_percent == 30.0  # mean of 20 and 40


def test_longest_streak() -> None:
    flags = np.array([False, True, True, False, True, True, True, False])
    assert longest_streak(flags) == (4, 3)
    assert longest_streak(np.array([False, False])) == (0, 0)
    assert longest_streak(np.array([True, True])) == (0, 2)


@pytest.mark.unit
def test_the_shipped_halfcheetah_defaults_do_not_trip_the_update_size_checks() -> None:
    """A real run of the shipped HalfCheetah configuration (tests/data, recorded from MLflow):
    clip fraction and KL stay above their limits for most of a run whose return triples.
    The checks judge large updates together with the return, so they stay silent on it."""
    data = json.loads((Path(__file__).parent / "data" / "halfcheetah_default_1m.json"
                       ).read_text())
    metrics = {key: Series(np.array([s for s, _ in points], dtype=np.int64),
                           np.array([v for _, v in points], dtype=float))
               for key, points in data["series"].items()}
    limits = Thresholds()
    clip = metrics["train/clip_fraction"].values
    assert longest_streak(clip > limits.clip_fraction_max)[1] > 100  # the data is the case
    assert np.mean(metrics["train/approx_kl"].values > limits.approx_kl_max) > 0.5
    reward = metrics["rollout/ep_rew_mean"].values
    assert reward[-10:].mean() > 2 * reward[10:20].mean()
    assert diagnose(metrics, data["total_timesteps"], limits) == []


# --------------------------------------------------------------------------- off-policy


@pytest.mark.unit
@pytest.mark.parametrize("values, fires, title", [
    ([1.0, 0.5, 0.1, 0.05, 0.03, 0.02, 0.02], False, None),  # SAC's usual decay
    ([1.0, 0.1, 1e-3, 5e-4, 2e-4, 1e-4, 1e-4], True, "entropy coefficient collapsed"),
    ([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0], True, "entropy coefficient exploding"),
    ([1.0, 1e-4, 1e-4, 0.2, 0.1, 1e-4, 0.1], False, None),  # dips, never 3 points in a row
])
def test_sac_entropy_coefficient_rule(values: list[float], fires: bool, title: str | None
                                      ) -> None:
    found = [d for d in diagnose({"train/ent_coef": series(values)}, BUDGET)
             if d.check == "ent_coef"]
    assert bool(found) == fires
    if found:
        assert found[0].title == title and "algo.ent_coef" in found[0].remedy


@pytest.mark.unit
def test_a_diverging_critic_loss_fires_and_a_growing_return_scale_does_not() -> None:
    diverging = series([1.0 * 2 ** (k / 2) for k in range(24)])  # x2 every 2 points
    growing = series([1.0 + 0.3 * k for k in range(24)])  # Q's scale follows the return
    assert [d.check for d in diagnose({"train/critic_loss": diverging}, BUDGET)] == [
        "critic_loss"]
    assert diagnose({"train/critic_loss": growing}, BUDGET) == []
