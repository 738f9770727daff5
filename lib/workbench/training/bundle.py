"""Policy bundles: the files a run's policy travels in, pulled from the Hugging Face Hub
by a pinned revision and verified before anything uses them.

A bundle holds nothing executable: ``policy.onnx``, ``weights.safetensors``,
``normalization.json``, ``samples.npz`` (loaded with ``allow_pickle=False``), YAML/JSON text,
the model card; ``bundle.json`` lists every file with its SHA-256. A pulled bundle is data from
whoever can write to its repository: :func:`check_files` holds it to the format's strict
schema (:mod:`workbench.training.bundle_format`) before anything is parsed for use, and its
``config.yaml`` may name a ``module:Id`` env only when the user allows that module.

:func:`pull` downloads exactly one commit, copies it into a temporary directory, checks and
verifies it there (hashes; the safetensors weights reproduce the shipped sample actions) and
only then installs it in ``experiments/hub/<org>/<name>/<commit>``: a bundle that fails leaves
nothing behind. Training starts from a pulled bundle with
``init.hub_repo_id``/``init.hub_revision`` (:func:`pull_for_init`);
:mod:`workbench.deploy.hub` writes and pushes bundles and adds the ONNX checks.

The token comes from ``HF_TOKEN`` or the standard login (``hf auth login``), resolved by
``huggingface_hub`` itself; the workbench never reads it into a message, a file, the manifest
or MLflow. ``HF_HUB_OFFLINE=1`` makes ``pull`` use the local Hub cache only.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench import paths
from workbench.config import ConfigError, WorkbenchConfig
from workbench.config.compose import hydra_value
from workbench.envs.checks import split_env_id
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.training.bundle_format import (
    COMMIT_SHA,
    INDEX_NAME,
    OPTIONAL_FILES,
    REQUIRED_FILES,
    TEXT_FILES,
    BundleError,
    BundleIndex,
    BundleRefused,
    check_config_text,
    check_entries,
    check_hashes,
    check_index,
    check_listing,
    check_normalization,
    check_samples,
    read_json,
)
from workbench.training.model import PolicySource, build_model

PARITY_TOLERANCE = 1e-5  # max abs action difference to the shipped samples (CPU)
# How the user allows a bundle's module:Id env (workbench hub pull / export).
PULL_TRUST_HINT = "pass --allow-module {module} if you trust that module"


@dataclass(frozen=True)
class CheckedBundle:
    """A bundle folder that passed :func:`check_files`, with its parsed, checked content."""

    directory: Path
    label: str  # org/name@revision for a pull, the directory for export --bundle
    index: BundleIndex
    config: WorkbenchConfig  # config.yaml, device cpu
    normalization: dict[str, Any]
    observations: np.ndarray  # samples.npz
    actions: np.ndarray


@dataclass(frozen=True)
class PulledBundle:
    """A verified bundle at one commit, in its fixed local directory."""

    repo_id: str
    requested_revision: str
    commit: str
    directory: Path
    checks: dict[str, Any] = field(default_factory=dict)
    config: WorkbenchConfig | None = None  # the bundle's checked config.yaml


Verifier = Callable[[CheckedBundle], dict[str, Any]]


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


# --------------------------------------------------------------------------- checking a bundle


def check_files(directory: Path, label: str | None = None, allowed_modules: Sequence[str] = (),
                trust_hint: str = PULL_TRUST_HINT) -> CheckedBundle:
    """The static checks of a bundle folder, in order: its entries (plain, bounded files),
    ``bundle.json`` against the schema, exactly the listed files present, every SHA-256, then
    ``config.yaml``, ``normalization.json`` and ``samples.npz`` against theirs.

    :class:`BundleRefused` (exit code 2) for a malformed bundle, :class:`BundleError` (exit
    code 1) for a missing or altered file. Imports nothing named by the bundle unless
    ``allowed_modules`` allows it.
    """
    label = label or str(directory)
    entries = check_entries(directory, label)
    if INDEX_NAME not in entries:
        raise BundleRefused(label, f"no {INDEX_NAME}; not a workbench policy bundle",
                            "pass the directory printed by `workbench hub pull`")
    index = check_index(read_json(entries[INDEX_NAME], label), label)
    check_listing(entries, index, label)
    check_hashes(entries, index, label)
    try:
        text = entries["config.yaml"].read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleRefused(label, f"config.yaml is not UTF-8 text ({exc})") from exc
    cfg = check_config_text(text, index, label, allowed_modules, trust_hint)
    stats = check_normalization(read_json(entries["normalization.json"], label), cfg, label)
    for name in ("export_report.json", *sorted(OPTIONAL_FILES & TEXT_FILES)):  # the JSON ones
        if name in entries and not isinstance(read_json(entries[name], label), dict):
            raise BundleRefused(label, f"{name} does not hold a JSON object")
    obs, actions = check_samples(entries["samples.npz"], label)
    return CheckedBundle(directory, label, index, cfg, stats, obs, actions)


def load_bundle_source(bundle: CheckedBundle, label: str | None = None) -> PolicySource:
    """Rebuild the SB3 policy from config + safetensors + normalization JSON (no pickles).

    The shapes the environment and the network give are checked against the shipped files,
    so a bundle that does not fit is refused in one line rather than failing inside SB3.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    cfg, stats = bundle.config, bundle.normalization
    venv = DummyVecEnv([lambda: make_env(EnvSpec.from_config(cfg))] * cfg.env.num_envs)
    obs_shape = venv.observation_space.shape
    check_shapes(bundle, obs_shape, venv.action_space.shape)
    model = build_model(cfg, venv)
    try:
        model.policy.load_state_dict(load_file(str(bundle.directory / "weights.safetensors")))
    except (SafetensorError, RuntimeError, OSError) as exc:
        raise BundleRefused(bundle.label, "weights.safetensors does not fit the network "
                            f"config.yaml describes: {str(exc).splitlines()[0][:200]}") from exc
    vecnormalize = None
    if stats["norm_obs"]:
        vecnormalize = VecNormalize(venv, training=False, norm_obs=True, norm_reward=False,
                                    clip_obs=stats["clip_obs"], epsilon=stats["epsilon"])
        apply_stats(vecnormalize, stats)
    return PolicySource(
        model=model, vecnormalize=vecnormalize, config=cfg,
        eval_mean_reward=bundle.index.eval_mean_reward,
        eval_std_reward=bundle.index.eval_std_reward,
        origin=label or f"bundle {bundle.label}",
    )


def check_shapes(bundle: CheckedBundle, obs_shape: Any, action_shape: Any) -> None:
    """Samples and statistics have the environment's observation and action sizes."""
    expected = {"samples.npz observations": (obs_shape, bundle.observations.shape[1:]),
                "samples.npz actions": (action_shape, bundle.actions.shape[1:])}
    if bundle.normalization["norm_obs"]:
        expected["normalization.json obs_mean"] = (
            obs_shape, (len(bundle.normalization["obs_mean"]),))
    for what, (env_shape, shipped) in expected.items():
        if tuple(env_shape or ()) != tuple(shipped):
            raise BundleRefused(bundle.label, f"{what} have shape {list(shipped)}, but "
                                f"{bundle.config.env.id} has {list(env_shape or ())}")


def apply_stats(vecnormalize: Any, stats: Mapping[str, Any]) -> None:
    """Load normalization.json's statistics into a VecNormalize wrapper."""
    rms = vecnormalize.obs_rms
    rms.mean = np.asarray(stats["obs_mean"], dtype=np.float64)
    rms.var = np.asarray(stats["obs_var"], dtype=np.float64)
    rms.count = float(stats["obs_count"])


def check_weights(bundle: CheckedBundle) -> float:
    """The SB3 policy rebuilt from the safetensors weights reproduces the shipped sample
    actions; returns the max abs difference (:class:`BundleError` above the tolerance)."""
    source = load_bundle_source(bundle)
    diff = float(np.max(np.abs(source.deterministic_actions(bundle.observations)
                               - bundle.actions)))
    if not diff <= PARITY_TOLERANCE:  # NaN fails too
        raise BundleError(
            f"{bundle.label}: safetensors weights differ from the shipped sample actions by "
            f"{diff:.2e} (> {PARITY_TOLERANCE:.0e})"
        )
    return diff


def verify(bundle: CheckedBundle) -> dict[str, Any]:
    """The weights of a checked bundle (what training from it needs); returns the checks."""
    return checks_summary(bundle, check_weights(bundle))


def checks_summary(bundle: CheckedBundle, weights_diff: float) -> dict[str, Any]:
    """What was verified, for ``workbench hub pull``'s table."""
    index = bundle.index
    return {
        "files": sorted(index.files),
        "manifest": "present" if index.manifest else "absent (the run had none)",
        "samples": int(len(bundle.observations)),
        "weights_max_abs_diff": weights_diff,
        "onnx_opset": index.onnx_opset,
    }


# --------------------------------------------------------------------------- Hub I/O


def download(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """Exactly one commit of ``repo_id`` in the local Hub cache; returns (snapshot, commit).

    Only the format's file names are fetched (a file the format does not have never reaches
    this machine). A branch or tag is resolved once to its commit, printed, and only the
    commit is used from then on. Works offline (``HF_HUB_OFFLINE=1``) from the local Hub cache.
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
    names = sorted({INDEX_NAME, *REQUIRED_FILES, *OPTIONAL_FILES})
    try:
        snapshot = Path(snapshot_download(repo_id, revision=revision, allow_patterns=names))
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
    if not COMMIT_SHA.fullmatch(commit) or snapshot.parent.name != "snapshots":
        raise BundleRefused(f"{repo_id}@{revision}", f"{snapshot} is not a commit snapshot of "
                            "the Hub cache", "check the refs of the local Hub cache")
    if revision != commit:
        print(f"revision {revision!r} of {repo_id} resolved to commit {commit}; "
              "pin that commit")
    return snapshot, commit


def pull(repo_id: str, revision: str | None, *, allowed_modules: Sequence[str] = (),
         trust_hint: str = PULL_TRUST_HINT, verifier: Verifier = verify) -> PulledBundle:
    """Download exactly one commit of ``repo_id``, check and verify it, then keep it.

    A commit pulled before is checked again as it is on disk (a commit never changes; local
    damage is caught). A new one is staged in a temporary directory and moved into
    ``experiments/hub/`` only once it passed: a bundle that fails leaves nothing behind.
    """
    snapshot, commit = download(repo_id, revision)
    label = f"{repo_id}@{revision}"
    directory = hub_directory(repo_id, commit)
    if directory.is_dir():
        try:
            checked = check_files(directory, label, allowed_modules, trust_hint)
            checks = verifier(checked)
        except BundleError as exc:
            raise BundleError(f"{exc}; {pulled_before(directory)}") from exc
        except BundleRefused as exc:
            raise ConfigError(f"{exc}; {pulled_before(directory)}") from exc
        return PulledBundle(repo_id, revision or commit, commit, directory, checks,
                            checked.config)
    with tempfile.TemporaryDirectory(prefix="workbench-pull-") as tmp:
        staged = stage(snapshot, Path(tmp) / commit, label)
        checked = check_files(staged, label, allowed_modules, trust_hint)
        checks = verifier(checked)
        install(staged, directory)
    return PulledBundle(repo_id, revision or commit, commit, directory, checks, checked.config)


def pulled_before(directory: Path) -> str:
    """What to do about a commit pulled earlier that no longer passes (damaged, or kept by a
    workbench without these checks)."""
    return f"it was pulled before into {directory}: delete that folder to pull it afresh"


def stage(snapshot: Path, target: Path, label: str) -> Path:
    """Copy a cache snapshot's files (links into the repository's blobs) to ``target``.

    Every entry must be a bounded file whose link stays inside the repository's own cache
    folder; the copies are regular files.
    """
    entries = check_entries(snapshot, label, blobs=snapshot.parent.parent.resolve())
    target.mkdir(parents=True)
    for name, path in entries.items():
        shutil.copyfile(path, target / name)
    return target


def install(staged: Path, directory: Path) -> None:
    """Move a verified staged bundle to its fixed directory (atomically: a rename)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for path in staged.iterdir():
            shutil.copyfile(path, partial / path.name)
        partial.rename(directory)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not directory.is_dir():  # else another pull of the same commit got there first
            raise


# --------------------------------------------------------------------------- training from a bundle


def pull_for_init(cfg: WorkbenchConfig) -> PulledBundle | None:
    """The bundle ``init.hub_repo_id``/``init.hub_revision`` names, pulled, verified and
    checked against ``cfg`` before any run exists; None without ``init.hub_repo_id``.

    The bundle's ``env.id`` may name a module only if ``cfg.env.id`` (the user's own config)
    names the same one: the user chose to import it.
    """
    if not cfg.init.hub_repo_id:
        return None
    module, _ = split_env_id(cfg.env.id)
    hint = ("training from it needs that env.id in your own config, which imports module "
            "{module}: set it only if you trust that module")
    try:
        bundle = pull(cfg.init.hub_repo_id, cfg.init.hub_revision,
                      allowed_modules=[module] if module else [], trust_hint=hint)
    except BundleError as exc:
        raise ConfigError(f"init.hub_repo_id={cfg.init.hub_repo_id}: bundle verification "
                          f"failed: {exc}; pin another revision") from exc
    theirs = bundle.config
    assert theirs is not None
    ours_net, their_net = network(cfg), network(theirs)
    for key, ours_value, their_value in (
        ("env.id", cfg.env.id, theirs.env.id),
        ("env.normalize", cfg.env.normalize, theirs.env.normalize),
        ("algo", cfg.algo.name, theirs.algo.name),
        *((f"algo.policy.{k}", ours_net[k], their_net.get(k)) for k in ours_net),
    ):
        if ours_value != their_value:
            raise ConfigError(
                f"{key}={ours_value}: the bundle {bundle.repo_id}@{bundle.commit[:12]} was "
                f"trained with {key}={their_value}; set {key}={hydra_value(their_value)}"
            )
    print(f"init: policy from {bundle.repo_id}@{bundle.commit} ({bundle.directory})")
    return bundle


def network(cfg: WorkbenchConfig) -> dict[str, Any]:
    """The keys of ``algo.policy`` that decide the weights' shapes and meaning."""
    policy: Any = cfg.algo.policy  # type: ignore[attr-defined]  # every algorithm has one
    keys = ("pi", "vf", "qf", "activation", "n_critics", "n_quantiles")
    return {k: (list(v) if isinstance(v, list | tuple) else v)
            for k in keys if (v := getattr(policy, k, None)) is not None}


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
