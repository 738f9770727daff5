"""The complete training state at an iteration boundary, captured in memory and restored.

What decides what happens next, so that a resumed run logs exactly what the uninterrupted run
would have: policy weights and optimizer states, ``num_timesteps`` and the update count, the
global RNG states, every training env copy's simulator state (:mod:`workbench.envs.simstate`),
the last observation and episode-start flags, the episode statistics window, ``VecNormalize``
statistics, the evaluation env's RNG, and the logger values recorded but not yet written.
The off-policy algorithms add their other optimizers and variables (SAC's learned entropy
coefficient), the unnormalized last observation and the replay buffer: its fill position is
taken at capture and its filled part when the snapshot is written (:func:`materialize`).
:mod:`workbench.training.checkpoint` writes snapshots to the run's artifacts.
"""

from __future__ import annotations

import random
import sys
from collections import deque
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.logger import KVWriter
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecNormalize

from workbench.envs import guards
from workbench.tracking.writer import MlflowWriter


def capture(model: Any, train_env: VecEnv, eval_env: VecEnv | None,
            restorable: bool | None = None) -> dict[str, Any]:
    """The complete training state now (call at an iteration boundary).

    ``restorable`` (whether every env copy's state is captured exactly) is asked from the
    envs unless given.
    """
    envs_state = env_states(train_env)
    if restorable is None:
        restorable = is_restorable(train_env)
    buffer_len = getattr(model.ep_info_buffer, "maxlen", None)
    off_policy = hasattr(model, "replay_buffer")
    return {
        "num_timesteps": int(model.num_timesteps),
        "n_updates": int(model._n_updates),
        "episode_num": int(model._episode_num),
        # SB3's iteration count (the off-policy logged points count themselves)
        "iterations": 0 if off_policy else int(model.num_timesteps // (model.n_envs
                                                                      * model.n_steps)),
        "policy": {k: v.detach().clone() for k, v in model.policy.state_dict().items()},
        "optimizer": clone_tree(optimizer_states(model)),
        **(off_policy_state(model) if off_policy else {}),
        "rng": rng_states(),
        "exact": restorable,
        "envs": envs_state,
        "last_obs": np.array(model._last_obs, copy=True),
        "last_episode_starts": np.array(model._last_episode_starts, copy=True),
        "ep_info_buffer": [dict(e) for e in (model.ep_info_buffer or [])],
        "ep_success_buffer": list(model.ep_success_buffer or []),
        "ep_buffer_len": buffer_len,
        "vecnormalize": vecnormalize_state(train_env),
        "eval_env": eval_env_state(eval_env),
        "logger": logger_state(model.logger),
    }


def optimizer_states(model: Any) -> dict[str, Any]:
    """PPO's and A2C's one optimizer state; the off-policy algorithms' optimizers by their
    attribute (``actor.optimizer``, ``critic.optimizer``, ``ent_coef_optimizer``), as SB3's
    own ``save`` names them."""
    names = [name for name in model._get_torch_save_params()[0] if name != "policy"]
    if names == ["policy.optimizer"]:
        return model.policy.optimizer.state_dict()  # type: ignore[no-any-return]
    return {name: attrgetter(name)(model).state_dict() for name in names}


def set_optimizer_states(model: Any, states: dict[str, Any]) -> None:
    """Inverse of :func:`optimizer_states`."""
    names = [name for name in model._get_torch_save_params()[0] if name != "policy"]
    if names == ["policy.optimizer"]:
        model.policy.optimizer.load_state_dict(states)
        return
    for name in names:
        attrgetter(name)(model).load_state_dict(states[name])


# The replay buffer's per-transition arrays (next_observations is None with
# optimize_memory_usage, which the workbench does not use).
BUFFER_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def off_policy_state(model: Any) -> dict[str, Any]:
    """What an off-policy algorithm adds: torch variables (SAC's ``log_ent_coef``), the last
    unnormalized observation, and the replay buffer by reference (:func:`materialize`)."""
    variables = {name: attrgetter(name)(model).detach().clone()
                 for name in model._get_torch_save_params()[1]}
    original = getattr(model, "_last_original_obs", None)
    buffer = model.replay_buffer
    return {
        "variables": variables,
        # the random actions before learning_starts come from the action space's own RNG
        "action_space_rng": model.action_space.np_random.bit_generator.state,
        "last_original_obs": None if original is None else np.array(original, copy=True),
        "replay_buffer": {"pos": int(buffer.pos), "full": bool(buffer.full), "live": buffer},
    }


def materialize(state: dict[str, Any], keep_buffer: bool = True) -> dict[str, Any]:
    """``state`` ready to write: the replay buffer's filled part as arrays (none without
    ``keep_buffer``: ``checkpoint.replay_buffer_max_mb``). Entries before the captured
    position do not change until the buffer wraps around, so a snapshot written when it was
    taken is exact; one written later, after a stop, with a full buffer holds up to the
    steps since the capture of newer transitions in place of the oldest."""
    buffer = state.get("replay_buffer")
    if not isinstance(buffer, dict) or "live" not in buffer:
        return state
    live = buffer["live"]
    end = live.buffer_size if buffer["full"] else buffer["pos"]
    arrays = {} if not keep_buffer else {
        name: getattr(live, name)[:end] for name in BUFFER_ARRAYS
        if getattr(live, name, None) is not None}
    return {**state, "replay_buffer": {"pos": buffer["pos"], "full": buffer["full"],
                                       "kept": keep_buffer, **arrays}}


def set_off_policy_state(model: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`off_policy_state` for a materialized state; without the buffer's
    arrays the resumed run refills it: updates start again after ``learning_starts`` more
    steps."""
    variables = state.get("variables", {})
    for name in model._get_torch_save_params()[1]:  # the model's own names, not the stored
        if name in variables:
            getattr(model, name).data.copy_(variables[name])
    if state.get("action_space_rng") is not None:
        model.action_space.np_random.bit_generator.state = state["action_space_rng"]
    original = state.get("last_original_obs")
    if original is not None:
        model._last_original_obs = original
    saved = state["replay_buffer"]
    buffer = model.replay_buffer
    if not saved.get("kept", True) or "observations" not in saved:
        model.learning_starts = model.num_timesteps + model.learning_starts
        return
    for name in BUFFER_ARRAYS:
        if name in saved and getattr(buffer, name, None) is not None:
            rows = len(saved[name])
            getattr(buffer, name)[:rows] = saved[name]
    buffer.pos, buffer.full = int(saved["pos"]), bool(saved["full"])


def clone_tree(tree: Any) -> Any:
    """A copy of nested dicts/lists/tuples with every tensor cloned (scalars are shared).

    ``copy.deepcopy`` of Adam's state dict costs ~6 ms per snapshot for the default net;
    this is the same result without deepcopy's per-object bookkeeping.
    """
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {key: clone_tree(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(clone_tree(value) for value in tree)
    return tree


def env_states(venv: VecEnv) -> list[dict[str, Any]] | None:
    """Each env copy's state, or None for a VecEnv without per-env access (EnvPool)."""
    try:
        return venv.env_method("workbench_capture")
    except AttributeError:
        return None


def is_restorable(venv: VecEnv) -> bool:
    """True when every env copy's state is captured exactly (see :mod:`workbench.envs.simstate`)."""
    try:
        return all(venv.env_method("workbench_restorable"))
    except AttributeError:
        return False


def restore(model: Any, train_env: VecEnv, eval_env: VecEnv | None, state: dict[str, Any]) -> None:
    """Put a freshly built model and its envs into a captured ``state``.

    Call before ``learn(..., reset_num_timesteps=False)``: PPO then keeps ``_last_obs`` and the
    episode statistics and continues counting from ``num_timesteps``. The global RNGs are
    restored last, after everything that could draw from them.
    """
    model.policy.load_state_dict(state["policy"])
    set_optimizer_states(model, state["optimizer"])
    model.num_timesteps = state["num_timesteps"]
    if "replay_buffer" in state:
        set_off_policy_state(model, state)
    model._n_updates = state["n_updates"]
    model._episode_num = state["episode_num"]
    maxlen = state.get("ep_buffer_len") or model._stats_window_size
    model.ep_info_buffer = deque(state["ep_info_buffer"], maxlen=maxlen)
    model.ep_success_buffer = deque(state["ep_success_buffer"], maxlen=maxlen)

    # A reset creates valid episodes (gymnasium's order checks, Monitor) and consumes the
    # pending seeds; the saved states then overwrite them.
    first_obs = train_env.reset()
    if state["exact"]:
        for rank, env_state in enumerate(state["envs"]):
            train_env.env_method("workbench_restore", env_state, indices=[rank])
        model._last_obs = state["last_obs"]
        model._last_episode_starts = state["last_episode_starts"]
    else:  # state not restorable exactly (see workbench.envs.simstate): fresh episodes
        print("workbench: note: these environments keep state a checkpoint cannot restore "
              "exactly (see workbench.envs.simstate); the resumed run starts fresh episodes",
              file=sys.stderr, flush=True)
        for rank, env_state in enumerate(state["envs"] or []):
            env_state = {**env_state, "physics": None}  # only the reset RNG stream
            train_env.env_method("workbench_restore", env_state, indices=[rank])
        model._last_obs = first_obs
        model._last_episode_starts = np.ones((train_env.num_envs,), dtype=bool)
        norm = find_wrapper(train_env, VecNormalize)
        if "replay_buffer" in state and norm is not None:  # off-policy: the raw observation
            model._last_original_obs = norm.get_original_obs()
    set_vecnormalize_state(train_env, state["vecnormalize"])
    guarded = find_wrapper(train_env, guards.GuardedVecEnv)
    if guarded is not None:
        guarded.num_timesteps = state["num_timesteps"]
    set_eval_env_state(eval_env, state["eval_env"])
    set_logger_state(model.logger, state["logger"], state["iterations"])
    set_rng_states(state["rng"])


def find_wrapper(venv: VecEnv, kind: type) -> Any:
    """The first VecEnv wrapper of type ``kind`` in ``venv``'s chain, or None."""
    layer: Any = venv
    while True:
        if isinstance(layer, kind):
            return layer
        if not isinstance(layer, VecEnvWrapper):
            return None
        layer = layer.venv


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch global RNG states (CUDA too when initialized)."""
    cuda = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state().clone(),
        "cuda": cuda,
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Inverse of :func:`rng_states` (JSON turned the tuples into lists)."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def vecnormalize_state(venv: VecEnv) -> dict[str, Any] | None:
    """Running statistics and per-env discounted returns of ``VecNormalize``, if present."""
    norm = find_wrapper(venv, VecNormalize)
    if norm is None:
        return None
    return {
        "obs_mean": np.array(norm.obs_rms.mean, copy=True),
        "obs_var": np.array(norm.obs_rms.var, copy=True),
        "obs_count": float(norm.obs_rms.count),
        "ret_mean": np.array(norm.ret_rms.mean, copy=True),
        "ret_var": np.array(norm.ret_rms.var, copy=True),
        "ret_count": float(norm.ret_rms.count),
        "returns": np.array(norm.returns, copy=True),
    }


def set_vecnormalize_state(venv: VecEnv, state: dict[str, Any] | None) -> None:
    """Inverse of :func:`vecnormalize_state`."""
    norm = find_wrapper(venv, VecNormalize)
    if norm is None or state is None:
        return
    norm.obs_rms.mean = np.array(state["obs_mean"], dtype=np.float64)
    norm.obs_rms.var = np.array(state["obs_var"], dtype=np.float64)
    norm.obs_rms.count = state["obs_count"]
    norm.ret_rms.mean = np.array(state["ret_mean"], dtype=np.float64)
    norm.ret_rms.var = np.array(state["ret_var"], dtype=np.float64)
    norm.ret_rms.count = state["ret_count"]
    norm.returns = np.array(state["returns"], dtype=np.float64)


def eval_env_state(eval_env: VecEnv | None) -> dict[str, Any] | None:
    """The evaluation env's reset RNG and its not-yet-used seeds (first evaluation)."""
    if eval_env is None:
        return None
    seeds = list(getattr(eval_env.unwrapped, "_seeds", []))
    return {"rng": eval_env.env_method("workbench_rng"), "pending_seeds": seeds}


def set_eval_env_state(eval_env: VecEnv | None, state: dict[str, Any] | None) -> None:
    """Inverse of :func:`eval_env_state`."""
    if eval_env is None or state is None:
        return
    for rank, rng in enumerate(state["rng"]):
        eval_env.env_method(
            "workbench_restore", {"rng": rng, "wrappers": {}, "physics": None}, indices=[rank]
        )
    eval_env.unwrapped._seeds = list(state["pending_seeds"])  # type: ignore[attr-defined]


def mlflow_writer(logger: Any) -> MlflowWriter | None:
    """The MLflow writer among a logger's outputs (possibly wrapped)."""
    for output in getattr(logger, "output_formats", []):
        while isinstance(output, IterationOffsetWriter):
            output = output.inner
        if isinstance(output, MlflowWriter):
            return output
    return None


def logger_state(logger: Any) -> dict[str, Any]:
    """Values recorded but not written yet, and the MLflow writer's step bookkeeping."""
    writer = mlflow_writer(logger)
    values = {}
    for key, value in logger.name_to_value.items():
        if isinstance(value, int | float | np.number) and not isinstance(value, bool):
            values[key] = float(value)
    excluded = {k: list(v) for k, v in logger.name_to_excluded.items() if k in values}
    return {
        "values": values,
        "excluded": excluded,
        "previous_step": writer.previous_step if writer is not None else None,
    }


def set_logger_state(logger: Any, state: dict[str, Any], iterations: int) -> None:
    """Re-record pending values; continue the writer's steps and SB3's iteration count."""
    for key, value in state["values"].items():
        logger.record(key, value, exclude=tuple(state["excluded"].get(key, ())) or None)
    writer = mlflow_writer(logger)
    if writer is not None:
        writer.previous_step = state["previous_step"]
    if iterations:
        logger.output_formats = [
            IterationOffsetWriter(o, iterations) for o in logger.output_formats
        ]


class IterationOffsetWriter(KVWriter):
    """Logger output adding the iterations done before a resume to ``time/iterations``.

    SB3 counts iterations per ``learn()`` call; after a resume the count restarts at 1.
    """

    def __init__(self, inner: Any, offset: int) -> None:
        self.inner = inner
        self.offset = offset

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0
              ) -> None:
        if "time/iterations" in key_values:
            key_values = {**key_values,
                          "time/iterations": key_values["time/iterations"] + self.offset}
        self.inner.write(key_values, key_excluded, step)

    def close(self) -> None:
        self.inner.close()
