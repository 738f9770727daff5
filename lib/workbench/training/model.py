"""The SB3 model of a run (any algorithm of :mod:`workbench.training.algorithms`): built from
the config, saved with what inference needs, and loaded back without executing code from the
file.

A saved model is weights + normalization statistics + resolved config + manifest
(``model/`` in the run's artifacts). :class:`PolicySource` is a trained policy together with
what inference needs: its normalization and its config (export and the Hub use it).
"""

from __future__ import annotations

import io
import json
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

import workbench.training.algorithms as algorithms
from workbench import config
from workbench.config import WorkbenchConfig
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_eval_env
from workbench.tracking import manifest
from workbench.tracking.redaction import scrub_yaml
from workbench.tracking.store import RunWrites

CONFIG_FILE = "config.yaml"


def build_model(cfg: WorkbenchConfig, train_env: VecEnv, device: str | None = None
                ) -> BaseAlgorithm:
    """The configured algorithm (PPO, A2C, SAC, TD3, TQC or CrossQ) on ``train_env``, on
    ``device`` when given, else on the configured one (:mod:`workbench.training.algorithms`)."""
    return algorithms.build(cfg, train_env, device)


def inference_model(cfg: WorkbenchConfig, env: VecEnv, device: str | None = None
                    ) -> BaseAlgorithm:
    """The run's model rebuilt on ``env`` to load weights into (resume's checks, export,
    eval, promote), never to train: SB3's PPO warns that ``batch_size`` does not divide
    ``n_steps * n_envs`` for the env it is given, and one evaluation env is not the run's
    env count, so that warning would say something false about the run; it is left out."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You have specified a mini-batch size")
        return build_model(cfg, env, device)


def save_model(
    client: RunWrites, run_id: str, cfg: WorkbenchConfig, model: BaseAlgorithm,
    train_env: VecEnv, run_manifest: Mapping[str, Any] | None = None,
) -> None:
    """Log ``model/``: weights (model.zip), normalization stats, resolved config, manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        model.save(folder / "model.zip")
        if isinstance(train_env, VecNormalize):
            train_env.save(str(folder / "vecnormalize.pkl"))
        (folder / CONFIG_FILE).write_text(scrub_yaml(config.to_dict(cfg)))
        if run_manifest is not None:
            (folder / manifest.MANIFEST_FILE).write_text(manifest.to_json(run_manifest))
        client.log_artifacts(run_id, str(folder), artifact_path="model")


# --------------------------------------------------------------------------- safe loading


class UnsafeLoadError(ValueError):
    """Loading would unpickle data; refused without ``allow_pickle=True``."""


def load_model(model_zip: str | Path, env: VecEnv | None = None, *, allow_pickle: bool = False,
               device: str = "cpu") -> Any:
    """Load an SB3 ``model.zip`` without executing code from the file.

    SB3's own loader unpickles some entries of ``model.zip`` (spaces, schedules,
    ``policy_kwargs``) with cloudpickle, which runs arbitrary code. Unless ``allow_pickle=True``
    (only for files you created), the model is instead rebuilt from the ``config.yaml`` next to
    it (Workbench writes ``model/config.yaml``) and only the weights are read, with
    ``torch.load(weights_only=True)`` (PyTorch's restricted, tensors-only unpickler).
    Without ``env`` a single evaluation env is made from the config.
    """
    model_zip = Path(model_zip)
    if allow_pickle:
        cls = algorithms.algorithm(_stored_algo(model_zip)).cls
        return cls.load(model_zip, env=env, device=device)
    config_path = model_zip.parent / CONFIG_FILE
    if not config_path.exists():
        raise UnsafeLoadError(
            f"{model_zip}: no {CONFIG_FILE} next to it to rebuild the model from; pass "
            "allow_pickle=True (CLI: --allow-pickle) only if you created this file"
        )
    cfg = config.from_yaml(config_path.read_text())
    env = env if env is not None else make_eval_env(EnvSpec.from_config(cfg))
    model = inference_model(cfg, env, device)
    with zipfile.ZipFile(model_zip) as archive:
        weights = torch.load(io.BytesIO(archive.read("policy.pth")), map_location=device,
                             weights_only=True)
        data = json.loads(archive.read("data").decode())
    model.policy.load_state_dict(weights)
    if isinstance(data.get("num_timesteps"), int):
        model.num_timesteps = data["num_timesteps"]
    return model


def _stored_algo(model_zip: Path) -> str:
    """``algo.name`` of the ``config.yaml`` beside a ``model.zip`` (PPO when there is none:
    files written before other algorithms existed)."""
    config_path = model_zip.parent / CONFIG_FILE
    if not config_path.exists():
        return "ppo"
    return config.from_yaml(config_path.read_text()).algo.name


def load_vecnormalize(path: str | Path, venv: VecEnv, *, allow_pickle: bool = False) -> VecEnv:
    """``VecNormalize.load`` (a pickle file) only with ``allow_pickle=True``.

    Prefer the statistics in a checkpoint's ``arrays.safetensors`` (see
    :func:`workbench.training.checkpoint.vecnormalize_state`), which cannot execute code.
    """
    if not allow_pickle:
        raise UnsafeLoadError(
            f"{path}: vecnormalize.pkl is a pickle and can execute code when loaded; pass "
            "allow_pickle=True (CLI: --allow-pickle) only for files you created"
        )
    return VecNormalize.load(str(path), venv)


@dataclass
class PolicySource:
    """A trained policy with what inference needs: the SB3 model, its normalization, the env."""

    model: BaseAlgorithm
    vecnormalize: VecNormalize | None  # frozen statistics (training=False); None: raw obs
    config: WorkbenchConfig
    eval_mean_reward: float | None  # the training log's final evaluation, for the replay
    eval_std_reward: float | None
    origin: str  # "run <id>" or "bundle <dir>", for reports

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Observations as the policy saw them in training (SB3's own ``normalize_obs``)."""
        if self.vecnormalize is None:
            return obs.astype(np.float32)
        return np.asarray(self.vecnormalize.normalize_obs(obs))

    def deterministic_actions(self, obs: np.ndarray) -> np.ndarray:
        """SB3's ``predict(deterministic=True)`` through the run's own normalization."""
        actions, _ = self.model.predict(self.normalize(obs), deterministic=True)
        return np.asarray(actions, dtype=np.float32)
