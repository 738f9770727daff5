"""The fast defaults compose as documented (conf/algo/ppo.yaml, docs/benchmarks.md), and each
default is written once: in the schema, or in the group option that sets it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf
from workbench import config
from workbench.config import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
# The files that hold defaults: the root and every group option that is not a preset
# (experiment/ and tuning/ deliberately restate published or measured values).
DEFAULT_FILES = [CONF / "config.yaml", *(
    f for group in ("algo", "env", "sweep", "search", "tracking")
    for f in sorted((CONF / group).glob("*.yaml")))]
SCHEMA_DEFAULTS = config.flatten(OmegaConf.to_container(
    OmegaConf.structured(config.WorkbenchConfig), enum_to_str=True))


@pytest.mark.unit
def test_default_halfcheetah_configuration() -> None:
    """The `ppo` defaults, as ``~tuning`` composes them for HalfCheetah (where they were chosen)."""
    cfg = load_config(["~tuning"])
    assert (cfg.env.id, cfg.env.num_envs, cfg.env.vec_env, cfg.env.normalize) == (
        "HalfCheetah-v5", 16, "auto", True)
    a = cfg.algo
    assert (a.n_steps, a.batch_size, a.n_epochs, a.learning_rate) == (64, 512, 5, 3e-4)
    assert (a.gamma, a.gae_lambda, a.clip_range) == (0.98, 0.92, 0.2)
    assert (a.policy.pi, a.policy.vf, a.policy.activation) == ([256, 256], [256, 256], "relu")
    assert (a.policy.log_std_init, a.policy.ortho_init) == (-2.0, False)
    assert cfg.torch_threads == 0
    assert config.derive(cfg).gradient_steps_per_iteration == 10


@pytest.mark.unit
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
    assert load_config(["env=hopper", "~tuning"]).algo == load_config(["~tuning"]).algo


@pytest.mark.unit
def test_default_swimmer_configuration() -> None:
    """env=swimmer adds conf/tuning/ppo_swimmer.yaml: rl-baselines3-zoo's entry sampled 16 wide,
    its learning rate falling linearly."""
    cfg = load_config(["env=swimmer"])
    assert (cfg.env.id, cfg.env.num_envs, cfg.env.normalize, cfg.env.norm_gamma) == (
        "Swimmer-v5", 16, True, 0.9999)
    a = cfg.algo
    assert (a.n_steps, a.batch_size, a.n_epochs) == (256, 256, 10)
    assert (a.learning_rate, a.lr_schedule, a.gamma, a.gae_lambda) == (6e-4, "linear", 0.9999,
                                                                        0.98)
    assert (a.policy.pi, a.policy.activation, a.policy.ortho_init) == ([64, 64], "tanh", True)
    assert config.derive(cfg).gradient_steps_per_iteration == 160
    assert load_config(["env=swimmer", "algo.lr_schedule=constant"]).algo.lr_schedule == "constant"


@pytest.mark.unit
def test_halfcheetah_tuning() -> None:
    """env=halfcheetah (the default) adds conf/tuning/ppo_halfcheetah.yaml: rollouts half as
    long, the learning rate falling linearly; everything else is the `ppo` defaults."""
    cfg, base = load_config([]), load_config(["~tuning"])
    a = cfg.algo
    assert (cfg.env.num_envs, a.n_steps, a.batch_size, a.n_epochs) == (16, 32, 256, 5)
    assert (a.learning_rate, a.lr_schedule) == (3e-4, "linear")
    assert config.derive(cfg).gradient_steps_per_iteration == 10
    tuned, untuned = config.flatten(config.to_dict(cfg)), config.flatten(config.to_dict(base))
    assert {k for k, v in tuned.items() if untuned[k] != v} == {
        "algo.n_steps", "algo.batch_size", "algo.lr_schedule"}
    assert load_config(["algo.n_steps=64"]).algo.n_steps == 64  # an explicit value wins


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "batch_size"),
    [
        (["env.num_envs=4"], 64),  # half a rollout (4 x 32), whatever the rollout
        (["algo.n_steps=256"], 2048),
        (["env.num_envs=1", "algo.n_steps=2"], 2),
        (["algo.batch_size=64"], 64),  # an explicit value wins
        (["algo=ppo_sb3"], 64),
    ],
)
def test_minibatch_follows_the_rollout(overrides: list[str], batch_size: int) -> None:
    assert load_config(overrides).algo.batch_size == batch_size


@pytest.mark.unit
@pytest.mark.parametrize("env", config.group_options("env"))
def test_every_env_composes_with_the_default_algo(env: str) -> None:
    cfg = load_config([f"env={env}"])
    assert cfg.algo.batch_size <= cfg.env.num_envs * cfg.algo.n_steps


@pytest.mark.unit
def test_presets_keep_sb3_defaults_where_they_say_nothing() -> None:
    zoo = load_config(["experiment=zoo_walker2d"])  # the zoo's Walker2d sets no network
    assert (zoo.algo.policy.pi, zoo.algo.policy.activation) == ([64, 64], "tanh")
    assert (zoo.algo.n_steps, zoo.algo.batch_size, zoo.env.num_envs) == (512, 32, 1)
    ant = load_config(["experiment=zoo_ant"])  # "mujoco defaults": SB3's PPO + VecNormalize
    assert (ant.algo.n_steps, ant.algo.batch_size, ant.algo.gamma) == (2048, 64, 0.99)
    demo = load_config(["experiment=demo"])
    assert (demo.algo.policy.log_std_init, demo.algo.policy.ortho_init) == (0.0, True)


def leaves(tree: Any, prefix: str) -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        return {k: v for key, value in tree.items()
                for k, v in leaves(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


@pytest.mark.unit
@pytest.mark.parametrize("path", DEFAULT_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_yaml_file_repeats_a_schema_default(path: Path) -> None:
    tree = yaml.safe_load(path.read_text()) or {}
    tree.pop("defaults", None)
    prefix = "" if path.name == "config.yaml" else f"{path.parent.name}."
    repeated = {k: v for k, v in leaves(tree, prefix).items()
                if k in SCHEMA_DEFAULTS and SCHEMA_DEFAULTS[k] == v}
    assert repeated == {}, f"{path.name} restates the schema's defaults: {repeated}"


@pytest.mark.unit
def test_schema_algo_defaults_are_sb3s_own() -> None:
    """algo=ppo_sb3 sets nothing: the schema carries stable-baselines3's PPO defaults."""
    import inspect

    from stable_baselines3 import PPO

    sb3 = {k: p.default for k, p in inspect.signature(PPO.__init__).parameters.items()}
    algo = load_config(["algo=ppo_sb3"]).algo
    for key in ("n_steps", "batch_size", "n_epochs", "learning_rate", "gamma", "gae_lambda",
                "clip_range", "ent_coef", "vf_coef", "max_grad_norm", "target_kl",
                "normalize_advantage"):
        assert getattr(algo, key) == sb3[key], key
