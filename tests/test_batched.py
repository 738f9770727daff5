"""``env.vec_env=batched``: gymnasium's numbers, step by step, with the physics in threads.

The backend runs the same code as ``dummy`` on the same numbers and only moves each copy's
``mj_step`` earlier, into threads (lib/workbench/envs/batched.py), so every comparison here
is exact (``assert_array_equal``, tolerance 0): a difference in the last bit means the
batched physics was not the physics the task's own step would have run. Real MuJoCo
throughout, a few dozen steps of 2-4 copies each.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv
from workbench.config import ConfigError, RandomizationConfig
from workbench.envs.batched import BatchedVecEnv
from workbench.envs.robots import MINI_DUCK_ID
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_envs
from workbench.training import load_config

EVERY_FACTOR = RandomizationConfig(
    obs_noise_std=0.01, action_noise_std=0.1, action_delay=2, friction=[0.5, 1.5],
    mass_scale=[0.8, 1.2], damping=[0.5, 2.0], actuator_gain=[0.7, 1.3])


def actions_for(venv: Any, steps: int, seed: int = 0) -> np.ndarray:
    """Uniform random actions in the action space, (steps, num_envs, dim), float32."""
    space = venv.action_space
    rng = np.random.default_rng(seed)
    return rng.uniform(space.low, space.high, (steps, venv.num_envs, *space.shape)
                       ).astype(np.float32)


def batched_of(venv: Any) -> BatchedVecEnv:
    """The batched VecEnv under the guard (and VecNormalize, if any)."""
    base = venv.unwrapped
    assert isinstance(base, BatchedVecEnv)
    return base


def run(venv: Any, actions: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """The reset observation and every step's (obs, rewards, dones, infos)."""
    first = venv.reset()
    return first, [venv.step(action) for action in actions]


def without_wall_time(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Infos without Monitor's ``episode["t"]`` (seconds since start: differs per run)."""
    return [{**info, "episode": {k: v for k, v in info["episode"].items() if k != "t"}}
            if "episode" in info else info for info in infos]


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(("env_id", "limit", "terminates"), [
    ("HalfCheetah-v5", 20, False), ("Hopper-v5", 20, True), ("Walker2d-v5", 20, True),
    ("Ant-v5", 20, True), (MINI_DUCK_ID, 15, True),  # limits that end some episodes early
])
def test_steps_exactly_as_gymnasium_envs(env_id: str, limit: int, terminates: bool) -> None:
    """One ``gymnasium.make`` copy per rank, reset with seed + rank and reset again when an
    episode ends, is what SB3's VecEnv contract describes; the batched backend gives the same
    observations, rewards, dones, ``terminal_observation``, ``TimeLimit.truncated`` and
    episode records, with every step's physics run ahead in the threads."""
    num_envs, seed = 3, 5
    venv = make_envs(EnvSpec(env_id, num_envs, vec_env="batched", seed=seed,
                             max_episode_steps=limit, num_threads=2))
    references = [gymnasium.make(env_id, max_episode_steps=limit) for _ in range(num_envs)]
    try:
        actions = actions_for(venv, 45)
        first, steps = run(venv, actions)
        expected_first = [env.reset(seed=seed + rank)[0] for rank, env in enumerate(references)]
        np.testing.assert_array_equal(first, np.stack(expected_first))
        returns, lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=int)
        ends = {"terminated": 0, "truncated": 0}
        for action, (obs, rewards, dones, infos) in zip(actions, steps, strict=True):
            for rank, env in enumerate(references):
                ob, reward, terminated, truncated, _ = env.step(action[rank])
                returns[rank] += reward
                lengths[rank] += 1
                assert rewards[rank] == np.float32(reward)  # SB3 keeps rewards as float32
                assert dones[rank] == (terminated or truncated)
                assert infos[rank]["TimeLimit.truncated"] == (truncated and not terminated)
                if terminated or truncated:
                    ends["terminated" if terminated else "truncated"] += 1
                    np.testing.assert_array_equal(infos[rank]["terminal_observation"], ob)
                    assert infos[rank]["episode"]["r"] == round(returns[rank], 6)
                    assert infos[rank]["episode"]["l"] == lengths[rank]
                    returns[rank], lengths[rank] = 0.0, 0
                    ob, _ = env.reset()
                else:
                    assert "terminal_observation" not in infos[rank]
                np.testing.assert_array_equal(obs[rank], ob)
        assert ends["truncated"] > 0 and (ends["terminated"] > 0) == terminates
        copies = batched_of(venv).copies
        assert [c.steps_ahead for c in copies] == [len(actions)] * num_envs  # none in place
    finally:
        venv.close()
        for env in references:
            env.close()


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", MINI_DUCK_ID])
def test_every_randomization_factor_as_dummy_with_physics_per_copy(env_id: str) -> None:
    """Under every factor of ``env.randomization`` (the same wrappers, keys and streams as
    ``dummy``): identical observations, rewards, dones and infos (the sampled scales, the
    duck's reward components), each copy stepping its own, re-sampled physics."""
    spec = EnvSpec(env_id, 4, vec_env="batched", seed=11, max_episode_steps=15,
                   randomization=EVERY_FACTOR, num_threads=2)
    batched, dummy = make_envs(spec), make_envs(EnvSpec(**{**vars(spec), "vec_env": "dummy"}))
    try:
        actions = actions_for(batched, 40, seed=1)
        frictions = []
        first_b, steps_b = run(batched, actions[:20])
        frictions.append({float(c.model.geom_friction[0, 0]) for c in batched_of(batched).copies})
        more_b = [batched.step(a) for a in actions[20:]]
        frictions.append({float(c.model.geom_friction[0, 0]) for c in batched_of(batched).copies})
        first_d, steps_d = run(dummy, actions)
        np.testing.assert_array_equal(first_b, first_d)
        for (ob, rb, db, ib), (od, rd, dd, idd) in zip(steps_b + more_b, steps_d, strict=True):
            np.testing.assert_array_equal(ob, od)
            np.testing.assert_array_equal(rb, rd)
            np.testing.assert_array_equal(db, dd)
            np.testing.assert_equal(without_wall_time(ib), without_wall_time(idd))
            assert all("randomization" in info for info in ib)
        assert len(frictions[0]) == 4 and frictions[0] != frictions[1]  # per copy, per episode
        assert all(c.steps_ahead == 40 for c in batched_of(batched).copies)
    finally:
        batched.close()
        dummy.close()


def test_a_resume_continues_bit_identically_on_either_backend() -> None:
    """The duck under every factor: each copy's state captured mid-episode and restored into
    fresh batched and dummy copies continues exactly (simulator, servo history, generators,
    delayed actions, sampled physics)."""
    spec = EnvSpec(MINI_DUCK_ID, 2, vec_env="batched", seed=3, randomization=EVERY_FACTOR,
                   num_threads=2)
    original = make_envs(spec)
    fresh = [make_envs(EnvSpec(**{**vars(spec), "seed": 99, "vec_env": backend}))
             for backend in ("batched", "dummy")]
    try:
        actions = actions_for(original, 50, seed=2)
        original.reset()
        for action in actions[:23]:
            original.step(action)
        assert all(original.env_method("workbench_restorable"))
        states = original.env_method("workbench_capture")
        expected = [original.step(a)[:3] for a in actions[23:]]
        for venv in fresh:
            venv.reset()
            for rank, state in enumerate(states):
                venv.env_method("workbench_restore", state, indices=[rank])
            got = [venv.step(a)[:3] for a in actions[23:]]
            for want, have in zip(expected, got, strict=True):
                for a, b in zip(want, have, strict=True):
                    np.testing.assert_array_equal(a, b)
    finally:
        for venv in (original, *fresh):
            venv.close()


class Halving(gymnasium.Wrapper):
    """Changes every action on its way (not a gymnasium ActionWrapper, nothing declared)."""

    def step(self, action: Any) -> Any:
        return self.env.step(np.asarray(action) * 0.5)


@pytest.mark.parametrize(("wrapper", "warnings_per_copy"), [
    (Halving, 1),  # found at the first physics call: the copy steps in place from then on
    (gymnasium.wrappers.ClipAction, 0),  # an ActionWrapper that declares nothing: known ahead
])
def test_an_undeclared_action_change_steps_in_place_exactly(wrapper: Any,
                                                            warnings_per_copy: int) -> None:
    def make() -> gymnasium.Env:
        return wrapper(gymnasium.make("Hopper-v5", max_episode_steps=10))

    batched, dummy = BatchedVecEnv([make, make], num_threads=2), DummyVecEnv([make, make])
    try:
        batched.seed(4)
        dummy.seed(4)
        # beyond Hopper's [-1, 1] controls, so that clipping changes them
        actions = np.random.default_rng(0).uniform(-1.5, 1.5, (25, 2, 3)).astype(np.float32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = run(batched, actions)
        notes = [str(w.message) for w in caught if w.category is RuntimeWarning]
        assert len(notes) == 2 * warnings_per_copy
        assert all("this copy now steps its physics in place" in note for note in notes)
        want = run(dummy, actions)
        np.testing.assert_array_equal(got[0], want[0])
        for g, w in zip(got[1], want[1], strict=True):
            for a, b in zip(g[:3], w[:3], strict=True):
                np.testing.assert_array_equal(a, b)
        assert [c.steps_ahead for c in batched.copies] == [0, 0]
        assert not any(c.ahead for c in batched.copies)
    finally:
        batched.close()
        dummy.close()


# --------------------------------------------------------------------------- bad input


@pytest.mark.unit
@pytest.mark.parametrize(("overrides", "start", "fix"), [
    (["env.randomization.gravity=[0.9,1.1]"], "env.randomization.gravity: unknown config key",
     "valid keys of env.randomization: action_delay, action_noise_std, actuator_gain, "
     "damping, friction, mass_scale, obs_noise_std"),
    (["env=cartpole"], "env.vec_env=batched steps MuJoCo physics in threads; CartPole-v1 is "
     "not a gymnasium MuJoCo task", "use env.vec_env=auto or dummy"),
    (["env.num_threads=4096"], "env.num_threads=4096: more threads than this machine's",
     "or drop it (one per core)"),
    (["env.num_threads=0"], "env.num_threads=0: must be >= 1", "(e.g. env.num_threads=2)"),
    (["env.num_envs=100000000", "algo.n_steps=8", "algo.batch_size=8",
      "total_timesteps=800000000"],
     "env.num_envs=100000000: that many copies of Workbench/MiniDuck-v0 need at least",
     "lower env.num_envs to at most"),
])
def test_bad_batched_settings_are_one_line_errors(overrides: list[str], start: str,
                                                  fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(["env=duck", "env.vec_env=batched", *overrides])
    message = str(error.value)
    assert message.startswith(start) and fix in message and "\n" not in message


@pytest.mark.unit
def test_threads_are_refused_where_nothing_uses_them() -> None:
    with pytest.raises(ConfigError, match=r"^env.num_threads=2: env.vec_env=dummy steps no "
                       r"threads; drop env.num_threads or use env.vec_env=batched$"):
        load_config(["env=duck", "env.vec_env=dummy", "env.num_threads=2"])
    assert load_config(["env=duck", "env.vec_env=batched", "env.num_threads=1"]
                       ).env.num_threads == 1
