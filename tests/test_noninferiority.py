"""Non-inferiority verdicts (workbench.review.noninferiority): Yuen's trimmed t against scipy's,
Fieller's interval against the test it inverts, the margins as written, the spending plan, and
the error rates of the staged procedure measured by simulation at the margin."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from workbench.config import ConfigError
from workbench.config.margin import Margin, parse_margin, parse_percent
from workbench.review import noninferiority as ni

pytestmark = pytest.mark.unit

SIZES = [(2, 2), (3, 3), (3, 5), (4, 4), (6, 7), (9, 12), (12, 12)]


@pytest.mark.parametrize(("n", "m"), SIZES)
def test_yuen_matches_scipys_trimmed_t(n: int, m: int) -> None:
    rng = np.random.default_rng(n * 100 + m)
    a, b = rng.normal(100, 10, n), rng.normal(97, 15, m)
    ta, tb = ni.trimmed(a), ni.trimmed(b)
    assert ta.mean == pytest.approx(stats.trim_mean(a, 0.25))
    plain = ni.contrast(ta, tb)
    oracle = stats.ttest_ind(b, a, trim=0.25, equal_var=False)
    assert plain.estimate / plain.se == pytest.approx(oracle.statistic)
    assert plain.df == pytest.approx(oracle.df)
    # The margins: B + 5 against A, and B against 0.95 x A (the ratio test), one-sided.
    shifted = ni.contrast(ta, tb, shift=5.0)
    assert shifted.p_not_worse() == pytest.approx(stats.ttest_ind(
        b + 5, a, trim=0.25, equal_var=False, alternative="greater").pvalue)
    assert shifted.p_worse() == pytest.approx(stats.ttest_ind(
        b + 5, a, trim=0.25, equal_var=False, alternative="less").pvalue)
    ratio = ni.contrast(ta, tb, ratio=0.95)
    assert ratio.p_not_worse() == pytest.approx(stats.ttest_ind(
        b, 0.95 * a, trim=0.25, equal_var=False, alternative="greater").pvalue)
    assert ratio.quantile(0.025) == pytest.approx(stats.t.ppf(0.975, ratio.df))


@pytest.mark.parametrize(("n", "m"), SIZES[1:])
@pytest.mark.parametrize("relative", [False, True])
def test_the_interval_excludes_the_margin_exactly_when_the_test_decides(
        n: int, m: int, relative: bool) -> None:
    """The words and the interval never disagree: not worse iff the lower bound is above
    -margin, worse iff the upper bound is below it (Fieller's interval for a margin in %)."""
    rng = np.random.default_rng(7 * n + m)
    margin = Margin(0.05, True) if relative else Margin(5.0, False)
    decided = 0
    for shift in np.linspace(-60, 40, 21):
        a, b = rng.normal(100, 8, n), rng.normal(100 + shift, 8, m)
        j = ni.judge_return(a, b, margin)
        bound = -margin.value
        assert (j.verdict == ni.NOT_WORSE) == (j.low > bound), (shift, j)
        assert (j.verdict == ni.WORSE) == (j.high < bound), (shift, j)
        assert j.low <= j.estimate <= j.high
        decided += j.decided
    assert decided >= 5  # the sweep of shifts reaches both sides of the margin


def test_fieller_bounds_are_the_ratios_the_test_would_not_reject() -> None:
    a, b = ni.trimmed([100, 104, 97, 101, 99]), ni.trimmed([96, 99, 94, 98])
    test = ni.contrast(a, b, ratio=0.95)
    q = test.quantile(0.025)
    low, high = ni.fieller(a, b, q, 0.95)
    for rho, sign in ((low, 1), (high, -1)):  # |T(rho)| = q at each bound
        t = (b.mean - rho * a.mean) / math.sqrt(b.d + rho * rho * a.d)
        assert t == pytest.approx(sign * q)
    assert ni.fieller(ni.trimmed([1.0, 50.0]), b, q, 0.95) is None  # A's IQM near 0


def scipy_interval(a: list[float], b: list[float], level: float = 0.025) -> tuple[float, float]:
    """The (1 - 2 level) interval of B's IQM - A's from scipy's Yuen test alone."""
    found = stats.ttest_ind(b, a, trim=0.25, equal_var=False)
    diff = stats.trim_mean(b, 0.25) - stats.trim_mean(a, 0.25)
    spread = stats.t.ppf(1 - level, found.df) * diff / found.statistic
    return diff - spread, diff + spread


@pytest.mark.parametrize(("a", "b", "words"), [
    ([100, 101, 99], [99, 100, 98], "B is not worse than A by more than 5"),
    ([100, 101, 99], [80, 82, 78], "B is worse than A by more than 5"),
    ([100, 110, 90], [99, 109, 89], "undecided: about {more} more seeds a side would settle it"),
    ([100, 101, 99], [110, 111, 109], "B is not worse than A by more than 5"),
])
def test_return_verdicts_in_words(a: list[float], b: list[float], words: str) -> None:
    low, high = scipy_interval(a, b)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)  # Julious's n, less the seeds there are
    distance = stats.trim_mean(b, 0.25) + 5 - stats.trim_mean(a, 0.25)
    words = words.format(more=math.ceil(z * z * (np.var(a, ddof=1) + np.var(b, ddof=1))
                                        / distance ** 2) - 3)
    holds = " holds -5" if words.startswith("undecided") else ""
    better = "; B is better" if low > 0 else ""
    assert ni.judge_return(a, b, Margin(5, False)).line() == (
        f"{words} (95 % interval of B - A: {low:+.1f} to {high:+.1f}{holds}; {len(a)} vs "
        f"{len(b)} seeds){better}")


def test_a_margin_in_percent_reads_as_a_share_of_a() -> None:
    judged = ni.judge_return([100, 101, 99], [50, 52, 48], Margin(0.05, True))
    assert judged.line() == (f"B is worse than A by more than 5 % (95 % interval of B - A: "
                             f"{judged.low * 100:+.1f} % to {judged.high * 100:+.1f} % of A's "
                             "IQM; 3 vs 3 seeds)")
    assert judged.estimate == pytest.approx(50 / 100 - 1)
    assert ni.judge_return([100], [99, 100], Margin(5, False)).line() == (
        "undecided (1 vs 2 seeds): an interval needs 2 seeds a side or more; run more seeds")
    assert ni.judge_return([-5, -3], [2, 3], Margin(0.05, True)).line() == (
        "undecided (2 vs 2 seeds): a margin in % needs A's IQM above 0 (it is -4.0); give the "
        "margin as a return, e.g. 50")


def test_seeds_needed_follow_julious_formula() -> None:
    a, b = [100, 110, 90], [99, 109, 89]
    judged = ni.judge_return(a, b, Margin(0.05, True))
    ta, tb = ni.trimmed(a), ni.trimmed(b)
    distance = tb.mean - 0.95 * ta.mean
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    n = math.ceil(z * z * (np.var(b, ddof=1) + 0.95 ** 2 * np.var(a, ddof=1)) / distance ** 2)
    assert judged.more_seeds == n - 3


def test_time_to_a_target_is_a_ratio_of_b_to_a() -> None:
    a, b = [10.0, 12.0, 11.0, 10.5, 11.5, 10.8], [9.0, 9.3, 9.1, 8.8, 9.4, 9.2]
    j = ni.judge_time(a, b, 0.05, 3000, (6, 6))
    logs = ni.contrast(ni.trimmed(-np.log(a)), ni.trimmed(-np.log(b)), shift=math.log(1.05))
    assert j.estimate == pytest.approx(math.exp(stats.trim_mean(np.log(b), 0.25)
                                                - stats.trim_mean(np.log(a), 0.25)))
    assert j.verdict == ni.verdict_of(logs, ni.ALPHA) == ni.NOT_WORSE
    assert j.high < 1.05 and j.better
    assert j.line().startswith(f"B reaches 3000 in {j.estimate:.2f}× A's time [{j.low:.2f}, "
                               f"{j.high:.2f}]: not slower than A by more than 5 % (95 %, 6 vs "
                               "6 seeds); B is faster")
    missed = ni.judge_time(a, b[:3], 0.05, 3000, (6, 6))
    assert missed.line() == (
        "time to 3000 undecided (6 vs 6 seeds): A reached it in 6 of 6 seeds, B in 3 of 6; a "
        "seed that never reached it has no time (a lower target, or a longer budget)")


@pytest.mark.parametrize(("text", "margin"), [
    ("5%", Margin(0.05, True)), ("0.1 %", Margin(0.001, True)), ("50", Margin(50.0, False)),
    (2.5, Margin(2.5, False))])
def test_a_margin_is_a_share_or_a_return(text: str | float, margin: Margin) -> None:
    assert parse_margin(text, "--margin") == margin


@pytest.mark.parametrize(("setting", "text", "line"), [
    ("compare --margin", "0%", "compare --margin 0%: a margin must be above 0 % and below "
     "100 %; give e.g. 5% (of A's IQM) or a return such as 50"),
    ("sweep.verify.margin", "100%", "sweep.verify.margin=100%: a margin must be above 0 % and "
     "below 100 %; give e.g. 5% (of A's IQM) or a return such as 50"),
    ("--margin", "-3", "--margin -3: a margin must be above 0; give e.g. 5% (of A's IQM) or a "
     "return such as 50"),
    ("--margin", "five", "--margin five: not a margin; give a share of A's IQM such as 5% or a "
     "return such as 50"),
])
def test_a_margin_out_of_range_is_one_line(setting: str, text: str, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_margin(text, setting)
    assert str(info.value) == line
    with pytest.raises(ConfigError, match="as a percentage of A's time"):
        parse_percent("30", "compare --time-margin")


def test_the_spending_plan_spends_alpha_over_the_looks() -> None:
    looks = ni.stage_seeds(3, 3, 12)
    assert looks == [3, 6, 9, 12] and ni.stage_seeds(2, 3, 6) == [2, 5, 6]
    levels = ni.stage_levels(looks)
    assert sum(levels) == pytest.approx(ni.ALPHA)
    assert levels[0] == pytest.approx(0.025 * math.log(1 + (math.e - 1) * 0.25))
    assert levels == sorted(levels, reverse=True)  # Pocock-type: most of it early
    assert ni.stage_levels([5]) == [pytest.approx(ni.ALPHA)]  # one look: the 95 % interval


def scores(rng: np.random.Generator, mean: float, n: int, failing: float) -> np.ndarray:
    """``n`` seeds' returns ~ N(mean, 15); with ``failing`` > 0 that share of the seeds fails
    and returns a fifth of the mean instead (two clusters, as RL seeds often are)."""
    values = rng.normal(mean, 15, n)
    return np.where(rng.random(n) < failing, mean / 5, values)


def staged(rng: np.random.Generator, mu_b: float, margin: Margin, reps: int,
           looks: tuple[int, ...] = (3, 6, 9, 12), failing: float = 0.0) -> dict[str, float]:
    """Share of each final verdict of the staged procedure over ``reps`` simulated
    verifications (A's seeds around 100, B's around ``mu_b``), stopping at the first decided
    look."""
    levels = ni.stage_levels(list(looks))
    counts = {ni.NOT_WORSE: 0, ni.WORSE: 0, ni.UNDECIDED: 0, "first look": 0}
    for _ in range(reps):
        a, b = (scores(rng, mean, looks[-1], failing) for mean in (100.0, mu_b))
        for k, (n, level) in enumerate(zip(looks, levels, strict=True)):
            judged = ni.judge_return(a[:n], b[:n], margin, level)
            if judged.decided:
                counts["first look"] += k == 0
                break
        counts[judged.verdict] += 1
    return {key: value / reps for key, value in counts.items()}


@pytest.mark.parametrize(("margin", "failing"), [
    (Margin(5.0, False), 0.0), (Margin(0.05, True), 0.0), (Margin(0.05, True), 0.2)],
    ids=["abs", "rel", "rel-failing-seeds"])
def test_staged_errors_stay_within_alpha_at_the_margin(margin: Margin, failing: float) -> None:
    """B exactly at the margin (95 = 100 - 5 = 0.95 x 100): neither verdict is true there, so
    each is an error; over 4 looks each must stay at or below 2.5 % (3 standard errors of
    this simulation's estimate allowed), with normal seeds and with a fifth of them failing."""
    reps = 3000
    rates = staged(np.random.default_rng(11), 95.0, margin, reps, failing=failing)
    allowed = ni.ALPHA + 3 * math.sqrt(ni.ALPHA * (1 - ni.ALPHA) / reps)
    assert rates[ni.NOT_WORSE] <= allowed and rates[ni.WORSE] <= allowed, rates
    assert rates[ni.NOT_WORSE] > 0 and rates[ni.WORSE] > 0  # the looks do decide sometimes


def test_a_clear_case_stops_early() -> None:
    rates = staged(np.random.default_rng(3), 10.0, Margin(0.05, True), 300)
    assert rates[ni.WORSE] == 1.0 and rates["first look"] >= 0.9, rates


def test_a_percentile_bootstrap_covers_less_than_it_says_with_three_seeds() -> None:
    """Why the verdicts use Yuen's t and not the report's bootstrap interval of the IQM: with
    3 seeds the bootstrap's 95 % interval holds the true mean far less often than 95 %, while
    Yuen's (Welch's, at 3 seeds) does."""
    from workbench.review.statistics import iqm_interval

    rng = np.random.default_rng(5)
    trials, covered, yuen = 400, 0, 0
    for _ in range(trials):
        x = rng.normal(100, 15, 3)
        found = iqm_interval([x], reps=400, seed=int(rng.integers(1 << 30)))
        covered += found.low <= 100 <= found.high
        t = ni.trimmed(x)
        half = stats.t.ppf(0.975, t.h - 1) * math.sqrt(t.d)
        yuen += t.mean - half <= 100 <= t.mean + half
    assert covered / trials < 0.85 < 0.92 < yuen / trials, (covered / trials, yuen / trials)
