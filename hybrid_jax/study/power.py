"""The smallest effect each of the study's tests detects, at 80 % power and alpha 0.05, for the design at hand.

Why: "not separable" alone does not tell an absent effect from a design too small to see it. Each verdict that
cannot separate says what it could have seen: the smallest true effect its test finds at p < ALPHA with
probability POWER, given the number of seeds (or pairs, or runs) and the spread it observed. An effect below that
may well be there.

One function per test the verdicts use, each in closed form (or the closed form of the parametric test scaled by
the rank test's asymptotic relative efficiency), so nothing is simulated:
- paired t over seed pairs (`paired_t`): the noncentral t. With n pairs whose differences spread by sd (ddof 1),
  the statistic is noncentral t with n - 1 degrees of freedom and noncentrality delta / (sd / sqrt(n)); the
  detectable delta is the one whose rejection probability is POWER.
- Wilcoxon signed-rank over the same pairs (`wilcoxon`): its exact null distribution has a smallest p-value,
  2 / 2^n two-sided (every difference of one sign), so at 5 pairs it never goes below 1/16 and detects nothing at
  alpha 0.05; beyond that, the paired t's detectable effect at n x 3/pi pairs (the test's asymptotic relative
  efficiency to the t test under normal differences).
- Welch's t interval of a difference of means (`welch`): the noncentral t at the Welch-Satterthwaite degrees of
  freedom, for a difference; `equivalence_margin` for the statement "within a margin": the smallest margin the
  interval's upper end falls below with probability POWER when the true difference is 0 (the two one-sided tests).
- Spearman's rank trend (`spearman`; the verdicts' p comes from permutations, whose null it shares): the Fisher z
  of rho with the variance 1.06 / (n - 3) of Fieller, Hartley and Pearson (1957).
- Kruskal-Wallis across arches (`kruskal`): the one-way ANOVA's noncentral F at N x 3/pi runs (the rank test's
  efficiency), as the standard deviation of the arch means that it detects (Cohen's f times the pooled spread).
"""

import math

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.8
EFFICIENCY = 3 / math.pi  # Asymptotic relative efficiency of the rank tests to their t / F tests, normal data.


def _t_power(nc: float, df: float, alpha: float, alternative: str) -> float:
  """Rejection probability of a t test with `df` degrees of freedom whose statistic has noncentrality nc >= 0."""
  c = stats.t.ppf(1 - alpha / (2 if alternative == 'two-sided' else 1), df)
  upper = float(stats.nct.sf(c, df, nc))
  upper = (1.0 if nc > c else 0.0) if math.isnan(upper) else upper  # scipy gives NaN far in a tail.
  if alternative != 'two-sided':
    return upper
  lower = float(stats.nct.cdf(-c, df, nc))
  return upper + (0.0 if math.isnan(lower) else lower)


def _root(f, high: float = 8.0) -> float:
  """The x >= 0 where the increasing f(x) crosses 0 (the bracket widened until it holds the root)."""
  while f(high) < 0:
    high *= 2
  return float(optimize.brentq(f, 0.0, high, xtol=1e-10))


def noncentrality(df: float, alpha: float = ALPHA, power: float = POWER, alternative: str = 'two-sided') -> float:
  """The noncentrality at which a t test with `df` degrees of freedom rejects with probability `power`."""
  return _root(lambda nc: _t_power(nc, df, alpha, alternative) - power)


def paired_t(n: float, sd: float, alpha: float = ALPHA, power: float = POWER,
             alternative: str = 'two-sided') -> float | None:
  """The smallest mean difference a paired t test over `n` pairs, whose differences spread by `sd` (ddof 1),
  detects; None below 2 pairs (no spread measured)."""
  if n < 2 or sd is None or not math.isfinite(sd):
    return None
  return noncentrality(n - 1, alpha, power, alternative) * sd / math.sqrt(n)


def wilcoxon_min_p(n: int, alternative: str = 'two-sided') -> float:
  """The smallest p-value the exact signed-rank test reaches with n pairs: every difference of one sign."""
  return min(1.0, (2.0 if alternative == 'two-sided' else 1.0) / 2 ** n)


def wilcoxon(n: int, sd: float, alpha: float = ALPHA, power: float = POWER,
             alternative: str = 'two-sided') -> float | None:
  """The smallest mean difference the signed-rank test over `n` pairs detects (module doc): math.inf when even its
  smallest p-value is not below alpha; None below 2 pairs."""
  if n < 2 or sd is None:
    return None
  if wilcoxon_min_p(n, alternative) >= alpha:
    return math.inf
  return paired_t(n * EFFICIENCY, sd, alpha, power, alternative)


def _welch_se_df(n1: int, sd1: float, n2: int, sd2: float) -> tuple[float, float]:
  v1, v2 = sd1 ** 2 / n1, sd2 ** 2 / n2
  se = math.sqrt(v1 + v2)
  df = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1)) if v1 + v2 > 0 else n1 + n2 - 2
  return se, df


def welch(n1: int, sd1: float, n2: int, sd2: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
  """The smallest difference of means Welch's two-sided t test (two groups of n1 and n2 spread by sd1 and sd2, ddof
  1) detects; None with a group below 2."""
  if min(n1, n2) < 2:
    return None
  se, df = _welch_se_df(n1, sd1, n2, sd2)
  return noncentrality(df, alpha, power) * se


def equivalence_margin(n1: int, sd1: float, n2: int, sd2: float, confidence: float = 1 - ALPHA,
                       power: float = POWER) -> float | None:
  """The smallest margin that the upper end of the two-sided Welch interval of a difference (at `confidence`) falls
  below with probability `power` when the true difference is 0: se (t_{(1 + confidence) / 2} + t_{power}) at the
  Welch degrees of freedom. None with a group below 2."""
  if min(n1, n2) < 2:
    return None
  se, df = _welch_se_df(n1, sd1, n2, sd2)
  return se * float(stats.t.ppf((1 + confidence) / 2, df) + stats.t.ppf(power, df))


def spearman(n: int, alpha: float = ALPHA, power: float = POWER, alternative: str = 'two-sided') -> float | None:
  """The smallest |rho| a Spearman rank test over n points detects (Fisher z, variance 1.06 / (n - 3)); None below
  4 points."""
  if n < 4:
    return None
  z = stats.norm.ppf(1 - alpha / (2 if alternative == 'two-sided' else 1)) + stats.norm.ppf(power)
  return float(math.tanh(z * math.sqrt(1.06 / (n - 3))))


def kruskal(sizes, sd: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
  """The smallest standard deviation of the group means (about their size-weighted mean) that a Kruskal-Wallis test
  over groups of `sizes` runs, spread by the pooled `sd` within groups, detects (module doc); None with fewer than two
  groups or no degrees of freedom left."""
  sizes = [int(n) for n in sizes]
  k, total = len(sizes), sum(sizes) * EFFICIENCY
  if k < 2 or total - k <= 0 or sd is None:
    return None
  df1, df2 = k - 1, total - k
  crit = stats.f.ppf(1 - alpha, df1, df2)
  nc = _root(lambda lam: float(stats.ncf.sf(crit, df1, df2, lam)) - power)
  return math.sqrt(nc / total) * sd


def pooled_sd(groups) -> float | None:
  """The pooled within-group standard deviation (ddof 1 per group) of groups of values; None without a degree of
  freedom."""
  groups = [np.asarray(g, float) for g in groups if len(g)]
  dof = sum(len(g) - 1 for g in groups)
  if dof <= 0:
    return None
  return float(math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof))


def paired_design(x, y, alternative: str = 'two-sided') -> dict:
  """What a paired comparison of x and y (equal length, paired by position) detects: {'n', 'sd' (of x - y, ddof 1),
  'paired_t', 'wilcoxon', 'wilcoxon_min_p'} (paired_t and wilcoxon: the detectable mean difference)."""
  d = np.asarray(x, float) - np.asarray(y, float)
  n = len(d)
  sd = float(np.std(d, ddof=1)) if n >= 2 else None
  return {'n': n, 'sd': sd, 'paired_t': paired_t(n, sd, alternative=alternative),
          'wilcoxon': wilcoxon(n, sd, alternative=alternative), 'wilcoxon_min_p': wilcoxon_min_p(n, alternative)}


def detects(effect, digits: int = 2, what: str = '', unit: str = '') -> str:
  """'the design detects >= 0.31 at 80 % power' (what: the effect's name, e.g. '|rho| '; unit: after the number),
  or why it detects nothing."""
  if effect is None:
    return 'no detectable effect can be stated (fewer than two values a side)'
  if effect == math.inf:
    return f'the design cannot reach p < {ALPHA} at any effect'
  return f'the design detects {what}>= {effect:.{digits}f}{unit} at {POWER * 100:.0f} % power'
