"""A checkpoint's training state checked as data before it goes into a model.

:func:`workbench.training.checkpoint.misfit` compares the shapes of weights and optimizer
moments with the network the run's config builds; this module checks everything else that
:func:`workbench.training.snapshot.restore` reads, so that a checkpoint written for another
run, or forged with its hashes recomputed, is refused before the run is reopened instead of
failing inside torch, NumPy or SB3 once it is RUNNING:

- the counters (``n_updates``, ``episode_num``, ``iterations``), ``exact``, the episode
  statistics window and the logger's pending values;
- the global RNG states (Python, NumPy, torch) and an off-policy algorithm's action-space
  RNG, each applied to a scratch generator of its kind first, so the library itself says
  whether it is well formed;
- the optimizers' states, loaded into the scratch model's optimizers;
- an off-policy algorithm's variables (names from :data:`VARIABLES` only, each the tensor the
  model holds), its last unnormalized observation and its replay buffer: ``pos`` within the
  buffer, ``full`` a real boolean, each array of the buffer's dtype with exactly the rows
  that ``pos`` and ``full`` say were filled.

Each check returns a short description of the first problem (``replay_buffer/pos is 999999999,
outside 0..999``) or None.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from workbench.training.snapshot import BUFFER_ARRAYS

# The torch variables an off-policy algorithm saves besides its state dicts (SB3's
# ``_get_torch_save_params``): SAC's, TQC's and CrossQ's entropy coefficient. A stored name
# outside this list is refused; restore sets only the model's own names.
VARIABLES = frozenset({"log_ent_coef", "ent_coef_tensor"})
COUNTERS = ("n_updates", "episode_num", "iterations")
EPISODE_KEYS = ("r", "l", "t")  # SB3's Monitor: return, length, time


def state_problem(state: Mapping[str, Any], model: Any, num_envs: int) -> str | None:
    """The first problem of ``state`` for ``model`` (a scratch copy built from the run's
    config) trained on ``num_envs`` envs, or None."""
    checks: list[Callable[[], str | None]] = [
        lambda: counters_problem(state),
        lambda: logger_problem(state.get("logger")),
        lambda: rng_problem(state.get("rng")),
        lambda: optimizer_problem(model, state.get("optimizer")),
    ]
    if hasattr(model, "replay_buffer"):
        checks += [lambda: variables_problem(model, state.get("variables")),
                   lambda: action_rng_problem(model, state.get("action_space_rng")),
                   lambda: observation_problem(model, state.get("last_original_obs"),
                                               num_envs),
                   lambda: buffer_problem(model, state.get("replay_buffer"), num_envs)]
    for check in checks:
        problem = check()
        if problem:
            return problem
    return None


def is_count(value: Any) -> bool:
    """A whole number >= 0 (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any) -> bool:
    """A finite int or float (not a boolean)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def counters_problem(state: Mapping[str, Any]) -> str | None:
    """Counters are counts, ``exact`` a boolean, the episode window a list of episodes."""
    for key in COUNTERS:
        if not is_count(state.get(key)):
            return f"{key} is {short(state.get(key))}, not a count"
    if not isinstance(state.get("exact"), bool):
        return f"exact is {short(state.get('exact'))}, not true or false"
    window = state.get("ep_buffer_len")
    if window is not None and not (is_count(window) and window >= 1):
        return f"ep_buffer_len is {short(window)}, not a window size"
    episodes = state.get("ep_info_buffer")
    if not isinstance(episodes, list) or not all(
            isinstance(e, Mapping) and all(is_number(e.get(k)) for k in EPISODE_KEYS)
            for e in episodes):
        return "ep_info_buffer is not a list of episodes (r, l, t numbers)"
    successes = state.get("ep_success_buffer")
    if not isinstance(successes, list) or not all(
            isinstance(s, bool) or is_number(s) for s in successes):
        return "ep_success_buffer is not a list of booleans"
    return None


def logger_problem(logger: Any) -> str | None:
    """The logger's pending values: names to numbers, exclusions, the writer's last step."""
    if not isinstance(logger, Mapping):
        return "logger is not a mapping"
    values, excluded = logger.get("values"), logger.get("excluded")
    if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            for k, v in values.items()):
        return "logger/values is not a mapping of metric names to numbers"
    if not isinstance(excluded, Mapping) or not all(
            isinstance(v, list) and all(isinstance(f, str) for f in v)
            for v in excluded.values()):
        return "logger/excluded is not a mapping of metric names to output formats"
    step = logger.get("previous_step")
    if step is not None and not is_count(step):
        return f"logger/previous_step is {short(step)}, not a step"
    return None


def applied(what: str, apply: Callable[[], object]) -> str | None:
    """None when ``apply`` (setting a value on a scratch object) succeeds, else why not."""
    try:
        apply()
    except (TypeError, ValueError, OverflowError, IndexError, KeyError, RuntimeError) as exc:
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        return f"{what} is malformed ({reason})"
    return None


def rng_problem(rng: Any) -> str | None:
    """The global RNG states, each set on a scratch generator of its kind."""
    if not isinstance(rng, Mapping) or not {"python", "numpy", "torch", "cuda"} <= set(rng):
        return "rng is not a mapping of python, numpy, torch and cuda states"

    def python() -> None:
        version, internal, gauss = rng["python"]
        random.Random().setstate((version, tuple(internal), gauss))

    def numpy() -> None:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.RandomState().set_state((name, np.asarray(keys, dtype=np.uint32), pos,
                                           has_gauss, cached))

    def generator() -> None:
        if not isinstance(rng["torch"], torch.Tensor):
            raise TypeError("not a tensor")
        torch.Generator().set_state(rng["torch"])

    cuda = rng["cuda"]
    if not isinstance(cuda, list) or not all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
            for t in cuda):
        return "rng/cuda is not a list of CUDA generator states"
    return (applied("rng/python", python) or applied("rng/numpy", numpy)
            or applied("rng/torch", generator))


def optimizer_problem(model: Any, saved: Any) -> str | None:
    """The optimizers' states load into the scratch model's optimizers (their moments'
    shapes are checked with the weights'); the names are the model's own."""
    if not isinstance(saved, Mapping):
        return "optimizer is not a mapping"
    names = [name for name in model._get_torch_save_params()[0] if name != "policy"]
    if names == ["policy.optimizer"]:  # PPO's and A2C's one optimizer
        return applied("optimizer", lambda: model.policy.optimizer.load_state_dict(saved))
    if set(saved) != set(names):
        return (f"optimizer holds {sorted(map(short, saved))[:4]}, the run's model has "
                f"{sorted(names)}")
    for name in names:
        problem = applied(f"optimizer/{name}",
                          partial(attrgetter(name)(model).load_state_dict, saved[name]))
        if problem:
            return problem
    return None


def model_variables(model: Any) -> dict[str, torch.Tensor]:
    """The model's own saved variables, by name (only names in :data:`VARIABLES`)."""
    return {name: getattr(model, name) for name in model._get_torch_save_params()[1]
            if name in VARIABLES}


def variables_problem(model: Any, saved: Any) -> str | None:
    """Exactly the model's variables, each a tensor of its shape and dtype."""
    if not isinstance(saved, Mapping):
        return "variables is not a mapping"
    own = model_variables(model)
    odd = sorted(str(name) for name in saved if name not in own)
    if odd:
        return (f"variables names {odd[0][:60]!r}, which the run's model does not save "
                f"(it saves {', '.join(sorted(own)) or 'none'})")
    for name, tensor in own.items():
        value = saved.get(name)
        if not isinstance(value, torch.Tensor) or value.shape != tensor.shape \
                or value.dtype != tensor.dtype:
            return (f"variables/{name} is {describe(value)}, the run's model needs "
                    f"{describe(tensor)}")
    return None


def action_rng_problem(model: Any, state: Any) -> str | None:
    """The action space's RNG state (random actions before ``learning_starts``), set on a
    scratch bit generator of the model's kind."""
    if state is None:
        return None
    kind = type(model.action_space.np_random.bit_generator)

    def apply() -> None:
        if not isinstance(state, Mapping):
            raise TypeError("not a mapping")
        kind().state = dict(state)

    return applied("action_space_rng", apply)


def observation_problem(model: Any, obs: Any, num_envs: int) -> str | None:
    """The last unnormalized observation, one row per env (or none)."""
    if obs is None:
        return None
    shape = (num_envs, *(model.observation_space.shape or ()))
    if not isinstance(obs, np.ndarray) or obs.shape != shape:
        return (f"last_original_obs is {describe(obs)}, the run needs an array of shape "
                f"{list(shape)}")
    return None


def buffer_problem(model: Any, saved: Any, num_envs: int) -> str | None:
    """The replay buffer: ``pos`` within it, ``full`` a boolean, and (when kept) every array
    of the buffer's dtype with the rows ``pos`` and ``full`` say were filled."""
    live = model.replay_buffer
    rows = max(live.buffer_size * live.n_envs // num_envs, 1)  # per env, as SB3 sizes it
    if not isinstance(saved, Mapping):
        return "replay_buffer is not a mapping"
    pos, full, kept = saved.get("pos"), saved.get("full"), saved.get("kept", True)
    if not is_count(pos) or pos >= rows:
        return f"replay_buffer/pos is {short(pos)}, outside 0..{rows - 1} (the buffer's rows)"
    if not isinstance(full, bool):
        return f"replay_buffer/full is {short(full)}, not true or false"
    if not isinstance(kept, bool):
        return f"replay_buffer/kept is {short(kept)}, not true or false"
    names = [name for name in BUFFER_ARRAYS if getattr(live, name, None) is not None]
    if not kept:
        odd = sorted(set(BUFFER_ARRAYS) & set(saved))
        return f"replay_buffer holds {odd[0]} but says it was not kept" if odd else None
    filled = rows if full else pos
    for name in names:
        template = getattr(live, name)
        value = saved.get(name)
        shape = (filled, num_envs, *template.shape[2:])
        if not isinstance(value, np.ndarray) or value.shape != shape \
                or value.dtype != template.dtype:
            fill = "full" if full else f"filled to pos {pos}"
            return (f"replay_buffer/{name} is {describe(value)}, a buffer {fill} needs "
                    f"{template.dtype} of shape {list(shape)}")
    return None


def describe(value: Any) -> str:
    """``float32 of shape [5000, 2, 17]``, or the value's type."""
    if isinstance(value, np.ndarray | torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype} of shape {list(value.shape)}"
    return "missing" if value is None else type(value).__name__


def short(value: Any) -> str:
    """A stored value as an error line quotes it: at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
