"""Guards around the environments: crashes and non-finite values reported in one line.

Every training env copy is wrapped (:class:`EnvGuard`, outermost gymnasium wrapper) and every
VecEnv sits under :class:`GuardedVecEnv`, so that:

- **Crashed environment worker** (an exception or a native crash inside a ``SubprocVecEnv``
  worker): SB3 alone reports ``EOFError``/``BrokenPipeError``. Each worker's env is wrapped in
  :class:`EnvGuard`, which writes the original exception to a crash report before the worker
  dies; :class:`GuardedVecEnv` turns the broken pipe into an :class:`EnvWorkerError` naming the
  task, the worker rank and that exception (or the signal that killed the worker).
- **Non-finite values**: observations, rewards (from the environments) and actions (from the
  policy) are checked by SB3's ``VecCheckNan`` (:class:`GuardedVecEnv` subclasses it to say
  which env rank and which step); losses and parameters after each PPO update by
  :class:`workbench.training.faults.UpdateCheck`. Both raise :class:`NonFiniteError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecCheckNan, VecEnv

from workbench.envs import mujoco_log, simstate

# What a parent sees when a SubprocVecEnv worker is gone.
PIPE_ERRORS = (EOFError, BrokenPipeError, ConnectionResetError)


class EnvWorkerError(RuntimeError):
    """A subprocess environment worker crashed; the message names env, rank and cause."""


class NonFiniteError(FloatingPointError):
    """A NaN or infinity appeared in observations, rewards, actions, losses or parameters."""


# --------------------------------------------------------------------------- env workers


class EnvGuard(gymnasium.Wrapper):
    """Outermost wrapper of every training env copy.

    Gives checkpoints access to the copy's state (``workbench_capture`` /
    ``workbench_restore``, called through ``VecEnv.env_method`` so they work in subprocess
    workers too) and, inside a worker, writes a crash report before an exception kills it.
    """

    def __init__(self, env: gymnasium.Env, rank: int, crash_dir: str | None = None) -> None:
        super().__init__(env)
        self.rank = rank
        self.crash_dir = crash_dir

    def step(self, action: Any) -> Any:
        try:
            return self.env.step(action)
        except Exception as exc:
            self._report(exc, "step")
            raise

    def reset(self, **kwargs: Any) -> Any:
        try:
            return self.env.reset(**kwargs)
        except Exception as exc:
            self._report(exc, "reset")
            raise

    def workbench_capture(self) -> dict[str, Any]:
        """The copy's full state (see :mod:`workbench.envs.simstate`)."""
        return simstate.capture(self.env)

    def workbench_rng(self) -> dict[str, Any] | None:
        """Only the reset RNG of :meth:`workbench_capture` (an evaluation env's whole state,
        its physics unused, would cost a snapshot at every iteration ten times more)."""
        return simstate.rng_state(self.env.unwrapped)

    def workbench_restore(self, state: dict[str, Any]) -> None:
        """Continue from a state returned by :meth:`workbench_capture`."""
        simstate.restore(self.env, state)

    def workbench_restorable(self) -> bool:
        """True when the simulator state can be restored exactly."""
        return simstate.is_restorable(self.env)

    def _report(self, exc: BaseException, phase: str) -> None:
        write_report(self.crash_dir, self.rank, exc, phase)


class _GuardedFactory:
    """Picklable env factory (runs inside the worker): signals, then the guarded env."""

    def __init__(self, fn: Callable[[], gymnasium.Env], rank: int, crash_dir: str | None):
        self.fn = fn
        self.rank = rank
        self.crash_dir = crash_dir

    def __call__(self) -> gymnasium.Env:
        if self.crash_dir is not None:  # inside a subprocess worker
            # A terminal's Ctrl-C reaches the whole process group; the trainer decides how
            # to stop and closes the workers. They still exit when the trainer dies (EOF).
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        mujoco_log.route_warnings()
        try:
            env = self.fn()
        except Exception as exc:
            write_report(self.crash_dir, self.rank, exc, "make")
            raise
        return EnvGuard(env, self.rank, self.crash_dir)


def guard_factories(env_fns: Sequence[Callable[[], gymnasium.Env]], crash_dir: str | None
                    ) -> list[Callable[[], gymnasium.Env]]:
    """Each env factory wrapped so that its env is an :class:`EnvGuard`."""
    return [_GuardedFactory(fn, rank, crash_dir) for rank, fn in enumerate(env_fns)]


class GuardedDummyVecEnv(DummyVecEnv):
    """SB3's ``DummyVecEnv`` whose envs are wrapped in :class:`EnvGuard`."""

    def __init__(self, env_fns: list[Callable[[], gymnasium.Env]], env_id: str = "") -> None:
        self.crash_dir: str | None = None
        super().__init__(guard_factories(env_fns, None))


class GuardedSubprocVecEnv(SubprocVecEnv):
    """SB3's ``SubprocVecEnv`` whose workers report crashes and ignore SIGINT/SIGTERM."""

    def __init__(self, env_fns: list[Callable[[], gymnasium.Env]],
                 start_method: str | None = None, env_id: str = "the environment") -> None:
        self.crash_dir = tempfile.mkdtemp(prefix="workbench-workers-")
        try:
            super().__init__(guard_factories(env_fns, self.crash_dir), start_method)
        except PIPE_ERRORS as exc:  # a worker died while making its env
            error = worker_error(self, "make", env_id)
            if hasattr(self, "processes"):
                reap_workers(self)
            shutil.rmtree(self.crash_dir, ignore_errors=True)
            raise error from exc

    def close(self) -> None:
        """Close the workers; after a crash, stop the survivors and reap every process.

        SB3's ``close`` would wait for every worker's pending reply, which never comes once
        one of them is dead (and a reply already read is not sent twice).
        """
        try:
            if any(p.exitcode is not None for p in self.processes):
                reap_workers(self)
            else:
                super().close()
        except Exception:
            reap_workers(self)
        finally:
            shutil.rmtree(self.crash_dir, ignore_errors=True)


GUARDED: dict[type[VecEnv], Any] = {
    DummyVecEnv: GuardedDummyVecEnv,
    SubprocVecEnv: GuardedSubprocVecEnv,
}


def guarded(vec_env_cls: type[VecEnv], env_id: str) -> Any:
    """``vec_env_cls`` for SB3's ``make_vec_env``: the guarded ``DummyVecEnv``/``SubprocVecEnv``."""
    cls = GUARDED.get(vec_env_cls)
    return functools.partial(cls, env_id=env_id) if cls is not None else vec_env_cls


def write_report(crash_dir: str | None, rank: int, exc: BaseException, phase: str) -> None:
    """Record a worker's exception where the trainer finds it after the worker died."""
    if crash_dir is None:
        return  # same process: the exception itself reaches the trainer
    report = {
        "rank": rank,
        "pid": os.getpid(),
        "phase": phase,
        "exception": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(),
    }
    with contextlib.suppress(OSError):
        (Path(crash_dir) / f"rank-{rank}.json").write_text(json.dumps(report))


def read_reports(crash_dir: str | None) -> list[dict[str, Any]]:
    """Crash reports written by workers, lowest rank first."""
    if crash_dir is None:
        return []
    reports = []
    for path in sorted(Path(crash_dir).glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError):
            reports.append(json.loads(path.read_text()))
    return sorted(reports, key=lambda r: r["rank"])


def worker_error(venv: Any, phase: str, env_id: str) -> EnvWorkerError:
    """Which worker of a ``SubprocVecEnv`` died and why: its crash report or exit status."""
    processes = list(getattr(venv, "processes", []))
    dead = _dead_workers(processes)
    reports = read_reports(getattr(venv, "crash_dir", None))
    if reports:
        report = reports[0]
        return EnvWorkerError(
            f"environment {env_id} worker rank {report['rank']} (pid {report['pid']}) "
            f"crashed during {report['phase']}: {report['exception']}"
        )
    if dead:
        rank, code = dead[0]
        cause = (
            f"killed by signal {signal.Signals(-code).name} (a native crash, no Python "
            "exception)" if code < 0 else f"exited with code {code}"
        )
        return EnvWorkerError(
            f"environment {env_id} worker rank {rank} (pid {processes[rank].pid}) {cause} "
            f"during {phase}"
        )
    return EnvWorkerError(f"environment {env_id}: lost the connection to a worker during {phase}")


class GuardedVecEnv(VecCheckNan):
    """SB3's ``VecCheckNan`` (raising) that also names crashed subprocess workers.

    Sits directly on the base VecEnv, below ``VecNormalize``, so it sees raw observations and
    rewards as the environments produced them. Its message says what went non-finite, in
    which env ranks, and at which step (``num_timesteps`` as PPO counts them).
    """

    def __init__(self, venv: VecEnv, env_id: str) -> None:
        super().__init__(venv, raise_exception=True, check_inf=True)
        self.env_id = env_id
        self.num_timesteps = 0

    def step_async(self, actions: np.ndarray) -> None:
        try:
            super().step_async(actions)
        except PIPE_ERRORS as exc:
            raise self.worker_error("step") from exc

    def step_wait(self) -> Any:
        self.num_timesteps += self.num_envs
        try:
            observations, rewards, dones, infos = super().step_wait()
        except PIPE_ERRORS as exc:
            raise self.worker_error("step") from exc
        # An episode's last observation travels in the info dict (the env was auto-reset);
        # PPO bootstraps truncated episodes from it, so it must be finite too.
        terminal = [i.get("terminal_observation") for i in infos]
        template = next((t for t in terminal if t is not None), None)
        if isinstance(template, np.ndarray):
            stacked = np.stack([t if t is not None else np.zeros_like(template) for t in terminal])
            self._check_val(event="step_wait", terminal_observations=stacked)
        return observations, rewards, dones, infos

    def reset(self) -> Any:
        try:
            return super().reset()
        except PIPE_ERRORS as exc:
            raise self.worker_error("reset") from exc

    def env_method(self, *args: Any, **kwargs: Any) -> list[Any]:
        try:
            return super().env_method(*args, **kwargs)
        except PIPE_ERRORS as exc:
            raise self.worker_error("env_method") from exc

    def _check_val(self, event: str, **kwargs: Any) -> None:
        problems = []
        for name, value in kwargs.items():
            if name == "dones":
                continue
            array = np.asarray(value)
            if array.dtype.kind not in "fc" or np.isfinite(array).all():
                continue
            bad = ~np.isfinite(array.reshape(len(array), -1)).all(axis=1)
            kinds = sorted({k for _, k in self.check_array_value(name, array)})
            ranks = ", ".join(str(r) for r in np.flatnonzero(bad))
            problems.append(f"{'/'.join(kinds)} in {name} of env rank {ranks}")
        if not problems:
            return
        source = "the policy" if event == "step_async" else f"environment {self.env_id}"
        when = "at reset" if event == "reset" else f"at step {self.num_timesteps}"
        raise NonFiniteError(f"non-finite values from {source} {when}: {'; '.join(problems)}")

    def worker_error(self, phase: str) -> EnvWorkerError:
        """Which worker died and why (see :func:`worker_error`)."""
        return worker_error(self.venv.unwrapped, phase, self.env_id)


def _dead_workers(processes: Sequence[Any], wait_s: float = 3.0) -> list[tuple[int, int]]:
    """``(rank, exitcode)`` of exited workers, waiting briefly for a dying one to exit."""
    deadline = time.monotonic() + wait_s
    while True:
        dead = [(r, p.exitcode) for r, p in enumerate(processes) if p.exitcode is not None]
        if dead or time.monotonic() > deadline:
            return dead
        for process in processes:
            process.join(timeout=0.05)


def reap_workers(venv: SubprocVecEnv, grace_s: float = 3.0) -> None:
    """Stop a ``SubprocVecEnv`` whose normal ``close`` failed (a worker is dead).

    Survivors get the normal "close" command; whatever has not exited after ``grace_s`` is
    killed (workers ignore SIGTERM, see :class:`_GuardedFactory`); every process is joined
    so none is left as a zombie.
    """
    for remote, process in zip(venv.remotes, venv.processes, strict=True):
        if process.is_alive():
            with contextlib.suppress(*PIPE_ERRORS, OSError):
                remote.send(("close", None))
    deadline = time.monotonic() + grace_s
    for process in venv.processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    for remote in venv.remotes:
        with contextlib.suppress(OSError):
            remote.close()
    venv.closed = True
