"""Simulator state of one environment copy, captured and restored exactly (for resume).

A resumed run must continue as if it had never stopped, so every environment copy has to
continue its current episode: same physics, same step count toward the time limit, same
episode return so far, same random stream for its next reset.

For MuJoCo tasks, ``mj_getState(..., mjSTATE_INTEGRATION)`` is MuJoCo's own definition of
"everything the simulation needs to continue exactly". It is not quite enough for the task:
some ``-v5`` rewards read quantities that MuJoCo derives during a step (Ant's and Humanoid's
``xpos``/``xipos`` before the step), so the fixed-size derived arrays of ``mjData`` are kept
as well. Arena-allocated arrays (contacts, constraint rows) are rebuilt by the next
``mj_step`` and are skipped. ``tests/test_checkpoint.py`` checks bit-identical continuation
on several tasks.

Only what is known is claimed exact: gymnasium's own MuJoCo tasks behind the standard
wrappers (time limit, order and API checks, SB3's ``Monitor``). Any other env or wrapper
(a custom robot, a reward-shaping wrapper) may keep per-episode state of its own; it makes
the copy restorable by implementing the protocol ``workbench_state() -> dict`` /
``workbench_restore(state)`` (plain values and numpy arrays), as the mini duck and the
domain randomization wrappers do. Otherwise the copy is reported as not restorable and a
resume starts fresh episodes for it (see ``checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np

# mjData arrays whose size depends on the current contacts/constraints (arena memory) or that
# describe sleeping/island bookkeeping rebuilt by every step: not part of the saved state.
ARENA_PREFIXES = (
    "efc_", "efm_", "iefc_", "island_", "map_", "contact", "tree_", "dof_awake", "body_awake",
    "parent_awake", "bvh_", "flex", "wrap_",
)


def layers(env: gymnasium.Env) -> Iterator[Any]:
    """The wrapper chain from the outermost wrapper down to the unwrapped environment."""
    layer: Any = env
    while True:
        yield layer
        if not isinstance(layer, gymnasium.Wrapper):
            return
        layer = layer.env


def mujoco_handles(env: gymnasium.Env) -> tuple[Any, Any] | None:
    """``(mjModel, mjData)`` of a MuJoCo environment, or None for other simulators."""
    try:
        import mujoco
    except ImportError:  # pragma: no cover - mujoco is a dependency, but stay importable
        return None
    base = env.unwrapped
    model, data = getattr(base, "model", None), getattr(base, "data", None)
    if isinstance(model, mujoco.MjModel) and isinstance(data, mujoco.MjData):
        return model, data
    return None


# Wrappers whose state is none, or is handled here (time limit, Monitor).
KNOWN_WRAPPERS = {
    "TimeLimit", "OrderEnforcing", "PassiveEnvChecker", "Monitor", "ClipAction",
    "RescaleAction",
}


def has_protocol(layer: Any) -> bool:
    """True when a layer saves and restores its own state (``workbench_state``)."""
    return callable(getattr(type(layer), "workbench_state", None)) and callable(
        getattr(type(layer), "workbench_restore", None))


def is_restorable(env: gymnasium.Env) -> bool:
    """True when :func:`capture` records everything that decides ``env``'s next steps."""
    if mujoco_handles(env) is None:
        return False
    for layer in layers(env):
        if layer is env.unwrapped:
            known = type(layer).__module__.startswith("gymnasium.envs.mujoco.")
        else:
            known = type(layer).__name__ in KNOWN_WRAPPERS
        if not (known or has_protocol(layer)):
            return False
    return True


def capture(env: gymnasium.Env) -> dict[str, Any]:
    """The state of ``env`` as plain values and numpy arrays (picklable, JSON + arrays)."""
    state: dict[str, Any] = {
        "rng": rng_state(env.unwrapped),
        "wrappers": wrapper_counters(env),
        "physics": None,
        "layers": [layer.workbench_state() if has_protocol(layer) else None
                   for layer in layers(env)],
    }
    handles = mujoco_handles(env)
    if handles is not None:
        state["physics"] = capture_mujoco(*handles)
    return state


def restore(env: gymnasium.Env, state: dict[str, Any]) -> None:
    """Put ``env`` (freshly reset, same task) into the captured ``state``.

    With ``state["physics"] = None`` only the reset RNG is restored (fresh episodes).
    """
    set_rng_state(env.unwrapped, state["rng"])
    handles = mujoco_handles(env)
    if state.get("physics") is not None and handles is not None:
        restore_mujoco(*handles, state["physics"])
        restore_wrapper_counters(env, state["wrappers"])
        for layer, saved in zip(layers(env), state.get("layers") or [], strict=False):
            if saved is not None and has_protocol(layer):
                layer.workbench_restore(saved)


# --------------------------------------------------------------------------- MuJoCo


def capture_mujoco(model: Any, data: Any) -> dict[str, Any]:
    """Integration state (MuJoCo's definition) plus the fixed-size derived arrays."""
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    integration = np.empty(mujoco.mj_stateSize(model, spec), dtype=np.float64)
    mujoco.mj_getState(model, data, integration, spec)
    return {"integration": integration, "derived": derived_arrays(data)}


def restore_mujoco(model: Any, data: Any, physics: dict[str, Any]) -> None:
    """Inverse of :func:`capture_mujoco` on an ``mjData`` of the same model."""
    import mujoco

    integration = np.ascontiguousarray(physics["integration"], dtype=np.float64)
    mujoco.mj_setState(model, data, integration, mujoco.mjtState.mjSTATE_INTEGRATION)
    for name, saved in physics["derived"].items():
        target = getattr(data, name, None)
        if isinstance(target, np.ndarray) and target.shape == np.shape(saved):
            target[...] = saved


def derived_arrays(data: Any) -> dict[str, np.ndarray]:
    """Copies of the fixed-size array fields of ``mjData`` (positions, inertias, forces...)."""
    arrays: dict[str, np.ndarray] = {}
    for name in array_fields(data):
        value = getattr(data, name)
        if value.size:
            arrays[name] = value.copy()
    return arrays


_ARRAY_FIELDS: dict[type, tuple[str, ...]] = {}


def array_fields(data: Any) -> tuple[str, ...]:
    """The names of ``mjData``'s numpy array fields (the same for every model), listed once.

    Listing them with ``dir`` costs ~1 ms per env copy; a snapshot is taken every iteration.
    """
    key = type(data)
    names = _ARRAY_FIELDS.get(key)
    if names is None:
        names = tuple(
            name for name in dir(data)
            if not name.startswith("_") and not name.startswith(ARENA_PREFIXES)
            and isinstance(getattr(data, name, None), np.ndarray)
        )
        _ARRAY_FIELDS[key] = names
    return names


# --------------------------------------------------------------------------- RNG and wrappers


def rng_state(base: Any) -> dict[str, Any] | None:
    """The bit generator state of the env's ``np_random`` (drives its resets), if seeded."""
    generator = getattr(base, "_np_random", None)
    if not isinstance(generator, np.random.Generator):
        return None
    return dict(generator.bit_generator.state)


def set_rng_state(base: Any, state: dict[str, Any] | None) -> None:
    """Restore the env's ``np_random`` stream (a no-op when none was recorded)."""
    if state is None:
        return
    generator = base.np_random  # creates the generator if the env was never seeded
    generator.bit_generator.state = state


def wrapper_counters(env: gymnasium.Env) -> dict[str, Any]:
    """Per-episode bookkeeping of the standard wrappers: time limit and Monitor."""
    counters: dict[str, Any] = {}
    for layer in layers(env):
        if hasattr(layer, "_elapsed_steps") and hasattr(layer, "_max_episode_steps"):
            counters["time_limit.elapsed_steps"] = layer._elapsed_steps
        if type(layer).__name__ == "Monitor" and hasattr(layer, "rewards"):
            # SB3's Monitor: the running episode's rewards give info["episode"] at its end.
            counters["monitor.rewards"] = [float(r) for r in layer.rewards]
            counters["monitor.needs_reset"] = bool(layer.needs_reset)
            counters["monitor.total_steps"] = int(layer.total_steps)
    return counters


def restore_wrapper_counters(env: gymnasium.Env, counters: dict[str, Any]) -> None:
    """Inverse of :func:`wrapper_counters`."""
    for layer in layers(env):
        if "time_limit.elapsed_steps" in counters and hasattr(layer, "_max_episode_steps"):
            layer._elapsed_steps = counters["time_limit.elapsed_steps"]
        if type(layer).__name__ == "Monitor" and "monitor.rewards" in counters:
            layer.rewards = list(counters["monitor.rewards"])
            layer.needs_reset = counters["monitor.needs_reset"]
            layer.total_steps = counters["monitor.total_steps"]
