"""The policy bundle's format, checked as untrusted data before any of it is used.

A pulled bundle is data from whoever can write to its Hub repository. Everything in it is
checked against a strict schema before the workbench parses a file for use, builds an
environment or loads a weight:

- the entries: at most :data:`MAX_ENTRIES` plain files (no folders, no symbolic links except
  the Hub cache's own links into its blobs), each name a plain file name, sizes bounded;
- ``bundle.json``: exactly the keys :func:`workbench.deploy.hub.write_bundle` writes, each
  with its type; ``files`` a mapping of known bundle file names to SHA-256 hex digests, and
  the directory holds exactly those files and the index (an unlisted file is refused by name);
  its ``contract`` (the policy's, as in ``policy.onnx``) and ``runner.py`` are checked by
  :func:`workbench.deploy.hub.verify_bundle`, which knows their format;
- ``config.yaml``: the normal schema and range checks, no YAML anchors or interpolations,
  bounds on what verification would allocate (:func:`check_pulled_config`), and an env id
  resolved against gymnasium's registry without importing anything
  (:func:`workbench.envs.checks.check_data_env_id`);
- ``normalization.json`` and ``samples.npz``: their keys, types and shapes.

A refusal is a :class:`BundleRefused` (a :class:`ConfigError`: one line, exit code 2). A file
that does not match its hash, or a policy that does not reproduce the shipped samples, is a
:class:`BundleError` (verification failed; the CLI reports it as one ``workbench: error:``
line, exit code 2, as a refusal).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from workbench import config
from workbench.config import ConfigError, Device, OffPolicyConfig, WorkbenchConfig
from workbench.envs import checks, randomization

BUNDLE_FORMAT = "workbench-policy-bundle/2"
# Before bundles carried the policy's contract and runner: refused, with what to do.
OLDER_FORMATS = frozenset({"workbench-policy-bundle/1"})
RUNNER_FILE = "runner.py"  # the standalone runner (never run by the workbench)
INDEX_NAME = "bundle.json"
CARD_NAME = "README.md"
REQUIRED_FILES = frozenset({CARD_NAME, "config.yaml", "export_report.json", "normalization.json",
                            "policy.onnx", RUNNER_FILE, "samples.npz", "weights.safetensors"})
# The replay video (the SB3 zoo's name): the export's ONNX-driven episode, when the run has one.
REPLAY_VIDEO = "replay.mp4"
OPTIONAL_FILES = frozenset({"manifest.json", REPLAY_VIDEO})  # manifest: when the run had one
TEXT_FILES = frozenset({INDEX_NAME, CARD_NAME, "config.yaml", "export_report.json",
                        "normalization.json", "manifest.json", RUNNER_FILE})
SAMPLE_ARRAYS = ("observations", "actions")
# The Hub adds .gitattributes to every new repository: skipped, never read or copied.
HUB_FILES = frozenset({".gitattributes"})

# Bounds on what a pulled bundle may make this process read or allocate. A real bundle is
# about 1 MiB (the default network's weights and ONNX graph, ~0.3 MiB each); the limits leave
# room for networks a hundred times larger and stop a hostile one before it costs anything.
MAX_ENTRIES = 16  # the format has 11 files; more is refused before any is read
MAX_FILE_BYTES = 64 << 20  # one weights file or ONNX graph: ~16M float32 parameters
MAX_TEXT_BYTES = 1 << 20  # JSON/YAML/Markdown: a Humanoid normalization.json is ~20 KiB
REPLAY_VIDEO_MAX_BYTES = 20 << 20  # the default video is ~0.1 MiB; a bundle is not a film
MAX_BUNDLE_BYTES = 256 << 20
# Values of a pulled config.yaml, on top of the schema's own ranges. Verification rebuilds the
# policy from it (PPO allocates its rollout buffer, num_envs * n_steps samples, and builds
# num_envs simulator copies in this process, ~0.7 MiB each), and `workbench export --bundle`
# replays full episodes under its time limit. The caps sit far above every setting in conf/
# and the SB3 zoo's (at most 64 copies, 2048-step rollouts), below what would take GiBs of
# memory or hours: env.num_envs=3000 alone peaks at 2.2 GB.
MAX_PULLED_NUM_ENVS = 256
MAX_PULLED_ROLLOUT = 1 << 18  # env.num_envs * algo.n_steps samples (PPO, A2C)
# algo.buffer_size transitions (off-policy): SB3 allocates the whole buffer when it builds the
# model; 1M (SB3's default) of Humanoid's 348 float64 observations is ~5.6 GB, so a pulled
# config keeps the buffer small (the bundle's weights do not need it)
MAX_PULLED_BUFFER = 1 << 20
MAX_PULLED_LAYER = 4096  # units per hidden layer
MAX_PULLED_LAYERS = 16
MAX_PULLED_EPISODE_STEPS = 100_000  # env.max_episode_steps

FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")  # a git commit: the only revision that never moves
REPUBLISH = "ask its publisher to push it again with `workbench hub push`"


class BundleError(RuntimeError):
    """A bundle that fails verification (missing or altered files, parity off); the CLI
    reports it in one line, exit code 2 (:mod:`workbench.deploy.commands`)."""


class BundleRefused(ConfigError):
    """A bundle that is not a well-formed workbench policy bundle (exit code 2).

    The message is ``bundle <label>: <what> (<fix>)``, ``label`` being ``org/name@revision``
    for a pull or the directory for ``workbench export --bundle``.
    """

    def __init__(self, label: str, what: str, fix: str | None = REPUBLISH) -> None:
        super().__init__(f"bundle {label}: {what}" + (f" ({fix})" if fix else ""))


@dataclass(frozen=True)
class BundleIndex:
    """``bundle.json``, checked: what the bundle says about itself and its files."""

    format: str
    created_at: str
    run_id: str
    run_name: str | None
    env_id: str
    algo: str
    num_timesteps: int
    eval_mean_reward: float | None
    eval_std_reward: float | None
    eval_episodes: int
    onnx_opset: int
    manifest: bool
    init_hub_commit: str | None
    contract: dict[str, Any]  # the policy's contract (checked by the deploy layer)
    files: dict[str, str]  # file name -> sha256 hex


# key -> (accepted types, may be null); bool is not an int here (JSON true is not 1)
INDEX_SCHEMA: dict[str, tuple[tuple[type, ...], bool]] = {
    "format": ((str,), False), "created_at": ((str,), False), "run_id": ((str,), False),
    "run_name": ((str,), True), "env_id": ((str,), False), "algo": ((str,), False),
    "num_timesteps": ((int,), False), "eval_mean_reward": ((int, float), True),
    "eval_std_reward": ((int, float), True), "eval_episodes": ((int,), False),
    "onnx_opset": ((int,), False), "manifest": ((bool,), False),
    "init_hub_commit": ((str,), True), "contract": ((dict,), False), "files": ((dict,), False),
}


JSON_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "true/false",
              dict: "an object"}


def describe(value: Any) -> str:
    """A JSON value as a short phrase for a message: scalars shown, containers named."""
    if isinstance(value, dict | list):
        return f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)}"
    return json.dumps(value)[:60]


# --------------------------------------------------------------------------- entries


def check_entries(directory: Path, label: str, blobs: Path | None = None) -> dict[str, Path]:
    """The bundle's files by name, each checked to be a bounded plain file inside the bundle.

    ``blobs`` is the Hub cache's storage folder of the repository when ``directory`` is a cache
    snapshot: its entries are symbolic links, which must resolve to files inside it. Anywhere
    else (a pulled copy, ``export --bundle``) every entry must be a regular file.
    """
    root = directory.resolve()
    found: dict[str, Path] = {}
    total = 0
    with os.scandir(directory) as scan:
        listed = sorted((e for e in scan if e.name not in HUB_FILES), key=lambda e: e.name)
        for count, entry in enumerate(listed, start=1):
            if count > MAX_ENTRIES:
                raise BundleRefused(label, f"more than {MAX_ENTRIES} entries; a workbench "
                                    "policy bundle has at most 11 files")
            path = confined(Path(entry.path), blobs or root, label, link_ok=blobs is not None)
            size = path.stat().st_size
            limit = (MAX_TEXT_BYTES if entry.name in TEXT_FILES else REPLAY_VIDEO_MAX_BYTES
                     if entry.name == REPLAY_VIDEO else MAX_FILE_BYTES)
            if size > limit:
                raise BundleRefused(label, f"{entry.name} is {size} bytes, more than the "
                                    f"{limit} a bundle file may have")
            total += size
            found[entry.name] = path
    if total > MAX_BUNDLE_BYTES:
        raise BundleRefused(label, f"{total} bytes in all, more than {MAX_BUNDLE_BYTES}")
    return found


def confined(path: Path, root: Path, label: str, link_ok: bool = False) -> Path:
    """``path`` resolved, checked to be a regular file inside ``root`` (symlinks only with
    ``link_ok``, and then only to a file inside ``root``)."""
    name = path.name
    if not FILE_NAME.fullmatch(name):
        raise BundleRefused(label, f"entry {name!r} is not a plain file name")
    if path.is_symlink() and not link_ok:
        raise BundleRefused(label, f"{name} is a symbolic link; a bundle holds regular files")
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise BundleRefused(label, f"{name} points outside the bundle ({resolved})")
    if not resolved.is_file():
        raise BundleRefused(label, f"{name} is not a regular file; a bundle is one flat folder "
                            "of files")
    return resolved


# --------------------------------------------------------------------------- bundle.json


def read_json(path: Path, label: str) -> Any:
    """A bundle's JSON file, parsed strictly: UTF-8, no duplicate keys, bounded nesting."""
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
        return dict(pairs)

    try:
        return json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=no_duplicates)
    except (ValueError, RecursionError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BundleRefused(label, f"{path.name} is not valid JSON: {problem}") from exc


def check_index(raw: Any, label: str) -> BundleIndex:
    """``bundle.json``'s content against the schema; :class:`BundleRefused` naming the key."""
    if not isinstance(raw, dict):
        raise BundleRefused(label, f"{INDEX_NAME} holds a {type(raw).__name__}, not an object")
    if raw.get("format") in OLDER_FORMATS:
        raise BundleRefused(label, f"{INDEX_NAME}: format {raw['format']!r} is older than "
                            f"{BUNDLE_FORMAT!r}: it carries no contract and no runner")
    if raw.get("format") != BUNDLE_FORMAT:
        raise BundleRefused(label, f"{INDEX_NAME}: format {raw.get('format')!r} is not "
                            f"{BUNDLE_FORMAT!r}; not a workbench policy bundle")
    unknown = sorted(set(raw) - set(INDEX_SCHEMA))
    missing = sorted(set(INDEX_SCHEMA) - set(raw))
    if unknown or missing:
        which = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise BundleRefused(label, f"{INDEX_NAME}: {which}")
    for key, (types, nullable) in INDEX_SCHEMA.items():
        value = raw[key]
        if value is None and nullable:
            continue
        if isinstance(value, bool) != (bool in types) or not isinstance(value, types):
            kind = " or ".join(JSON_TYPES[t] for t in types) + (" or null" if nullable else "")
            raise BundleRefused(label, f"{INDEX_NAME}: {key} is {describe(value)}, expected "
                                f"{kind}")
    check_index_values(raw, label)
    return BundleIndex(**raw)


def check_index_values(raw: Mapping[str, Any], label: str) -> None:
    """Ranges of bundle.json's typed values and its ``files`` mapping."""
    for key in ("num_timesteps", "eval_episodes", "onnx_opset"):
        if raw[key] < (1 if key == "onnx_opset" else 0):
            raise BundleRefused(label, f"{INDEX_NAME}: {key}={raw[key]} is out of range")
    for key in ("eval_mean_reward", "eval_std_reward"):
        if raw[key] is not None and not math.isfinite(raw[key]):
            raise BundleRefused(label, f"{INDEX_NAME}: {key} is not finite")
    if raw["algo"].lower() not in config.ALGORITHMS:
        raise BundleRefused(label, f"{INDEX_NAME}: algo {raw['algo'][:50]!r}; bundles hold "
                            f"one of {', '.join(config.ALGORITHMS)}")
    commit = raw["init_hub_commit"]
    if commit is not None and not COMMIT_SHA.fullmatch(commit):
        raise BundleRefused(label, f"{INDEX_NAME}: init_hub_commit {commit[:50]!r} is not a "
                            "commit sha")
    files = raw["files"]
    known = sorted(REQUIRED_FILES | OPTIONAL_FILES)
    for name, digest in files.items():
        if name not in known:
            raise BundleRefused(label, f"{INDEX_NAME} lists {name[:80]!r}, which is not a file "
                                f"of a workbench policy bundle ({', '.join(known)})")
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            raise BundleRefused(label, f"{INDEX_NAME}: the sha256 of {name} is "
                                f"{describe(digest)}, not 64 lowercase hex digits")
    if not set(files) >= REQUIRED_FILES:
        absent = sorted(REQUIRED_FILES - set(files))
        raise BundleRefused(label, f"{INDEX_NAME} does not list {absent[0]}")
    if raw["manifest"] != ("manifest.json" in files):
        raise BundleRefused(label, f"{INDEX_NAME}: manifest={json.dumps(raw['manifest'])} but "
                            f"manifest.json is {'not ' if raw['manifest'] else ''}listed")


def check_listing(entries: Mapping[str, Path], index: BundleIndex, label: str) -> None:
    """The folder holds exactly the listed files and the index: nothing unlisted is kept."""
    for name in entries:
        if name != INDEX_NAME and name not in index.files:
            raise BundleRefused(label, f"{name} is not listed in {INDEX_NAME}; a bundle holds "
                                "only the files its index lists")
    for name in index.files:
        if name not in entries:
            raise BundleError(f"{label}: {name} is missing")


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def check_hashes(entries: Mapping[str, Path], index: BundleIndex, label: str) -> None:
    """Every listed file matches its SHA-256 (:class:`BundleError` otherwise)."""
    for name, digest in index.files.items():
        if sha256(entries[name]) != digest:
            raise BundleError(f"{label}: {name} differs from its sha256 in {INDEX_NAME}")


# --------------------------------------------------------------------------- config.yaml


def check_config_text(text: str, index: BundleIndex, label: str,
                      allowed_modules: Sequence[str], trust_hint: str) -> WorkbenchConfig:
    """A pulled ``config.yaml``: plain YAML, the schema, the pulled bounds, the env checks.

    Nothing is imported for the env id unless the user allowed its module (``trust_hint``
    says how, e.g. ``--allow-module {module}``).
    """
    where = "config.yaml"
    try:
        # A resolved config has no anchors; aliases can expand exponentially in OmegaConf.
        aliased = any(isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None)
                      for event in yaml.parse(text, Loader=yaml.SafeLoader))
        node = None if aliased else OmegaConf.create(text)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise BundleRefused(label, f"{where} is not YAML: {str(exc).splitlines()[0]}") from exc
    if aliased:
        raise BundleRefused(label, f"{where} uses YAML anchors or aliases; a resolved config "
                            "has none")
    if not isinstance(node, DictConfig):
        raise BundleRefused(label, f"{where} does not hold a mapping of config keys")
    if any("${" in s for s in strings(OmegaConf.to_container(node, resolve=False))):
        raise BundleRefused(label, f"{where} has ${{...}} interpolations; a resolved config "
                            "has none (they could read this machine's environment)")
    try:
        cfg = config.validate(node)
        check_pulled_config(cfg)
        if cfg.env.id != index.env_id:
            raise ConfigError(f"env.id={cfg.env.id!r} but {INDEX_NAME} says "
                              f"env_id={index.env_id!r}")
        if cfg.algo.name != index.algo.lower():
            raise ConfigError(f"algo.name={cfg.algo.name!r} but {INDEX_NAME} says "
                              f"algo={index.algo!r}")
        checks.check_data_env_id(cfg.env.id, allowed_modules, trust_hint)
        checks.check_env_kwargs(cfg.env.id, cfg.env.kwargs)
        randomization.check_settings("env.randomization", cfg.env.randomization, cfg.env.id)
        randomization.check_settings("eval.randomization", cfg.eval.randomization, cfg.env.id)
    except ConfigError as exc:  # the env checks' messages end with their own (fix)
        fixed = str(exc).endswith(")")
        raise BundleRefused(label, f"{where}: {exc}", None if fixed else REPUBLISH) from exc
    cfg.device = Device.cpu  # verification and export infer on the CPU
    return cfg


def strings(tree: Any) -> list[str]:
    """Every string (keys included) in a nested container."""
    if isinstance(tree, str):
        return [tree]
    if isinstance(tree, Mapping):
        return [*strings(list(tree.keys())), *strings(list(tree.values()))]
    if isinstance(tree, list | tuple):
        return [s for item in tree for s in strings(item)]
    return []


def check_pulled_config(cfg: WorkbenchConfig) -> None:
    """Bounds a pulled config must keep on top of the schema's ranges (see the MAX_PULLED_*
    constants); raises :class:`ConfigError` naming the key."""
    a = cfg.algo
    bounds = [("env.num_envs", cfg.env.num_envs, MAX_PULLED_NUM_ENVS),
              ("env.num_envs * algo.n_steps", cfg.env.num_envs * a.steps_per_update(),
               MAX_PULLED_ROLLOUT),
              ("env.max_episode_steps", cfg.env.max_episode_steps or 0, MAX_PULLED_EPISODE_STEPS)]
    if isinstance(a, OffPolicyConfig):
        bounds += [("algo.buffer_size", a.buffer_size, MAX_PULLED_BUFFER)]
    for key in ("pi", "vf", "qf"):
        if not hasattr(a.policy, key):  # type: ignore[attr-defined]
            continue
        layers = list(getattr(a.policy, key))  # type: ignore[attr-defined]
        bounds += [(f"algo.policy.{key} (layers)", len(layers), MAX_PULLED_LAYERS),
                   (f"algo.policy.{key} (units per layer)", max(layers, default=0),
                    MAX_PULLED_LAYER)]
    for key, value, limit in bounds:
        if value > limit:
            raise ConfigError(f"{key}={value}: more than the {limit} a pulled bundle may ask for")
    for key, value in config.flatten({"env.kwargs": dict(cfg.env.kwargs)}).items():
        if key.endswith("file") or any(isinstance(s, str) and ("/" in s or "\\" in s)
                                       for s in strings(value)):
            raise ConfigError(f"{key}={value!r}: a pulled config may not point the simulator "
                              "at files (a bundle's only files are its own)")


# --------------------------------------------------------------------------- data files


def check_normalization(raw: Any, cfg: WorkbenchConfig, label: str) -> dict[str, Any]:
    """``normalization.json``: ``{"norm_obs": false}`` or the full statistics, typed."""
    where = "normalization.json"
    expected = cfg.env.normalize and cfg.env.norm_obs
    if not isinstance(raw, dict) or raw.get("norm_obs") is not expected:
        raise BundleRefused(label, f"{where} must be an object with norm_obs="
                            f"{json.dumps(expected)} (config.yaml's env.normalize/norm_obs)")
    keys = {"norm_obs", "clip_obs", "epsilon", "obs_mean", "obs_var", "obs_count"}
    if set(raw) != (keys if expected else {"norm_obs"}):
        raise BundleRefused(label, f"{where} has keys {sorted(raw)}, expected "
                            f"{sorted(keys) if expected else ['norm_obs']}")
    if not expected:
        return raw
    for key in ("clip_obs", "epsilon", "obs_count"):
        if not is_number(raw[key]) or raw[key] < 0 or (key != "obs_count" and raw[key] == 0):
            raise BundleRefused(label, f"{where}: {key} must be a finite positive number")
    for key in ("obs_mean", "obs_var"):
        value = raw[key]
        if not (isinstance(value, list) and value and all(is_number(v) for v in value)):
            raise BundleRefused(label, f"{where}: {key} must be a non-empty list of numbers")
    if len(raw["obs_mean"]) != len(raw["obs_var"]) or min(raw["obs_var"]) < 0:
        raise BundleRefused(label, f"{where}: obs_var must be as long as obs_mean and >= 0")
    return raw


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_samples(path: Path, label: str) -> tuple[np.ndarray, np.ndarray]:
    """``samples.npz``: exactly two float32 matrices with one row per sample, read without
    pickles; every member's size is checked before it is decompressed."""
    where = "samples.npz"
    try:
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: info.file_size for info in archive.infolist()}
        if set(members) != {f"{name}.npy" for name in SAMPLE_ARRAYS}:
            raise BundleRefused(label, f"{where} holds {sorted(members)[:4]}, expected "
                                "observations.npy and actions.npy")
        if max(members.values()) > MAX_FILE_BYTES:
            raise BundleRefused(label, f"{where} expands to more than {MAX_FILE_BYTES} bytes")
        with np.load(path, allow_pickle=False) as samples:
            obs, actions = (samples[name] for name in SAMPLE_ARRAYS)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise BundleRefused(label, f"{where} cannot be read: {exc}") from exc
    if (obs.dtype != np.float32 or actions.dtype != np.float32 or obs.ndim != 2
            or actions.ndim != 2 or len(obs) != len(actions) or not len(obs)):
        raise BundleRefused(label, f"{where}: observations {obs.dtype}{list(obs.shape)} and "
                            f"actions {actions.dtype}{list(actions.shape)} must be float32 "
                            "matrices with one row per sample")
    return obs, actions
