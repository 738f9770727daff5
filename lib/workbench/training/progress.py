"""What training prints while it runs: a line per iteration, a progress bar, and once the
pace, with the training time the budget takes at it.

A bare progress bar is not enough to debug RL: each iteration line shows reward, entropy, KL,
clip fraction (off-policy: entropy coefficient, critic and actor loss) and the rollout/update
time split. Both are SB3 extension points (a logger
``KVWriter`` and a callback), so they see exactly what MLflow receives.
"""

from __future__ import annotations

import time
from typing import Any

from stable_baselines3.common.logger import KVWriter
from tqdm.auto import tqdm

from workbench import console
from workbench.console import format_value
from workbench.tracking.writer import LATE_PREFIXES
from workbench.training.callbacks import LocalsFreeCallback

# (logger key, label, format) of the per-iteration line.
LINE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("rollout/ep_rew_mean", "rew", "{:.1f}"),
    ("rollout/ep_len_mean", "len", "{:.0f}"),
    ("train/entropy", "ent", "{:.3f}"),
    ("train/approx_kl", "kl", "{:.4f}"),
    ("train/clip_fraction", "clip", "{:.3f}"),
    ("train/ent_coef", "alpha", "{:.3g}"),  # SAC, TQC, CrossQ
    ("train/critic_loss", "critic", "{:.3g}"),  # the off-policy algorithms
    ("train/actor_loss", "actor", "{:.3g}"),
    ("time/fps", "fps", "{:.0f}"),
    ("time/rollout_s", "roll", "{:.2f}s"),
    ("time/update_s", "upd", "{:.2f}s"),
)


class ConsoleWriter(KVWriter):
    """SB3 logger output printing one concise line per iteration (above the progress bar).

    SB3 dumps the logger after a rollout and before that iteration's update, so the update's
    ``train/*`` and ``time/update_s`` values arrive with the next dump (or the closing dump at
    training end). The line of iteration k is printed when they do: every value on it,
    KL and clip fraction included, is iteration k's (as :class:`MlflowWriter` dates them).
    """

    def __init__(self, total_iterations: int, late: tuple[str, ...] = LATE_PREFIXES) -> None:
        self.total_iterations = total_iterations
        self.late = late  # keys that arrive one dump late (none off-policy)
        self.pending: dict[str, Any] | None = None  # iteration k's own values, awaiting update k
        self.pending_step = 0

    def write(
        self,
        key_values: dict[str, Any],
        key_excluded: dict[str, tuple[str, ...]],
        step: int = 0,
    ) -> None:
        update = {k: v for k, v in key_values.items() if self.late and k.startswith(self.late)}
        if self.pending is not None:
            self.print_line({**self.pending, **update}, self.pending_step)
            self.pending = None
        if "time/iterations" in key_values:
            self.pending = {k: v for k, v in key_values.items() if k not in update}
            self.pending_step = step

    def print_line(self, values: dict[str, Any], step: int) -> None:
        """``it k/N | steps | rew | len | ent | kl | clip | fps | roll | upd | eval``."""
        parts = [f"it {values['time/iterations']}/{self.total_iterations}", f"{step} steps"]
        for key, label, fmt in LINE_FIELDS:
            if key in values:
                parts.append(f"{label} {format_value(values[key], fmt)}")
        if "eval/mean_reward" in values:
            parts.append(f"eval {format_value(values['eval/mean_reward'], '{:.1f}')}")
        tqdm.write(" | ".join(parts))

    def close(self) -> None:
        """A line still waiting for its update (training stopped early) is printed as it is."""
        if self.pending is not None:
            self.print_line(self.pending, self.pending_step)
            self.pending = None


class ProgressBarCallback(LocalsFreeCallback):
    """A tqdm bar over environment steps in a terminal or JupyterLab; with output redirected,
    a line every minute (:func:`workbench.console.progress`)."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total
        self.bar: Any = None
        self.shown = 0

    def _on_training_start(self) -> None:
        self.bar = console.progress(self.total, "training", "step", leave=False)

    def _on_step(self) -> bool:
        self.bar.update(self.num_timesteps - self.shown)
        self.shown = self.num_timesteps
        return True

    def _on_training_end(self) -> None:
        if self.bar is not None:
            self.bar.close()


PACE_AFTER_S = 15.0  # training seconds before the pace line: past start-up, early enough


class PaceLine(LocalsFreeCallback):
    """One line, once, ``after_s`` seconds into training: the pace so far and the training
    time the whole budget takes at it. A run that will take hours (SAC on one env on a
    2-core CPU: ~30 steps/s) says so within seconds, not at the end."""

    acts_on_steps = False

    def __init__(self, total: int, after_s: float = PACE_AFTER_S) -> None:
        super().__init__()
        self.total = total
        self.after_s = after_s
        self.started = 0.0
        self.first = 0
        self.done = False

    def _on_training_start(self) -> None:
        self.started, self.first = time.perf_counter(), self.model.num_timesteps

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if self.done:
            return
        elapsed = time.perf_counter() - self.started
        steps = self.model.num_timesteps - self.first
        if elapsed < self.after_s or steps <= 0:
            return
        self.done = True
        rate = steps / elapsed
        print(pace_text(rate, elapsed, self.total - self.first), flush=True)


def pace_text(rate: float, elapsed: float, budget: int) -> str:
    """``pace: 33 steps/s over the first 15 s: 20,000 steps take about 10 min of training``."""
    return (f"pace: {rate:,.0f} steps/s over the first {elapsed:.0f} s: {budget:,} "
            f"steps take about {console.duration(budget / rate)} of training")
