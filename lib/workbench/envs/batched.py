"""``env.vec_env=batched``: every copy's MuJoCo physics stepped at once, in native threads.

Domain randomization needs gymnasium wrappers around each copy, which EnvPool's C++ tasks
cannot take, so randomized runs stepped one Python env after the other (``dummy``). This
backend keeps exactly the copies ``dummy`` builds (gymnasium's own task classes under the
same wrappers: randomization, SB3's ``Monitor``, the time limit, the guard; seeded alike) in
a ``DummyVecEnv``, and takes only the physics out of its loop. A step:

1. **Plan** (the learner's thread): each copy's control for its action, found without
   changing anything. A wrapper that changes actions says what it will pass on
   (``workbench_preview_action``: action noise and delay in
   :mod:`workbench.envs.randomization`); the task says which controls an action becomes
   (``workbench_control``, the duck's servo targets); gymnasium's MuJoCo tasks give MuJoCo the
   action itself.
2. **Physics** (``num_threads`` threads, the learner's among them): for each copy, a
   snapshot of its ``MjData`` (``mj_copyData``), then gymnasium's own
   ``MujocoEnv._step_mujoco_simulation`` (``mj_step`` over the frame skip, then
   ``mj_rnePostConstraint``) on the copy's own ``MjModel`` and ``MjData``. Per-copy physics
   parameters are each copy's own model, which physics randomization rescales at every reset.
   MuJoCo's bindings release the GIL while they compute, so the copies step in parallel.
3. **Step** (the learner's thread): ``DummyVecEnv.step_wait``'s loop runs each copy's
   wrappers and task ``step`` as ``dummy`` does (:meth:`BatchedVecEnv.step_wait`). The
   task's code before its physics call reads the snapshot (the state it would have read),
   and its physics call finds the work done: it checks that the controls and frame count are
   the planned ones and switches to the stepped data. Should they differ (a wrapper or task
   changing actions in a way it did not declare), the snapshot is put back and that copy
   steps in place, as under ``dummy``, from then on (one warning).

So observations, rewards, terminations, truncations, ``terminal_observation``, episode
statistics, ``info`` and every random stream are bit-identical to ``dummy``, i.e. to
gymnasium's env under the same wrappers (``tests/test_batched.py``: HalfCheetah, Hopper,
Walker2d, Ant and the duck, step by step): the same code runs on the same numbers, only the
physics runs earlier and on every core. Any gymnasium ``MujocoEnv`` runs on it. Resets, seeds,
``env_method``/``get_attr`` and each copy's checkpoint state (:mod:`workbench.envs.simstate`)
are ``DummyVecEnv``'s and the guard's, unchanged, so a resume is exact wherever ``dummy``'s is.

Why not ``mujoco.rollout`` (C++ threads, no GIL): it steps from states it sets into
per-thread scratch data and returns states and sensor values only, while the tasks' rewards
read what MuJoCo derives during a step (contact forces, body positions before the last
substep, actuator forces); data rebuilt from the returned states would not be the data
gymnasium's step leaves. Why not each copy's whole ``step`` in a thread pool: the steps'
Python then contends for the GIL at every physics call; measured, that was slower than
``dummy`` on 2 cores. Here the Python of the tasks (observations, rewards, wrappers) stays on
the learner's thread, serial, and only the physics is spread: a step costs at least that
Python plus the physics divided among the threads. The figures are in docs/benchmarks.md
(section "Batched physics with randomization").
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium
import mujoco
import numpy as np
from gymnasium.envs.mujoco import MujocoEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from workbench.config import ConfigError
from workbench.envs import guards, simstate
from workbench.envs.randomization import is_mujoco_task

Preview = Callable[[Any], Any]


def unsupported_reason(env_id: str) -> str | None:
    """Why ``env.vec_env=batched`` cannot step ``env_id`` (a registered id), or None."""
    if not is_mujoco_task(env_id):
        return f"{env_id} is not a gymnasium MuJoCo task"
    return None


def check_support(env_id: str) -> None:
    """A one-line :class:`ConfigError` when ``env.vec_env=batched`` cannot step ``env_id``."""
    reason = unsupported_reason(env_id)
    if reason is not None:
        raise ConfigError(f"env.vec_env=batched steps MuJoCo physics in threads; {reason}: "
                          "use env.vec_env=auto or dummy")


def action_previews(env: gymnasium.Env) -> list[Preview] | None:
    """The ``workbench_preview_action`` of every wrapper of ``env`` that changes actions,
    outermost first; None when a gymnasium ``ActionWrapper`` does not declare its change."""
    previews: list[Preview] = []
    for layer in simstate.layers(env):
        if layer is env.unwrapped:
            break
        if callable(getattr(type(layer), "workbench_preview_action", None)):
            previews.append(layer.workbench_preview_action)
        elif isinstance(layer, gymnasium.ActionWrapper):
            return None
    return previews


def same_controls(given: Any, planned: Any) -> bool:
    """Whether the controls a task gives MuJoCo are the planned ones: the same bytes (the
    common case, ~0.2 us), else equal values, NaN equal to NaN (~5 us)."""
    given, planned = np.asarray(given), np.asarray(planned)
    if (given.dtype == planned.dtype and given.shape == planned.shape
            and given.tobytes() == planned.tobytes()):
        return True
    return bool(np.array_equal(given, planned, equal_nan=True))


class PhysicsAhead:
    """One copy's physics, stepped before its ``step`` runs (steps 1-3 of the module
    docstring). Installs itself as the task's ``_step_mujoco_simulation``: the one call
    through which every gymnasium MuJoCo task's ``do_simulation`` steps MuJoCo."""

    def __init__(self, env: gymnasium.Env) -> None:
        task = env.unwrapped
        if not isinstance(task, MujocoEnv):
            raise TypeError(f"env.vec_env=batched steps MuJoCo physics; {type(task).__name__} "
                            "is not a gymnasium MujocoEnv")
        self.task = task
        self.model, self.data = task.model, task.data
        self.snapshot = mujoco.MjData(self.model)
        self.previews = action_previews(env)
        self.control: Preview | None = getattr(task, "workbench_control", None)
        self.step_in_place = task._step_mujoco_simulation  # gymnasium's, or the task's own
        task._step_mujoco_simulation = self.physics_call  # type: ignore[method-assign]
        self.ahead = self.previews is not None  # False: this copy steps in place
        self.planned: tuple[Any, int] | None = None  # (controls, frames) of the next step
        self.stepped = False  # the planned step is done, the task reads the snapshot
        self.steps_ahead = 0  # steps whose physics ran ahead (the rest stepped in place)

    def plan(self, action: Any) -> None:
        """The controls and frames the task's next ``step`` will give MuJoCo for ``action``."""
        if not self.ahead:
            return
        for preview in self.previews or ():
            action = preview(action)
        controls = self.control(action) if self.control is not None else action
        self.planned = (controls, int(self.task.frame_skip))

    def step_ahead(self) -> None:
        """Snapshot, then step the copy's own data (in a worker thread; GIL released)."""
        if self.planned is None:
            return
        mujoco.mj_copyData(self.snapshot, self.model, self.data)
        self.step_in_place(*self.planned)
        self.task.data = self.snapshot
        self.stepped = True

    def physics_call(self, ctrl: Any, n_frames: int) -> None:
        """The task's physics call: the planned step's result, or the step itself."""
        planned, stepped = self.planned, self.stepped
        self.planned, self.stepped = None, False
        if not stepped or planned is None:
            self.step_in_place(ctrl, n_frames)
            return
        self.task.data = self.data
        if n_frames == planned[1] and same_controls(ctrl, planned[0]):
            self.steps_ahead += 1
            return
        mujoco.mj_copyData(self.data, self.model, self.snapshot)  # undo, then as dummy does
        self.ahead = False
        warnings.warn(
            f"env.vec_env=batched: {type(self.task).__name__} received controls other than "
            "planned (a wrapper or task changes actions without workbench_preview_action or "
            "workbench_control); this copy now steps its physics in place, exactly but "
            "without threads", RuntimeWarning, stacklevel=2)
        self.step_in_place(ctrl, n_frames)

    def settle(self) -> None:
        """After a step: a step done ahead that the task never asked for is undone."""
        if self.stepped:
            self.task.data = self.data
            mujoco.mj_copyData(self.data, self.model, self.snapshot)
        self.planned, self.stepped = None, False


class PhysicsThreads:
    """``count`` threads stepping copies ahead: the caller's own and ``count - 1`` workers,
    each taking the next copy not yet taken (unequal physics costs balance out)."""

    def __init__(self, count: int) -> None:
        self.count = max(1, count)
        self.pool = (ThreadPoolExecutor(self.count - 1, thread_name_prefix="workbench-physics")
                     if self.count > 1 else None)
        self.lock = threading.Lock()

    def run(self, copies: Sequence[PhysicsAhead]) -> None:
        """Step every copy ahead; returns when all are done (a worker's error is raised)."""
        pending = iter(copies)
        futures = ([self.pool.submit(self.drain, pending) for _ in range(self.count - 1)]
                   if self.pool is not None else [])
        self.drain(pending)
        for future in futures:
            future.result()

    def drain(self, pending: Iterator[PhysicsAhead]) -> None:
        """Step copies ahead, the next one not yet taken each time, until none is left."""
        while True:
            with self.lock:
                copy = next(pending, None)
            if copy is None:
                return
            copy.step_ahead()

    def close(self) -> None:
        """Stop the worker threads (they hold no work between steps)."""
        if self.pool is not None:
            self.pool.shutdown()


class BatchedVecEnv(guards.GuardedDummyVecEnv):
    """SB3's ``DummyVecEnv`` (guarded) whose copies' physics is stepped ahead in threads."""

    def __init__(self, env_fns: list[Callable[[], gymnasium.Env]], env_id: str = "",
                 num_threads: int = 1) -> None:
        super().__init__(env_fns, env_id=env_id)
        try:
            self.copies = [PhysicsAhead(env) for env in self.envs]
        except TypeError:
            super().close()
            raise
        self.threads = PhysicsThreads(min(num_threads, self.num_envs))

    def step_wait(self) -> VecEnvStepReturn:
        """Plan, physics in the threads, then ``DummyVecEnv.step_wait``'s loop as it is
        (auto-reset, ``terminal_observation``, ``TimeLimit.truncated``), except that the
        infos are copied one level deep, not deep-copied: every copy makes new info dicts at
        every step, and deep copies of the duck's cost ~9 us per copy and step, a tenth of a
        randomized step's Python."""
        for copy, action in zip(self.copies, self.actions, strict=True):
            copy.plan(action)
        try:
            self.threads.run(self.copies)
            for index, env in enumerate(self.envs):
                obs, self.buf_rews[index], terminated, truncated, info = env.step(
                    self.actions[index])
                self.buf_dones[index] = terminated or truncated
                info["TimeLimit.truncated"] = truncated and not terminated
                if self.buf_dones[index]:
                    info["terminal_observation"] = obs
                    obs, self.reset_infos[index] = env.reset()
                self.buf_infos[index] = info
                self._save_obs(index, obs)
        finally:
            for copy in self.copies:
                copy.settle()
        return (self._obs_from_buf(), np.copy(self.buf_rews), np.copy(self.buf_dones),
                [dict(info) for info in self.buf_infos])

    def close(self) -> None:
        """The threads, then the copies."""
        self.threads.close()
        super().close()
