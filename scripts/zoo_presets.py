"""Write ``conf/experiment/zoo_<algo>_<task>.yaml`` from rl-baselines3-zoo's hyperparameters.

rl-baselines3-zoo (DLR-RM/rl-baselines3-zoo, ``rl_zoo3`` on PyPI; Raffin et al.) keeps tuned
values per algorithm and task in ``hyperparams/<algo>.yml``. This script translates its MuJoCo
entries for A2C, SAC, TD3, TQC and CrossQ into Hydra presets of the workbench, one per
algorithm and task, each naming the entry it came from in its header:

    python scripts/zoo_presets.py --hyperparams <rl_zoo3 folder>/hyperparams
    python scripts/zoo_presets.py --hyperparams rl_zoo3-2.9.2-py3-none-any.whl

The files are read as data (YAML's safe loader; ``policy_kwargs`` strings are parsed as
Python literals through :mod:`ast`, never evaluated). A key the workbench has no setting for
stops the script with its name rather than being dropped. ``--check`` compares the committed
presets with what the files give instead of writing (tests/test_algorithms.py runs it on the
entries stored in tests/data/zoo_hyperparams/).
"""

from __future__ import annotations

import argparse
import ast
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALGOS = {"a2c": "A2C", "sac": "SAC", "td3": "TD3", "tqc": "TQC", "crossq": "CrossQ"}
# the zoo's -v4 entries, applied to the workbench's -v5 tasks (conf/env/<task>.yaml)
TASKS = {"HalfCheetah-v4": "halfcheetah", "Hopper-v4": "hopper", "Walker2d-v4": "walker2d",
         "Ant-v4": "ant", "Humanoid-v4": "humanoid", "Swimmer-v4": "swimmer"}
# zoo key -> workbench key (the rest: see translate)
SAME = ("learning_starts", "buffer_size", "batch_size", "train_freq", "gradient_steps", "gamma",
        "tau", "policy_delay", "top_quantiles_to_drop_per_net", "target_policy_noise",
        "target_noise_clip", "n_steps", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm",
        "use_sde", "sde_sample_freq", "normalize_advantage", "use_rms_prop")


class ZooEntryError(ValueError):
    """An entry with a key or value the workbench cannot express."""


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


def policy_kwargs(text: str) -> dict[str, Any]:
    """``dict(net_arch=[400, 300], log_std_init=-3)`` as a dict, literals only."""
    tree = ast.parse(text, mode="eval").body
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name)
            and tree.func.id == "dict" and not tree.args):
        raise ZooEntryError(f"policy_kwargs {text!r}: not a dict(...) of literals")
    return {kw.arg: literal(kw.value) for kw in tree.keywords if kw.arg is not None}


def literal(node: ast.expr) -> Any:
    """A literal, or a nested ``dict(...)`` of literals."""
    if isinstance(node, ast.Call):
        return policy_kwargs(ast.unparse(node))
    return ast.literal_eval(node)


def translate(entry: Mapping[str, Any], algo: str) -> dict[str, Any]:
    """The preset's values for one zoo entry (``env``, ``algo`` and ``total_timesteps``)."""
    algo_values: dict[str, Any] = {}
    env: dict[str, Any] = {"num_envs": int(entry.get("n_envs", 1)),
                           "normalize": bool(entry.get("normalize", False))}
    for key, value in entry.items():
        if key in ("policy", "n_timesteps", "n_envs", "normalize"):
            continue
        if key == "learning_rate":
            if isinstance(value, str) and value.startswith("lin_"):
                algo_values["learning_rate"] = float(value[4:])
                algo_values["lr_schedule"] = "linear"
            else:
                algo_values["learning_rate"] = float(value)
        elif key == "noise_type":
            if value != "normal":
                raise ZooEntryError(f"noise_type {value!r}: only normal noise is supported")
        elif key == "noise_std":
            algo_values["action_noise_std"] = float(value)
        elif key == "policy_kwargs":
            algo_values["policy"] = network(policy_kwargs(value), algo)
        elif key in SAME:
            algo_values[key] = str(value) if key == "ent_coef" and algo != "a2c" else value
        else:
            raise ZooEntryError(f"{key}: no workbench setting for this zoo key")
    if "noise_std" in entry and "noise_type" not in entry:
        raise ZooEntryError("noise_std without noise_type")
    return {"env": env, "algo": algo_values, "total_timesteps": int(entry["n_timesteps"])}


def network(kwargs: Mapping[str, Any], algo: str) -> dict[str, Any]:
    """``policy_kwargs`` as ``algo.policy`` keys (a list net_arch is the actor's and critics')."""
    out: dict[str, Any] = {}
    critic = "vf" if algo == "a2c" else "qf"
    for key, value in kwargs.items():
        if key == "net_arch":
            if isinstance(value, list):
                out["pi"], out[critic] = list(value), list(value)
            else:
                out.update({("pi" if k == "pi" else critic): list(v) for k, v in value.items()})
        elif key in ("log_std_init", "n_critics", "n_quantiles", "ortho_init"):
            out[key] = value
        else:
            raise ZooEntryError(f"policy_kwargs {key}: no workbench setting for it")
    return out


def preset_text(algo: str, zoo_id: str, task: str, values: Mapping[str, Any], version: str
                ) -> str:
    """The YAML file of one preset, its header naming the entry."""
    name = f"zoo_{algo}_{task}"
    values = {k: v for k, v in values.items() if v != {}}
    body = yaml.safe_dump({"experiment_name": name, **values}, sort_keys=False,
                          default_flow_style=None, width=96)
    return (
        "# @package _global_\n"
        f"# rl-baselines3-zoo's {ALGOS[algo]} hyperparameters for {zoo_id}\n"
        f"# (DLR-RM/rl-baselines3-zoo, rl_zoo3 {version}, hyperparams/{algo}.yml; credited to "
        "the zoo\n# authors, Raffin et al.), applied to the -v5 task. Generated by "
        "scripts/zoo_presets.py:\n# edit the script, not this file. Unset keys keep the "
        f"library's defaults (conf/algo/{algo}.yaml);\n"
        "# observations are normalized only where the zoo says so.\n"
        "defaults:\n"
        f"  - override /algo: {algo}\n"
        f"  - override /env: {task}\n\n"
        + body
    )


def presets(source: Path, version: str) -> dict[Path, str]:
    """Every preset the zoo's files give: path -> text."""
    out: dict[Path, str] = {}
    for algo in ALGOS:
        entries = read_hyperparams(source, algo)
        for zoo_id, task in TASKS.items():
            if zoo_id not in entries:
                continue
            try:
                values = translate(entries[zoo_id], algo)
            except ZooEntryError as exc:
                raise ZooEntryError(f"{algo}.yml {zoo_id}: {exc}") from exc
            path = ROOT / "conf" / "experiment" / f"zoo_{algo}_{task}.yaml"
            out[path] = preset_text(algo, zoo_id, task, values, version)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hyperparams", type=Path, required=True,
                        help="rl_zoo3's hyperparams folder, or an rl_zoo3 wheel")
    parser.add_argument("--version", default="2.9.2", help="the rl_zoo3 version they come from")
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed presets; exit 1 on a difference")
    args = parser.parse_args(argv)
    try:
        wanted = presets(args.hyperparams, args.version)
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
