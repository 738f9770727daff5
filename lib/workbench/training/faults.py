"""Faults of a training run, detected where they happen and reported in one line.

- **Interruption** (SIGINT, SIGTERM, a JupyterLab kernel interrupt): the first signal asks
  training to stop after the current environment step (:class:`Interruption`); a second one
  raises :class:`TrainingInterrupted` at once. While a run is being created or its status
  written, a signal is held (:class:`HeldSignals`) and raised once the run's status can
  follow it; a second one while held stops at once.
- **Non-finite updates**: losses and parameters after each PPO update are checked by
  :class:`UpdateCheck` (raising :class:`workbench.envs.guards.NonFiniteError`, the same error
  the environment guards raise for observations, rewards and actions).
- **GPU memory** held by a failed or interrupted training is released
  (:func:`release_accelerator`).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

import torch

from workbench.console import in_jupyter_kernel
from workbench.envs.guards import NonFiniteError
from workbench.training.callbacks import LocalsFreeCallback

# Loss and diagnostic keys SB3's PPO records after each update.
UPDATE_KEYS = (
    "train/loss", "train/value_loss", "train/policy_gradient_loss", "train/entropy_loss",
    "train/approx_kl", "train/std", "train/policy_loss",  # PPO, A2C
    "train/actor_loss", "train/critic_loss", "train/ent_coef", "train/ent_coef_loss",  # off-policy
)


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
        if not in_jupyter_kernel():  # a notebook gets one line, when the run has stopped
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


class HeldSignals:
    """SIGINT/SIGTERM held back over a stretch where an interruption would make a run lie.

    Between the moment the store creates a run and the moment the code that marks it KILLED
    owns it, and while that code writes the status, an exception from a signal handler
    would leave the run RUNNING (or half-ended). :meth:`hold` records such a signal instead;
    :meth:`release` restores the handlers and delivers the recorded signal through the
    handler that was in place (the CLI's raises :class:`KeyboardInterrupt`). A second
    signal while held is delivered at once, so that a hung store call can still be stopped.
    Only in the main thread (where Python runs signal handlers); elsewhere a no-op.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.signum: int | None = None

    def hold(self) -> HeldSignals:
        """Record SIGINT/SIGTERM from now on, until :meth:`release`."""
        if self.previous or threading.current_thread() is not threading.main_thread():
            return self
        self.previous = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
        for sig in self.SIGNALS:
            signal.signal(sig, self._record)
        return self

    def release(self, deliver: bool = True) -> None:
        """Restore the handlers; deliver a held signal now (unless ``deliver`` is False)."""
        if not self.previous:
            return
        previous, self.previous = self.previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signum, self.signum = self.signum, None
        if signum is not None and deliver:
            self._deliver(signum, previous[signum])

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            return
        self.release()  # the second one: delivered at once (the first is raised with it)

    @staticmethod
    def _deliver(signum: int, handler: Any) -> None:
        if callable(handler):
            handler(signum, None)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)  # the default action: the process ends


def interrupt_reason(exc: BaseException) -> str:
    """The ``error`` tag of a KILLED run."""
    if isinstance(exc, TrainingInterrupted):
        return f"interrupted: {exc}"
    text = str(exc)
    return f"interrupted: KeyboardInterrupt{': ' + text if text else ''}"


# --------------------------------------------------------------------------- updates


class UpdateCheck(LocalsFreeCallback):
    """Stops training when an update produced non-finite losses or parameters.

    SB3 records the update's losses in the logger; they are read before the next rollout
    starts (and at training end), i.e. before a NaN policy could act. Put it first in the
    callback list, before anything that dumps the logger. The off-policy algorithms update
    after every few steps: their parameters are scanned every ``params_every`` updates (a
    non-finite parameter shows in the losses of the update that made it anyway).
    """

    acts_on_steps = False

    def __init__(self, params_every: int = 1) -> None:
        super().__init__()
        self.checked_updates = 0
        self.params_every = params_every
        self.params_checked = 0

    def _on_rollout_start(self) -> None:
        self.check()

    def _on_training_end(self) -> None:
        self.check(every_parameter=True)

    def _on_step(self) -> bool:
        return True

    def check(self, every_parameter: bool = False) -> None:
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
                f"non-finite {', '.join(bad)} in the update after step "
                f"{self.num_timesteps}: lower algo.learning_rate or check the scale of "
                "rewards and observations (env.normalize=true)"
            )
        due = updates - self.params_checked >= self.params_every or not self.params_checked
        if not (due or every_parameter):
            return
        self.params_checked = updates
        named = list(self.model.policy.named_parameters())
        if math.isfinite(parameter_sum(param for _, param in named)):
            return  # the usual case: one cheap pass, one device sync
        for name, param in named:
            if not torch.isfinite(param).all():
                raise NonFiniteError(
                    f"non-finite policy parameter {name} after the update at step "
                    f"{self.num_timesteps}: lower algo.learning_rate (PPO/A2C: or "
                    "algo.max_grad_norm)"
                )


def parameter_sum(params: Iterable[torch.Tensor]) -> float:
    """The sum of every element, accumulated in float64.

    Finite float32 values cannot overflow a float64 sum, so the sum is finite exactly when
    every element is (a NaN, or infinities of both signs, propagate): a fifth of the cost of
    ``torch.isfinite`` element by element on a 256x256 policy's CPU update.
    """
    sums = [p.detach().sum(dtype=torch.float64) for p in params]
    return float(torch.stack(sums).sum()) if sums else 0.0


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
