"""The fast defaults compose as documented (conf/algo/ppo.yaml, README "Performance")."""

from __future__ import annotations

import pytest
from workbench import config
from workbench.config import load_config


def test_default_halfcheetah_configuration() -> None:
    cfg = load_config([])
    assert (cfg.env.id, cfg.env.num_envs, cfg.env.vec_env, cfg.env.normalize) == (
        "HalfCheetah-v5", 16, "auto", True)
    a = cfg.algo
    assert (a.n_steps, a.batch_size, a.n_epochs, a.learning_rate) == (64, 512, 5, 3e-4)
    assert (a.gamma, a.gae_lambda, a.clip_range) == (0.98, 0.92, 0.2)
    assert (a.policy.pi, a.policy.vf, a.policy.activation) == ([256, 256], [256, 256], "relu")
    assert (a.policy.log_std_init, a.policy.ortho_init) == (-2.0, False)
    assert cfg.torch_threads == 0
    assert config.derive(cfg).gradient_steps_per_iteration == 10


def test_default_hopper_configuration() -> None:
    """env=hopper adds conf/tuning/ppo_hopper.yaml: SB3's network and horizon, sampled 16 wide."""
    cfg = load_config(["env=hopper"])
    assert (cfg.env.id, cfg.env.num_envs, cfg.env.vec_env, cfg.env.normalize) == (
        "Hopper-v5", 16, "auto", True)
    a = cfg.algo
    assert (a.n_steps, a.batch_size, a.n_epochs, a.learning_rate) == (128, 64, 5, 3e-4)
    assert (a.gamma, a.gae_lambda, a.clip_range) == (0.99, 0.95, 0.2)
    assert (a.policy.pi, a.policy.vf, a.policy.activation) == ([64, 64], [64, 64], "tanh")
    assert (a.policy.log_std_init, a.policy.ortho_init) == (0.0, True)
    assert config.derive(cfg).gradient_steps_per_iteration == 160
    assert load_config(["env=hopper", "~tuning"]).algo == load_config(["env=halfcheetah"]).algo


@pytest.mark.parametrize(
    ("overrides", "batch_size"),
    [
        (["env.num_envs=4"], 128),  # half a rollout, whatever the rollout
        (["algo.n_steps=256"], 2048),
        (["env.num_envs=1", "algo.n_steps=2"], 2),
        (["algo.batch_size=64"], 64),  # an explicit value wins
        (["algo=ppo_sb3"], 64),
    ],
)
def test_minibatch_follows_the_rollout(overrides: list[str], batch_size: int) -> None:
    assert load_config(overrides).algo.batch_size == batch_size


@pytest.mark.parametrize("env", config.group_options("env"))
def test_every_env_composes_with_the_default_algo(env: str) -> None:
    cfg = load_config([f"env={env}"])
    assert cfg.algo.batch_size <= cfg.env.num_envs * cfg.algo.n_steps


def test_presets_keep_sb3_defaults_where_they_say_nothing() -> None:
    zoo = load_config(["experiment=zoo_walker2d"])  # the zoo's Walker2d sets no network
    assert (zoo.algo.policy.pi, zoo.algo.policy.activation) == ([64, 64], "tanh")
    assert (zoo.algo.n_steps, zoo.algo.batch_size, zoo.env.num_envs) == (512, 32, 1)
    ant = load_config(["experiment=zoo_ant"])  # "mujoco defaults": SB3's PPO + VecNormalize
    assert (ant.algo.n_steps, ant.algo.batch_size, ant.algo.gamma) == (2048, 64, 0.99)
    demo = load_config(["experiment=demo"])
    assert (demo.algo.policy.log_std_init, demo.algo.policy.ortho_init) == (0.0, True)
