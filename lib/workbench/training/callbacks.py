"""SB3 callbacks that add what SB3 does not record itself: timing split, entropy, evaluation,
reward components, memory, and a tuning trial's clock, budget and reports.

All values go through ``self.logger.record`` so they reach every logger writer (MLflow,
console) in the same dump as SB3's own keys.
"""

from __future__ import annotations

import contextlib
import math
import resource
import sys
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, sync_envs_normalization

from workbench.tracking.metric_keys import PROCESS_MEMORY_KEY


class LocalsFreeCallback(BaseCallback):
    """A callback without children that never reads ``self.locals`` itself.

    After every environment step SB3 hands the rollout loop's local variables to the callback
    list, which copies them into its ``locals`` dict and then into every child's. In a
    ``CallbackList`` (how SB3 runs a list of callbacks) the children's dict *is* the list's, so
    each child's copy re-writes that dict with its own contents: ~1 µs per callback per step
    for nothing (docs/benchmarks/costs.md#the-workbenchs-own-cost). Such a callback skips it; in a
    list its ``locals`` stay exactly SB3's, and alone it never reads them.
    """

    #: Whether ``_on_step`` does anything. A callback that only acts at iteration boundaries
    #: says False, and a :class:`CallbackChain` does not call it after every step.
    acts_on_steps: bool = True

    def update_locals(self, locals_: dict[str, Any]) -> None:
        """Skip the per-step copy (see the class)."""


class CallbackChain(CallbackList):
    """SB3's ``CallbackList`` without the per-step work none of its children needs.

    After every environment step (16 envs: ~350 times a second on HalfCheetah) SB3 copies the
    rollout loop's local variables into the list and calls every child's ``on_step``. Here the
    copy is made only when a child may read them (one that is not a
    :class:`LocalsFreeCallback`: a user's callback, SB3's own), and ``on_step`` reaches only
    the children that act on steps; the others' step counters (``num_timesteps``,
    ``n_calls``), which SB3 updates in ``on_step``, are brought up to date before each of
    their other hooks, so every hook reads what it would in a plain ``CallbackList``.
    """

    def __init__(self, callbacks: list[BaseCallback]) -> None:
        super().__init__(callbacks)
        self.readers = [c for c in callbacks if not isinstance(c, LocalsFreeCallback)]
        self.stepped = [c for c in callbacks
                        if not isinstance(c, LocalsFreeCallback) or c.acts_on_steps]
        self.idle = [c for c in callbacks if c not in self.stepped]

    def update_locals(self, locals_: dict[str, Any]) -> None:
        """Copy the rollout loop's locals only for the children that may read them."""
        if self.readers:
            self.locals.update(locals_)
            for callback in self.readers:
                callback.update_locals(locals_)

    def _on_step(self) -> bool:
        continue_training = True
        for callback in self.stepped:
            continue_training = callback.on_step() and continue_training
        return continue_training

    def _sync_idle(self) -> None:
        """The step counters SB3's ``on_step`` would have set on the children it skipped."""
        for callback in self.idle:
            callback.n_calls = self.n_calls
            callback.num_timesteps = self.model.num_timesteps

    def _on_rollout_start(self) -> None:
        self._sync_idle()
        super()._on_rollout_start()

    def _on_rollout_end(self) -> None:
        self._sync_idle()
        super()._on_rollout_end()

    def _on_training_end(self) -> None:
        self._sync_idle()
        super()._on_training_end()


class IterationCallback(LocalsFreeCallback):
    """Per-iteration additions: ``time/rollout_s``, ``time/update_s``, ``time/eval_s``, their
    CPU-time counterparts ``time/rollout_cpu_s``, ``time/update_cpu_s`` (CPU seconds of the
    process tree: what the run itself spent, whatever else the machine runs),
    ``train/entropy`` and periodic deterministic evaluation (``eval/*``).

    A PPO iteration is: collect a rollout (between ``_on_rollout_start`` and
    ``_on_rollout_end``), dump the logs, update. The update of iteration k is timed from the
    end of rollout k (after any evaluation) to the start of rollout k+1, and its ``train/*``
    values are readable from the logger there. At training end the last update's values are
    recorded and dumped: SB3 itself never dumps them.

    Unlike SB3's ``EvalCallback``, evaluation runs between rollout and dump and never dumps the
    logger itself, so its results land in the iteration's single batched log call. No
    evaluation is made once the budget is reached: the trainer's final evaluation covers it.
    """

    acts_on_steps = False

    def __init__(
        self, eval_env: VecEnv | None = None, every_steps: int = 0, n_episodes: int = 5,
        total: int = 0,
    ) -> None:
        super().__init__()
        self.eval_env = eval_env
        self.every_steps = every_steps
        self.n_episodes = n_episodes
        self.total = total
        self.next_eval = every_steps
        self.rollout_started = 0.0
        self.rollout_ended: float | None = None
        self.cpu_mark = 0.0  # tree CPU seconds at the last rollout start or end
        self.tree = ProcessTree()

    def _on_training_start(self) -> None:
        # A resumed run starts at its checkpoint's num_timesteps: the evaluations due up to
        # there were made before the checkpoint was taken (workbench.training.checkpoint).
        while self.every_steps > 0 and self.next_eval <= self.num_timesteps:
            self.next_eval += self.every_steps

    def _on_rollout_start(self) -> None:
        now, cpu = time.perf_counter(), self.tree.cpu_seconds()
        if self.rollout_ended is not None:
            self.logger.record("time/update_cpu_s", cpu - self.cpu_mark)
        self._record_update(now)
        self.rollout_started, self.cpu_mark = now, cpu

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        now, cpu = time.perf_counter(), self.tree.cpu_seconds()
        self.logger.record("time/rollout_s", now - self.rollout_started)
        self.logger.record("time/rollout_cpu_s", cpu - self.cpu_mark)
        self._evaluate_if_due(now)
        self.rollout_ended, self.cpu_mark = time.perf_counter(), self.tree.cpu_seconds()

    def _on_training_end(self) -> None:
        if self.rollout_ended is not None:
            self.logger.record("time/update_cpu_s", self.tree.cpu_seconds() - self.cpu_mark)
        self._record_update(time.perf_counter())
        self.logger.dump(self.num_timesteps)

    def _evaluate_if_due(self, now: float) -> None:
        """A deterministic evaluation when one is due, recorded as ``eval/*`` and the seconds
        it took since ``now`` (``time/eval_s``)."""
        if self.eval_env is None or not self._eval_due():
            return
        mean, std = evaluate(self.model, self.training_env, self.eval_env, self.n_episodes)
        remember(self.eval_env, Evaluation(policy_version(self.model), self.n_episodes, mean,
                                           std))
        self.logger.record("eval/mean_reward", mean)
        self.logger.record("eval/std_reward", std)
        self.logger.record("time/eval_s", time.perf_counter() - now)

    def _eval_due(self) -> bool:
        if self.every_steps <= 0 or self.num_timesteps >= self.total:
            return False
        if self.num_timesteps < self.next_eval:
            return False
        while self.next_eval <= self.num_timesteps:
            self.next_eval += self.every_steps
        return True

    def _record_update(self, now: float) -> None:
        if self.rollout_ended is None:
            return  # no update has happened yet
        self.logger.record("time/update_s", now - self.rollout_ended)
        entropy_loss = self.logger.name_to_value.get("train/entropy_loss")
        if entropy_loss is not None:
            # SB3 logs entropy_loss = -mean(entropy); practitioners watch the entropy itself.
            self.logger.record("train/entropy", -float(entropy_loss))  # type: ignore[arg-type]
        self.rollout_ended = None


class OffPolicyIterationCallback(IterationCallback):
    """The off-policy algorithms' logged points: one every ``log_every`` env steps.

    SAC, TD3, TQC and CrossQ update after every ``train_freq`` steps, far too often for a
    logged point each; SB3 itself logs every few episodes. Here the logger is dumped once
    ``log_every`` steps have passed, right after an update, with SB3's own ``rollout/*`` and
    ``time/*`` keys (``dump_logs``), that update's ``train/*`` values, the collection and
    update wall seconds summed since the last point (``time/rollout_s``, ``time/update_s``)
    and their CPU seconds (this process's: ``time.process_time``, cheap enough to read at
    every step; subprocess envs are not in it), and any evaluation made since. Every value
    of a point belongs to its step, so no key is dated back (``late_prefixes``).
    """

    def __init__(self, eval_env: VecEnv | None = None, every_steps: int = 0,
                 n_episodes: int = 5, total: int = 0, log_every: int = 1000) -> None:
        super().__init__(eval_env, every_steps, n_episodes, total)
        self.log_every = log_every
        self.next_log = log_every
        self.points = 0
        self.sums = dict.fromkeys(("rollout_s", "update_s", "rollout_cpu_s", "update_cpu_s"),
                                  0.0)

    def _on_training_start(self) -> None:
        super()._on_training_start()
        while self.next_log <= self.num_timesteps:  # a resumed run: the points made before
            self.next_log += self.log_every
            self.points += 1
        self.cpu_mark = time.process_time()

    def _on_rollout_start(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.rollout_ended is not None:  # an update ran since the last rollout's end
            self.sums["update_s"] += now - self.rollout_ended
            self.sums["update_cpu_s"] += cpu - self.cpu_mark
            self.rollout_ended = None
        if self.num_timesteps >= self.next_log:
            self._dump()
        self.rollout_started, self.cpu_mark = time.perf_counter(), time.process_time()

    def _on_rollout_end(self) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        self.sums["rollout_s"] += now - self.rollout_started
        self.sums["rollout_cpu_s"] += cpu - self.cpu_mark
        self._evaluate_if_due(now)
        self.rollout_ended, self.cpu_mark = time.perf_counter(), time.process_time()

    def _on_training_end(self) -> None:
        if self.num_timesteps < self.total:
            return  # stopped: a resume continues from the last snapshot and logs from there
        if self.rollout_ended is not None:
            self.sums["update_s"] += time.perf_counter() - self.rollout_ended
            self.sums["update_cpu_s"] += time.process_time() - self.cpu_mark
            self.rollout_ended = None
        self._dump()

    def _dump(self) -> None:
        while self.next_log <= self.num_timesteps:
            self.next_log += self.log_every
        self.points += 1
        for key, value in self.sums.items():
            self.logger.record(f"time/{key}", value)
        self.sums = dict.fromkeys(self.sums, 0.0)
        self.logger.record("time/iterations", self.points)
        self.model.dump_logs()  # type: ignore[attr-defined]  # SB3's keys, then the dump


def evaluate(
    model: Any, train_env: VecEnv, eval_env: VecEnv, n_episodes: int
) -> tuple[float, float]:
    """Mean and std of the deterministic return over ``n_episodes`` on ``eval_env``."""
    if n_episodes <= 0:
        return math.nan, math.nan
    sync_envs_normalization(train_env, eval_env)  # copies VecNormalize stats when present
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=n_episodes, deterministic=True)
    return float(mean), float(std)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Evaluation:
    """A deterministic evaluation of one version of the policy."""

    version: tuple[int, int]  # policy_version() of the model evaluated
    n_episodes: int
    mean: float
    std: float


def policy_version(model: Any) -> tuple[int, int]:
    """``(num_timesteps, gradient updates so far)``: the weights change only with the second,
    and SB3 counts it in ``_n_updates`` (PPO: epochs, A2C: updates, off-policy: gradient
    steps). PPO's periodic evaluation at step N runs before that iteration's update, so it
    measures other weights than the checkpoint taken at step N after the update."""
    return int(model.num_timesteps), int(getattr(model, "_n_updates", 0))


# The latest evaluation made on each evaluation env (IterationCallback's periodic ones), so
# that a checkpoint of the very same policy version is not evaluated a second time.
_LATEST: weakref.WeakKeyDictionary[VecEnv, Evaluation] = weakref.WeakKeyDictionary()


def remember(eval_env: VecEnv, evaluation: Evaluation) -> None:
    """Record ``evaluation`` as the latest made on ``eval_env``."""
    _LATEST[eval_env] = evaluation


def recall(eval_env: VecEnv, model: Any) -> Evaluation | None:
    """The latest evaluation made on ``eval_env`` if it measured the model's current weights."""
    latest = _LATEST.get(eval_env)
    return latest if latest is not None and latest.version == policy_version(model) else None


def evaluate_version(model: Any, train_env: VecEnv, eval_env: VecEnv, n_episodes: int
                     ) -> tuple[Evaluation, bool]:
    """The deterministic evaluation of the model's current weights, and whether it was reused:
    the latest one on ``eval_env`` when it measured this very policy version with as many
    episodes, else a new one (then remembered)."""
    latest = recall(eval_env, model)
    if latest is not None and latest.n_episodes == n_episodes:
        return latest, True
    mean, std = evaluate(model, train_env, eval_env, n_episodes)
    made = Evaluation(policy_version(model), n_episodes, mean, std)
    remember(eval_env, made)
    return made, False


class RewardComponentsCallback(BaseCallback):
    """Per-iteration mean of each named quantity an env reports in its step's ``info``,
    recorded as ``<prefix>/<name>``: by default the reward components.

    Environments that shape their reward report the weighted terms in
    ``info["reward_components"]`` (they sum to the step's reward). Their means over every
    step of the rollout show *how* the return is earned, so reward hacking (a growing
    ``reward/forward`` made of jitter, an energy penalty that swamps progress) is visible
    next to ``rollout/ep_rew_mean``. A commanded task reports what it was told and what it
    did in ``info["tracked"]`` (``track/<name>``: the walking duck's commanded and achieved
    speed), so the run shows both as curves.
    """

    def __init__(self, names: Sequence[str], info_key: str = "reward_components",
                 prefix: str = "reward") -> None:
        super().__init__()
        self.names = tuple(names)
        self.info_key = info_key
        self.prefix = prefix
        self.sums = dict.fromkeys(self.names, 0.0)
        self.count = 0

    def _on_rollout_start(self) -> None:
        self.sums = dict.fromkeys(self.names, 0.0)
        self.count = 0

    def _on_step(self) -> bool:
        for info in self.locals.get("infos", ()):
            components = info.get(self.info_key)
            if not components:
                continue
            for name in self.names:
                self.sums[name] += float(components[name])
            self.count += 1
        return True

    def _on_rollout_end(self) -> None:
        if self.count == 0:
            return
        for name in self.names:
            self.logger.record(f"{self.prefix}/{name}", self.sums[name] / self.count)


# What an env may declare (a class attribute naming its entries) -> the info key and the
# logged prefix of their per-iteration means.
INFO_MEANS = {"reward_component_names": ("reward_components", "reward"),
              "tracked_quantities": ("tracked", "track")}


def reward_component_names(venv: VecEnv, attribute: str = "reward_component_names"
                           ) -> tuple[str, ...]:
    """The env's ``reward_component_names`` (or another :data:`INFO_MEANS` attribute), or
    ``()`` when it declares none."""
    if not venv.has_attr(attribute):
        return ()
    return tuple(venv.get_attr(attribute, indices=[0])[0])


def reward_component_callbacks(venv: VecEnv) -> list[BaseCallback]:
    """A :class:`RewardComponentsCallback` for each of :data:`INFO_MEANS` the env declares."""
    found: list[BaseCallback] = []
    for attribute, (info_key, prefix) in INFO_MEANS.items():
        names = reward_component_names(venv, attribute)
        if names:
            found.append(RewardComponentsCallback(names, info_key, prefix))
    return found


class MemoryPeak(LocalsFreeCallback):
    """Peak resident memory of the training process tree: this process and its env workers.

    The tree's PSS (psutil) is sampled at rollout ends, at most every ``every_s`` seconds (one
    sample reads every memory mapping, ~10 ms for a torch process), and at training end;
    this process's own peak is the kernel's (``VmHWM``), so a short spike between samples is
    not missed where it matters most. (The peaks of reaped children are not added:
    ``RUSAGE_CHILDREN`` is the largest child ever, not a sum, and counts helpers that ended
    long before training.)
    """

    acts_on_steps = False

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s = every_s
        self.peak_bytes = 0
        self.last_bytes = 0
        self.sampled_at = -math.inf

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        if time.monotonic() - self.sampled_at >= self.every_s:
            self.sample()
            # The tree's memory over the run: what "memory creeping up" in a report reads.
            self.logger.record(PROCESS_MEMORY_KEY, self.last_bytes / 2**20)

    def _on_training_end(self) -> None:
        self.sample()

    def sample(self) -> None:
        """Add the tree's current RSS to the peak."""
        self.sampled_at = time.monotonic()
        self.last_bytes = tree_rss_bytes()
        self.peak_bytes = max(self.peak_bytes, self.last_bytes)

    @property
    def peak_mb(self) -> float:
        """The peak in MiB: the sampled tree's, or this process's own peak if higher."""
        return max(self.peak_bytes, own_peak_bytes()) / 2**20


def own_peak_bytes() -> int:
    """This process's peak resident memory: the kernel's ``VmHWM`` where there is one.

    Not ``ru_maxrss`` on Linux: an exec'd process inherits its parent's peak there, so a
    training started from a large process (a test runner, a notebook server) would report the
    parent's memory as its own.
    """
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


class ProcessTree:
    """This process and its live descendants (env workers), for their CPU seconds.

    Listing descendants reads every process's ``/proc`` entry, a millisecond or more on a busy
    machine, too much for three reads per iteration on one core (a few per cent of a fast
    configuration's training); the list is therefore refreshed at most every ``refresh_s``
    seconds. Env workers live as long as the training, so a stale list rarely misses one.
    """

    def __init__(self, refresh_s: float = 5.0) -> None:
        self.refresh_s = refresh_s
        self.me = psutil.Process()
        self.children: list[psutil.Process] = []
        self.listed_at = -math.inf

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of this process and its descendants now."""
        if time.monotonic() - self.listed_at >= self.refresh_s:
            with contextlib.suppress(psutil.Error):
                self.children = self.me.children(recursive=True)
            self.listed_at = time.monotonic()
        total = time.process_time()  # this process: a clock read, no /proc parsing
        for process in self.children:
            with contextlib.suppress(psutil.Error):  # a child that just exited
                times = process.cpu_times()
                total += times.user + times.system
        return total


def tree_rss_bytes() -> int:
    """Memory of this process and all its descendants now, shared pages counted once.

    Each process's proportional set size (PSS: a shared page split among its users) where
    the kernel reports it: subprocess workers forked from one server share most of their
    pages (torch, MuJoCo), which a plain RSS sum would count once per worker.
    """
    me = psutil.Process()
    total = proportional_bytes(me)
    own_command = me.cmdline()
    for process in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a worker that just exited
            # A child still running this program is a fork that has not exec'd yet (e.g. the
            # manifest's ``git``, started by ``subprocess`` with vfork): it shares this
            # process's pages, and a vfork child's PSS is the whole shared address space.
            # Env workers come from the forkserver and run its command line instead.
            # A child between fork and exec, or exiting, may show no command line at all;
            # reading it again after the PSS closes the race with an exec in between.
            if process.cmdline() not in (own_command, []):
                pss = proportional_bytes(process)
                if process.cmdline() not in (own_command, []):
                    total += pss
    return total


def proportional_bytes(process: psutil.Process) -> int:
    """PSS of ``process`` (Linux), else its RSS."""
    try:
        return int(process.memory_full_info().pss)
    except (AttributeError, psutil.AccessDenied):  # no pss on this platform / not ours
        return int(process.memory_info().rss)


# --------------------------------------------------------------------------- tuning trials

CONTINUE, STOP, PRUNE = "continue", "stop", "prune"  # what a trial's reporter answers


class TrialReporter(Protocol):
    """What a tuning trial's training talks to (``workbench.tuning.trial`` implements it with
    Optuna); training itself never imports Optuna."""

    budget_s: float | None  # training seconds the trial may use (None: total_timesteps only)

    def progress(self, train_s: float, steps: int, mean_return: float | None) -> str:
        """Called at every rollout end with the training clock and, when an evaluation ran,
        its mean return; answers CONTINUE, STOP (the objective is settled) or PRUNE."""
        ...


class TrialCallback(LocalsFreeCallback):
    """Training as one trial of a study: its own clock, its budget, its reports.

    The clock counts training only: the time of the evaluations ``IterationCallback`` makes
    (``time/eval_s``; this callback runs after it) is excluded, as in
    ``benchmarks/time_to_reward.py``. At every rollout end it records ``trial/train_s`` and,
    after an evaluation, ``trial/eval_train_s`` (the clock when the evaluation started), so
    the run's record holds the return-vs-time curve the objective is computed from. Training
    stops at the next step once the budget is spent, the reporter says the objective is
    settled, or the pruner stops the trial (``pruned`` is then True).
    """

    def __init__(self, reporter: TrialReporter) -> None:
        super().__init__()
        self.reporter = reporter
        self.verdict = CONTINUE
        self.started = 0.0
        self.paused = 0.0

    @property
    def pruned(self) -> bool:
        return self.verdict == PRUNE

    def _on_training_start(self) -> None:
        self.started = time.perf_counter()
        self.paused = 0.0

    def _on_step(self) -> bool:
        return self.verdict == CONTINUE

    def _on_rollout_end(self) -> None:
        values = self.logger.name_to_value
        mean_return = values.get("eval/mean_reward") if "eval/mean_reward" in values else None
        eval_s = float(values.get("time/eval_s", 0.0)) if mean_return is not None else 0.0
        train_s = time.perf_counter() - self.started - self.paused - eval_s
        self.paused += eval_s
        self.logger.record("trial/train_s", train_s)
        if mean_return is not None:
            self.logger.record("trial/eval_train_s", train_s)
        verdict = self.reporter.progress(train_s, self.num_timesteps,
                                         None if mean_return is None else float(mean_return))
        budget = self.reporter.budget_s
        if verdict == CONTINUE and budget is not None and train_s >= budget:
            verdict = STOP
        self.verdict = verdict
