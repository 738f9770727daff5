"""Config tier: every option composes; bad input fails in one line, exit 2, nothing created."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest
from workbench import cli, config
from workbench.config import ConfigError, load_config
from workbench.envs import robots  # noqa: F401  (registers the workbench's own ids)

from .conftest import run_cli


@pytest.mark.unit
@pytest.mark.parametrize(
    ("group", "option"),
    [(g, o) for g in config.GROUPS for o in config.group_options(g)],
)
def test_every_option_composes(group: str, option: str) -> None:
    cfg = load_config([f"{group}={option}"])
    assert isinstance(cfg, config.WorkbenchConfig)
    if group == "env":
        assert cfg.env.name == option
        # MuJoCo -v5 tasks, classic-control tasks and the workbench's own robots
        assert cfg.env.id.endswith(("-v5", "-v1", "-v0")) and cfg.env.id in gymnasium.registry
    if group == "experiment":
        assert cfg.experiment_name == option


@pytest.mark.unit
def test_issue_overrides_reach_the_config() -> None:
    cfg = load_config(["env=hopper", "env.num_envs=8", "algo.n_steps=256", "seed=3"])
    assert (cfg.env.id, cfg.env.num_envs, cfg.algo.n_steps, cfg.seed) == ("Hopper-v5", 8, 256, 3)
    assert config.derive(cfg).env_seeds == [3, 4, 5, 6, 7, 8, 9, 10]


@pytest.mark.unit
def test_zoo_preset_values() -> None:
    cfg = load_config(["experiment=zoo_halfcheetah"])
    assert cfg.env.id == "HalfCheetah-v5"
    assert cfg.env.normalize is True
    assert cfg.algo.learning_rate == pytest.approx(2.0633e-05)
    assert cfg.algo.policy.pi == [256, 256]
    assert cfg.algo.policy.activation == "relu"


def _tuning_target(option: str) -> tuple[str, str]:
    """``ppo_hopper`` -> ``("ppo", "hopper")``: the algo and env a tuning option is for."""
    for algo in sorted(config.group_options("algo"), key=len, reverse=True):
        env = option.removeprefix(f"{algo}_")
        if env != option and env in config.group_options("env"):
            return algo, env
    raise AssertionError(f"conf/tuning/{option}.yaml names no <algo>_<env> pair")


def _flat(overrides: list[str]) -> dict[str, object]:
    return config.flatten(config.to_dict(load_config(overrides)))


@pytest.mark.unit
@pytest.mark.parametrize("option", config.group_options("tuning"))
def test_tuning_applies_to_its_algo_and_env_only(option: str) -> None:
    from omegaconf import OmegaConf

    algo, env = _tuning_target(option)
    base = [f"algo={algo}", f"env={env}"]
    tuned, plain = _flat(base), _flat([*base, "~tuning"])
    values = config.flatten(OmegaConf.to_container(
        OmegaConf.load(config.conf_dir() / "tuning" / f"{option}.yaml"), resolve=False))
    assert values, f"{option}.yaml sets nothing"
    for key, value in values.items():
        if not (isinstance(value, str) and value.startswith("${")):
            assert tuned[key] == value, key
    assert any(tuned[key] != plain[key] for key in values)
    # an explicit override beats the tuning; another algo does not get it
    key = next(iter(values))
    assert _flat([*base, f"{key}={plain[key]}"])[key] == plain[key]
    other = [a for a in config.group_options("algo") if a != algo][0]
    assert _flat([f"algo={other}", f"env={env}"]) == _flat([f"algo={other}", f"env={env}",
                                                            "~tuning"])


@pytest.mark.unit
def test_tuning_null_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="write ~tuning"):
        load_config(["env=hopper", "tuning=null"])


@pytest.mark.unit
def test_derived_values_are_exact() -> None:
    cfg = load_config(["env.num_envs=8", "algo.n_steps=256", "algo.batch_size=512",
                       "total_timesteps=50000", "algo.n_epochs=10"])
    d = config.derive(cfg)
    assert d.rollout_size == 2048
    assert d.minibatches_per_epoch == 4
    assert d.gradient_steps_per_iteration == 40
    assert d.iterations == 25  # ceil(50000 / 2048)


@pytest.mark.unit
def test_flatten_is_dotted() -> None:
    flat = config.flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}})
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "e": {}}


@pytest.mark.unit
def test_recompose_in_same_process() -> None:
    # A notebook re-running its compose cell must not hit "GlobalHydra is already initialized".
    assert load_config(["seed=1"]).seed == 1
    assert load_config(["seed=2"]).seed == 2


BAD_INPUT = [
    (["algo.n_step=5"], "algo.n_step: unknown config key; did you mean algo.n_steps?"),
    (["env.num_envs=abc"], "env.num_envs=abc"),
    (["env=halfcheeta"], "env=halfcheeta: unknown env option (did you mean halfcheetah?)"),
    (["algo.batch_size=4096", "env.num_envs=2", "algo.n_steps=64"],
     "algo.batch_size=4096 is larger than one rollout"),
    (["total_timesteps=100", "env.num_envs=2", "algo.n_steps=64", "algo.batch_size=64"],
     "total_timesteps=100 is smaller than one rollout"),
    (["env.num_envs=0"], "env.num_envs=0: must be >= 1"),
    (["algo.n_steps=1", "algo.batch_size=2"], "algo.n_steps=1: must be >= 2"),
    (["total_timesteps=-5"], "total_timesteps=-5: must be >= 1"),
    (["env.id=HalfCheetah-v9"], "env.id='HalfCheetah-v9': not a registered gymnasium id"),
    (["env.vec_env=threads"], "env.vec_env='threads': not a valid choice; choose one of dummy"),
    (["device=tpu"], "device='tpu': not a valid choice"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_INPUT)
def test_bad_input_one_line_exit_2_nothing_created(
    overrides: list[str], expected: str, bare_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["train", *overrides])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("workbench: error: ")
    assert not bare_store.exists(), "no MLflow store (and no run) may be created on bad input"


@pytest.mark.unit
def test_wrong_type_names_key_and_expected_type() -> None:
    with pytest.raises(ConfigError, match=r"env\.num_envs=abc: .*expected int"):
        load_config(["env.num_envs=abc"])


@pytest.mark.unit
def test_sweep_syntax_in_one_run_points_to_the_sweep() -> None:
    with pytest.raises(ConfigError, match=r"several values for one run; sweep them with "
                                          r"`workbench sweep algo.gamma=0.9,0.99`"):
        load_config(["algo.gamma=0.9,0.99"])


def test_bad_input_through_real_process(bare_store: Path) -> None:
    proc = run_cli("train", "env=halfcheeta")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "workbench: error: env=halfcheeta: unknown env option (did you mean halfcheetah?); "
        "choose one of " + ", ".join(config.group_options("env"))
    ]
    assert not bare_store.exists()


@pytest.mark.unit
def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trian"]) == 2
    assert capsys.readouterr().err.startswith(
        "workbench: error: argument COMMAND: invalid choice: 'trian'")


@pytest.mark.parametrize("preset", config.group_options("experiment"))
def test_every_preset_composes_and_builds_its_model(preset: str) -> None:
    """The preset's values reach the SB3 model as they are written (schedules, gSDE
    included): PPO's field by field, the other algorithms' every constructor argument."""
    from dataclasses import replace

    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_envs
    from workbench.training import algorithms
    from workbench.training import load_config as load_run_config
    from workbench.training.model import build_model

    cfg = load_run_config([f"experiment={preset}", "device=cpu"])
    venv = make_envs(replace(EnvSpec.from_config(cfg), vec_env="dummy"))
    try:
        model = build_model(cfg, venv)
        a = cfg.algo
        lr_end = 0.0 if a.lr_schedule == "linear" else a.learning_rate
        assert (model.lr_schedule(1.0), model.lr_schedule(0.0)) == (a.learning_rate, lr_end)
        assert (model.gamma, model.n_envs) == (a.gamma, cfg.env.num_envs)
        if not isinstance(a, config.PPOConfig):
            optimizer = getattr(model.policy, "optimizer", None)
            for key, value in algorithms.algorithm(a).arguments(a).items():
                if key == "use_rms_prop":  # A2C: it chooses the optimizer
                    assert (type(optimizer).__name__ == "RMSprop") == value
                    continue
                if key == "rms_prop_eps":
                    assert not a.use_rms_prop or optimizer.defaults["eps"] == value
                    continue
                held = getattr(model, key)
                if key == "train_freq":
                    held = held.frequency  # SB3's TrainFreq(frequency, unit)
                if key != "target_entropy":  # "auto" becomes -(action dimensions)
                    assert held == value, key
            return
        assert (model.n_steps, model.batch_size, model.n_epochs) == (
            a.n_steps, a.batch_size, a.n_epochs)
        assert (model.gamma, model.gae_lambda, model.ent_coef, model.vf_coef) == (
            a.gamma, a.gae_lambda, a.ent_coef, a.vf_coef)
        assert (model.use_sde, model.max_grad_norm, model.n_envs) == (
            a.use_sde, a.max_grad_norm, cfg.env.num_envs)
        end = 0.0 if a.clip_range_schedule == "linear" else a.clip_range
        assert (model.clip_range(1.0), model.clip_range(0.0)) == (a.clip_range, end)
    finally:
        venv.close()


def test_zoo_presets_carry_the_zoos_entries() -> None:
    """Spot checks against rl-baselines3-zoo's hyperparams/ppo.yml (one key of each kind)."""
    pendulum = load_config(["experiment=zoo_pendulum"])
    assert (pendulum.env.id, pendulum.env.num_envs, pendulum.algo.use_sde,
            pendulum.algo.sde_sample_freq, pendulum.algo.gamma) == ("Pendulum-v1", 4, True, 4, 0.9)
    cartpole = load_config(["experiment=zoo_cartpole"])
    assert (cartpole.algo.lr_schedule, cartpole.algo.clip_range_schedule) == ("linear", "linear")
    assert cartpole.total_timesteps == 100_000 and not cartpole.env.normalize
    swimmer = load_config(["experiment=zoo_swimmer"])
    assert (swimmer.algo.gamma, swimmer.algo.n_steps, swimmer.env.num_envs) == (0.9999, 1024, 4)
    assert (swimmer.env.normalize, swimmer.env.norm_gamma) == (True, 0.9999)
    car = load_config(["experiment=zoo_mountain_car_continuous"])
    assert (car.algo.policy.log_std_init, car.algo.max_grad_norm) == (-3.29, 5.0)


@pytest.mark.unit
def test_an_off_policy_algo_takes_one_env_unless_told_otherwise() -> None:
    """SAC as a newcomer runs it (algo=sac env=pendulum) gets its library's replay ratio, not
    PPO's 16 envs; the command line, a preset, debug and ~algo_env still decide."""
    envs = {tuple(o): config.load_config(o).env.num_envs for o in (
        ["algo=sac", "env=pendulum"], ["algo=td3"], ["algo=tqc"], ["algo=crossq"],
        ["algo=sac", "env.num_envs=4"], ["algo=sac", "~algo_env"], ["algo=sac", "debug=tiny"],
        ["experiment=zoo_sac_halfcheetah"], ["algo=ppo"], ["algo=a2c"])}
    assert envs == {("algo=sac", "env=pendulum"): 1, ("algo=td3",): 1, ("algo=tqc",): 1,
                    ("algo=crossq",): 1, ("algo=sac", "env.num_envs=4"): 4,
                    ("algo=sac", "~algo_env"): 16, ("algo=sac", "debug=tiny"): 2,
                    ("experiment=zoo_sac_halfcheetah",): 1, ("algo=ppo",): 16,
                    ("algo=a2c",): 16}
    with pytest.raises(ConfigError, match=r"the algo_env group is chosen from algo"):
        config.load_config(["algo_env=null"])
