"""The best trial as a preset ``workbench train`` composes: ``experiment=tuned/<study>``.

Written to ``experiments/conf/experiment/tuned/<study>.yaml`` (the user's config, searched
after ``conf/``, see :func:`workbench.config.compose.user_conf_dir`); copy it into
``conf/experiment/tuned/`` to commit it. It names the env option and states the
trial's whole resolved ``algo`` section and its env settings, so it trains what the trial
trained whatever ``conf/algo/`` says later; a comment gives the study, the objective and the
trial's value.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from workbench import config
from workbench.config import WorkbenchConfig
from workbench.config.compose import user_conf_dir
from workbench.tuning.objectives import UNITS, Objective

ENV_KEYS = ("num_envs", "normalize", "norm_obs", "norm_reward", "norm_gamma", "clip_obs")


def best_config_path(study: str) -> Path:
    """``experiments/conf/experiment/tuned/<study>.yaml``."""
    return user_conf_dir() / "experiment" / "tuned" / f"{study}.yaml"


def best_config_text(study: str, objective: Objective, number: int, value: float,
                     run_id: str | None, cfg: WorkbenchConfig, sampled: dict[str, Any], *,
                     verdict: str | None = None, seeds: str | None = None) -> str:
    """The preset's YAML with its provenance in a comment: in a study over ``seeds``, the
    trial's value is their aggregate, and ``verdict`` says how the trial did against the
    defaults on fresh seeds.

    ``algo=ppo_sb3`` underneath: every algo value is written out, so no per-task file
    (``conf/tuning/``) or interpolation of ``conf/algo/ppo.yaml`` changes what it trains.
    """
    resolved = config.to_dict(cfg)
    body: dict[str, Any] = {
        "defaults": [{"override /env": cfg.env.name}, {"override /algo": "ppo_sb3"}],
        "experiment_name": f"tuned/{study}",
        "env": {k: resolved["env"][k] for k in ENV_KEYS},
        "algo": resolved["algo"],
    }
    sampled_text = ", ".join(f"{k}={v}" for k, v in sampled.items())
    which = "Best trial" if verdict is None else "Trial chosen on fresh seeds"
    header = [
        "# @package _global_",
        f"# {which} of study {study} (workbench tune), written "
        f"{datetime.now(UTC).isoformat(timespec='seconds')}:",
        f"#   objective {objective.describe()}, {objective.direction}: trial {number} scored "
        f"{value:.4g} {UNITS[objective.name]}" + (f" over seeds {seeds}" if seeds else "")
        + (f" (MLflow run {run_id})" if run_id else ""),
        *([f"#   {unreached}"] if (unreached := objective.unreached_note(value)) else []),
        f"#   sampled: {sampled_text}",
        *([f"#   re-checked: {verdict}"] if verdict else []),
        f"# Train it: workbench train experiment=tuned/{study}  (docs/tuning.md). The algo",
        "# section is the trial's whole resolved algo config; total_timesteps and seed are yours.",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False)


def write_best_config(study: str, text: str) -> Path:
    """Write atomically (concurrent workers of one study write the same file)."""
    path = best_config_path(study)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(staging, path)
    return path
