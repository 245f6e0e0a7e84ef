"""The statistics of the compare verdict and of the race: paired tests, Holm's correction, TOST,
the smallest detectable difference, and the per-look level that keeps a sequential race at its
alpha.

Why a paired t-test (scipy.stats.ttest_rel) and not a rank test (Wilcoxon, or Friedman as irace
uses): every candidate runs the same seeds, so the seed's own effect (initial weights, data order)
cancels in the paired difference; and with the few seeds a compare can afford a rank test cannot
reject at all (Wilcoxon's smallest two-sided p is 0.25 with n = 3 and 0.0625 with n = 5). The
t-test assumes the per-seed differences are roughly normal, which seed noise of a trained encoder's
score usually is; the race's calibration (benchmarks/race_calibration.py) checks the error rates it
promises under that model.

Nothing here imports augtune: the search layer's driver can call it, and scipy is imported inside
the functions, since a trial process must not pay for loading it.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Sequence

import numpy as np

POWER = 0.8  # the power at which the verdict states the smallest detectable difference


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (monotone, capped at 1)."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [1.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def _constant(d: np.ndarray) -> bool:
    return bool(np.allclose(d, d[0], rtol=0, atol=1e-12))


def paired_p(a: Sequence[float], b: Sequence[float], alternative: str = "two-sided") -> float:
    """The paired t-test's p-value of a - b (`alternative`: "two-sided", or "greater": a above b).

    Differences that are all the same leave the t statistic undefined (0 / 0 or x / 0): then the
    evidence is taken at face value, p = 0 when they point the way the alternative asks, else 1."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(d) < 2:
        return 1.0
    if _constant(d):
        if abs(d[0]) <= 1e-12:
            return 1.0
        return 0.0 if alternative == "two-sided" or d[0] > 0 else 1.0
    return float(stats.ttest_rel(a, b, alternative=alternative).pvalue)


def paired_ps(best: Sequence[float], others: Sequence[Sequence[float]]) -> list[float]:
    """`paired_p(best, o)` (two-sided) for each row `o` of `others`, in one call of ttest_rel (a
    race tests every candidate of a round against the same best: one call instead of one per
    candidate, which the race's calibration makes by the hundred thousand)."""
    from scipy import stats

    others = np.atleast_2d(np.asarray(others, dtype=float))
    if others.size == 0:
        return []
    best = np.broadcast_to(np.asarray(best, dtype=float), others.shape)
    d = best - others
    if d.shape[1] < 2:
        return [1.0] * len(d)
    with warnings.catch_warnings():  # a row of constant differences: replaced below
        warnings.simplefilter("ignore", RuntimeWarning)
        p = np.atleast_1d(stats.ttest_rel(best, others, axis=1).pvalue)
    return [paired_p(best[i], others[i]) if _constant(d[i]) else float(p[i])
            for i in range(len(d))]


def above_p(a: Sequence[float], value: float) -> float:
    """One-sided one-sample t-test that the mean of `a` is above a constant (the raw input's score,
    which no seed changes)."""
    return paired_p(a, np.full(len(a), float(value)), alternative="greater")


def tost_p(a: Sequence[float], b: Sequence[float], margin: float) -> float:
    """Paired two one-sided tests (TOST) of equivalence: p < level shows |mean(a - b)| < margin at
    that level (the larger of the two one-sided p-values; no correction is due, both must
    reject)."""
    from scipy import stats

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(d) < 2 or not margin > 0:
        return 1.0
    if _constant(d):
        return 0.0 if abs(d[0]) < margin else 1.0
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


# -- power and the detectable difference ----------------------------------------------------------

def power(delta: float, sd: float, n: int, level: float, sides: int = 2) -> float:
    """Power of the paired t-test with `n` pairs at `level` when the true mean difference is
    `delta` and the differences' standard deviation is `sd`: the noncentral t distribution
    (scipy.stats.nct) beyond the critical values."""
    from scipy import stats

    if n < 2:
        return 0.0
    df, nc = n - 1, delta * math.sqrt(n) / sd
    if sides == 1:
        return float(stats.nct.sf(stats.t.ppf(1 - level, df), df, nc))
    c = stats.t.ppf(1 - level / 2, df)
    # the far tail against the difference: below the central t's level / 2 when delta >= 0, and
    # scipy's nct.cdf returns NaN for some of its tiny values (nc ~ 9, df = 2): those count as 0
    wrong = float(stats.nct.cdf(-c, df, nc))
    return float(stats.nct.sf(c, df, nc)) + (wrong if math.isfinite(wrong) else 0.0)


def detectable_difference(sd: float, n: int, level: float, target: float = POWER,
                          sides: int = 2) -> float:
    """The smallest true difference a paired t-test with `n` pairs at `level` detects with power
    `target`, given the differences' standard deviation `sd` (in the metric's units; inf
    when n < 2).

    The root of power(delta) = target; power grows with delta, so the root is found by bracketing
    (scipy.optimize.brentq) between 0 and a delta where the test surely rejects."""
    from scipy import optimize

    if n < 2 or not math.isfinite(sd):
        return math.inf
    if sd <= 0:
        return 0.0
    hi = sd
    while power(hi, sd, n, level, sides) < target:
        hi *= 2
    return float(optimize.brentq(lambda d: power(d, sd, n, level, sides) - target, 0.0, hi,
                                 xtol=1e-10 * sd, rtol=1e-10))


def pooled_sd(diffs: Sequence[Sequence[float]]) -> float:
    """One standard deviation of the paired differences of several pairs (each its own mean): the
    square root of their degrees-of-freedom-weighted variances, as a pooled t-test's."""
    num = den = 0.0
    for d in diffs:
        d = np.asarray(d, dtype=float)
        if len(d) >= 2:
            num += float(np.var(d, ddof=1)) * (len(d) - 1)
            den += len(d) - 1
    return math.sqrt(num / den) if den else math.nan


# -- the sequential level -------------------------------------------------------------------------

_DRAWS = 1 << 18  # simulated null races: the level's Monte Carlo error is about 1 % of it
_SEED = 20250101  # fixed: the level is a constant of (alpha, looks), the same in every process


@functools.lru_cache(maxsize=64)
def sequential_level(alpha: float, min_seeds: int, max_seeds: int, sides: int = 2) -> float:
    """The per-look level of a race that tests after min_seeds, min_seeds + 1, ..., max_seeds
    seeds, such that two equal candidates are told apart at some look with probability `alpha`
    (Pocock's constant boundary, for the t-test instead of the z-test).

    Testing at `alpha` at every look would name a false winner far more often than `alpha` (the
    chance to cross by noise adds up over the looks); Bonferroni over the looks (alpha / looks)
    keeps it but spends much of the power, since the looks share most of their seeds. Here the
    level is the one at which `alpha` of simulated null races reject at some look (found by
    bisection): the paired differences are standard normal under the null, and the t statistic
    does not depend on their scale, so the level is exact up to its Monte Carlo error (seeded: the
    same in every process; 0.0121 for 3 to 10 seeds at alpha 0.05). With two candidates this is
    the false-winner rate; with more, naming a winner takes more rejections, each Holm-corrected
    within its round, so the rate is lower. `sides` = 1 gives the level of a one-sided test at
    every look (TOST's two halves)."""
    from scipy import stats

    if max_seeds <= min_seeds:
        return alpha
    rng = np.random.default_rng(_SEED)
    d = rng.standard_normal((_DRAWS, max_seeds))
    n = np.arange(1, max_seeds + 1)
    mean = np.cumsum(d, axis=1) / n
    var = (np.cumsum(d * d, axis=1) - n * mean ** 2) / np.maximum(n - 1, 1)
    looks = np.arange(min_seeds, max_seeds + 1)
    t = mean[:, looks - 1] / np.sqrt(var[:, looks - 1] / looks)
    t = np.abs(t) if sides == 2 else t

    def rate(level: float) -> float:  # null races that reject at some look, at this level
        return float((t > stats.t.isf(level / sides, looks - 1)).any(axis=1).mean())

    # Bonferroni's level holds alpha, alpha at each look does not: the level is between
    lo, hi = alpha / len(looks), alpha
    for _ in range(40):  # bisection on the level: the rate grows with it
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) <= alpha else (lo, mid)
    return lo
