"""Domain randomization wrappers: each changes exactly what it claims, on real MuJoCo tasks.

Every check runs a wrapped env next to an unwrapped twin with the same seed and compares:
noise statistics within tolerance, the delayed action sequence exactly, physics values
inside their ranges, re-sampled per episode, and every other model value untouched.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from workbench.config import ConfigError, RandomizationConfig
from workbench.envs import randomization
from workbench.envs.backends import randomization_wrapper
from workbench.envs.randomization import (
    ActionDelay,
    ActionNoise,
    ObservationNoise,
    PhysicsRandomization,
)
from workbench.envs.robots import MINI_DUCK_ID
from workbench.envs.vector import make_envs, make_eval_env
from workbench.training import load_config

PHYSICS = RandomizationConfig(
    friction=[0.5, 1.5], mass_scale=[0.8, 1.2], damping=[0.5, 2.0], actuator_gain=[0.7, 1.3]
)


class ActionRecorder(gymnasium.Wrapper):
    """Records the actions that actually reach the task (placed under the wrapper tested)."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def step(self, action: Any) -> Any:
        self.actions.append(np.array(action, copy=True))  # keeps the dtype the task saw
        return self.env.step(action)


def outer_actions(space: gymnasium.spaces.Box, n: int, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(space.low, space.high).astype(space.dtype) for _ in range(n)]


def rollout(env: gymnasium.Env, actions: list[np.ndarray], seed: int) -> list[tuple]:
    """(obs, reward, terminated, truncated) per step, resetting when an episode ends."""
    obs, _ = env.reset(seed=seed)
    out = [(obs, 0.0, False, False)]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append((obs, 0.0, False, False))
    return out


# --------------------------------------------------------------------------- observation noise


def test_observation_noise_statistics_and_nothing_else() -> None:
    std = 0.1
    clean = gymnasium.make("HalfCheetah-v5")
    noisy = randomization.wrap(gymnasium.make("HalfCheetah-v5"),
                               RandomizationConfig(obs_noise_std=std))
    assert isinstance(noisy, ObservationNoise)
    actions = outer_actions(clean.action_space, 400)
    a, b = rollout(clean, actions, seed=3), rollout(noisy, actions, seed=3)
    diffs = np.concatenate([nb[0] - na[0] for na, nb in zip(a, b, strict=True)])
    # The task underneath is untouched: same rewards and ends, observations differ by noise only.
    assert [x[1:] for x in a] == [x[1:] for x in b]
    n = diffs.size  # 401 observations x 17 values
    assert abs(diffs.mean()) < 5 * std / np.sqrt(n)
    assert diffs.std() == pytest.approx(std, rel=0.05)
    assert noisy.observation_space == clean.observation_space


def test_observation_noise_is_reproducible_per_seed() -> None:
    env = randomization.wrap(gymnasium.make("HalfCheetah-v5"),
                             RandomizationConfig(obs_noise_std=0.1))
    first, _ = env.reset(seed=11)
    again, _ = env.reset(seed=11)
    other, _ = env.reset(seed=12)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


# --------------------------------------------------------------------------- action noise


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "InvertedPendulum-v5"])
def test_action_noise_scales_with_the_action_range(env_id: str) -> None:
    std = 0.05
    recorder = ActionRecorder(gymnasium.make(env_id))
    env = randomization.wrap(recorder, RandomizationConfig(action_noise_std=std))
    assert isinstance(env, ActionNoise)
    space = env.action_space
    given = np.zeros(space.shape, dtype=space.dtype)  # mid-range: clipping never triggers
    env.reset(seed=0)
    for _ in range(1000):
        _, _, terminated, truncated, _ = env.step(given)
        if terminated or truncated:
            env.reset()
    noise = np.stack(recorder.actions) - given
    expected = std * (space.high - space.low) / 2.0  # per dimension
    assert np.all(np.abs(noise.mean(axis=0)) < 5 * expected / np.sqrt(len(noise)))
    np.testing.assert_allclose(noise.std(axis=0), expected, rtol=0.1)
    received = np.stack(recorder.actions)
    assert np.all((received >= space.low) & (received <= space.high))


def test_action_noise_changes_only_the_action() -> None:
    recorder = ActionRecorder(gymnasium.make("HalfCheetah-v5"))
    noisy = randomization.wrap(recorder, RandomizationConfig(action_noise_std=0.2))
    actions = outer_actions(noisy.action_space, 200)
    noisy_steps = rollout(noisy, actions, seed=5)
    # Replaying the noisy actions the task received on a clean twin gives identical results.
    replay = rollout(gymnasium.make("HalfCheetah-v5"), recorder.actions, seed=5)
    for got, want in zip(noisy_steps, replay, strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1:] == want[1:]


# --------------------------------------------------------------------------- action delay


@pytest.mark.parametrize("k", [1, 3])
def test_action_delay_is_exactly_k_steps(k: int) -> None:
    recorder = ActionRecorder(gymnasium.make("HalfCheetah-v5"))
    env = randomization.wrap(recorder, RandomizationConfig(action_delay=k))
    assert isinstance(env, ActionDelay)
    actions = outer_actions(env.action_space, 20)
    env.reset(seed=0)
    for action in actions[:10]:
        env.step(action)
    env.reset(seed=1)  # the queue restarts: k neutral actions again
    for action in actions[10:]:
        env.step(action)
    neutral = np.zeros(env.action_space.shape)
    expected = [neutral] * k + actions[: 10 - k] + [neutral] * k + actions[10 : 20 - k]
    assert len(recorder.actions) == len(expected) == 20
    for got, want in zip(recorder.actions, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_action_delay_changes_only_the_timing() -> None:
    k = 2
    delayed = randomization.wrap(gymnasium.make("HalfCheetah-v5"),
                                 RandomizationConfig(action_delay=k))
    actions = outer_actions(delayed.action_space, 100)
    neutral = np.zeros(delayed.action_space.shape, dtype=np.float32)
    got = rollout(delayed, actions, seed=9)
    want = rollout(gymnasium.make("HalfCheetah-v5"), [neutral] * k + actions[:-k], seed=9)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g[0], w[0])
        assert g[1:] == w[1:]


def test_action_delay_neutral_action_respects_bounds() -> None:
    # Walker-style spaces always contain 0; a space that does not gets the nearest bound.
    class Shifted(gymnasium.ActionWrapper):
        def __init__(self, env: gymnasium.Env) -> None:
            super().__init__(env)
            self.action_space = gymnasium.spaces.Box(0.5, 1.0, shape=(6,), dtype=np.float32)

        def action(self, action: Any) -> Any:
            return action

    recorder = ActionRecorder(Shifted(gymnasium.make("HalfCheetah-v5")))
    env = ActionDelay(recorder, 1)
    env.reset(seed=0)
    env.step(np.ones(6, dtype=np.float32))
    np.testing.assert_array_equal(recorder.actions[0], np.full(6, 0.5))


# --------------------------------------------------------------------------- physics


def model_arrays(model: Any) -> dict[str, np.ndarray]:
    """Every numeric array of an MjModel, copied."""
    arrays = {}
    for name in dir(model):
        if name.startswith("_"):
            continue
        value = getattr(model, name, None)
        if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
            arrays[name] = value.copy()
    return arrays


@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", MINI_DUCK_ID])
def test_physics_within_ranges_resampled_per_episode_nothing_else(env_id: str) -> None:
    env = randomization.wrap(gymnasium.make(env_id), PHYSICS)
    assert isinstance(env, PhysicsRandomization)
    model = env.unwrapped.model  # type: ignore[attr-defined]
    nominal = model_arrays(model)
    ranges = randomization.physics_ranges(PHYSICS)
    affine = model.actuator_biastype == 1
    seen: list[dict[str, float]] = []
    for episode in range(4):
        _, info = env.reset(seed=episode) if episode == 0 else env.reset()
        sampled = info["randomization"]
        assert set(sampled) == set(ranges)
        for key, (low, high) in ranges.items():
            assert low <= sampled[key] <= high, (key, sampled[key])
        np.testing.assert_array_equal(
            model.geom_friction[:, 0], nominal["geom_friction"][:, 0] * sampled["friction"])
        np.testing.assert_array_equal(model.body_mass, nominal["body_mass"] * sampled["mass_scale"])
        np.testing.assert_array_equal(
            model.body_inertia, nominal["body_inertia"] * sampled["mass_scale"])
        np.testing.assert_array_equal(
            model.dof_damping, nominal["dof_damping"] * sampled["damping"])
        gain = sampled["actuator_gain"]
        np.testing.assert_array_equal(
            model.actuator_gainprm[:, 0], nominal["actuator_gainprm"][:, 0] * gain)
        np.testing.assert_array_equal(
            model.actuator_biasprm[affine, 1], nominal["actuator_biasprm"][affine, 1] * gain)
        # Everything else in the model is bitwise nominal.
        now = model_arrays(model)
        changed = {name for name in nominal if not np.array_equal(now[name], nominal[name])}
        assert changed <= {"geom_friction", "body_mass", "body_inertia", "dof_damping",
                           "actuator_gainprm", "actuator_biasprm"}, changed
        np.testing.assert_array_equal(model.geom_friction[:, 1:], nominal["geom_friction"][:, 1:])
        np.testing.assert_array_equal(model.actuator_gainprm[:, 1:],
                                      nominal["actuator_gainprm"][:, 1:])
        biasprm = nominal["actuator_biasprm"].copy()
        biasprm[affine, 1] = model.actuator_biasprm[affine, 1]
        np.testing.assert_array_equal(model.actuator_biasprm, biasprm)
        _, _, _, _, step_info = env.step(env.action_space.sample())
        assert step_info["randomization"] == sampled
        seen.append(sampled)
    for key in ranges:  # re-sampled every episode
        assert len({s[key] for s in seen}) == len(seen), key
    if env_id == MINI_DUCK_ID:
        assert affine.all()  # position servos: their kp is scaled with the gain


def test_physics_is_reproducible_and_leaves_the_task_rng_alone() -> None:
    settings = RandomizationConfig(friction=[0.5, 1.5])
    a = randomization.wrap(gymnasium.make("HalfCheetah-v5"), settings)
    b = randomization.wrap(gymnasium.make("HalfCheetah-v5"), settings)
    obs_a, info_a = a.reset(seed=21)
    obs_b, info_b = b.reset(seed=21)
    assert info_a["randomization"] == info_b["randomization"]
    clean_obs, _ = gymnasium.make("HalfCheetah-v5").reset(seed=21)
    # The initial state comes from the task's own generator, which the wrapper never touches.
    np.testing.assert_array_equal(obs_a, clean_obs)
    # Only the configured quantity moves.
    model = a.unwrapped.model  # type: ignore[attr-defined]
    clean_model = gymnasium.make("HalfCheetah-v5").unwrapped.model  # type: ignore[attr-defined]
    np.testing.assert_array_equal(model.body_mass, clean_model.body_mass)
    np.testing.assert_array_equal(model.dof_damping, clean_model.dof_damping)
    assert not np.array_equal(model.geom_friction, clean_model.geom_friction)


def test_physics_randomization_changes_the_dynamics() -> None:
    # Heavier, weaker robot: the same actions produce a different trajectory.
    heavy = randomization.wrap(
        gymnasium.make("HalfCheetah-v5"),
        RandomizationConfig(mass_scale=[2.0, 2.0], actuator_gain=[0.5, 0.5]),
    )
    actions = outer_actions(heavy.action_space, 30)
    got = rollout(heavy, actions, seed=0)
    want = rollout(gymnasium.make("HalfCheetah-v5"), actions, seed=0)
    np.testing.assert_array_equal(got[0][0], want[0][0])
    assert not np.allclose(got[-1][0], want[-1][0])


# --------------------------------------------------------------------------- composition


def test_all_wrappers_pass_the_checkers_on_the_duck() -> None:
    settings = RandomizationConfig(obs_noise_std=0.01, action_noise_std=0.05, action_delay=2,
                                   friction=[0.8, 1.2], mass_scale=[0.9, 1.1],
                                   damping=[0.8, 1.2], actuator_gain=[0.9, 1.1])
    env = randomization.wrap(gymnasium.make(MINI_DUCK_ID), settings)
    chain = []
    inner: Any = env
    while isinstance(inner, gymnasium.Wrapper):
        chain.append(type(inner))
        inner = inner.env
    assert chain[:4] == [ObservationNoise, ActionNoise, ActionDelay, PhysicsRandomization]
    check_env(env, skip_render_check=True)
    sb3_check_env(env)


def test_nothing_configured_adds_no_wrapper() -> None:
    assert not randomization.is_active(RandomizationConfig())
    env = gymnasium.make("HalfCheetah-v5")
    assert randomization.wrap(env, RandomizationConfig()) is env
    assert randomization_wrapper(RandomizationConfig()) is None


def test_training_and_evaluation_envs_get_their_own_settings() -> None:
    cfg = load_config([
        "env=duck", "env.num_envs=2",
        "env.randomization.friction=[0.5,1.5]", "env.randomization.action_delay=1",
        "eval.randomization.obs_noise_std=0.2",
    ])
    from workbench.envs.spec import EnvSpec

    spec = EnvSpec.from_config(cfg)
    train_env = make_envs(spec)
    eval_env = make_eval_env(spec, randomization=cfg.eval.randomization)
    try:
        assert train_env.env_is_wrapped(PhysicsRandomization) == [True, True]
        assert train_env.env_is_wrapped(ActionDelay) == [True, True]
        assert train_env.env_is_wrapped(ObservationNoise) == [False, False]
        assert eval_env.env_is_wrapped(ObservationNoise) == [True]
        assert eval_env.env_is_wrapped(PhysicsRandomization) == [False]
        train_env.reset()
        _, _, _, infos = train_env.step(np.zeros((2, 8), dtype=np.float32))
        for info in infos:  # the sampled values reach SB3's infos
            assert 0.5 <= info["randomization"]["friction"] <= 1.5
        # Env ranks are seeded seed + r: different episodes, different samples.
        assert infos[0]["randomization"] != infos[1]["randomization"]
    finally:
        train_env.close()
        eval_env.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.randomization.friction=[1.2,0.8]", "env.randomization.friction=[1.2, 0.8]: must be"),
        ("env.randomization.mass_scale=[0.8]", "env.randomization.mass_scale=[0.8]: must be"),
        ("env.randomization.damping=[0,1]", "env.randomization.damping=[0.0, 1.0]: must be"),
        ("env.randomization.obs_noise_std=-0.1", "env.randomization.obs_noise_std=-0.1: must be"),
        ("eval.randomization.action_delay=-2", "eval.randomization.action_delay=-2: must be"),
        ("env.randomization.fricton=[1,2]", "did you mean env.randomization.friction?"),
    ],
)
def test_bad_randomization_is_a_config_error(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config([override])


@pytest.mark.unit
def test_physics_randomization_needs_a_mujoco_task() -> None:
    with pytest.raises(ConfigError, match="needs a MuJoCo task"):
        load_config(["env.id=CartPole-v1", "env.randomization.friction=[0.9,1.1]"])
    # Noise and delay work on any Box task.
    load_config(["env.id=Pendulum-v1", "env.randomization.obs_noise_std=0.1"])
