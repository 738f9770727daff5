"""Checkpoints and resume: exact continuation, retention, the file format, safe loading."""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs, make_eval_env
from workbench.training import checkpoint, load_config, train
from workbench.training import model as model_io
from workbench.training.faults import TrainingInterrupted

from .conftest import TINY
from .support.files import Marker
from .support.runs import (
    SignalAt,
    assert_same_training,
    interrupt_and_resume,
)
from .trained_run import FinishedRun

# --------------------------------------------------------------------------- format


def test_encode_decode_round_trip() -> None:
    state = {
        "tensor": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "rng": torch.get_rng_state(),
        "array": np.array([[1.5, np.nan], [np.inf, -0.0]]),
        "flags": np.array([True, False]),
        "int_keys": {0: {"step": torch.tensor(3.0)}, 7: [1, 2]},
        "numpy_rng": np.random.get_state(),
        "scalars": [np.float32(0.25), np.int64(3), None, "text", float("nan")],
    }
    arrays: dict[str, np.ndarray] = {}
    tree = json.loads(json.dumps(checkpoint.encode(state, arrays)))
    back = checkpoint.decode(tree, arrays)
    assert torch.equal(back["tensor"], state["tensor"])
    assert torch.equal(back["rng"], state["rng"]) and back["rng"].dtype == torch.uint8
    np.testing.assert_array_equal(back["array"], state["array"])
    assert back["flags"].dtype == bool and back["flags"].tolist() == [True, False]
    assert set(back["int_keys"]) == {0, 7}
    assert torch.equal(back["int_keys"][0]["step"], torch.tensor(3.0))
    name, keys, pos, has_gauss, cached = back["numpy_rng"]
    assert name == "MT19937" and keys.dtype == np.uint32
    np.testing.assert_array_equal(keys, state["numpy_rng"][1])
    assert back["scalars"][:4] == [0.25, 3, None, "text"] and math.isnan(back["scalars"][4])


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "Ant-v5", "Humanoid-v5"])
def test_env_state_continues_bit_identically(env_id: str) -> None:
    """Capture mid-episode, restore into fresh copies: the next steps are bit-identical.

    Ant and Humanoid read MuJoCo's derived positions before each step: the integration
    state alone would differ in the first reward after the restore.
    """
    spec = EnvSpec(env_id, num_envs=2, seed=3, max_episode_steps=40)
    rng = np.random.default_rng(0)
    original, fresh = make_envs(spec), make_envs(spec.__class__(
        env_id, num_envs=2, seed=99, max_episode_steps=40))
    try:
        original.reset()
        actions = rng.uniform(-0.4, 0.4, size=(130, 2, original.action_space.shape[0]))
        for a in actions[:57]:
            original.step(a.astype(np.float32))
        states = original.env_method("workbench_capture")
        expected = [original.step(a.astype(np.float32))[:3] for a in actions[57:]]
        fresh.reset()
        for rank, state in enumerate(states):
            fresh.env_method("workbench_restore", state, indices=[rank])
        got = [fresh.step(a.astype(np.float32))[:3] for a in actions[57:]]
        for (obs_a, rew_a, done_a), (obs_b, rew_b, done_b) in zip(expected, got, strict=True):
            np.testing.assert_array_equal(obs_a, obs_b)
            np.testing.assert_array_equal(rew_a, rew_b)
            np.testing.assert_array_equal(done_a, done_b)
    finally:
        original.close()
        fresh.close()


class CountingWrapper(gymnasium.Wrapper):
    """A wrapper with per-episode state that saves and restores it (the protocol)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.count = 0

    def step(self, action):
        self.count += 1
        return self.env.step(action)

    def workbench_state(self) -> dict:
        return {"count": self.count}

    def workbench_restore(self, state: dict) -> None:
        self.count = state["count"]


def test_only_known_state_is_claimed_exact() -> None:
    from workbench.config import RandomizationConfig
    from workbench.envs import simstate
    from workbench.envs.randomization import wrap

    from .faulty_envs import CrashingCheetah

    plain = gymnasium.make("HalfCheetah-v5")
    assert simstate.is_restorable(plain)
    # Unknown per-episode state: an env subclass.
    assert not simstate.is_restorable(gymnasium.wrappers.TimeLimit(CrashingCheetah(), 100))
    # The randomization wrappers keep theirs through the protocol (tests/test_batched.py).
    noisy = wrap(gymnasium.make("HalfCheetah-v5"), RandomizationConfig(obs_noise_std=0.1))
    assert simstate.is_restorable(noisy)
    counting = CountingWrapper(gymnasium.make("HalfCheetah-v5"))
    assert simstate.is_restorable(counting)
    counting.reset(seed=0)
    for _ in range(7):
        counting.step(counting.action_space.sample())
    state = simstate.capture(counting)
    fresh = CountingWrapper(gymnasium.make("HalfCheetah-v5"))
    fresh.reset(seed=5)
    simstate.restore(fresh, state)
    assert fresh.count == 7
    assert not simstate.is_restorable(gymnasium.make("CartPole-v1"))  # not MuJoCo


# --------------------------------------------------------------------------- resume


RESUME_CASES = [
    pytest.param([], id="dummy"),
    pytest.param(["env.vec_env=subproc", "env.normalize=true"], id="subproc-vecnormalize",
                 marks=pytest.mark.slow),
    # every randomization factor's state (generators, delayed actions, physics scales) too
    pytest.param(["env.vec_env=batched", "env.randomization.obs_noise_std=0.01",
                  "env.randomization.action_noise_std=0.05", "env.randomization.action_delay=1",
                  "env.randomization.friction=[0.8,1.2]", "env.randomization.mass_scale=[0.9,1.1]"],
                 id="batched-randomized"),
]


@pytest.mark.parametrize("extra", RESUME_CASES)
def test_resume_after_sigint_equals_the_uninterrupted_run(
    extra: list[str], store: Path, tmp_path: Path
) -> None:
    # Evaluations every 192 steps fall between iterations (128 steps): due at 256, 384, 640.
    overrides = [*TINY, "total_timesteps=768",
                 "console.iteration_lines=false", "tracking.system_metrics=false",
                 "checkpoint.every_steps=256", "checkpoint.keep_last=2", "eval.every_steps=192",
                 *extra]
    client, full, killed, resumed = interrupt_and_resume(overrides)
    assert killed.info.status == "KILLED"
    assert killed.data.tags["error"].startswith("interrupted: SIGINT received at step 42")
    # The last iteration boundary before the signal (384) was written on the way out.
    assert killed.data.tags["workbench.checkpoint"] == "checkpoints/step-000000000384"
    assert resumed.run_id == killed.info.run_id  # the same MLflow run is reopened
    run = client.get_run(resumed.run_id)
    assert "error" not in run.data.tags
    assert run.data.tags["resume.count"] == "1"
    assert run.data.tags["resume.from_step"] == "384"
    assert run.data.tags["resume.previous_error"].startswith("interrupted: SIGINT")
    got = assert_same_training(client, full, resumed, tmp_path)
    assert [s for s, _ in got["rollout/ep_rew_mean"]] == [128, 256, 384, 512, 640, 768]
    assert [s for s, _ in got["eval/mean_reward"]] == [256, 384, 640, 768]  # 768: final

    # Retention: checkpoints at 256, 512 and the final 768; the newest two are kept.
    for run_id in (full.run_id, resumed.run_id):
        stored = checkpoint.stored_checkpoints(client, run_id)
        assert [(c.step, c.complete) for c in stored] == [(512, True), (768, True)]


def test_checkpoint_files_cannot_execute_code(finished_run: FinishedRun) -> None:
    folder = finished_run.artifacts() / "checkpoints" / "step-000000000384"
    assert sorted(p.name for p in folder.iterdir()) == [
        "arrays.safetensors", "config.yaml", "state.json"]
    meta = json.loads((folder / "state.json").read_text())
    assert meta["format"] == "workbench-checkpoint/1" and meta["num_timesteps"] == 384
    assert set(meta["files"]) == {"arrays.safetensors", "config.yaml"}
    state, config_yaml = checkpoint.read_files(folder)
    assert state["num_timesteps"] == 384 and state["exact"] is True
    assert "total_timesteps: 384" in config_yaml
    assert set(state["policy"]) >= {"log_std", "action_net.weight", "value_net.bias"}


# --------------------------------------------------------------------------- safe loading


def poisoned_copy(model_zip: Path, target: Path, marker: Path) -> Path:
    """``model.zip`` with a malicious cloudpickled ``lr_schedule`` entry."""
    import base64

    import cloudpickle

    target.mkdir(parents=True)
    with zipfile.ZipFile(model_zip) as src:
        data = json.loads(src.read("data"))
        payload = base64.b64encode(cloudpickle.dumps(Marker(marker))).decode()
        data["lr_schedule"] = {":type:": "<class 'function'>", ":serialized:": payload}
        with zipfile.ZipFile(target / "model.zip", "w") as dst:
            for item in src.infolist():
                content = json.dumps(data) if item.filename == "data" else src.read(item)
                dst.writestr(item, content)
    (target / "config.yaml").write_text((model_zip.parent / "config.yaml").read_text())
    return target / "model.zip"


def test_models_load_without_unpickling_unless_allowed(
    finished_run: FinishedRun, tmp_path: Path
) -> None:
    model_dir = finished_run.artifacts() / "model"
    marker = tmp_path / "code-ran"
    poisoned = poisoned_copy(model_dir / "model.zip", tmp_path / "downloaded", marker)

    model = model_io.load_model(poisoned)
    assert not marker.exists()  # the pickled entry was never loaded
    obs = np.zeros((1, *model.observation_space.shape), dtype=np.float32)
    reference = model_io.load_model(model_dir / "model.zip")
    assert np.array_equal(model.predict(obs, deterministic=True)[0],
                          reference.predict(obs, deterministic=True)[0])
    assert model.num_timesteps == 384

    with pytest.raises(model_io.UnsafeLoadError, match="allow_pickle=True"):
        model_io.load_vecnormalize(model_dir / "vecnormalize.pkl", make_eval_env(
            EnvSpec("HalfCheetah-v5", 1)))
    # The threat is real: SB3's own loader (allow_pickle=True) runs the payload.
    model_io.load_model(poisoned, allow_pickle=True)
    assert marker.exists()


CUSTOM_ROBOT = "env.id=tests.custom_robot:Custom/Cheetah-v0"


@pytest.mark.slow
def test_resume_with_unrestorable_state_starts_fresh_episodes(store: Path) -> None:
    overrides = [*TINY, "total_timesteps=768",
                 "console.iteration_lines=false", "tracking.system_metrics=false",
                 "checkpoint.every_steps=256", CUSTOM_ROBOT]  # a subclass: state unknown
    with pytest.raises(TrainingInterrupted):
        train(load_config(overrides), callbacks=[SignalAt(420)])
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (killed,) = client.search_runs([client.get_experiment_by_name("workbench").experiment_id])
    resumed = train(load_config([f"resume={killed.info.run_id}", CUSTOM_ROBOT]))  # trusted
    run = client.get_run(resumed.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["resume.exact"] == "false"
    steps = [m.step for m in client.get_metric_history(resumed.run_id, "rollout/ep_rew_mean")]
    assert steps == [128, 256, 384, 512, 640, 768]
