"""Algorithms beyond PPO: the ``algo`` group's schemas, their checks, training with each
algorithm's own metrics, and an off-policy resume that continues exactly (replay buffer
included)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from stable_baselines3 import A2C
from workbench import config
from workbench.config import A2CConfig, ConfigError, OnPolicyConfig
from workbench.training import algorithms, load_config, train

from .conftest import TINY
from .support.runs import assert_same_training, interrupt_and_resume

ALGOS = ["a2c", "sac", "td3", "tqc", "crossq"]


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("name", ["ppo", *ALGOS])
def test_each_algorithm_composes_with_its_librarys_defaults(name: str) -> None:
    cfg = config.load_config([f"algo={name}"])
    spec = algorithms.algorithm(cfg.algo)
    assert cfg.algo.name == name and spec.name == name
    # every schema default is the library's own constructor default
    signature = inspect.signature(spec.cls.__init__).parameters
    arguments = spec.arguments(cfg.algo)
    if name != "ppo":  # conf/algo/ppo.yaml is the workbench's tuned PPO
        for key, value in arguments.items():
            if key in signature and not callable(value):
                assert signature[key].default == value, (name, key)
        assert signature["learning_rate"].default == cfg.algo.learning_rate


@pytest.mark.parametrize(("overrides", "message"), [
    (["algo=sac", "algo.n_epochs=5"],
     r"^algo\.n_epochs: not an option of algo=sac \(a key of algo=ppo\); .*sac's keys under "
     r"algo: .*gradient_steps"),
    (["algo=td3", "algo.ent_coef=0.1"], r"^algo\.ent_coef: not an option of algo=td3"),
    (["algo=ppo", "algo.policy.qf=[64]"], r"^algo\.policy\.qf: not an option of algo=ppo"),
    (["algo=sac", "algo.gradient_steps=0"],
     r"^algo\.gradient_steps=0: must be >= 1 \(e\.g\. algo\.gradient_steps=1\)$"),
    (["algo=sac", "algo.ent_coef=lots"], r"^algo\.ent_coef='lots': write \"auto\""),
    (["algo=sac", "algo.n_epoch=5"], r"^algo\.n_epoch: unknown config key; did you mean "
                                     r"algo\.n_epochs\?"),
])
def test_a_key_of_another_algorithm_is_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config.load_config(overrides)


def test_a_replay_buffer_larger_than_memory_is_refused_before_any_run(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"^algo\.buffer_size=1000000000000: the replay "
                                          r"buffer needs [\d.]+ GiB .* lower algo\.buffer_size "
                                          r"to at most \d+$"):
        load_config([*TINY, "algo=sac", "algo.buffer_size=1000000000000"])
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_a_stored_config_rebuilds_its_own_algorithm() -> None:
    cfg = config.load_config(["algo=tqc", "algo.policy.n_quantiles=7", "algo.tau=0.02"])
    again = config.from_yaml(config.to_yaml(cfg))
    assert type(again.algo).__name__ == "TQCConfig"
    assert again.algo == cfg.algo
    with pytest.raises(ConfigError, match=r"algo\.name='dqn': unknown algorithm"):
        config.from_yaml(config.to_yaml(cfg).replace("name: tqc", "name: dqn"))


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize("name", ALGOS)
def test_each_algorithm_trains_and_logs_its_own_metrics(name: str, store: Path) -> None:
    result = train(load_config([*TINY, f"algo={name}", "tracking.system_metrics=false",
                                "console.iteration_lines=false"]))
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algo.name"] == name
    spec = algorithms.algorithm(name)
    metrics = run.data.metrics
    assert set(spec.metrics) <= set(metrics), set(spec.metrics) - set(metrics)
    for key in ("rollout/ep_rew_mean", "time/rollout_s", "time/update_s", "eval/mean_reward"):
        assert key in metrics, key
    if spec.off_policy:  # one point every log_every_steps, each key at its own step
        steps = [m.step for m in client.get_metric_history(result.run_id, "train/critic_loss")]
        assert steps == sorted(set(steps)) and len(steps) >= 3
        assert run.data.params["derived.log_every_steps"] == "38"


def test_an_off_policy_resume_continues_exactly_with_its_replay_buffer(
    store: Path, tmp_path: Path
) -> None:
    # 2 envs, a logged point and a snapshot every 76 steps; a checkpoint every 152.
    overrides = [*TINY, "algo=sac", "env.vec_env=dummy", "total_timesteps=768",
                 "console.iteration_lines=false", "tracking.system_metrics=false",
                 "checkpoint.every_steps=152", "eval.every_steps=200"]
    client, full, killed, resumed = interrupt_and_resume(overrides)
    # the last snapshot before the signal (380) was written on the way out, buffer included
    assert killed.data.tags["workbench.checkpoint"] == "checkpoints/step-000000000380"
    assert_same_training(client, full, resumed, tmp_path)


# --------------------------------------------------------------------------- zoo presets

ROOT = Path(__file__).resolve().parents[1]


def zoo_presets_script() -> Any:
    """scripts/zoo_presets.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("zoo_presets", ROOT / "scripts" /
                                                  "zoo_presets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zoo_presets_are_what_the_zoos_files_give(capsys: pytest.CaptureFixture[str]) -> None:
    """Every zoo_* preset is what the installed rl_zoo3's hyperparams/*.yml give."""
    script = zoo_presets_script()
    assert script.main(["--check"]) == 0, capsys.readouterr()
    assert script.installed_version() == "2.9.2"  # the version the presets' headers name
    with pytest.raises(script.ZooEntryError, match=r"^policy_kwargs .*not a dict"):
        script.policy_kwargs("__import__('os').system('true')")
    with pytest.raises(script.ZooEntryError, match=r"^replay_buffer_class: no workbench"):
        script.translate({"n_timesteps": 10, "replay_buffer_class": "HerReplayBuffer"}, "sac")
    with pytest.raises(script.ZooEntryError, match=r"^normalize 'dict\(norm_obs=False\)': "):
        script.translate({"n_timesteps": 10, "normalize": "dict(norm_obs=False)"}, "ppo")
    with pytest.raises(script.ZooEntryError, match=r"^nn\.SiLU: not a literal or one of "):
        script.policy_kwargs("dict(activation_fn=nn.SiLU)")
    with pytest.raises(script.ZooEntryError, match=r"^duck: rl-baselines3-zoo has no PPO"):
        script.zoo_entry("ppo", "duck")


@pytest.mark.parametrize("preset", sorted(
    p.stem for p in (ROOT / "conf" / "experiment").glob("zoo_*_*.yaml")
    if p.stem.split("_")[1] in ALGOS))
def test_each_zoo_preset_builds_the_zoos_model(preset: str) -> None:
    algo, task = preset.split("_", 2)[1:]
    script = zoo_presets_script()
    entry = script.zoo_entry(algo, task)[1]
    cfg = config.load_config([f"experiment={preset}"])
    assert (cfg.algo.name, cfg.env.name) == (algo, task)
    assert cfg.total_timesteps == int(entry["n_timesteps"])
    assert cfg.env.normalize == bool(entry.get("normalize", False))
    arguments = {**algorithms.algorithm(cfg.algo).arguments(cfg.algo), "gamma": cfg.algo.gamma}
    for key in ("learning_starts", "buffer_size", "batch_size", "gamma", "policy_delay",
                "top_quantiles_to_drop_per_net", "train_freq", "gradient_steps"):
        if key in entry:
            assert arguments[key] == entry[key], key
    if "net_arch" in script.policy_kwargs(entry.get("policy_kwargs", "dict()")):
        net = script.policy_kwargs(entry["policy_kwargs"])["net_arch"]
        pi = net if isinstance(net, list) else net["pi"]
        assert algorithms.algorithm(cfg.algo).policy_kwargs(cfg.algo)["net_arch"]["pi"] == pi


def ppo_tasks() -> list[str]:
    """The tasks of the installed rl_zoo3's PPO entries the presets come from."""
    script = zoo_presets_script()
    return sorted(script.tasks(script.read_hyperparams(script.installed_hyperparams(), "ppo"))
                  .values())


PPO_PRESETS = [f"zoo_{task}" for task in ppo_tasks()]


@pytest.mark.parametrize("preset", PPO_PRESETS)
def test_each_ppo_zoo_preset_builds_what_rl_zoo3_builds(preset: str, tmp_path: Path) -> None:
    """rl_zoo3's own ExperimentManager builds its model from its hyperparams/ppo.yml entry;
    the preset's model has the same hyperparameters, network, n_envs and VecNormalize."""
    import gymnasium

    # importing rl_zoo3 swaps gymnasium's TimeLimit for its own everywhere; the rest of this
    # worker's tests must see gymnasium's (workbench.envs.simstate knows only those wrappers)
    modules = (gymnasium.wrappers, gymnasium.wrappers.common, gymnasium.envs.registration)
    original = gymnasium.wrappers.TimeLimit
    import rl_zoo3.exp_manager  # noqa: F401

    for module in modules:
        module.TimeLimit = original  # type: ignore[attr-defined]
    from stable_baselines3.common.vec_env import VecNormalize
    from workbench.envs.spec import EnvSpec
    from workbench.envs.vector import make_envs
    from workbench.training.model import build_model

    task = preset.removeprefix("zoo_")
    cfg = load_config([f"experiment={preset}", "device=cpu", "env.vec_env=dummy"])
    _, manager, zoo = zoo_presets_script().zoo_experiment(task, cfg.env.id, tmp_path,
                                                         device="cpu")
    ours = build_model(cfg, make_envs(EnvSpec.from_config(cfg)))
    try:
        assert type(ours) is type(zoo) and ours.n_envs == zoo.n_envs
        assert cfg.total_timesteps == manager.n_timesteps
        for key in ("n_steps", "n_epochs", "gamma", "gae_lambda", "ent_coef", "vf_coef",
                    "max_grad_norm", "use_sde", "sde_sample_freq", "normalize_advantage",
                    "target_kl", "clip_range_vf"):
            assert getattr(ours, key) == getattr(zoo, key), key
        rollout = zoo.n_steps * zoo.n_envs  # SB3 caps a larger minibatch at the rollout
        assert ours.batch_size == min(zoo.batch_size, rollout)
        for schedule in ("lr_schedule", "clip_range"):
            for progress in (1.0, 0.5, 0.0):
                assert getattr(ours, schedule)(progress) == pytest.approx(
                    getattr(zoo, schedule)(progress), rel=1e-12), (schedule, progress)
        for key in ("net_arch", "activation_fn", "ortho_init", "log_std_init",
                    "share_features_extractor"):
            assert getattr(ours.policy, key) == getattr(zoo.policy, key), key
        ours_norm, zoo_norm = ours.get_vec_normalize_env(), zoo.get_vec_normalize_env()
        assert (ours_norm is None) == (zoo_norm is None)
        if isinstance(zoo_norm, VecNormalize) and isinstance(ours_norm, VecNormalize):
            for key in ("norm_obs", "norm_reward", "gamma", "clip_obs", "clip_reward",
                        "epsilon"):
                assert getattr(ours_norm, key) == getattr(zoo_norm, key), key
        limits = [spec.max_episode_steps for spec in (ours.get_env().get_attr("spec")[0],
                                                      zoo.get_env().get_attr("spec")[0])]
        assert limits[0] == limits[1]
    finally:
        ours.get_env().close()
        zoo.get_env().close()


# --------------------------------------------------------------------------- export and Hub


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_an_off_policy_policy_exports_and_round_trips_a_hub_bundle(
    name: str, store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Hugging Face Hub is unreachable from these machines: the bundle goes through
    # huggingface_hub's own offline cache, as tests/test_hub.py's pulls do.
    from workbench.deploy import export, hub

    from .support.hub import offline_cache, populate_cache

    result = train(load_config([*TINY, f"algo={name}", "env.normalize=true",
                                "tracking.system_metrics=false",
                                "console.iteration_lines=false"]))
    exported = export.export_run(result.run_id, observations=64, episodes=2, calls=1000,
                                 warmup=10)
    assert exported.passed
    assert exported.report["parity"]["onnx_max_abs_diff"] <= 1e-5
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    folder = tmp_path / "bundle"
    hub.write_bundle(client, result.run_id, folder)
    label = algorithms.algorithm(name).label
    index = json.loads((folder / "bundle.json").read_text())
    card = (folder / "README.md").read_text()
    assert index["algo"] == label and f"# {label} on HalfCheetah-v5" in card
    assert "| `algo.buffer_size` | 2000 |" in card
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    commit = populate_cache(tmp_path / "cache", f"test-org/tiny-{name}", files)
    offline_cache(monkeypatch, tmp_path / "cache")
    pulled = hub.pull(f"test-org/tiny-{name}", commit)
    assert pulled.checks["onnx_max_abs_diff"] <= 1e-5
    assert pulled.config is not None and pulled.config.algo.name == name


# --------------------------------------------------------------------------- sweep and report


@pytest.mark.slow
def test_a_sweep_over_algorithms_and_its_report_compare_them(store: Path, tmp_path: Path
                                                             ) -> None:
    from .conftest import run_cli

    proc = run_cli("sweep", "sweep.grid={algo:[ppo,sac]}", "sweep.seeds=[0,1]", *TINY,
                   "env=inverted_pendulum", "tracking.system_metrics=false",
                   env={"WORKBENCH_CPU_BUDGET": "2"}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    children = [r for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.`sweep.role` = 'child'")]
    assert sorted(r.info.run_name for r in children) == ["ppo-s0", "ppo-s1", "sac-s0",
                                                         "sac-s1"]
    assert {r.data.params["algo.name"] for r in children} == {"ppo", "sac"}
    assert all(r.info.status == "FINISHED" for r in children)
    sweep_id = children[0].data.tags["sweep_id"]
    out = tmp_path / "report"
    proc = run_cli("report", "--sweep", sweep_id, "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = out / f"sweep-{sweep_id}"
    # return vs environment steps and vs training seconds, and each family's update signals
    for figure in ("reward_curves.png", "reward_vs_time.png", "update_signals.png",
                   "off_policy_signals.png"):
        assert (folder / figure).stat().st_size > 0, figure
    markdown = (folder / "report.md").read_text()
    assert "algo=ppo" in markdown and "algo=sac" in markdown


@dataclass
class ToyConfig(OnPolicyConfig):
    """A new on-policy algorithm (SB3's A2C under another name), added by the recipe alone."""

    name: str = "toy"
    n_steps: int = 8


class Toy(A2C):
    """The toy's implementation: its own class, so a built model names its algorithm."""


def test_a_new_on_policy_algorithm_needs_only_the_documented_recipe(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/algorithms.md's "Adding an algorithm", steps 1-3, for an on-policy algorithm that
    is neither PPO nor A2C: nothing else in the workbench has to know it."""
    monkeypatch.setitem(config.ALGORITHMS, "toy", ToyConfig)  # 1. the schema, in ALGORITHMS
    conf = store / "conf"  # 2. its config files (here in the user's config directory)
    for group, name, text in (("algo", "toy", "defaults: [toy_schema, _self_]\n"),
                              ("debug_algo", "tiny_toy", "policy: {pi: [16], vf: [16]}\n"),
                              ("search", "toy", "name: toy\nparams:\n  learning_rate: "
                                                "{low: 1.0e-4, high: 1.0e-3, log: true}\n")):
        (conf / group).mkdir(parents=True, exist_ok=True)
        (conf / group / f"{name}.yaml").write_text(text)
    a2c = algorithms.algorithm("a2c")  # 3. its Algorithm entry
    monkeypatch.setitem(algorithms.REGISTRY, "toy", dataclasses.replace(
        a2c, name="toy", label="Toy", cls=Toy, arguments=lambda a: a2c.arguments(
            A2CConfig(**{f.name: getattr(a, f.name) for f in dataclasses.fields(ToyConfig)
                         if f.name != "name"}))))
    cfg = load_config(["algo=toy", *TINY, "total_timesteps=64", "eval.final_episodes=1"])
    assert (cfg.algo.name, config.derive(cfg).gradient_steps_per_iteration) == ("toy", 1)
    result = train(cfg)
    run = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.params["algo.name"] == "toy"
    assert run.data.params["derived.minibatches_per_epoch"] == "1"
