"""Write ``conf/experiment/zoo_*.yaml`` from rl-baselines3-zoo's hyperparameters.

rl-baselines3-zoo (DLR-RM/rl-baselines3-zoo, ``rl_zoo3`` on PyPI; Raffin et al.) keeps tuned
values per algorithm and task in ``hyperparams/<algo>.yml``. This script translates its entries
into Hydra presets of the workbench, each naming the entry it came from in its header:
PPO's (``zoo_<task>``, on ``algo=ppo_sb3``) and A2C's, SAC's, TD3's, TQC's and CrossQ's
(``zoo_<algo>_<task>``) for every task of ``conf/env/`` the zoo has an entry for.
By default it reads the rl_zoo3 installed in this environment (``make setup``: the ``zoo``
extra, pinned in pyproject.toml), else a folder or wheel:

    python scripts/zoo_presets.py                 # the installed rl_zoo3
    python scripts/zoo_presets.py --hyperparams rl_zoo3-2.9.3-py3-none-any.whl --version 2.9.3

The files are read as data (YAML's safe loader; ``policy_kwargs`` strings are parsed as
Python literals through :mod:`ast`, never evaluated). A key the workbench has no setting for
stops the script with its name rather than being dropped. ``--check`` compares the committed
presets with what the files give instead of writing (tests/test_algorithms.py).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALGOS = {"ppo": "PPO", "a2c": "A2C", "sac": "SAC", "td3": "TD3", "tqc": "TQC",
         "crossq": "CrossQ"}
# the zoo's -v4 entries, applied to the workbench's -v5 tasks (conf/env/<task>.yaml)
TASKS = {"HalfCheetah-v4": "halfcheetah", "Hopper-v4": "hopper", "Walker2d-v4": "walker2d",
         "Ant-v4": "ant", "Humanoid-v4": "humanoid", "Swimmer-v4": "swimmer"}
# Every entry id of conf/env/'s tasks the zoo's files use (its -v2 ones applied to -v5 too),
# in order of preference where a task has two (PPO's HumanoidStandup-v2, CrossQ's -v4): each
# algorithm gets a preset wherever its file has one of them.
ZOO_TASKS = {**TASKS, "HumanoidStandup-v2": "humanoid_standup",
             "HumanoidStandup-v4": "humanoid_standup",
             "InvertedDoublePendulum-v2": "inverted_double_pendulum",
             "InvertedPendulum-v2": "inverted_pendulum", "Reacher-v2": "reacher",
             "Pendulum-v1": "pendulum", "CartPole-v1": "cartpole", "Acrobot-v1": "acrobot",
             "MountainCar-v0": "mountain_car",
             "MountainCarContinuous-v0": "mountain_car_continuous"}
# Entries the workbench cannot express, left out on purpose (any other one stops the script).
UNEXPRESSED = {("td3", "MountainCarContinuous-v0"):
               "Ornstein-Uhlenbeck action noise (algo.action_noise_std is Gaussian)"}
ACTIVATIONS = {"nn.ReLU": "relu", "nn.Tanh": "tanh", "nn.ELU": "elu"}
# zoo key -> workbench key (the rest: see translate)
SAME = ("learning_starts", "buffer_size", "batch_size", "train_freq", "gradient_steps", "gamma",
        "tau", "policy_delay", "top_quantiles_to_drop_per_net", "target_policy_noise",
        "target_noise_clip", "n_steps", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm",
        "use_sde", "sde_sample_freq", "normalize_advantage", "use_rms_prop", "n_epochs")
ON_POLICY = ("ppo", "a2c")


class ZooEntryError(ValueError):
    """An entry with a key or value the workbench cannot express."""


def installed_hyperparams() -> Path:
    """The installed rl_zoo3's ``hyperparams`` folder (found without importing rl_zoo3)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or spec.origin is None:
        raise OSError("rl_zoo3 is not installed: make setup installs it (the zoo extra), "
                      "or pass --hyperparams")
    return Path(spec.origin).parent / "hyperparams"


def installed_version() -> str:
    from importlib.metadata import version

    return version("rl_zoo3")


def tasks(entries: Mapping[str, Any]) -> dict[str, str]:
    """The zoo's entry ids of one ``hyperparams/<algo>.yml`` this script reads -> the
    workbench's task: one id per task, the first of :data:`ZOO_TASKS` the file has."""
    found: dict[str, str] = {}
    for zoo_id, task in ZOO_TASKS.items():
        if zoo_id in entries and task not in found.values():
            found[zoo_id] = task
    return found


def preset_name(algo: str, task: str) -> str:
    """``zoo_<task>`` for PPO (the first presets), ``zoo_<algo>_<task>`` for the others."""
    return f"zoo_{task}" if algo == "ppo" else f"zoo_{algo}_{task}"


def read_hyperparams(source: Path, algo: str) -> dict[str, Any]:
    """``hyperparams/<algo>.yml`` from a folder or from an rl_zoo3 wheel."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            text = wheel.read(f"rl_zoo3/hyperparams/{algo}.yml").decode()
    else:
        text = (source / f"{algo}.yml").read_text()
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


def zoo_entry(algo: str, task: str, source: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The zoo's id and entry for ``task`` (a conf/env option) in ``hyperparams/<algo>.yml``
    (default: the installed rl_zoo3's), YAML merge keys resolved."""
    entries = read_hyperparams(source or installed_hyperparams(), algo)
    known = tasks(entries)
    zoo_id = next((k for k, v in known.items() if v == task), None)
    if zoo_id is None:
        raise ZooEntryError(f"{task}: rl-baselines3-zoo has no {ALGOS[algo]} entry this "
                            f"script reads; choose one of {', '.join(known.values())}")
    return zoo_id, entries[zoo_id]


def zoo_experiment(task: str, env_id: str, folder: Path, **kwargs: Any) -> tuple[str, Any, Any]:
    """rl_zoo3's own ExperimentManager for PPO on ``env_id``, from its entry for ``task``
    copied under ``env_id`` into the manager's config file (nothing else changed), and the
    model it builds: ``(zoo id, manager, model)``. ``kwargs`` go to ExperimentManager."""
    import argparse

    from rl_zoo3.exp_manager import ExperimentManager

    zoo_id, entry = zoo_entry("ppo", task)
    config = folder / "ppo.yml"
    config.write_text(yaml.safe_dump({env_id: entry}))
    manager = ExperimentManager(argparse.Namespace(), "ppo", env_id, str(folder), eval_freq=-1,
                                config=str(config), verbose=0, **kwargs)
    built = manager.setup_experiment()
    if built is None:  # only when it optimizes hyperparameters, which this never asks for
        raise ZooEntryError(f"{zoo_id}: rl_zoo3 built no model")
    return zoo_id, manager, built[0]


def policy_kwargs(text: str) -> dict[str, Any]:
    """``dict(net_arch=[400, 300], log_std_init=-3)`` as a dict, literals only."""
    tree = ast.parse(text, mode="eval").body
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)
            and tree.func.id == "dict" and not tree.args):
        raise ZooEntryError(f"policy_kwargs {text!r}: not a dict(...) of literals")
    return {kw.arg: literal(kw.value) for kw in tree.keywords if kw.arg is not None}


def literal(node: ast.expr) -> Any:
    """A literal, a nested ``dict(...)`` of literals, or an activation's name (``nn.ReLU``)."""
    if isinstance(node, ast.Call):
        return policy_kwargs(ast.unparse(node))
    if isinstance(node, ast.Attribute) and ast.unparse(node) in ACTIVATIONS:
        return ast.unparse(node)
    try:
        return ast.literal_eval(node)
    except ValueError as exc:  # a name or call the workbench has no setting for
        raise ZooEntryError(f"{ast.unparse(node)}: not a literal or one of "
                            f"{', '.join(ACTIVATIONS)}") from exc


def translate(entry: Mapping[str, Any], algo: str) -> dict[str, Any]:
    """The preset's values for one zoo entry (``env``, ``algo`` and ``total_timesteps``)."""
    algo_values: dict[str, Any] = {}
    normalize = entry.get("normalize", False)
    if not isinstance(normalize, bool):
        raise ZooEntryError(f"normalize {normalize!r}: only true or false is supported")
    env: dict[str, Any] = {"num_envs": int(entry.get("n_envs", 1)), "normalize": normalize}
    if normalize and "gamma" in entry:  # the zoo's VecNormalize discounts with the algorithm's
        env["norm_gamma"] = entry["gamma"]
    for key, value in entry.items():
        if key not in ("policy", "n_timesteps", "n_envs", "normalize"):
            algo_values.update(algo_setting(key, value, algo))
    if "noise_std" in entry and "noise_type" not in entry:
        raise ZooEntryError("noise_std without noise_type")
    if algo == "ppo":  # SB3 takes a minibatch larger than the rollout as the whole rollout
        rollout = env["num_envs"] * algo_values.get("n_steps", 2048)
        if algo_values.get("batch_size", 64) > rollout:
            algo_values["batch_size"] = rollout
    return {"env": env, "algo": algo_values, "total_timesteps": int(entry["n_timesteps"])}


def algo_setting(key: str, value: Any, algo: str) -> dict[str, Any]:
    """The ``algo.*`` values one zoo key gives (a schedule adds its kind)."""
    if key in ("learning_rate", "clip_range"):
        schedule = "lr_schedule" if key == "learning_rate" else "clip_range_schedule"
        if isinstance(value, str) and value.startswith("lin_"):
            return {key: float(value[4:]), schedule: "linear"}
        return {key: float(value)}
    if key == "noise_type":
        if value != "normal":
            raise ZooEntryError(f"noise_type {value!r}: only normal noise is supported")
        return {}
    if key == "noise_std":
        return {"action_noise_std": float(value)}
    if key == "policy_kwargs":
        return {"policy": network(policy_kwargs(value), algo)}
    if key in SAME:
        return {key: str(value) if key == "ent_coef" and algo not in ON_POLICY else value}
    raise ZooEntryError(f"{key}: no workbench setting for this zoo key")


def network(kwargs: Mapping[str, Any], algo: str) -> dict[str, Any]:
    """``policy_kwargs`` as ``algo.policy`` keys (a list net_arch is the actor's and critics')."""
    out: dict[str, Any] = {}
    critic = "vf" if algo in ON_POLICY else "qf"
    for key, value in kwargs.items():
        if key == "net_arch":
            if isinstance(value, list):
                out["pi"], out[critic] = list(value), list(value)
            else:
                out.update({("pi" if k == "pi" else critic): list(v) for k, v in value.items()})
        elif key in ("log_std_init", "n_critics", "n_quantiles", "ortho_init", "use_expln"):
            out[key] = value
        elif key == "activation_fn":
            out["activation"] = ACTIVATIONS[value]
        else:
            raise ZooEntryError(f"policy_kwargs {key}: no workbench setting for it")
    return out


def preset_text(algo: str, zoo_id: str, task: str, values: Mapping[str, Any], version: str,
                entry: Mapping[str, Any]) -> str:
    """The YAML file of one preset, its header naming the entry."""
    group = "ppo_sb3" if algo == "ppo" else algo
    values = {k: v for k, v in values.items() if v != {}}
    body = yaml.safe_dump({"experiment_name": preset_name(algo, task), **values},
                          sort_keys=False, default_flow_style=None, width=96)
    notes = ""
    if "batch_size" in entry and values.get("algo", {}).get("batch_size") != entry["batch_size"]:
        notes = (f"# batch_size: the zoo says {entry['batch_size']}, more than its rollout of "
                 f"{values['algo']['batch_size']} samples; SB3 then\n# takes the whole rollout "
                 "as one minibatch, and so does this preset.\n")
    return (
        "# @package _global_\n"
        f"# rl-baselines3-zoo's {ALGOS[algo]} hyperparameters for {zoo_id}\n"
        f"# (DLR-RM/rl-baselines3-zoo, rl_zoo3 {version}, hyperparams/{algo}.yml; credited to "
        f"the zoo\n# authors, Raffin et al.), applied to conf/env/{task}.yaml's task. Generated "
        "by\n# scripts/zoo_presets.py: edit the script, not this file. Unset keys keep the "
        f"library's\n# defaults (conf/algo/{group}.yaml); observations are normalized only "
        "where the zoo says\n# so, rewards with the zoo's discount (env.norm_gamma).\n"
        + notes +
        "defaults:\n"
        f"  - override /algo: {group}\n"
        f"  - override /env: {task}\n\n"
        + body
    )


def presets(source: Path, version: str) -> dict[Path, str]:
    """Every preset the zoo's files give: path -> text."""
    out: dict[Path, str] = {}
    for algo in ALGOS:
        entries = read_hyperparams(source, algo)
        for zoo_id, task in tasks(entries).items():
            if (algo, zoo_id) in UNEXPRESSED:
                continue
            try:
                values = translate(entries[zoo_id], algo)
            except ZooEntryError as exc:
                raise ZooEntryError(f"{algo}.yml {zoo_id}: {exc}") from exc
            path = ROOT / "conf" / "experiment" / f"{preset_name(algo, task)}.yaml"
            out[path] = preset_text(algo, zoo_id, task, values, version, entries[zoo_id])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hyperparams", type=Path,
                        help="rl_zoo3's hyperparams folder, or an rl_zoo3 wheel (default: the "
                             "installed rl_zoo3's)")
    parser.add_argument("--version", help="the rl_zoo3 version they come from (default: the "
                                          "installed one's)")
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed presets; exit 1 on a difference")
    args = parser.parse_args(argv)
    try:
        source = args.hyperparams or installed_hyperparams()
        version = args.version or (installed_version() if args.hyperparams is None else None)
        if version is None:
            raise OSError("--version: say which rl_zoo3 version the files come from")
        wanted = presets(source, version)
    except (OSError, KeyError, ZooEntryError) as exc:
        print(f"zoo_presets: {exc}", file=sys.stderr)
        return 2
    stale = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"zoo_presets: {path.relative_to(ROOT)} differs from the zoo's entry; run "
                  "scripts/zoo_presets.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
