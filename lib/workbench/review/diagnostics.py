"""What went wrong in a run: diagnostics from its metric series, and where its time went.

Each check reads the per-iteration series a run logged (SB3's keys, ``time/*`` and MLflow's
``system/*`` metrics) and, when it fires, returns a :class:`Diagnostic` carrying the numbers
that triggered it and the usual remedy (docs/reports.md, "Diagnostics").
:func:`analyse_bottleneck` turns the rollout/update time split and the system metrics into
one verdict per run ("Where the time goes"), with the GPU's temperature and clocks where a
GPU was sampled, so that thermal throttling shows.

All thresholds live in :class:`Thresholds` (typed, one comment per field); the report CLI
exposes each as an option (``--approx-kl-max 0.1``) and the notebook takes a dict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from workbench.config import ConfigError
from workbench.tracking.metric_keys import PROCESS_MEMORY_KEY

REWARD_KEYS = ("rollout/ep_rew_mean", "eval/mean_reward")  # first present wins
CPU_KEY = "system/cpu_utilization_percentage"
MEMORY_KEY = "system/system_memory_usage_megabytes"  # the whole machine's (MLflow's sampler)
# The training process tree's own memory (PROCESS_MEMORY_KEY) is preferred; runs recorded
# before it existed fall back to the machine's.
# MLflow's CPU sampler reports 0 for its first sample (psutil's cpu_percent without a previous
# call); it is dropped, and a mean needs this many samples after it.
MIN_CPU_SAMPLES = 3
# MLflow logs one series per GPU (system/gpu_0_utilization_percentage, ...); some stores carry
# an unnumbered one.
GPU_KEY = re.compile(r"^system/gpu(_\d+)?_utilization_percentage$")
# The workbench's own NVML sampler (workbench/tracking/system_metrics.py), per GPU: what shows
# thermal throttling. MLflow's GPU monitor logs utilization, memory and power only.
GPU_FACTS = ("temperature_celsius", "sm_clock_mhz", "sm_clock_max_mhz",
             "thermal_throttle_percentage", "power_throttle_percentage")
GPU_FACT_KEY = re.compile(rf"^system/gpu(?:_(\d+))?_({'|'.join(GPU_FACTS)})$")


def threshold(default: float, help_text: str) -> Any:
    """A threshold field whose help text the CLI shows (``workbench report --help``)."""
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class Thresholds:
    """When a diagnostic fires and how a bottleneck verdict is reached."""

    clip_fraction_max: float = threshold(0.3, "clip_fraction above this ...")
    clip_fraction_iterations: int = threshold(3, "... for this many consecutive iterations fires")
    approx_kl_max: float = threshold(0.05, "approx KL above this ...")
    # One spike is common in healthy runs; repeated ones mean the updates are too large.
    approx_kl_iterations: int = threshold(3, "... in this many iterations fires")
    entropy_early_fraction: float = threshold(
        0.25, "'early' for entropy collapse: within this fraction of the budget")
    entropy_collapse_ratio: float = threshold(
        0.2, "collapsed: policy std (or entropy) below this ratio x its start")
    reward_flat_after_fraction: float = threshold(
        0.5, "judge the reward trend once this fraction of the budget ran")
    reward_flat_min_change: float = threshold(
        0.05, "flat: (last fifth - first fifth) / scale of the reward below this")
    iteration_time_growth: float = threshold(
        1.5, "growing: last-third / first-third median iteration time above this ...")
    iteration_time_trend: float = threshold(
        0.5, "... and rising steadily: rank correlation of iteration time with iteration "
        "number at least this (other load on the machine makes spikes, not a trend)")
    min_iterations: int = threshold(10, "fewer iterations are too short to judge time trends")
    bound_share: float = threshold(
        0.6, "rollout (or update) share of the iteration time that dominates")
    cpu_busy_percent: float = threshold(60.0, "mean system CPU utilization counted as busy")
    gpu_busy_percent: float = threshold(50.0, "mean GPU utilization counted as busy")
    memory_creep_mb: float = threshold(
        512.0, "memory rise of the training process tree (older runs: the machine's), first "
        "to last quarter of samples and rising in each, that counts as creeping")
    gpu_throttle_percent: float = threshold(
        10.0, "percent of the samples with the GPU's clocks slowed for heat that counts as "
        "thermal throttling")
    ent_coef_min: float = threshold(
        1e-3, "SAC/TQC/CrossQ: a learned entropy coefficient below this ...")
    ent_coef_max: float = threshold(5.0, "... or above this (it starts at 1) ...")
    ent_coef_points: int = threshold(3, "... for this many consecutive logged points fires")
    critic_loss_growth: float = threshold(
        20.0, "off-policy: last-quarter / first-quarter median critic loss above this, and "
        "rising steadily, counts as diverging")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value <= 0:
                raise ConfigError(f"threshold {f.name}={value}: must be > 0")
        for name in ("entropy_early_fraction", "reward_flat_after_fraction", "bound_share"):
            value = getattr(self, name)
            if value > 1:
                raise ConfigError(f"threshold {name}={value}: must be a fraction in (0, 1]")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        """Thresholds from ``{"approx_kl_max": 0.1, ...}``; unknown names fail with the list."""
        known = {f.name: f for f in fields(cls)}
        typed: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise ConfigError(
                    f"threshold {name!r}: unknown; valid thresholds: {', '.join(known)}"
                )
            kind = int if known[name].type in ("int", int) else float
            try:
                typed[name] = kind(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"threshold {name}={value!r}: expected {kind.__name__}"
                ) from exc
        return cls(**typed)


@dataclass(frozen=True)
class Series:
    """One metric's history, ordered by step."""

    steps: np.ndarray  # environment steps (MLflow step), int
    values: np.ndarray  # float; NaN/inf kept as logged
    timestamps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # ms since epoch

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, steps: Any, values: Any, timestamps: Any = None) -> Series:
        """A series from plain sequences, sorted by (step, timestamp)."""
        s = np.asarray(steps, dtype=np.int64)
        v = np.asarray(values, dtype=float)
        t = np.asarray(timestamps if timestamps is not None else np.zeros(len(s)), dtype=float)
        order = np.lexsort((t, s))
        return cls(steps=s[order], values=v[order], timestamps=t[order])


@dataclass(frozen=True)
class Diagnostic:
    """A problem found in one run: what, the numbers that show it, what usually helps."""

    check: str  # short id, e.g. "approx_kl"
    title: str
    evidence: str  # the triggering numbers, in words
    remedy: str
    values: Mapping[str, float]  # the triggering numbers, for tables and tests


Check = Callable[[Mapping[str, Series], int | None, Thresholds], Diagnostic | None]


# --------------------------------------------------------------------------- checks


def check_nonfinite(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """NaN or inf in any metric: the run diverged (it never ranks first)."""
    bad = {k: s for k, s in metrics.items() if len(s) and not np.all(np.isfinite(s.values))}
    if not bad:
        return None
    firsts = {k: int(s.steps[~np.isfinite(s.values)][0]) for k, s in bad.items()}
    first_key = min(firsts, key=lambda k: (firsts[k], k))
    counts = {k: int(np.sum(~np.isfinite(s.values))) for k, s in bad.items()}
    listed = ", ".join(sorted(bad)[:6]) + (" ..." if len(bad) > 6 else "")
    return Diagnostic(
        check="nonfinite",
        title="NaN/inf in metrics (diverged)",
        evidence=f"{sum(counts.values())} non-finite values in {len(bad)} metric(s) ({listed}); "
        f"first: {first_key} at step {firsts[first_key]}",
        remedy="training diverged: lower algo.learning_rate, check observations and rewards for "
        "NaN/inf, consider env.normalize=true; this run is ranked below every finite run",
        values={"metrics": float(len(bad)), "first_step": float(firsts[first_key])},
    )


def check_clip_fraction(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """clip_fraction above the limit for several consecutive iterations: updates too large."""
    s = metrics.get("train/clip_fraction")
    if s is None or not len(s):
        return None
    start, length = longest_streak(s.values > limits.clip_fraction_max)
    if length < limits.clip_fraction_iterations:
        return None
    window = s.values[start : start + length]
    first, last = int(s.steps[start]), int(s.steps[start + length - 1])
    if return_still_rising(metrics, first, limits):
        return None
    return Diagnostic(
        check="clip_fraction",
        title="clip_fraction sustained high",
        evidence=f"clip_fraction > {limits.clip_fraction_max:g} for {length} consecutive "
        f"iterations (steps {first}-{last}), peak {np.max(window):.3f}, and the return "
        "stopped improving from there",
        remedy="each update moves the policy too far: lower algo.learning_rate or the rollout "
        "length algo.n_steps (or algo.n_epochs)",
        values={"iterations": float(length), "peak": float(np.max(window)),
                "first_step": float(first)},
    )


def finite_reward(metrics: Mapping[str, Series]) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The return series the reward checks judge (the first of ``REWARD_KEYS`` with at least
    3 points): its key, and its steps and values without NaN/inf."""
    key = next((k for k in REWARD_KEYS if k in metrics and len(metrics[k]) >= 3), None)
    if key is None:
        return None
    s = metrics[key]
    finite = np.isfinite(s.values)
    return key, s.steps[finite], s.values[finite]


def return_still_rising(metrics: Mapping[str, Series], from_step: int, limits: Thresholds
                        ) -> bool:
    """Whether the return kept improving from ``from_step`` to the end of the run.

    Large updates (clip fraction, approx KL over their limits) are a problem when learning
    stalls with them. Healthy runs show them too: PPO with SB3's defaults on HalfCheetah
    keeps clip fractions of 0.4-0.47 and KL of 0.06-0.08 past 1M steps while its return
    climbs (docs/reports.md). "Improving" is the reward-flat test's measure: the mean of the
    last fifth minus the value at ``from_step``, over the return's scale, at least
    ``reward_flat_min_change``.
    """
    reward = finite_reward(metrics)
    if reward is None:
        return False
    _, steps, values = reward
    after = values[steps >= from_step]
    if len(after) < 2:
        return False
    start, end = float(after[0]), float(np.mean(after[-max(1, len(after) // 5):]))
    scale = max(abs(start), abs(end), float(np.ptp(values)), 1.0)
    return (end - start) / scale >= limits.reward_flat_min_change


def check_approx_kl(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """approx KL above the limit: old and new policy diverge."""
    s = metrics.get("train/approx_kl")
    if s is None or not len(s):
        return None
    above = s.values > limits.approx_kl_max
    count = int(np.sum(above))
    if count < limits.approx_kl_iterations:
        return None
    if return_still_rising(metrics, int(s.steps[np.argmax(above)]), limits):
        return None
    finite = np.where(np.isfinite(s.values), s.values, -np.inf)
    peak = int(np.argmax(finite))
    return Diagnostic(
        check="approx_kl",
        title="approx KL above threshold",
        evidence=f"approx_kl > {limits.approx_kl_max:g} in {count} of {len(s)} iterations, "
        f"max {s.values[peak]:.3f} at step {int(s.steps[peak])}, and the return stopped "
        "improving from the first of them",
        remedy="old and new policy diverge: lower algo.learning_rate or algo.n_steps, or set "
        "algo.target_kl to stop an update's epochs early",
        values={"iterations": float(count), "max": float(s.values[peak]),
                "max_step": float(s.steps[peak])},
    )


def check_entropy_collapse(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """Policy entropy collapsing within the first part of the budget: premature convergence.

    A Gaussian policy's entropy is sum(log std) + const and can be negative, so "collapse"
    is judged on SB3's ``train/std`` (std below ratio x its start = entropy down by
    log(1/ratio) nats per action dimension). Without ``train/std`` (discrete actions,
    entropy >= 0) the entropy itself is compared with its start.
    """
    entropy = metrics.get("train/entropy")
    std = metrics.get("train/std")
    signal, name = (std, "policy std") if std is not None and len(std) else (entropy, "entropy")
    if signal is None or len(signal) < 2 or not budget:
        return None
    early_end = limits.entropy_early_fraction * budget
    early = (signal.steps <= early_end) & np.isfinite(signal.values)
    start = float(signal.values[0])
    if start <= 0 or not np.any(early):
        return None
    index = int(np.argmin(np.where(early, signal.values, np.inf)))
    low = float(signal.values[index])
    ratio = low / start
    if ratio > limits.entropy_collapse_ratio:
        return None
    step = int(signal.steps[index])
    extra = ""
    if name == "policy std" and entropy is not None and len(entropy):
        at = entropy.values[entropy.steps <= step]
        if len(at):
            extra = f"; entropy {entropy.values[0]:.2f} -> {at[-1]:.2f}"
    return Diagnostic(
        check="entropy_collapse",
        title="entropy collapsing early",
        evidence=f"{name} fell from {start:.3g} to {low:.3g} (x{ratio:.2f}) by step {step} "
        f"({step / budget:.0%} of the budget){extra}",
        remedy="premature convergence: raise algo.ent_coef, lower algo.learning_rate, or "
        "start with a larger algo.policy.log_std_init",
        values={"ratio": ratio, "step": float(step), "start": start, "low": low},
    )


def check_reward_flat(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """No upward reward trend after a fair share of the budget."""
    reward = finite_reward(metrics)
    if reward is None:
        return None
    key, steps, values = reward
    total = budget or int(metrics[key].steps[-1])
    if len(values) < 3 or steps[-1] < limits.reward_flat_after_fraction * total:
        return None
    k = max(1, len(values) // 5)  # mean of the first and last fifth: robust to one noisy point
    first, last = float(np.mean(values[:k])), float(np.mean(values[-k:]))
    scale = max(abs(first), abs(last), 1.0)
    change = (last - first) / scale
    if change >= limits.reward_flat_min_change:
        return None
    return Diagnostic(
        check="reward_flat",
        title="reward flat",
        evidence=f"{key} {first:.2f} -> {last:.2f} ({change:+.1%} of its scale) after "
        f"{int(steps[-1])} steps ({steps[-1] / total:.0%} of the budget); needs >= "
        f"{limits.reward_flat_min_change:.0%}",
        remedy="check the reward signal and normalization (env.normalize, reward scale, "
        "termination) before tuning hyperparameters",
        values={"first": first, "last": last, "change": change},
    )


def check_iteration_time(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """Time per iteration growing steadily over the run: memory, logging or cache growth.

    Judged on CPU seconds per iteration (``time/*_cpu_s``): what the run itself spent, so other
    load on a shared machine, which stretches wall time, does not fire it. Runs recorded
    before those existed are judged on wall time.
    """
    cpu = iteration_seconds(metrics, "time/rollout_cpu_s", "time/update_cpu_s")
    times, kind = (cpu, "CPU") if cpu is not None else (iteration_seconds(metrics), "wall")
    if times is None or len(times) < limits.min_iterations:
        return None
    body = times[1:]  # the first iteration carries start-up costs
    first, last, trend = growth(body, 3)
    if first <= 0 or last / first < limits.iteration_time_growth:
        return None
    if trend < limits.iteration_time_trend:
        return None
    return Diagnostic(
        check="iteration_time",
        title="iteration time growing",
        evidence=f"median {kind} time per iteration {first:.3g} s in the first third -> "
        f"{last:.3g} s in the last (x{last / first:.2f}, over {len(times)} iterations; rank "
        f"correlation with the iteration number {trend:.2f})",
        remedy="look for memory fragmentation, logging or caches that grow with the run "
        "(objects kept across iterations)",
        values={"first_s": first, "last_s": last, "growth": last / first, "trend": trend},
    )


def check_ent_coef(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """SAC's (TQC's, CrossQ's) learned entropy coefficient collapsing to ~0 or exploding."""
    s = metrics.get("train/ent_coef")
    if s is None or not len(s):
        return None
    for low, flags in ((True, s.values < limits.ent_coef_min),
                       (False, s.values > limits.ent_coef_max)):
        start, length = longest_streak(flags)
        if length < limits.ent_coef_points:
            continue
        step, value = int(s.steps[start]), float(s.values[start + length - 1])
        bound = limits.ent_coef_min if low else limits.ent_coef_max
        return Diagnostic(
            check="ent_coef",
            title="entropy coefficient collapsed" if low else "entropy coefficient exploding",
            evidence=f"train/ent_coef {'<' if low else '>'} {bound:g} for {length} logged "
            f"points from step {step} (last {value:.3g}; it starts at "
            f"{float(s.values[0]):.3g})",
            remedy=("exploration stopped: the policy is near-deterministic; lower the target "
                    "entropy's magnitude (algo.target_entropy) or fix the coefficient "
                    "(algo.ent_coef=0.01)") if low else
            ("the policy cannot reach its target entropy: check the action scale and "
             "algo.target_entropy, or fix the coefficient (algo.ent_coef=0.1)"),
            values={"points": float(length), "step": float(step), "last": value},
        )
    return None


def check_critic_loss(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds
) -> Diagnostic | None:
    """The off-policy critic's loss growing by orders of magnitude: Q-values diverging."""
    s = metrics.get("train/critic_loss")
    if s is None or len(s) < limits.min_iterations:
        return None
    values = s.values[np.isfinite(s.values)]
    if len(values) < limits.min_iterations:
        return None
    first, last, trend = growth(values, 4)
    if first <= 0 or last / first < limits.critic_loss_growth:
        return None
    if trend < limits.iteration_time_trend:
        return None
    return Diagnostic(
        check="critic_loss",
        title="critic loss diverging",
        evidence=f"median train/critic_loss {first:.3g} in the first quarter -> {last:.3g} in "
        f"the last (x{last / first:.0f}; rank correlation with the step {trend:.2f})",
        remedy="Q-values are blowing up: lower algo.learning_rate or algo.tau (slower target "
        "updates; SAC, TD3, TQC), or scale the rewards (env.normalize=true)",
        values={"first": first, "last": last, "growth": last / first, "trend": trend},
    )


CHECKS: tuple[Check, ...] = (
    check_nonfinite,
    check_clip_fraction,
    check_approx_kl,
    check_entropy_collapse,
    check_ent_coef,
    check_critic_loss,
    check_reward_flat,
    check_iteration_time,
)


def diagnose(
    metrics: Mapping[str, Series], budget: int | None, limits: Thresholds | None = None
) -> list[Diagnostic]:
    """Every diagnostic that fires for one run (``budget``: its total_timesteps)."""
    limits = limits or Thresholds()
    found = (check(metrics, budget, limits) for check in CHECKS)
    return [d for d in found if d is not None]


# --------------------------------------------------------------------------- bottlenecks


@dataclass(frozen=True)
class GpuHealth:
    """Temperature and clocks of a run's GPUs; with several, the worst one of each."""

    temperature_c: float | None  # mean temperature of the hottest GPU
    temperature_peak_c: float | None  # highest sample of any GPU
    sm_clock_mhz: float | None  # mean SM clock of the GPU furthest below its maximum
    sm_clock_max_mhz: float | None  # ... and that GPU's maximum SM clock
    thermal_throttle_percent: float | None  # most samples with a thermal slowdown, any GPU
    power_throttle_percent: float | None  # most samples at the power cap, any GPU

    @property
    def clock_ratio(self) -> float | None:
        """Mean SM clock / maximum SM clock (1.0: always at full speed)."""
        if not self.sm_clock_mhz or not self.sm_clock_max_mhz:
            return None
        return self.sm_clock_mhz / self.sm_clock_max_mhz


@dataclass(frozen=True)
class Bottleneck:
    """Where one run's time went, and the verdict."""

    rollout_s: float  # total seconds collecting rollouts
    update_s: float  # total seconds in PPO updates
    rollout_share: float  # rollout / (rollout + update); NaN without timings
    cpu_percent: float | None  # mean system CPU utilization (None: too few samples)
    gpu_percent: float | None  # mean GPU utilization (None: no GPU metrics)
    memory_start_mb: float | None  # median memory, first quarter of >= 8 samples
    memory_end_mb: float | None  # ... last quarter
    verdict: str  # sampling-bound | update-bound | neither busy | balanced | unknown
    remedy: str
    memory_creeping: bool
    gpu_health: GpuHealth | None = None  # None: no temperature or clock metrics
    gpu_throttled: bool = False  # thermal slowdown in >= gpu_throttle_percent of samples
    cpu_samples: int = 0  # CPU samples the mean is over (MLflow's first one dropped)
    memory_of: str = "process tree"  # whose memory: "process tree" or "whole machine"

    @property
    def memory_rise_mb(self) -> float | None:
        if self.memory_start_mb is None or self.memory_end_mb is None:
            return None
        return self.memory_end_mb - self.memory_start_mb

    @property
    def verdicts(self) -> list[str]:
        """The verdict plus "memory creeping up" / "GPU throttling" when those were seen."""
        return [self.verdict, *(["memory creeping up"] if self.memory_creeping else []),
                *(["GPU throttling"] if self.gpu_throttled else [])]


REMEDIES = {
    "sampling-bound": "more parallel envs (env.num_envs, env.vec_env=subproc), a faster "
    "simulator or fewer physics substeps",
    "update-bound": "larger algo.batch_size (fewer, bigger minibatches), fewer algo.n_epochs "
    "or a smaller network (algo.policy.pi, algo.policy.vf), the update on a GPU (device=cuda; "
    "it pays with large minibatches)",
    "neither busy": "look at IPC and synchronisation: shared-memory size, worker count vs cores "
    "(env.num_envs), CPU affinity",
    "balanced": "neither part dominates: scale both (more envs and a larger batch)",
    "unknown": "no time/rollout_s or time/update_s logged",
    "memory creeping up": "find what is kept alive across iterations (tensors, buffers, "
    "lists, caches): a leak ends in an out-of-memory error",
    "GPU throttling": "the GPU slowed its clocks for heat: check its cooling (fans, airflow, "
    "ambient temperature) and other jobs on it; nvidia-smi -q -d PERFORMANCE names the reason",
}


def analyse_bottleneck(metrics: Mapping[str, Series], limits: Thresholds | None = None
                       ) -> Bottleneck:
    """Verdict from the rollout/update split and MLflow's system metrics (docs/reports.md)."""
    limits = limits or Thresholds()
    rollout = finite_sum(metrics.get("time/rollout_s"))
    update = finite_sum(metrics.get("time/update_s"))
    share = rollout / (rollout + update) if rollout + update > 0 else math.nan
    cpu_values = finite_values(metrics.get(CPU_KEY))[1:]
    cpu = float(np.mean(cpu_values)) if len(cpu_values) >= MIN_CPU_SAMPLES else None
    gpu_series = [s for k, s in metrics.items() if GPU_KEY.match(k)]
    gpu_means = [m for m in (finite_mean(s) for s in gpu_series) if m is not None]
    gpu = float(np.mean(gpu_means)) if gpu_means else None
    memory_of = "process tree" if PROCESS_MEMORY_KEY in metrics else "whole machine"
    memory_key = PROCESS_MEMORY_KEY if memory_of == "process tree" else MEMORY_KEY
    quarters = quarter_medians(metrics.get(memory_key))
    start, end = (quarters[0], quarters[-1]) if quarters else (None, None)
    # A leak grows steadily: every quarter at least as high as the one before, and the whole
    # rise past the limit. One-off jumps (another job starting on the machine) do not count.
    creeping = (
        start is not None and end is not None and end - start >= limits.memory_creep_mb
        and all(a <= b for a, b in zip(quarters, quarters[1:], strict=False))
    )
    verdict = bottleneck_verdict(share, cpu, gpu, limits)
    health = gpu_health(metrics)
    throttled = (health is not None and health.thermal_throttle_percent is not None
                 and health.thermal_throttle_percent >= limits.gpu_throttle_percent)
    extras = [name for name, seen in (("memory creeping up", creeping),
                                      ("GPU throttling", throttled)) if seen]
    remedy = "; ".join([REMEDIES[verdict], *(REMEDIES[name] for name in extras)])
    return Bottleneck(rollout, update, share, cpu, gpu, start, end, verdict, remedy, creeping,
                      health, throttled, cpu_samples=len(cpu_values), memory_of=memory_of)


def gpu_health(metrics: Mapping[str, Series]) -> GpuHealth | None:
    """Temperature, clocks and throttling from the per-GPU series; None when none was logged."""
    per_gpu: dict[str, dict[str, Series]] = {}
    for key, s in metrics.items():
        match = GPU_FACT_KEY.match(key)
        if match:
            per_gpu.setdefault(match.group(1) or "", {})[match.group(2)] = s
    if not per_gpu:
        return None

    def fact(gpu: Mapping[str, Series], name: str) -> float | None:
        return finite_mean(gpu.get(name))

    temperatures = [t for g in per_gpu.values() if (t := fact(g, "temperature_celsius"))
                    is not None]
    peaks = [float(np.max(h.values[np.isfinite(h.values)])) for g in per_gpu.values()
             if (h := g.get("temperature_celsius")) is not None and np.isfinite(h.values).any()]
    clocks = [(c, m) for g in per_gpu.values()
              if (c := fact(g, "sm_clock_mhz")) is not None
              and (m := fact(g, "sm_clock_max_mhz"))]
    slowest = min(clocks, key=lambda cm: cm[0] / cm[1]) if clocks else (None, None)

    def most(name: str) -> float | None:
        shares = [s for g in per_gpu.values() if (s := fact(g, name)) is not None]
        return max(shares) if shares else None

    return GpuHealth(
        temperature_c=max(temperatures) if temperatures else None,
        temperature_peak_c=max(peaks) if peaks else None,
        sm_clock_mhz=slowest[0], sm_clock_max_mhz=slowest[1],
        thermal_throttle_percent=most("thermal_throttle_percentage"),
        power_throttle_percent=most("power_throttle_percentage"),
    )


def bottleneck_verdict(
    share: float, cpu: float | None, gpu: float | None, limits: Thresholds
) -> str:
    """sampling-bound / update-bound / neither busy / balanced / unknown."""
    if math.isnan(share):
        return "unknown"
    cpu_idle = cpu is not None and cpu < limits.cpu_busy_percent
    gpu_idle = gpu is None or gpu < limits.gpu_busy_percent
    if share >= limits.bound_share:
        # Sampling dominates; with the CPU idle the simulator waits on something else.
        return "neither busy" if cpu_idle and gpu_idle else "sampling-bound"
    if 1 - share >= limits.bound_share:
        return "update-bound"
    return "neither busy" if cpu_idle and gpu_idle else "balanced"


# --------------------------------------------------------------------------- series helpers


def longest_streak(flags: np.ndarray) -> tuple[int, int]:
    """(start index, length) of the longest run of True values; (0, 0) if none."""
    best_start, best_len, start = 0, 0, None
    for i, flag in enumerate([*flags.tolist(), False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start > best_len:
                best_start, best_len = start, i - start
            start = None
    return best_start, best_len


def iteration_seconds(metrics: Mapping[str, Series], rollout_key: str = "time/rollout_s",
                      update_key: str = "time/update_s") -> np.ndarray | None:
    """rollout + update seconds per iteration, matched by step (None without timings)."""
    rollout, update = metrics.get(rollout_key), metrics.get(update_key)
    if rollout is None or update is None:
        return None
    by_step = dict(zip(update.steps.tolist(), update.values.tolist(), strict=True))
    times = [r + by_step[s] for s, r in zip(rollout.steps.tolist(), rollout.values.tolist(),
                                            strict=True) if s in by_step]
    return np.asarray(times, dtype=float)


def growth(values: np.ndarray, parts: int) -> tuple[float, float, float]:
    """Median of the first and of the last ``1/parts`` of ``values``, and their rank
    correlation with their index (how steadily they rise)."""
    m = max(1, len(values) // parts)
    return (float(np.median(values[:m])), float(np.median(values[-m:])),
            rank_correlation(values))


def rank_correlation(values: np.ndarray) -> float:
    """Spearman's rank correlation of ``values`` with their index (1: steadily rising); tied
    values share their mean rank, so a flat stretch counts as no trend."""
    n = len(values)
    if n < 3 or np.all(values == values[0]):
        return 0.0
    ranks = np.empty(n)
    ranks[np.argsort(values, kind="stable")] = np.arange(n, dtype=float)
    _, tie_group = np.unique(values, return_inverse=True)
    ranks = (np.bincount(tie_group, ranks) / np.bincount(tie_group))[tie_group]
    return float(np.corrcoef(np.arange(n, dtype=float), ranks)[0, 1])


def finite_sum(s: Series | None) -> float:
    """Sum of the finite values (0 for a missing series)."""
    if s is None:
        return 0.0
    return float(np.sum(s.values[np.isfinite(s.values)]))


def finite_values(s: Series | None) -> np.ndarray:
    """The finite values of a series, in order (empty for a missing series)."""
    if s is None:
        return np.empty(0)
    return s.values[np.isfinite(s.values)]


def finite_mean(s: Series | None) -> float | None:
    """Mean of the finite values, None if there are none."""
    if s is None:
        return None
    finite = s.values[np.isfinite(s.values)]
    return float(np.mean(finite)) if len(finite) else None


def quarter_medians(s: Series | None) -> list[float]:
    """Medians of the four quarters of a series' finite values ([] below 8 samples)."""
    if s is None:
        return []
    values = s.values[np.isfinite(s.values)]
    if len(values) < 8:
        return []
    return [float(np.median(q)) for q in np.array_split(values, 4)]
