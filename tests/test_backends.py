"""Vectorization backends: dummy, subproc, envpool and batched step, reset, seed and train alike.

Real MuJoCo physics throughout; EnvPool is the optional extra ``fast`` (``make setup``
installs it on Linux x86_64); without it the envpool cases are skipped with the install hint
as the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from workbench import cli
from workbench.config import ConfigError
from workbench.envs import envpool_vec
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.training import load_config, train

from .conftest import TINY

needs_envpool = pytest.mark.skipif(
    not envpool_vec.is_installed(), reason=f"envpool not installed: {envpool_vec.INSTALL_HINT}"
)
BACKENDS = ["dummy", "subproc", pytest.param("envpool", marks=needs_envpool), "batched"]


def rollout(venv, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Reset, then step through ``actions``; observations, rewards, dones and infos."""
    observations, rewards, dones, infos = [venv.reset()], [], [], []
    for action in actions:
        obs, reward, done, info = venv.step(action)
        observations.append(obs)
        rewards.append(reward)
        dones.append(done)
        infos.append(info)
    return np.array(observations), np.array(rewards), np.array(dones), infos


def fixed_actions(steps: int, num_envs: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (steps, num_envs, dim))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_steps_resets_and_seeds_reproducibly(backend: str) -> None:
    spec = EnvSpec("HalfCheetah-v5", num_envs=2, vec_env=backend, seed=3,
                        max_episode_steps=5)
    actions = fixed_actions(12, 2, 6)
    first, second, other = (make_envs(s) for s in (spec, spec, _reseeded(spec, 4)))
    try:
        obs_a, rew_a, done_a, infos = rollout(first, actions)
        obs_b, rew_b, done_b, _ = rollout(second, actions)
        obs_c, _, _, _ = rollout(other, actions)
    finally:
        for venv in (first, second, other):
            venv.close()
    assert obs_a.shape == (13, 2, 17) and obs_a.dtype == np.float64
    assert rew_a.shape == (12, 2) and np.issubdtype(rew_a.dtype, np.floating)
    np.testing.assert_array_equal(obs_a, obs_b)  # same seed, same actions: same trajectory
    np.testing.assert_array_equal(rew_a, rew_b)
    assert not np.array_equal(obs_a[0], obs_c[0])  # another seed: other start states
    # max_episode_steps=5: both envs end at steps 5 and 10 (1-based), truncated, and are reset
    # in the same step (SB3's convention), the last observation kept in the info.
    assert [t for t in range(12) if done_a[t].any()] == [4, 9]
    assert done_a[4].all() and done_a[9].all()
    for env in range(2):
        info = infos[4][env]
        assert info["TimeLimit.truncated"] is True
        assert info["episode"]["l"] == 5
        assert info["episode"]["r"] == pytest.approx(float(rew_a[:5, env].sum()), abs=1e-5)
        assert info["terminal_observation"].shape == (17,)
        assert not np.array_equal(info["terminal_observation"], obs_a[5, env])
    # rank r is seeded seed + r: rank 1 of seed 3 starts where rank 0 of seed 4 starts.
    np.testing.assert_array_equal(obs_a[0, 1], obs_c[0, 0])


def _reseeded(spec: EnvSpec, seed: int) -> EnvSpec:
    return EnvSpec(spec.env_id, spec.num_envs, spec.vec_env, seed, spec.max_episode_steps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_trains_with_vecnormalize(backend: str, store: Path) -> None:
    result = train(load_config([*TINY, f"env.vec_env={backend}", "env.normalize=true",
                                "tracking.system_metrics=false"]))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["env.vec_env"] == backend
    assert run.data.params["derived.vec_env"] == backend
    # 50-step episodes end inside 192 steps per env: Monitor-style statistics reach SB3.
    lengths = client.get_metric_history(result.run_id, "rollout/ep_len_mean")
    assert lengths and all(m.value == 50.0 for m in lengths)
    files = {a.path for a in client.list_artifacts(result.run_id, "model")}
    assert "model/vecnormalize.pkl" in files
    assert np.isfinite(result.eval_mean_reward)


@needs_envpool
def test_envpool_seed_call_recreates_pool_with_new_seeds() -> None:
    reseeded = envpool_vec.EnvPoolVecEnv("Hopper-v5", 3, seed=0)
    fresh = envpool_vec.EnvPoolVecEnv("Hopper-v5", 3, seed=7)
    try:
        assert reseeded.seed(7) == [7, 8, 9]  # SB3 applies seeds at the next reset
        np.testing.assert_array_equal(reseeded.reset(), fresh.reset())
        assert reseeded.seeds == [7, 8, 9]
    finally:
        reseeded.close()
        fresh.close()


@needs_envpool
@pytest.mark.parametrize(("env_id", "steps"), [("HalfCheetah-v5", 40), ("Hopper-v5", 60)])
def test_envpool_matches_gymnasium_v5(env_id: str, steps: int) -> None:
    """Same spaces; without reset noise a fixed action sequence gives the same trajectory.

    Tolerances (docs/benchmarks.md#envpool-vs-gymnasium): observations 1e-6 absolute (the
    two MuJoCo builds round differently; HalfCheetah's contacts amplify it past 1e-6 only
    after ~60 steps), rewards 1e-5 relative (EnvPool returns float32).
    """
    kwargs = {"reset_noise_scale": 0.0}
    reference = make_envs(EnvSpec(env_id, 1, "dummy", kwargs=kwargs))
    pool = make_envs(EnvSpec(env_id, 1, "envpool", kwargs=kwargs))
    try:
        assert pool.observation_space == reference.observation_space
        assert pool.action_space == reference.action_space
        actions = fixed_actions(steps, 1, reference.action_space.shape[0], seed=1)
        obs_ref, rew_ref, done_ref, _ = rollout(reference, actions)
        obs_pool, rew_pool, done_pool, _ = rollout(pool, actions)
    finally:
        reference.close()
        pool.close()
    end = int(np.argmax(done_ref[:, 0])) if done_ref.any() else steps  # Hopper may fall
    np.testing.assert_array_equal(done_pool[: end + 1], done_ref[: end + 1])
    np.testing.assert_allclose(obs_pool[: end + 1], obs_ref[: end + 1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(rew_pool[: end + 1], rew_ref[: end + 1], rtol=1e-5, atol=1e-6)
    assert float(rew_pool[: end + 1].sum()) == pytest.approx(float(rew_ref[: end + 1].sum()),
                                                               rel=1e-5)


@pytest.mark.unit
def test_envpool_rejects_what_it_cannot_run() -> None:
    if envpool_vec.is_installed():
        with pytest.raises(ConfigError, match="CartPole-v1 is not one of EnvPool's"):
            load_config(["env.id=CartPole-v1", "env.vec_env=envpool"])
        with pytest.raises(ConfigError, match=r"env\.kwargs\.xml_file has no EnvPool"):
            load_config(["env.vec_env=envpool", "+env.kwargs.xml_file=half_cheetah.xml"])
    else:
        with pytest.raises(ConfigError, match=r"pip install '\.\[fast\]'"):
            load_config(["env.vec_env=envpool"])


def test_envpool_missing_is_one_line_exit_2(bare_store: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Python's documented way to make an import fail: a None entry in sys.modules.
    monkeypatch.setitem(__import__("sys").modules, "envpool", None)
    code = cli.main(["train", "env.vec_env=envpool"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (
        "workbench: error: env.vec_env=envpool: the envpool package is not installed; "
        f"{envpool_vec.INSTALL_HINT}, or choose env.vec_env=auto|dummy|subproc"
    )
    assert not bare_store.exists()


@needs_envpool
def test_importing_envpool_leaves_the_environment_alone() -> None:
    # envpool's import sets MPLBACKEND=Agg: papermill kernels started later drew no figures.
    # A fresh interpreter, so that the import really runs.
    code = ("import os; from workbench.envs import envpool_vec; before = dict(os.environ); "
            "envpool_vec.import_envpool(); print(sorted(set(os.environ.items()) ^ "
            "set(before.items())))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MPL")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
