"""Checkpoints: the complete training state at a PPO iteration boundary, in the run's artifacts.

A checkpoint is taken where an iteration begins (SB3's ``on_rollout_start``): the previous
update is done, the rollout buffer is about to be refilled from scratch (so it holds nothing
worth saving), and the environments are between two steps. It holds everything that decides
what happens next, so that a resumed run logs exactly what the uninterrupted run would have:

- policy weights and optimizer (Adam) state, ``num_timesteps``, the update count;
- the global RNG states (Python, NumPy: minibatch shuffling, torch: action sampling);
- every training env copy's simulator state, time-limit counter and running episode return
  (:mod:`workbench.envs.simstate`), PPO's last observation and episode-start flags, the episode
  statistics window behind ``rollout/ep_rew_mean``;
- ``VecNormalize`` statistics and its per-env discounted returns; the evaluation env's RNG;
- the logger values recorded but not yet written (SB3 logs an update's ``train/*`` values
  one dump late) and the resolved config.

Format (``checkpoints/step-<num_timesteps:012d>/`` in the run's artifacts), nothing that can
execute code when loaded: ``arrays.safetensors`` (every array and tensor), ``config.yaml``,
and ``state.json`` (all other values, the SHA-256 of the two files). ``state.json`` is
uploaded last: a checkpoint without it is incomplete and ignored.

A snapshot is captured in memory at every iteration boundary (cheap:
docs/benchmarks/costs.md#robustness-costs) and written every ``checkpoint.every_steps``
steps, at the end of training, and when training is interrupted or fails (the last good
boundary).

Each written checkpoint also becomes an MLflow logged model (workbench.tracking.logged_models).
With ``checkpoint.keep=best`` each checkpoint written every ``every_steps`` steps and at the
end is evaluated deterministically first, and retention keeps the best-evaluated one besides
the newest ``keep_last`` (:func:`retention_victims`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient
from stable_baselines3.common.vec_env import VecEnv

from workbench.config import WorkbenchConfig
from workbench.config.schema import CheckpointKeep
from workbench.envs.spec import EnvSpec
from workbench.envs.vector import make_env
from workbench.tracking import runs
from workbench.tracking.logged_models import (
    BEST_STEP_TAG,
    BEST_VALUE_KEY,
    EVAL_MEAN_KEY,
    EVAL_STD_KEY,
    CheckpointEvaluation,
    CheckpointModels,
    is_better,
    now_ms,
)
from workbench.tracking.outbox import RunWriter
from workbench.training.callbacks import LocalsFreeCallback, evaluate_version, recall
from workbench.training.faults import Interruption
from workbench.training.model import inference_model
from workbench.training.snapshot import capture, is_restorable, materialize
from workbench.training.state_checks import state_problem

FORMAT = "workbench-checkpoint/1"
ARRAYS_FILE = "arrays.safetensors"
CONFIG_FILE = "config.yaml"
STATE_FILE = "state.json"
CHECKPOINTS_DIR = "checkpoints"
NAME_PATTERN = re.compile(r"^step-(\d+)$")
INDEXED_FILES = (ARRAYS_FILE, CONFIG_FILE)  # what state.json lists, with their SHA-256
META_KEYS = frozenset({"format", "num_timesteps", "created_at", "files", "state"})
# What snapshot.restore reads from the state (snapshot.capture writes these and more).
STATE_KEYS = frozenset({"num_timesteps", "n_updates", "episode_num", "policy", "optimizer",
                        "iterations", "rng", "exact", "envs", "last_obs", "last_episode_starts",
                        "ep_info_buffer", "ep_success_buffer", "vecnormalize", "eval_env",
                        "logger"})
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class CorruptCheckpoint(ValueError):
    """A checkpoint whose files are missing, truncated or modified."""


def checkpoint_path(step: int) -> str:
    """Artifact path of the checkpoint taken at ``num_timesteps == step``."""
    return f"{CHECKPOINTS_DIR}/step-{step:012d}"


# --------------------------------------------------------------------------- capture / restore


# --------------------------------------------------------------------------- files


def encode(tree: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
    """``tree`` as JSON values; arrays and tensors moved into ``arrays`` by path."""
    if isinstance(tree, torch.Tensor):
        arrays[path] = np.array(tree.detach().cpu().numpy(), order="C", copy=True)
        return {"__array__": path, "torch": True}
    if isinstance(tree, np.ndarray):
        arrays[path] = np.array(tree, order="C", copy=True)  # keeps 0-d shapes
        return {"__array__": path}
    if isinstance(tree, np.generic):
        return tree.item()
    if isinstance(tree, dict):
        if all(isinstance(k, str) for k in tree):
            return {k: encode(v, arrays, f"{path}/{k}") for k, v in tree.items()}
        return {"__items__": [[encode(k, arrays, f"{path}/{i}k"), encode(v, arrays, f"{path}/{i}")]
                              for i, (k, v) in enumerate(tree.items())]}
    if isinstance(tree, list | tuple | deque):
        return [encode(v, arrays, f"{path}/{i}") for i, v in enumerate(tree)]
    return tree


def decode(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of :func:`encode` (tuples come back as lists)."""
    if isinstance(tree, dict):
        if "__array__" in tree:
            array = np.array(arrays[tree["__array__"]], copy=True)
            return torch.from_numpy(array) if tree.get("torch") else array
        if "__items__" in tree:
            return {decode(k, arrays): decode(v, arrays) for k, v in tree["__items__"]}
        return {k: decode(v, arrays) for k, v in tree.items()}
    if isinstance(tree, list):
        return [decode(v, arrays) for v in tree]
    return tree


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_files(folder: Path, state: dict[str, Any], config_yaml: str) -> None:
    """Write ``arrays.safetensors``, ``config.yaml`` and (last) ``state.json`` into ``folder``."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    tree = encode(state, arrays)
    save_file(arrays, str(folder / ARRAYS_FILE))
    (folder / CONFIG_FILE).write_text(config_yaml)
    meta = {
        "format": FORMAT,
        "num_timesteps": state["num_timesteps"],
        "created_at": time.time(),
        "files": {name: sha256(folder / name) for name in (ARRAYS_FILE, CONFIG_FILE)},
        "state": tree,
    }
    (folder / STATE_FILE).write_text(json.dumps(meta))


def read_files(folder: Path) -> tuple[dict[str, Any], str]:
    """``(state, config_yaml)`` of a checkpoint folder; :class:`CorruptCheckpoint` if damaged.

    Only JSON and safetensors are parsed: loading a checkpoint cannot execute code, whoever
    made it. ``state.json`` is data too: it must list exactly the checkpoint's two files, by
    plain names that resolve inside ``folder`` (no absolute paths, no ``..``, no link out of
    it), so a forged index can neither skip a hash nor make the resume read another file.
    """
    meta = read_meta(folder)
    for name, expected in meta["files"].items():
        if sha256(confined(folder, name)) != expected:
            raise CorruptCheckpoint(
                f"{name} does not match its recorded SHA-256 (truncated or modified)"
            )
    arrays = read_arrays(confined(folder, ARRAYS_FILE))
    try:
        state = decode(meta["state"], arrays)
    except KeyError as exc:
        raise CorruptCheckpoint(f"{ARRAYS_FILE} lacks array {exc}") from exc
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{STATE_FILE}: the state tree is malformed ({exc})") from exc
    try:
        config_yaml = confined(folder, CONFIG_FILE).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptCheckpoint(f"{CONFIG_FILE} is not UTF-8 text") from exc
    return state, config_yaml


def read_meta(folder: Path) -> dict[str, Any]:
    """``state.json`` parsed and checked against its schema (:class:`CorruptCheckpoint`)."""
    path = confined(folder, STATE_FILE, missing="incomplete checkpoint")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{STATE_FILE} is truncated or not JSON ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptCheckpoint(f"{STATE_FILE} is not a {FORMAT} file")
    if set(meta) != META_KEYS:
        raise CorruptCheckpoint(f"{STATE_FILE} has keys {sorted(map(str, meta))[:8]}, expected "
                                f"{sorted(META_KEYS)}")
    files = meta["files"]
    if not isinstance(files, dict):
        raise CorruptCheckpoint(f"{STATE_FILE}: files is a {type(files).__name__}, expected a "
                                f"mapping of {ARRAYS_FILE} and {CONFIG_FILE} to their SHA-256")
    if set(files) != set(INDEXED_FILES):
        odd = sorted(set(files) ^ set(INDEXED_FILES))[0]
        raise CorruptCheckpoint(f"{STATE_FILE} lists {str(odd)[:80]!r}; a checkpoint's files "
                                f"are exactly {' and '.join(INDEXED_FILES)}")
    for name, digest in files.items():
        if not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            raise CorruptCheckpoint(f"{STATE_FILE}: the SHA-256 of {name} is not 64 hex digits")
    steps, state = meta["num_timesteps"], meta["state"]
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise CorruptCheckpoint(f"{STATE_FILE}: num_timesteps is not a step count")
    if not isinstance(state, dict):
        raise CorruptCheckpoint(f"{STATE_FILE}: state is a {type(state).__name__}, not a mapping")
    if not set(state) >= STATE_KEYS:
        raise CorruptCheckpoint(f"{STATE_FILE}: state lacks {sorted(STATE_KEYS - set(state))[0]}")
    if state["num_timesteps"] != steps:
        raise CorruptCheckpoint(f"{STATE_FILE}: state.num_timesteps differs from num_timesteps")
    return meta


def confined(folder: Path, name: str, missing: str = "") -> Path:
    """``folder/name`` for a plain file name that resolves to a regular file inside ``folder``."""
    if not FILE_NAME.fullmatch(name):
        raise CorruptCheckpoint(f"{name[:80]!r} is not a plain file name inside the checkpoint")
    path = folder / name
    resolved = path.resolve()
    if path.is_symlink() or not resolved.is_relative_to(folder.resolve()):
        raise CorruptCheckpoint(f"{name} points outside the checkpoint folder")
    if not resolved.exists():
        raise CorruptCheckpoint(f"{name} is missing" + (f" ({missing})" if missing else ""))
    if not resolved.is_file():
        raise CorruptCheckpoint(f"{name} is not a regular file")
    return resolved


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The checkpoint's safetensors arrays (:class:`CorruptCheckpoint` if unreadable)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{ARRAYS_FILE} cannot be read ({exc})") from exc


# --------------------------------------------------------------------------- fit to the model


Shape = tuple[int, ...] | None  # None: no such array


def shape_text(shape: Shape) -> str:
    """``shape [6, 256]``, or ``no array``."""
    return "no array" if shape is None else f"shape {list(shape)}"


def misfit(state: dict[str, Any], cfg: WorkbenchConfig) -> str | None:
    """What in ``state`` does not fit the model ``cfg`` builds (e.g. ``policy/action_net.weight
    is shape [7, 256], the run's config needs shape [6, 256]``), or None.

    Matching hashes only say the files are the ones ``state.json`` lists: a checkpoint written
    for another network or task, or forged with its hashes recomputed, is caught here before
    its arrays go into a model (where torch or SB3 would fail with a traceback).
    """
    model = scratch_model(cfg)
    for key, expected, found in shape_pairs(state, cfg, model):
        if found != expected:
            return f"{key} is {shape_text(found)}, the run's config needs {shape_text(expected)}"
    return state_problem(state, model, cfg.env.num_envs)  # the rest restore reads


def scratch_model(cfg: WorkbenchConfig) -> Any:
    """A one-env copy of the run's model on the CPU: its shapes, dtypes and optimizers,
    nothing trained."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: make_env(EnvSpec.from_config(cfg))])
    try:
        return inference_model(cfg, venv, device="cpu")
    finally:
        venv.close()


def shape_pairs(state: dict[str, Any], cfg: WorkbenchConfig, model: Any
                ) -> list[tuple[str, Shape, Shape]]:
    """``(array, shape the config gives, shape in the checkpoint)`` for every array whose
    shape the config and the environment's spaces decide (policy weights, Adam moments,
    PPO's last observation, VecNormalize statistics)."""
    obs = tuple(model.observation_space.shape or ())
    net = model.policy
    weights, policy, n = net.state_dict(), as_mapping(state.get("policy")), cfg.env.num_envs
    pairs: list[tuple[str, Shape, Shape]] = [
        (f"policy/{name}", tuple(w.shape), shape_of(policy.get(name)))
        for name, w in weights.items()]
    pairs += [(f"policy/{name}", None, shape_of(policy[name]))  # a tensor the net has not
              for name in sorted(set(policy) - set(weights), key=str)]
    pairs += optimizer_pairs(model, state.get("optimizer"))
    pairs += [("last_obs", (n, *obs), shape_of(state.get("last_obs"))),
              ("last_episode_starts", (n,), shape_of(state.get("last_episode_starts")))]
    norm = state.get("vecnormalize")
    if norm is not None:
        norm = as_mapping(norm)
        pairs += [(f"vecnormalize/{key}", obs, shape_of(norm.get(key)))
                  for key in ("obs_mean", "obs_var")]
        pairs += [("vecnormalize/returns", (n,), shape_of(norm.get("returns")))]
    return pairs


# The per-parameter state each optimizer keeps (besides its scalar step count).
MOMENTS = {"Adam": ("exp_avg", "exp_avg_sq"), "RMSprop": ("square_avg",)}


def optimizer_pairs(model: Any, saved: Any) -> list[tuple[str, Shape, Shape]]:
    """The optimizers' moments against their parameters' shapes: PPO's and A2C's one
    optimizer (``optimizer/<param>/<moment>``), the off-policy algorithms' by name
    (``optimizer/actor.optimizer/<param>/<moment>``, as snapshot.optimizer_states keeps
    them). An optimizer's state is keyed by the parameter's index in its param groups."""
    names = {id(p): name for name, p in model.policy.named_parameters()}
    held = [name for name in model._get_torch_save_params()[0] if name != "policy"]
    on_policy = held == ["policy.optimizer"]
    pairs: list[tuple[str, Shape, Shape]] = []
    for held_name in held:
        optimizer = attrgetter(held_name)(model)
        label = "optimizer" if on_policy else f"optimizer/{held_name}"
        state = as_mapping(saved) if on_policy else as_mapping(as_mapping(saved).get(held_name))
        moments = as_mapping(state.get("state"))
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            if index not in moments:
                continue
            for moment in MOMENTS.get(type(optimizer).__name__, ()):
                found = shape_of(as_mapping(moments[index]).get(moment))
                pairs.append((f"{label}/{names.get(id(param), index)}/{moment}",
                              tuple(param.shape), found))
    return pairs


def as_mapping(value: Any) -> dict[Any, Any]:
    """``value`` if it is a mapping, else an empty one (its arrays then show as missing)."""
    return value if isinstance(value, dict) else {}


def shape_of(value: Any) -> Shape:
    """The shape of an array or tensor; None for anything else (a missing entry)."""
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


# --------------------------------------------------------------------------- the store


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint folder in a run's artifacts."""

    step: int
    path: str
    complete: bool  # has state.json (uploaded last)


def stored_checkpoints(client: MlflowClient, run_id: str) -> list[StoredCheckpoint]:
    """The run's checkpoint folders, oldest first."""
    found = []
    for info in client.list_artifacts(run_id, CHECKPOINTS_DIR):
        match = NAME_PATTERN.match(info.path.rsplit("/", 1)[-1])
        if not (info.is_dir and match):
            continue
        files = {f.path.rsplit("/", 1)[-1] for f in client.list_artifacts(run_id, info.path)}
        found.append(StoredCheckpoint(int(match.group(1)), info.path, STATE_FILE in files))
    return sorted(found, key=lambda c: c.step)


def download(client: MlflowClient, run_id: str, stored: StoredCheckpoint, dst: Path
             ) -> tuple[dict[str, Any], str]:
    """Download and read one stored checkpoint (raises :class:`CorruptCheckpoint`)."""
    # MLflow's download progress bar would break the one-line errors of a refused resume.
    previous = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        local = Path(client.download_artifacts(run_id, stored.path, str(dst)))
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = previous
    state, config_yaml = read_files(local)
    if state["num_timesteps"] != stored.step:
        raise CorruptCheckpoint(f"{STATE_FILE} is of step {state['num_timesteps']}, not of "
                                f"the folder's step {stored.step}")
    return state, config_yaml


# --------------------------------------------------------------------------- retention


def retention_victims(saved_steps: Sequence[int], keep_last: int, best_step: int | None
                      ) -> list[int]:
    """The checkpoints retention deletes: all but the newest ``keep_last`` (0 keeps all) and
    the best-evaluated one (``best_step``; None with ``checkpoint.keep=last``), oldest first."""
    if keep_last <= 0:
        return []
    newest = set(sorted(saved_steps)[-keep_last:])
    return [step for step in sorted(saved_steps) if step not in newest and step != best_step]


def stored_evaluations(client: MlflowClient, run_id: str, steps: Sequence[int]
                       ) -> dict[int, CheckpointEvaluation]:
    """The recorded evaluations of a resumed run's checkpoints at ``steps`` (the run's
    ``checkpoint/eval_*`` metrics); {} when the store cannot say (no best is kept then)."""
    try:
        means = {m.step: m for m in client.get_metric_history(run_id, EVAL_MEAN_KEY)}
        stds = {m.step: m.value for m in client.get_metric_history(run_id, EVAL_STD_KEY)}
    except Exception:  # the store is away: the best is found among the new checkpoints only
        return {}
    return {step: CheckpointEvaluation(step, means[step].value, stds.get(step, math.nan),
                                       means[step].timestamp)
            for step in steps if step in means}


# --------------------------------------------------------------------------- the callback


class RecoveryCallback(LocalsFreeCallback):
    """What a run needs to survive its process: snapshots, checkpoints, heartbeat, stop.

    - At every iteration boundary (off-policy: every ``capture_every`` steps and when a
      checkpoint is due): an in-memory snapshot (:func:`capture`); written as a checkpoint
      when ``every_steps`` have passed since the last due point, keeping the newest
      ``keep_last`` in the store.
    - After every environment step: a stop requested by :class:`Interruption` ends
      the rollout (the step in flight completes first); at most every
      ``runs.HEARTBEAT_INTERVAL_S`` seconds the run's heartbeat tag is refreshed.
    - At the end: the final state is written; after a stop request, the last boundary.
    - ``keep="best"``: a checkpoint written every ``every_steps`` or at the end is first
      evaluated deterministically (``eval_episodes`` episodes on ``eval_env``; the periodic
      evaluation's result when it measured these very weights). The evaluation runs before
      the snapshot is captured, so the evaluation env's RNG in the checkpoint is the one the
      uninterrupted run continues with, and a resumed run logs what it would have. Retention
      keeps the best-evaluated checkpoint besides the newest ``keep_last``; the run records
      it (tag ``checkpoint.best_step``, metric ``checkpoint/best_eval_mean_reward``). A
      checkpoint written after a failure or a stop is not evaluated: the model has moved on
      from its weights.
    - With ``experiment_id``: every written checkpoint becomes a logged model
      (:class:`workbench.tracking.logged_models.CheckpointModels`, through the run's writer).

    Put it last in the callback list, after callbacks that record into the logger at
    ``on_rollout_start`` and after the one that dumps it at training end.
    """

    def __init__(
        self,
        client: RunWriter,
        run_id: str,
        config_yaml: str,
        train_env: VecEnv,
        eval_env: VecEnv | None,
        *,
        every_steps: int,
        keep_last: int,
        interruption: Interruption,
        existing_steps: Sequence[int] = (),
        capture_every: int = 0,
        keep_buffer: bool = True,
        keep: CheckpointKeep = CheckpointKeep.last,
        eval_episodes: int = 0,
        experiment_id: str | None = None,
    ) -> None:
        super().__init__()
        self.client = client
        self.run_id = run_id
        self.config_yaml = config_yaml
        self.train_env = train_env
        self.eval_env = eval_env
        self.every_steps = every_steps
        self.keep_last = keep_last
        self.interruption = interruption
        self.saved_steps: list[int] = sorted(existing_steps)
        self.snapshot: dict[str, Any] | None = None
        self.next_due = 0
        self.last_beat = -float("inf")
        self.save_times_s: list[float] = []
        self.last_size_bytes = 0
        self.restorable = is_restorable(train_env)
        self.capture_every = capture_every  # 0: at every iteration boundary
        self.next_capture = 0
        self.keep_buffer = keep_buffer  # off-policy: checkpoints carry the replay buffer
        self.keep = CheckpointKeep(keep)
        self.eval_episodes = eval_episodes
        self.evaluation: CheckpointEvaluation | None = None  # of the boundary being saved
        self.best: CheckpointEvaluation | None = None
        self.models = None if experiment_id is None else CheckpointModels(
            lambda state: client.logged_models(run_id, state), self.saved_steps)

    @property
    def last_saved(self) -> str | None:
        """Artifact path of the newest checkpoint written (or found at resume)."""
        return checkpoint_path(self.saved_steps[-1]) if self.saved_steps else None

    def _on_training_start(self) -> None:
        if self.every_steps > 0:
            self.next_due = (self.num_timesteps // self.every_steps + 1) * self.every_steps
        self.heartbeat(force=True)
        if self.saved_steps and self.keep == CheckpointKeep.best:  # resumed: its records
            for found in stored_evaluations(self.client.store, self.run_id,
                                            self.saved_steps).values():
                if is_better(found.mean, self.best.mean if self.best else None):
                    self.best = found

    def _on_rollout_start(self) -> None:
        due = self.every_steps > 0 and self.num_timesteps >= self.next_due
        if self.capture_every and not due and self.num_timesteps < self.next_capture:
            return  # off-policy: a boundary every train_freq steps, a snapshot less often
        self.next_capture = self.num_timesteps + self.capture_every
        if due:
            self.evaluate()
        self.snapshot = capture(self.model, self.train_env, self.eval_env, self.restorable)
        if due:
            while self.next_due <= self.num_timesteps:
                self.next_due += self.every_steps
            self.save()

    def _on_step(self) -> bool:
        self.heartbeat()
        return not self.interruption.requested

    def _on_training_end(self) -> None:
        if not self.interruption.requested:
            self.evaluate()
            self.snapshot = capture(self.model, self.train_env, self.eval_env, self.restorable)
        self.save()

    def evaluate(self) -> None:
        """The deterministic evaluation of the checkpoint about to be captured and written:
        with ``keep="best"`` made (or reused), else only the periodic evaluation's when it
        measured these very weights."""
        self.evaluation = None
        step = self.num_timesteps
        if self.eval_env is None or step in self.saved_steps:
            return
        if self.keep == CheckpointKeep.best and self.eval_episodes > 0:
            made, reused = evaluate_version(self.model, self.train_env, self.eval_env,
                                            self.eval_episodes)
        else:
            found = recall(self.eval_env, self.model)
            if found is None:
                return
            made, reused = found, True
        self.evaluation = CheckpointEvaluation(step, made.mean, made.std, now_ms(), reused)

    def heartbeat(self, force: bool = False) -> None:
        """Refresh the run's heartbeat tag (throttled)."""
        now = time.monotonic()
        if force or now - self.last_beat >= runs.HEARTBEAT_INTERVAL_S:
            self.last_beat = now
            self.client.heartbeat()

    def save(self) -> str | None:
        """Write the latest snapshot unless it is already stored; returns its artifact path."""
        if self.snapshot is None:
            return self.last_saved
        step = self.snapshot["num_timesteps"]
        if step in self.saved_steps:
            return checkpoint_path(step)
        started = time.perf_counter()
        path = checkpoint_path(step)
        with tempfile.TemporaryDirectory(prefix="workbench-ckpt-") as tmp:
            folder = Path(tmp) / "data"
            write_files(folder, materialize(self.snapshot, self.keep_buffer), self.config_yaml)
            state_file = folder / STATE_FILE
            committed = Path(tmp) / STATE_FILE
            state_file.rename(committed)
            self.last_size_bytes = sum(p.stat().st_size for p in folder.iterdir())
            self.last_size_bytes += committed.stat().st_size
            self.client.log_artifacts(self.run_id, str(folder), path)
            self.client.log_artifact(self.run_id, str(committed), path)  # commit marker, last
        self.save_times_s.append(time.perf_counter() - started)
        self.saved_steps.append(step)
        self.client.set_tag(self.run_id, "workbench.checkpoint", path)
        self.record(step, path)
        self.apply_retention()
        if self.models is not None:
            self.models.publish()
        return path

    def record(self, step: int, path: str) -> None:
        """The checkpoint's evaluation in the run (through the outbox), the best one, and
        its logged model (made at the next sync)."""
        evaluation = self.evaluation if self.evaluation and self.evaluation.step == step else None
        better = False
        if evaluation is not None:
            self.client.log_batch(self.run_id, metrics=evaluation.metrics())
            better = self.keep == CheckpointKeep.best and is_better(
                evaluation.mean, self.best.mean if self.best else None)
        if better and evaluation is not None:
            self.best = evaluation
            self.client.log_batch(
                self.run_id,
                metrics=[Metric(BEST_VALUE_KEY, evaluation.mean, evaluation.timestamp_ms, step)],
                tags=[RunTag(BEST_STEP_TAG, str(step))])
        if self.models is not None:
            self.models.add(step, path, evaluation)
            if better:
                self.models.set_best(step)

    @property
    def best_step(self) -> int | None:
        """Step of the best-evaluated checkpoint (``keep="best"``), None before the first."""
        return self.best.step if self.best and self.keep == CheckpointKeep.best else None

    def apply_retention(self) -> None:
        """Delete the checkpoints :func:`retention_victims` names (keeping the best one and
        the newest ``keep_last``; 0 keeps all); their logged models stay, marked deleted."""
        for step in retention_victims(self.saved_steps, self.keep_last, self.best_step):
            self.saved_steps.remove(step)
            self.client.delete_artifacts(self.run_id, checkpoint_path(step))
            if self.models is not None:
                self.models.set_deleted(step)


def save_last_good(recovery: RecoveryCallback | None, write: bool = True) -> str | None:
    """After a failure or interruption, write the last good snapshot; never raises.

    Returns the newest stored checkpoint (``write=False``: only report it, e.g. after a
    second Ctrl-C asked to stop at once).
    """
    if recovery is None:
        return None
    if not write:
        return recovery.last_saved
    try:
        return recovery.save()
    except Exception as exc:  # the original error matters more than a failed checkpoint
        print(f"workbench: warning: could not write the last checkpoint: {exc}",
              file=sys.stderr, flush=True)
        return recovery.last_saved


