"""Faults during training, detected where they happen and reported in one line.

- **Interruption** (SIGINT, SIGTERM, a JupyterLab kernel interrupt): the first signal asks
  training to stop after the current environment step (:class:`Interruption`); a second one
  raises :class:`TrainingInterrupted` at once.
- **Crashed environment worker** (an exception or a native crash inside a ``SubprocVecEnv``
  worker): SB3 alone reports ``EOFError``/``BrokenPipeError``. Each worker's env is wrapped in
  :class:`EnvGuard`, which writes the original exception to a crash report before the worker
  dies; :class:`GuardedVecEnv` turns the broken pipe into an :class:`EnvWorkerError` naming the
  task, the worker rank and that exception (or the signal that killed the worker).
- **Non-finite values**: observations, rewards (from the environments) and actions (from the
  policy) are checked by SB3's ``VecCheckNan`` (:class:`GuardedVecEnv` subclasses it to say
  which env rank and which step); losses and parameters after each PPO update by
  :class:`UpdateCheck`. Both raise :class:`NonFiniteError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import gymnasium
import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecCheckNan, VecEnv

from workbench.envs import simstate

# What a parent sees when a SubprocVecEnv worker is gone.
PIPE_ERRORS = (EOFError, BrokenPipeError, ConnectionResetError)

# Loss and diagnostic keys SB3's PPO records after each update.
UPDATE_KEYS = (
    "train/loss", "train/value_loss", "train/policy_gradient_loss", "train/entropy_loss",
    "train/approx_kl", "train/std",
)


class EnvWorkerError(RuntimeError):
    """A subprocess environment worker crashed; the message names env, rank and cause."""


class NonFiniteError(FloatingPointError):
    """A NaN or infinity appeared in observations, rewards, actions, losses or parameters."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by a signal; ``signum`` tells SIGINT (130) from SIGTERM (143)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


# --------------------------------------------------------------------------- interruption


class Interruption:
    """Graceful stop on the first SIGINT/SIGTERM, immediate stop on the second.

    Installed only around ``model.learn`` and only in the main thread (where Python delivers
    signals; a notebook kernel runs cells there, so a kernel interrupt lands here too).
    Elsewhere a signal keeps Python's default behaviour: ``KeyboardInterrupt`` at once.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.received_at: float | None = None
        self.forced = False

    @property
    def requested(self) -> bool:
        """True once a stop was requested."""
        return self.signum is not None

    @contextlib.contextmanager
    def installed(self) -> Iterator[Interruption]:
        """Route SIGINT and SIGTERM to :meth:`handle` for the duration of the block."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self.handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: request a stop, or stop now if one was already requested."""
        name = signal.Signals(signum).name
        if self.requested:
            self.forced = True
            raise TrainingInterrupted(signum, f"{name} received twice: stopped immediately")
        self.signum = signum
        self.received_at = time.monotonic()
        print(
            f"\nworkbench: {name} received: stopping after the current step and saving a "
            "checkpoint (send it again to stop immediately)",
            file=sys.stderr, flush=True,
        )

    def error(self, detail: str = "") -> TrainingInterrupted:
        """The exception that ends training after a requested stop."""
        assert self.signum is not None
        name = signal.Signals(self.signum).name
        return TrainingInterrupted(self.signum, f"{name} received{detail}")


def interrupt_reason(exc: BaseException) -> str:
    """The ``error`` tag of a KILLED run."""
    if isinstance(exc, TrainingInterrupted):
        return f"interrupted: {exc}"
    text = str(exc)
    return f"interrupted: KeyboardInterrupt{': ' + text if text else ''}"


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


# --------------------------------------------------------------------------- PPO updates


class UpdateCheck(BaseCallback):
    """Stops training when a PPO update produced non-finite losses or parameters.

    SB3 records the update's losses in the logger; they are read before the next rollout
    starts (and at training end), i.e. before a NaN policy could act. Put it first in the
    callback list, before anything that dumps the logger.
    """

    def __init__(self) -> None:
        super().__init__()
        self.checked_updates = 0

    def _on_rollout_start(self) -> None:
        self.check()

    def _on_training_end(self) -> None:
        self.check()

    def _on_step(self) -> bool:
        return True

    def check(self) -> None:
        """Raise :class:`NonFiniteError` if the latest update went non-finite."""
        updates = int(getattr(self.model, "_n_updates", 0))
        if updates == self.checked_updates:
            return
        self.checked_updates = updates
        values = self.logger.name_to_value
        bad = [
            f"{key}={values[key]}" for key in UPDATE_KEYS
            if key in values and not math.isfinite(float(values[key]))  # type: ignore[arg-type]
        ]
        if bad:
            raise NonFiniteError(
                f"non-finite {', '.join(bad)} in the PPO update after step "
                f"{self.num_timesteps}: lower algo.learning_rate or check the scale of "
                "rewards and observations (env.normalize=true)"
            )
        for name, param in self.model.policy.named_parameters():
            if not torch.isfinite(param).all():
                raise NonFiniteError(
                    f"non-finite policy parameter {name} after the PPO update at step "
                    f"{self.num_timesteps}: lower algo.learning_rate or algo.max_grad_norm"
                )


# --------------------------------------------------------------------------- accelerator


def release_accelerator(model: Any) -> None:
    """Free the GPU memory a failed or interrupted training holds.

    The exception's traceback keeps ``train()``'s frame (and so the model) alive, e.g. in a
    notebook's ``sys.last_traceback``; moving the policy and the optimizer state to the CPU
    and emptying PyTorch's cache frees the device for the next run.
    """
    if model is None or not torch.cuda.is_available():
        return
    policy = getattr(model, "policy", None)
    if policy is not None:
        policy.to("cpu")
        optimizer = getattr(policy, "optimizer", None)
        for state in getattr(optimizer, "state", {}).values():
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor):
                    state[key] = value.cpu()
    torch.cuda.empty_cache()
