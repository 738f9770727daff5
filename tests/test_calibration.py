"""``env.vec_env=auto``: the calibration measures real backends, decides, caches and logs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium
import pytest
from mlflow.tracking import MlflowClient
from workbench.envs import calibration, envpool_vec
from workbench.envs.cores import auto_torch_threads
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.training import load_config, train

from .conftest import TINY
from .test_train import ExplodingEnv


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "calibration" / "vec_env.json"
    monkeypatch.setenv("WORKBENCH_CALIBRATION_CACHE", str(path))
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # idle: results are cached
    return path


@pytest.mark.unit
@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ({"dummy": 100.0}, "dummy"),
        ({"dummy": 100.0, "envpool": 110.0}, "dummy"),  # within the margin: keep the simplest
        ({"dummy": 100.0, "envpool": 200.0}, "envpool"),
        ({"dummy": 100.0, "envpool": 200.0, "subproc": 300.0}, "subproc"),
        ({"dummy": 300.0, "envpool": 200.0}, "dummy"),
    ],
)
def test_decide_takes_the_fastest_beyond_the_margin(rates: dict[str, float],
                                                    expected: str) -> None:
    assert calibration.decide(rates) == expected


@pytest.mark.unit
def test_candidates_follow_cores_and_task() -> None:
    spec = EnvSpec("HalfCheetah-v5", num_envs=8)
    pool = ["envpool"] if envpool_vec.is_installed() else []
    assert calibration.candidates(spec, budget=2) == ["dummy", *pool]
    assert calibration.candidates(spec, budget=4) == ["dummy", *pool, "subproc"]
    single = EnvSpec("HalfCheetah-v5", num_envs=1)
    assert calibration.candidates(single, budget=4) == ["dummy", *pool]
    assert calibration.candidates(EnvSpec("CartPole-v1", 8), budget=2) == ["dummy"]


@pytest.mark.unit
def test_auto_calibrates_once_then_uses_the_cache(cache: Path) -> None:
    spec = EnvSpec("Hopper-v5", num_envs=4, vec_env="auto")
    first = calibration.choose_vec_env(spec, budget=2)
    assert first.name in {"dummy", "envpool"} and not first.cached
    assert set(first.rates) == set(calibration.candidates(spec, budget=2))
    assert all(rate > 0 for rate in first.rates.values())
    assert first.name == calibration.decide(first.rates)
    stored = json.loads(cache.read_text())
    assert list(stored.values()) == [first.rates]
    second = calibration.choose_vec_env(spec, budget=2)
    assert second.cached and second.rates == first.rates and second.name == first.name
    # another env count is another measurement
    other = calibration.choose_vec_env(EnvSpec("Hopper-v5", 2, vec_env="auto"), budget=2)
    assert not other.cached and len(json.loads(cache.read_text())) == 2


@pytest.mark.unit
@pytest.mark.skipif(not envpool_vec.is_installed(), reason="needs a second candidate (extra fast)")
def test_a_calibration_on_a_busy_machine_is_used_not_cached(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = EnvSpec("Hopper-v5", num_envs=4, vec_env="auto")
    monkeypatch.setattr(os, "getloadavg", lambda: (2.5, 2.0, 1.0))  # 1 + half of 2 cores: busy
    busy = calibration.choose_vec_env(spec, budget=2)
    assert busy.rates and not busy.cached and busy.name == calibration.decide(busy.rates)
    assert "not cached: load average 2.5 on 2 cores" in busy.reason
    assert not cache.exists()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 2.0, 1.0))  # below the bar: cached
    idle = calibration.choose_vec_env(spec, budget=2)
    assert not idle.cached and list(json.loads(cache.read_text()).values()) == [idle.rates]
    assert calibration.choose_vec_env(spec, budget=2).cached


@pytest.mark.unit
def test_a_broken_env_never_stops_auto(cache: Path) -> None:
    gymnasium.register("WorkbenchTest/ExplodingCalibration-v0", entry_point=ExplodingEnv)
    spec = EnvSpec("WorkbenchTest/ExplodingCalibration-v0", 2, vec_env="auto")
    assert calibration.calibrate(spec, ["dummy"]) == {}  # stepping raised: no rate
    choice = calibration.choose_vec_env(spec, budget=2)  # only dummy applies: not measured
    assert (choice.name, choice.rates) == ("dummy", {})
    assert not cache.exists()


@pytest.mark.unit
def test_explicit_choice_is_not_calibrated(cache: Path) -> None:
    choice = calibration.choose_vec_env(EnvSpec("Hopper-v5", 4, vec_env="subproc"))
    assert (choice.name, choice.rates, choice.params()) == (
        "subproc", {}, {"derived.vec_env": "subproc"}
    )
    assert not cache.exists()


def test_make_envs_resolves_auto(cache: Path) -> None:
    venv = make_envs(EnvSpec("Hopper-v5", 2, vec_env="auto"))
    try:
        expected = calibration.choose_vec_env(EnvSpec("Hopper-v5", 2, vec_env="auto"))
        kind = {"dummy": "DummyVecEnv", "subproc": "SubprocVecEnv", "envpool": "EnvPoolVecEnv"}
        # The backend sits under workbench.envs.guards' NaN/crash guard, as a guarded subclass.
        backend = type(venv.unwrapped).__mro__
        assert kind[expected.name] in {cls.__name__ for cls in backend}
        assert venv.reset().shape == (2, 11)
    finally:
        venv.close()


def test_auto_is_the_default_and_is_logged(store: Path, cache: Path) -> None:
    assert load_config([]).env.vec_env == "auto"
    result = train(load_config([*TINY, "tracking.system_metrics=false"]))
    params = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(result.run_id).data.params
    assert params["env.vec_env"] == "auto"
    (rates,) = json.loads(cache.read_text()).values()
    assert params["derived.vec_env"] == calibration.decide(rates)
    assert params["derived.vec_env_rates"] == ", ".join(
        f"{name} {rate:.0f}/s" for name, rate in sorted(rates.items())
    )
    threads = auto_torch_threads(2, params["derived.vec_env"])
    assert params["derived.torch_threads"] == str(threads)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("num_envs", "vec_env", "budget", "expected"),
    [
        (8, "dummy", 2, 1),  # one learner thread per 4 free cores, at least one
        (8, "envpool", 2, 1),
        (8, "subproc", 2, 1),
        (16, "envpool", 16, 4),  # EnvPool's threads sleep while the learner runs
        (2, "subproc", 16, 3),  # 14 cores left by the 2 workers
        (16, "subproc", 8, 1),
        (1, "dummy", 1, 1),
    ],
)
def test_torch_threads_never_oversubscribe(num_envs: int, vec_env: str, budget: int,
                                           expected: int) -> None:
    assert auto_torch_threads(num_envs, vec_env, budget) == expected
