"""``env.vec_env=auto``: a documented rule, never a timing; ``workbench calibrate`` measures."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.config import RandomizationConfig
from workbench.envs import calibration, envpool_vec
from workbench.envs.cores import auto_torch_threads
from workbench.envs.robots import MINI_DUCK_ID
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.training import load_config, train

from .conftest import TINY
from .support.envs import ExplodingEnv

POOL = "envpool" if envpool_vec.is_installed() else "batched"  # 8 envs or more of MuJoCo
RANDOMIZED = RandomizationConfig(friction=[0.8, 1.2])


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core budget the rule sees, the same on any machine."""
    monkeypatch.setenv("WORKBENCH_CPU_BUDGET", "2")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (EnvSpec("HalfCheetah-v5", 16, "auto"), POOL),  # EnvPool runs it (where installed)
        (EnvSpec("Hopper-v5", 8, "auto"), POOL),
        (EnvSpec("Hopper-v5", 7, "auto"), "dummy"),  # too few envs for EnvPool's hand-off
        (EnvSpec("Hopper-v5", 1, "auto"), "dummy"),
        (EnvSpec("CartPole-v1", 8, "auto"), "dummy"),  # not one of EnvPool's MuJoCo tasks
        (EnvSpec("HalfCheetah-v5", 4, "auto", randomization=RandomizationConfig(
            friction=[0.8, 1.2])), "dummy"),  # randomization wraps gymnasium envs
        (EnvSpec("HalfCheetah-v5", 4, "auto", kwargs={"xml_file": "x.xml"}), "dummy"),
        (EnvSpec("HalfCheetah-v5", 4, "subproc"), "subproc"),  # explicit choices pass through
        # EnvPool cannot run it; 8 envs or more of a MuJoCo task: the physics in threads
        (EnvSpec("HalfCheetah-v5", 8, "auto", randomization=RANDOMIZED), "batched"),
        (EnvSpec("HalfCheetah-v5", 8, "auto", kwargs={"xml_file": "x.xml"}), "batched"),
        (EnvSpec(MINI_DUCK_ID, 8, "auto"), "batched"),
        (EnvSpec(MINI_DUCK_ID, 16, "auto", num_threads=1), "dummy"),  # one thread: no batch
        (EnvSpec(MINI_DUCK_ID, 7, "auto"), "dummy"),  # too few envs for the threads' hand-off
    ],
)
@pytest.mark.usefixtures("two_cores")
def test_auto_follows_the_rule(spec: EnvSpec, expected: str) -> None:
    choice = calibration.choose_vec_env(spec)
    assert choice.name == expected
    assert choice.params() == {"derived.vec_env": expected}  # a decision, never a measurement
    assert calibration.resolve_spec(spec).vec_env == expected


@pytest.mark.unit
def test_the_choice_ignores_the_machine_load(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = EnvSpec("Hopper-v5", 4, "auto")
    idle = calibration.choose_vec_env(spec)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert calibration.choose_vec_env(spec) == idle


@pytest.mark.unit
def test_batched_needs_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKBENCH_CPU_BUDGET", "1")
    choice = calibration.choose_vec_env(EnvSpec(MINI_DUCK_ID, 16, "auto"))
    assert choice.name == "dummy"
    assert choice.reason.endswith("batched needs 2 threads or more)")


@pytest.mark.unit
def test_candidates_follow_env_count_and_task() -> None:
    pool = ["envpool"] if envpool_vec.is_installed() else []
    assert calibration.candidates(EnvSpec("HalfCheetah-v5", 8)) == [
        "dummy", *pool, "subproc", "batched"]
    assert calibration.candidates(EnvSpec("HalfCheetah-v5", 1)) == ["dummy", *pool]
    assert calibration.candidates(EnvSpec("CartPole-v1", 8)) == ["dummy", "subproc"]


def test_calibrate_measures_real_backends_and_skips_a_broken_env() -> None:
    rates = calibration.calibrate(EnvSpec("Hopper-v5", 2), ["dummy"], seconds=0.05)
    assert set(rates) == {"dummy"} and rates["dummy"] > 0
    discrete = calibration.calibrate(EnvSpec("CartPole-v1", 2), ["dummy"], seconds=0.05)
    assert discrete["dummy"] > 0  # Discrete action spaces step too
    gymnasium.register("WorkbenchTest/ExplodingCalibration-v0", entry_point=ExplodingEnv)
    broken = EnvSpec("WorkbenchTest/ExplodingCalibration-v0", 2)
    assert calibration.calibrate(broken, ["dummy"], seconds=0.05) == {}  # stepping raised


@pytest.mark.usefixtures("two_cores")
def test_calibrate_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["calibrate", "--seconds", "0.05", "env=hopper", "env.num_envs=2"]) == 0
    out = capsys.readouterr().out
    assert "Backends for Hopper-v5 x 2 envs (0.05 s each, random actions)" in out
    assert "dummy" in out and "x dummy)" in out
    assert "auto: dummy (" in out  # 2 envs: below EnvPool's threshold, or not installed
    assert cli.main(["calibrate", "--seconds", "0.05", "env=hopper", "env.num_envs=8"]) == 0
    assert f"auto: {'EnvPool runs Hopper-v5' if POOL == 'envpool' else 'batched, '}" in (
        capsys.readouterr().out)
    assert cli.main(["calibrate", "--seconds", "0"]) == 2


def test_make_envs_resolves_auto() -> None:
    venv = make_envs(EnvSpec("Hopper-v5", 8, vec_env="auto"))
    try:
        expected = calibration.choose_vec_env(EnvSpec("Hopper-v5", 8, vec_env="auto"))
        kind = {"dummy": "DummyVecEnv", "subproc": "SubprocVecEnv", "envpool": "EnvPoolVecEnv",
                "batched": "BatchedVecEnv"}
        # The backend sits under workbench.envs.guards' NaN/crash guard, as a guarded subclass.
        backend = type(venv.unwrapped).__mro__
        assert kind[expected.name] in {cls.__name__ for cls in backend}
        assert venv.reset().shape == (8, 11)
    finally:
        venv.close()


@pytest.mark.usefixtures("two_cores")
def test_auto_is_the_default_and_is_logged(store: Path) -> None:
    assert load_config([]).env.vec_env == "auto"
    result = train(load_config([*TINY, "env.vec_env=auto", "env.num_envs=8", "algo.n_steps=16",
                                "tracking.system_metrics=false"]))
    params = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(result.run_id).data.params
    assert params["env.vec_env"] == "auto"
    assert params["derived.vec_env"] == POOL
    assert not any("rates" in key for key in params)  # timings never become params
    threads = auto_torch_threads(8, params["derived.vec_env"])
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
