"""Policy bundles: the files a run's policy travels in, pulled from the Hugging Face Hub
by a pinned revision and verified before anything uses them.

A bundle holds nothing executable: ``policy.onnx``, ``weights.safetensors``,
``normalization.json``, ``samples.npz`` (loaded with ``allow_pickle=False``), YAML/JSON text,
the model card; ``bundle.json`` lists every file with its SHA-256. :func:`pull` downloads
exactly one commit into ``experiments/hub/<org>/<name>/<commit>``, checks every file's hash
and that the safetensors weights reproduce the shipped sample actions. Training starts from
a pulled bundle with ``init.hub_repo_id``/``init.hub_revision`` (:func:`pull_for_init`);
:mod:`workbench.deploy.hub` writes and pushes bundles and adds the ONNX checks.

The token comes from ``HF_TOKEN`` or the standard login (``hf auth login``), resolved by
``huggingface_hub`` itself; the workbench never reads it into a message, a file, the manifest
or MLflow. ``HF_HUB_OFFLINE=1`` makes ``pull`` use the local Hub cache only.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench import config, paths
from workbench.config import ConfigError, WorkbenchConfig
from workbench.config.compose import hydra_value
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.training.model import PolicySource, build_model

BUNDLE_FORMAT = "workbench-policy-bundle/1"
INDEX_NAME = "bundle.json"
PARITY_TOLERANCE = 1e-5  # max abs action difference to the shipped samples (CPU)
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")  # a git commit: the only revision that never moves


class BundleError(RuntimeError):
    """A bundle that fails verification (missing or altered files, parity off)."""


@dataclass(frozen=True)
class PulledBundle:
    """A verified bundle at one commit, in its fixed local directory."""

    repo_id: str
    requested_revision: str
    commit: str
    directory: Path
    checks: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- names and places


def check_repo_id(repo_id: str | None) -> str:
    """``org/name`` as the Hub accepts it, else a ConfigError."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not repo_id:
        raise ConfigError(
            "repository id: missing; give it as <org>/<name>, e.g. my-org/ppo-cheetah")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ConfigError(f"repository id {repo_id!r}: {str(exc).splitlines()[0]}") from exc
    if repo_id.count("/") != 1:
        raise ConfigError(f"repository id {repo_id!r}: write it as <org or user>/<name>")
    return repo_id


def hub_directory(repo_id: str, commit: str) -> Path:
    """The fixed local directory of a pulled commit: ``experiments/hub/<org>/<name>/<commit>``."""
    return paths.experiments_dir() / "hub" / repo_id / commit


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- reading a bundle


def read_index(directory: Path) -> dict[str, Any]:
    path = directory / INDEX_NAME
    if not path.is_file():
        raise BundleError(f"{directory}: no {INDEX_NAME}; not a workbench policy bundle")
    index: dict[str, Any] = json.loads(path.read_text())
    if index.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{path}: format {index.get('format')!r}, expected {BUNDLE_FORMAT}")
    return index


def check_files(directory: Path) -> dict[str, Any]:
    """Every file listed in ``bundle.json`` is there and matches its SHA-256; returns the index."""
    index = read_index(directory)
    for name, digest in index["files"].items():
        path = directory / name
        if not path.is_file():
            raise BundleError(f"{directory}: {name} is missing")
        if sha256(path) != digest:
            raise BundleError(f"{directory}: {name} differs from its sha256 in {INDEX_NAME}")
    if index["manifest"] and "manifest.json" not in index["files"]:
        raise BundleError(f"{directory}: the run had a manifest.json but the bundle lacks it")
    return index


def bundle_config(directory: Path) -> WorkbenchConfig:
    """The bundle's config.yaml validated by the schema, for CPU inference."""
    cfg = config.from_yaml((directory / "config.yaml").read_text())
    cfg.device = "cpu"
    return cfg


def load_bundle_source(directory: Path, label: str | None = None) -> PolicySource:
    """Rebuild the SB3 policy from config + safetensors + normalization JSON (no pickles)."""
    from safetensors.torch import load_file
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    index = read_index(directory)
    cfg = bundle_config(directory)
    venv = DummyVecEnv([lambda: make_env(EnvSpec.from_config(cfg))] * cfg.env.num_envs)
    model = build_model(cfg, venv)
    model.policy.load_state_dict(load_file(str(directory / "weights.safetensors")))
    stats = json.loads((directory / "normalization.json").read_text())
    vecnormalize = None
    if stats["norm_obs"]:
        vecnormalize = VecNormalize(venv, training=False, norm_obs=True, norm_reward=False,
                                    clip_obs=stats["clip_obs"], epsilon=stats["epsilon"])
        apply_stats(vecnormalize, stats)
    return PolicySource(
        model=model, vecnormalize=vecnormalize, config=cfg,
        eval_mean_reward=index.get("eval_mean_reward"),
        eval_std_reward=index.get("eval_std_reward"),
        origin=label or f"bundle {directory}",
    )


def apply_stats(vecnormalize: Any, stats: Mapping[str, Any]) -> None:
    """Load normalization.json's statistics into a VecNormalize wrapper."""
    rms = vecnormalize.obs_rms
    rms.mean = np.asarray(stats["obs_mean"], dtype=np.float64)
    rms.var = np.asarray(stats["obs_var"], dtype=np.float64)
    rms.count = float(stats["obs_count"])


def load_samples(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """The shipped sample observations and SB3's deterministic actions for them."""
    with np.load(directory / "samples.npz", allow_pickle=False) as samples:
        return samples["observations"], samples["actions"]


def check_weights(directory: Path) -> float:
    """The SB3 policy rebuilt from the safetensors weights reproduces the shipped sample
    actions; returns the max abs difference (:class:`BundleError` above the tolerance)."""
    obs, expected = load_samples(directory)
    source = load_bundle_source(directory)
    diff = float(np.max(np.abs(source.deterministic_actions(obs) - expected)))
    if diff > PARITY_TOLERANCE:
        raise BundleError(
            f"{directory}: safetensors weights differ from the shipped sample actions by "
            f"{diff:.2e} (> {PARITY_TOLERANCE:.0e})"
        )
    return diff


def verify(directory: Path) -> dict[str, Any]:
    """Hashes and weights of a bundle (what training from it needs); returns the checks."""
    index = check_files(directory)
    return checks_summary(directory, index, check_weights(directory))


def checks_summary(directory: Path, index: Mapping[str, Any], weights_diff: float
                   ) -> dict[str, Any]:
    """What was verified, for ``workbench hub pull``'s table."""
    return {
        "files": sorted(index["files"]),
        "manifest": "present" if index["manifest"] else "absent (the run had none)",
        "samples": int(len(load_samples(directory)[0])),
        "weights_max_abs_diff": weights_diff,
        "onnx_opset": index["onnx_opset"],
    }


# --------------------------------------------------------------------------- Hub I/O


def download(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """Exactly one commit of ``repo_id`` in its fixed directory; returns (directory, commit).

    A branch or tag is resolved once to its commit, printed, and only the commit is used
    from then on. Works offline (``HF_HUB_OFFLINE=1``) from the local Hub cache.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    check_repo_id(repo_id)
    if not revision:
        raise ConfigError(
            f"revision: missing for {repo_id}; pin a commit sha or a tag "
            "(`workbench hub push` prints the commit)"
        )
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision))
    except RevisionNotFoundError as exc:
        raise ConfigError(f"revision {revision!r}: not found in {repo_id}") from exc
    except RepositoryNotFoundError as exc:
        raise ConfigError(f"{repo_id}: no such repository on the Hub (or no access)") from exc
    except LocalEntryNotFoundError as exc:
        mode = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else "the Hub is unreachable"
        raise ConfigError(
            f"{repo_id}@{revision}: not in the local Hub cache "
            f"({constants.HF_HUB_CACHE}) and {mode}; pull it once with network access"
        ) from exc
    commit = snapshot.name  # huggingface_hub's cache names each snapshot by its commit
    if not COMMIT_SHA.fullmatch(commit):
        raise BundleError(f"{snapshot}: not a commit snapshot of the Hub cache")
    if revision != commit:
        print(f"revision {revision!r} of {repo_id} resolved to commit {commit}; "
              "pin that commit")
    return materialize(snapshot, hub_directory(repo_id, commit)), commit


def pull(repo_id: str, revision: str | None) -> PulledBundle:
    """Download exactly one commit of ``repo_id`` and verify it (:func:`verify`)."""
    directory, commit = download(repo_id, revision)
    return PulledBundle(repo_id, revision or commit, commit, directory, verify(directory))


def materialize(snapshot: Path, directory: Path) -> Path:
    """Copy a cache snapshot (symlinks into blobs) to its fixed directory, once per commit."""
    if directory.is_dir():
        return directory  # a commit never changes; verify_bundle catches local damage
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(snapshot, partial, symlinks=False)
    partial.rename(directory)
    return directory


# --------------------------------------------------------------------------- training from a bundle


def pull_for_init(cfg: WorkbenchConfig) -> PulledBundle | None:
    """The bundle ``init.hub_repo_id``/``init.hub_revision`` names, pulled, verified and
    checked against ``cfg`` before any run exists; None without ``init.hub_repo_id``."""
    if not cfg.init.hub_repo_id:
        return None
    bundle = pull(cfg.init.hub_repo_id, cfg.init.hub_revision)
    theirs = bundle_config(bundle.directory)
    for key, ours_value, their_value in (
        ("env.id", cfg.env.id, theirs.env.id),
        ("env.normalize", cfg.env.normalize, theirs.env.normalize),
        ("algo.policy.pi", list(cfg.algo.policy.pi), list(theirs.algo.policy.pi)),
        ("algo.policy.vf", list(cfg.algo.policy.vf), list(theirs.algo.policy.vf)),
        ("algo.policy.activation", cfg.algo.policy.activation, theirs.algo.policy.activation),
    ):
        if ours_value != their_value:
            raise ConfigError(
                f"{key}={ours_value}: the bundle {bundle.repo_id}@{bundle.commit[:12]} was "
                f"trained with {key}={their_value}; set {key}={hydra_value(their_value)}"
            )
    print(f"init: policy from {bundle.repo_id}@{bundle.commit} ({bundle.directory})")
    return bundle


def init_run_info(bundle: PulledBundle) -> dict[str, Any]:
    """The manifest ``run`` section's record of the policy a run started from."""
    return {"init_hub": {"repo_id": bundle.repo_id, "revision": bundle.requested_revision,
                         "commit": bundle.commit}}


def initialize_model(model: Any, train_env: Any, bundle: PulledBundle) -> None:
    """Load the bundle's weights into ``model`` and its statistics into ``train_env``.

    The optimizer starts fresh; VecNormalize's observation statistics continue from the
    bundle's (the weights were trained on observations normalized by them), its return
    statistics start fresh.
    """
    from safetensors.torch import load_file
    from stable_baselines3.common.vec_env import VecNormalize

    state = load_file(str(bundle.directory / "weights.safetensors"), device=str(model.device))
    model.policy.load_state_dict(state)
    stats = json.loads((bundle.directory / "normalization.json").read_text())
    if isinstance(train_env, VecNormalize) and stats["norm_obs"]:
        apply_stats(train_env, stats)
