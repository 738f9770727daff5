"""Is B not worse than A by more than a margin, and no slower to reach a target? Decided over
seeds, at one look or in stages.

The question of an upgrade or a refactor is not "is B better?" but "did B get worse?": a
*non-inferiority* test against a margin the team accepts (5 % of A's return, or 50 return
points). Each side is one score per seed (its final return; for time, its training seconds
to a target return), summarised by its IQM, the 25 % trimmed mean the rest of the report
uses.

- **Test**: Yuen's two-sample trimmed t (Yuen 1974, "The two-sample trimmed t for unequal
  population variances", Biometrika 61), the test of trimmed means that
  ``scipy.stats.ttest_ind(b, a, trim=0.25, equal_var=False)`` computes, applied to the
  margin: B + δ against A for a margin δ in return points; B against (1 − m)·A for a margin m
  of A's IQM (the ratio test: B's IQM ≥ (1 − m) × A's). "Not worse" rejects "B is worse by the
  margin or more" at one-sided level α; "worse" rejects "B is within the margin" at α.
- **Interval**: the values of the margin the test would not reject, i.e. the (1 − 2α)
  interval of B − A (in return points, or in % of A's IQM by Fieller's theorem for a ratio,
  with the test's degrees of freedom at the margin), so the words and the interval never
  disagree: not worse when it lies above −margin, worse when it lies below, else undecided.
- **Time to a target**: the same on the logarithm of the seconds, so the interval is a ratio
  of B's time to A's (``0.92× [0.85, 1.01]``) and the margin a share (5 %: B's time at most
  1.05× A's); only when every seed of both sides reached the target (a seed that never did
  has no time).
- **Stages** (a verification sweep): looks after n_1 < n_2 < ... ≤ n_K seeds a side, each
  at the level α_k that the Lan-DeMets alpha-spending function of Pocock type,
  α(t) = α ln(1 + (e − 1) t) (Lan and DeMets 1983, Biometrika 70), spends between t_{k-1}
  and t_k = n_k / n_K. By Bonferroni's inequality the chance of any wrong "not worse" over all
  looks is at most Σ α_k = α, and the same for "worse"; ``tests/test_noninferiority.py``
  checks both by simulation at the margin.
- **Seeds needed** when undecided: the normal-approximation sample size of a non-inferiority
  test (Julious 2004, "Sample sizes for clinical trials with Normal data", Statistics in
  Medicine 23) at level α and 80 % power, with the spread and the difference seen so far: an
  estimate, which is why it says "about".

Plain numpy and scipy on scores already loaded: no MLflow, no matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from workbench.config.margin import Margin

ALPHA = 0.025  # one-sided, each way: the 95 % two-sided interval of a single look
TRIM = 0.25  # the IQM: a quarter of the seeds cut at each end (scipy's trim_mean)
POWER = 0.8  # of the seeds-needed estimate
MIN_SEEDS = 2  # a side, for Yuen's variance: one seed has no spread
MOST_SEEDS_SHOWN = 1000  # an estimate beyond this says "more than" instead
NOT_WORSE, WORSE, UNDECIDED = "not worse", "worse", "undecided"


# --------------------------------------------------------------------------- Yuen's trimmed t


@dataclass(frozen=True)
class Trimmed:
    """One side's scores as Yuen's test sees them."""

    mean: float  # the 25 % trimmed mean: the IQM
    d: float  # the squared standard error of the trimmed mean (Yuen's d)
    h: int  # scores left after trimming
    n: int  # scores


def trimmed(scores: Sequence[float] | np.ndarray) -> Trimmed:
    """The trimmed mean and Yuen's d = (n − 1) s_w² / (h (h − 1)), s_w² the variance of the
    winsorized scores (as ``scipy.stats.ttest_ind(..., trim=0.25)`` computes them)."""
    x = np.sort(np.asarray(scores, dtype=float))
    n = len(x)
    if n < MIN_SEEDS:
        raise ValueError(f"Yuen's test needs {MIN_SEEDS} scores or more, got {n}")
    g = int(TRIM * n)
    h = n - 2 * g
    winsorized = np.clip(x, x[g], x[n - g - 1])
    d = (n - 1) * float(np.var(winsorized, ddof=1)) / (h * (h - 1))
    return Trimmed(float(np.mean(x[g:n - g])), d, h, n)  # scipy's trim_mean, sorted already


@dataclass(frozen=True)
class Contrast:
    """B + shift − ratio × A, Yuen-Welch style: its estimate, standard error and degrees of
    freedom (NaN where neither side's scores vary)."""

    estimate: float
    se: float
    df: float

    def p_not_worse(self) -> float:
        """One-sided p of "the contrast is 0 or below" (B worse by the margin or more)."""
        return self.p(greater=True)

    def p_worse(self) -> float:
        """One-sided p of "the contrast is 0 or above" (B within the margin)."""
        return self.p(greater=False)

    def p(self, greater: bool) -> float:
        if self.se == 0:  # no spread: the estimate is the truth of these scores
            above = self.estimate > 0 if greater else self.estimate < 0
            return 0.0 if above else 1.0
        t = self.estimate / self.se
        return float(special.stdtr(self.df, -t if greater else t))  # Student's t tail

    def quantile(self, level: float) -> float:
        """The t quantile a one-sided test at ``level`` compares with (0 without spread)."""
        return 0.0 if self.se == 0 else float(special.stdtrit(self.df, 1 - level))


def contrast(a: Trimmed, b: Trimmed, ratio: float = 1.0, shift: float = 0.0) -> Contrast:
    """Yuen's statistic for B + ``shift`` − ``ratio`` × A: ``scipy.stats.ttest_ind(b + shift,
    ratio * a, trim=0.25, equal_var=False)`` for ``ratio`` > 0 (scaling A scales its trimmed
    mean and its d by ratio and ratio²)."""
    da, db = ratio * ratio * a.d, b.d
    se2 = da + db
    df = se2 * se2 / (da * da / (a.h - 1) + db * db / (b.h - 1)) if se2 > 0 else math.nan
    return Contrast(b.mean + shift - ratio * a.mean, math.sqrt(se2), df)


# --------------------------------------------------------------------------- the judgement


@dataclass(frozen=True)
class Judgement:
    """One verdict with the figures behind it.

    ``low``/``high`` bound B − A: in return points, or as a share of A's IQM for a margin in
    %; for ``measure == "time"`` they bound B's time / A's time instead (a ratio).
    """

    measure: str  # "return" or "time"
    verdict: str  # NOT_WORSE, WORSE, UNDECIDED
    margin: Margin
    level: float  # the one-sided level of this look (0.025: the 95 % interval)
    seeds: tuple[int, int]  # scores of A and B
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    more_seeds: int | None = None  # undecided: about this many more seeds a side would do
    reason: str = ""  # undecided without an interval or an estimate: why
    target: float | None = None  # time: the return to reach

    @property
    def decided(self) -> bool:
        return self.verdict in (NOT_WORSE, WORSE)

    @property
    def confidence(self) -> str:
        """``95 %``, ``98.2 %``: the two-sided level of the interval shown."""
        return f"{float(f'{(1 - 2 * self.level) * 100:.3g}'):g} %"

    @property
    def better(self) -> bool:
        """Not worse, and the whole interval on B's side of no difference."""
        if self.verdict != NOT_WORSE:
            return False
        return self.high < 1 if self.measure == "time" else self.low > 0

    def line(self) -> str:
        """The verdict in words, with its interval (see docs/reports.md#verifying-a-change)."""
        return time_line(self) if self.measure == "time" else return_line(self)


def margin_text(margin: Margin, measure: str) -> str:
    """``5 %``, ``50``; a time margin is always a share."""
    return f"{margin.value * 100:g} %" if measure == "time" or margin.relative else \
        f"{margin.value:g}"


def shown(value: float, margin: Margin) -> str:
    """A bound of B − A: ``-3.4 %`` (of A's IQM) or ``-20.3`` (return points)."""
    return f"{value * 100:+.1f} %" if margin.relative else f"{value:+,.1f}"


def counted(judgement: Judgement) -> str:
    return f"{judgement.seeds[0]} vs {judgement.seeds[1]} seeds"


def more_text(judgement: Judgement) -> str:
    """``about 9 more seeds a side would settle it`` (or why no estimate exists)."""
    if judgement.more_seeds is None:
        return judgement.reason
    if judgement.more_seeds > MOST_SEEDS_SHOWN:
        return (f"more than {MOST_SEEDS_SHOWN:,} more seeds a side would be needed: the "
                "difference sits at the margin")
    n = judgement.more_seeds
    return f"about {n} more seed{'' if n == 1 else 's'} a side would settle it"


def return_line(j: Judgement) -> str:
    """``B is not worse than A by more than 5 % (95 % interval of B - A: -3.4 % to +1.0 % of
    A's IQM; 3 vs 3 seeds)``, ``B is worse ...``, ``undecided: about N more seeds ...``."""
    margin = margin_text(j.margin, j.measure)
    if math.isnan(j.low):
        return f"undecided ({counted(j)}): {j.reason}"
    unit = " of A's IQM" if j.margin.relative else ""
    interval = (f"{j.confidence} interval of B - A: {shown(j.low, j.margin)} to "
                f"{shown(j.high, j.margin)}{unit}")
    return by_verdict(
        j, f"B is not worse than A by more than {margin} ({interval}; {counted(j)})"
        + ("; B is better" if j.better else ""),
        f"B is worse than A by more than {margin} ({interval}; {counted(j)})",
        f"undecided: {more_text(j)} ({interval} holds -{margin}; {counted(j)})")


def by_verdict(j: Judgement, not_worse: str, worse: str, undecided: str) -> str:
    """The words of ``j``'s verdict."""
    return {NOT_WORSE: not_worse, WORSE: worse}.get(j.verdict, undecided)


def time_line(j: Judgement) -> str:
    """``B reaches 3000 in 0.92× A's time [0.85, 1.01]: not slower than A by more than
    5 % (95 %, 3 vs 3 seeds)``."""
    margin = margin_text(j.margin, j.measure)
    reach = f"B reaches {j.target:g}"
    if math.isnan(j.low):
        return f"time to {j.target:g} undecided ({counted(j)}): {j.reason}"
    ratio = f"{reach} in {j.estimate:.2f}× A's time [{j.low:.2f}, {j.high:.2f}]"
    where = f"({j.confidence}, {counted(j)})"
    return by_verdict(
        j, f"{ratio}: not slower than A by more than {margin} {where}"
        + ("; B is faster" if j.better else ""),
        f"{ratio}: B is slower than A by more than {margin} {where}",
        f"{ratio}: undecided, {more_text(j)} {where}")


def verdict_of(test: Contrast, level: float) -> str:
    """Not worse, worse or undecided at one-sided ``level`` each way."""
    if test.p_not_worse() < level:
        return NOT_WORSE
    if test.p_worse() < level:
        return WORSE
    return UNDECIDED


def seeds_needed(a: Trimmed, b: Trimmed, test: Contrast, ratio: float = 1.0,
                 alpha: float = ALPHA, power: float = POWER) -> int | None:
    """About how many seeds a side would decide the test, were the difference and the
    spread what they are now: Julious's n = (z_{1-α} + z_{power})² (v_B + ratio² v_A) / Δ²,
    v the variance of one seed's score behind each trimmed mean (d × n), Δ the contrast's
    distance from its boundary. None when the scores do not vary."""
    spread = b.d * b.n + ratio * ratio * a.d * a.n
    if spread == 0:
        return None
    if test.estimate == 0:
        return MOST_SEEDS_SHOWN + 1
    z = special.ndtri(1 - alpha) + special.ndtri(power)
    return math.ceil(z * z * spread / (test.estimate * test.estimate))


def judge_return(a_scores: Sequence[float], b_scores: Sequence[float], margin: Margin,
                 level: float = ALPHA) -> Judgement:
    """Is B not worse than A by more than ``margin``? One look at one-sided ``level``."""
    seeds = (len(a_scores), len(b_scores))
    base = Judgement("return", UNDECIDED, margin, level, seeds)
    if min(seeds) < MIN_SEEDS:
        return replace_reason(base, f"an interval needs {MIN_SEEDS} seeds a side or more; run "
                                    "more seeds")
    a, b = trimmed(a_scores), trimmed(b_scores)
    if not margin.relative:
        test = contrast(a, b, shift=margin.value)
        q = test.quantile(level)
        diff = b.mean - a.mean
        return judged(base, test, a, b, 1.0, diff, diff - q * test.se, diff + q * test.se)
    if a.mean <= 0:
        return replace_reason(base, f"a margin in % needs A's IQM above 0 (it is "
                                    f"{a.mean:,.1f}); give the margin as a return, e.g. 50")
    ratio = 1 - margin.value
    test = contrast(a, b, ratio=ratio)
    bounds = fieller(a, b, test.quantile(level), ratio)
    if bounds is None:
        return replace_reason(base, "A's IQM is too uncertain for a margin in % (its interval "
                                    "holds 0); run more seeds or give the margin as a return")
    low, high = bounds
    return judged(base, test, a, b, ratio, b.mean / a.mean - 1, low - 1, high - 1)


def fieller(a: Trimmed, b: Trimmed, q: float, ratio: float) -> tuple[float, float] | None:
    """Fieller's interval of B's IQM / A's: the ρ where |B − ρ A| / se(ρ) ≤ q, with ``q`` at
    the degrees of freedom of ρ = ``ratio`` (the margin), so that the interval excludes the
    margin exactly when the test at the margin decides. None: unbounded (A's IQM within
    ``q`` standard errors of 0)."""
    if a.d == 0 and b.d == 0:
        return b.mean / a.mean, b.mean / a.mean
    lead = a.mean * a.mean - q * q * a.d
    if lead <= 0:
        return None
    root = q * math.sqrt(a.mean * a.mean * b.d + b.mean * b.mean * a.d - q * q * a.d * b.d)
    return (a.mean * b.mean - root) / lead, (a.mean * b.mean + root) / lead


def judged(base: Judgement, test: Contrast, a: Trimmed, b: Trimmed, ratio: float,
           estimate: float, low: float, high: float) -> Judgement:
    """``base`` with the test's verdict, the interval and, when undecided, the seeds."""
    verdict = verdict_of(test, base.level)
    more = None
    reason = ""
    if verdict == UNDECIDED:
        needed = seeds_needed(a, b, test, ratio)
        if needed is None:
            reason = "the scores do not vary and sit at the margin"
        else:
            more = max(needed - max(a.n, b.n), 1)
    return Judgement(base.measure, verdict, base.margin, base.level, base.seeds, estimate, low,
                     high, more, reason, base.target)


def replace_reason(base: Judgement, reason: str) -> Judgement:
    return Judgement(base.measure, UNDECIDED, base.margin, base.level, base.seeds,
                     reason=reason, target=base.target)


def judge_time(a_seconds: Sequence[float], b_seconds: Sequence[float], margin: float,
               target: float, seeds: tuple[int, int], level: float = ALPHA) -> Judgement:
    """Does B reach ``target`` no slower than (1 + ``margin``) × A's time? ``a_seconds`` and
    ``b_seconds``: the training seconds of the seeds that reached it, of ``seeds`` scored."""
    share = Margin(margin, relative=True)
    base = Judgement("time", UNDECIDED, share, level, seeds, target=target)
    reached = (len(a_seconds), len(b_seconds))
    if reached != seeds:
        return replace_reason(base, f"A reached it in {reached[0]} of {seeds[0]} seeds, B in "
                                    f"{reached[1]} of {seeds[1]}; a seed that never reached it "
                                    "has no time (a lower target, or a longer budget)")
    if min(seeds) < MIN_SEEDS or min(min(a_seconds), min(b_seconds)) <= 0:
        return replace_reason(base, f"an interval needs {MIN_SEEDS} seeds a side or more, "
                                    "each with a time above 0; run more seeds")
    # On -log(seconds) "higher is better", and the margin is log(1 + m): B's time at most
    # (1 + m) times A's. The interval of -log(B / A) maps back to a ratio, bounds swapped.
    a, b = trimmed(-np.log(a_seconds)), trimmed(-np.log(b_seconds))
    test = contrast(a, b, shift=math.log1p(margin))
    q = test.quantile(level)
    diff = b.mean - a.mean
    out = judged(base, test, a, b, 1.0, diff, diff - q * test.se, diff + q * test.se)
    return Judgement(out.measure, out.verdict, share, level, seeds, math.exp(-diff),
                     math.exp(-out.high), math.exp(-out.low), out.more_seeds, out.reason,
                     target)


# --------------------------------------------------------------------------- stages


def spent(fraction: float, alpha: float = ALPHA) -> float:
    """Lan-DeMets's Pocock-type spending function: the error spent by information
    ``fraction`` (0..1), α ln(1 + (e − 1) t)."""
    return alpha * math.log1p((math.e - 1) * min(max(fraction, 0.0), 1.0))


def stage_seeds(first: int, add: int, cap: int) -> list[int]:
    """Seeds a side at each look: ``first``, then ``add`` more each time, the last ``cap``."""
    looks = [first]
    while looks[-1] < cap:
        looks.append(min(looks[-1] + add, cap))
    return looks


def stage_levels(looks: Sequence[int], alpha: float = ALPHA) -> list[float]:
    """The one-sided level of each look: what the spending function spends between the
    previous look's information (seeds / the last look's seeds) and this one's."""
    fractions = [n / looks[-1] for n in looks]
    return [spent(t, alpha) - spent(previous, alpha)
            for previous, t in zip([0.0, *fractions[:-1]], fractions, strict=True)]
