"""The smallest detectable effects of hybrid_jax.study.power against published values, exact null distributions
and simulations of the tests themselves."""

import math

import numpy as np
import pytest
from scipy import stats

from hybrid_jax.study import power


def _simulated_paired_t_power(n, delta, sd, draws=100_000, seed=0):
  """Share of draws of n normal differences (mean delta, spread sd) where the two-sided paired t test rejects."""
  d = np.random.default_rng(seed).normal(delta, sd, size=(draws, n))
  t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
  return float((np.abs(t) > stats.t.ppf(0.975, n - 1)).mean())


def test_paired_t_matches_published_values_and_a_simulation():
  # Cohen's dz for 80 % power at alpha 0.05 two-sided (G*Power: 1.6818 at 5 pairs, 0.9959 at 10).
  assert power.paired_t(5, 1.0) == pytest.approx(1.6818, abs=2e-4)
  assert power.paired_t(10, 1.0) == pytest.approx(0.9959, abs=2e-4)
  assert power.paired_t(10, 0.2) == pytest.approx(0.2 * power.paired_t(10, 1.0))  # in the data's units
  # At the effect it names, the test itself rejects 80 % of the time (sd 0.13, 8 pairs; simulation error 0.0013).
  delta = power.paired_t(8, 0.13)
  assert _simulated_paired_t_power(8, delta, 0.13) == pytest.approx(0.80, abs=0.006)
  assert _simulated_paired_t_power(8, 0.8 * delta, 0.13) < 0.7
  # One-sided needs less; fewer than two pairs measure no spread.
  assert power.paired_t(8, 1.0, alternative='greater') < power.paired_t(8, 1.0)
  assert power.paired_t(1, 1.0) is None and power.paired_t(2, 1.0) > 10


def test_wilcoxon_smallest_p_is_its_exact_null_and_five_pairs_detect_nothing():
  assert power.wilcoxon_min_p(5) == 1 / 16 and power.wilcoxon_min_p(6) == 1 / 32
  assert power.wilcoxon_min_p(5, 'greater') == 1 / 32
  for n in (4, 5, 6, 8):  # scipy's exact test on differences all of one sign
    assert stats.wilcoxon(np.arange(1.0, n + 1)).pvalue == pytest.approx(power.wilcoxon_min_p(n))
  assert power.wilcoxon(5, 0.1) == math.inf and 'cannot reach p < 0.05' in power.detects(math.inf)
  # Beyond that: the paired t at n x 3 / pi pairs (asymptotic relative efficiency), above the t test's own.
  assert power.wilcoxon(12, 1.0) == pytest.approx(power.paired_t(12 * 3 / math.pi, 1.0))
  assert power.wilcoxon(12, 1.0) > power.paired_t(12, 1.0)


def test_paired_design_reads_the_spread_of_the_differences_not_of_each_arm():
  base = np.array([0.1, 0.5, 0.3, 0.7, 0.2, 0.9])  # seeds differ far more than the effect does
  shifted = base + 0.15 + np.array([0.01, -0.01, 0.005, 0.0, -0.005, 0.002])
  design = power.paired_design(shifted, base)
  sd = np.std(shifted - base, ddof=1)
  assert design['n'] == 6 and design['sd'] == pytest.approx(sd)
  assert design['paired_t'] == pytest.approx(power.paired_t(6, sd)) and design['paired_t'] < 0.02
  assert design['wilcoxon_min_p'] == 1 / 32 and design['wilcoxon'] == pytest.approx(power.paired_t(6 * 3 / math.pi, sd))
  unpaired = power.welch(6, np.std(shifted, ddof=1), 6, np.std(base, ddof=1))
  assert unpaired > 10 * design['paired_t']


def test_welch_matches_the_two_sample_t_and_its_equivalence_margin_a_simulation():
  # Equal groups and spreads: Cohen's d of the two-sample t test (G*Power: 2.0244 at 5 a group).
  assert power.welch(5, 1.0, 5, 1.0) == pytest.approx(2.0244, abs=3e-4)
  assert power.welch(1, 1.0, 5, 1.0) is None
  # With no true difference, the Welch interval's upper end falls below the margin 80 % of the time: exactly
  # with many seeds, a little less (0.77) with 5 and 4, whose spreads are themselves uncertain.
  rng = np.random.default_rng(1)
  for (n1, n2), (low, high) in (((5, 4), (0.75, 0.80)), ((40, 30), (0.79, 0.81))):
    a, b = rng.normal(0.97, 0.02, size=(20_000, n1)), rng.normal(0.97, 0.04, size=(20_000, n2))
    margin = power.equivalence_margin(n1, 0.02, n2, 0.04)
    upper = stats.ttest_ind(a, b, axis=1, equal_var=False).confidence_interval(0.95).high
    assert low <= float((upper < margin).mean()) <= high, (n1, n2)


def test_spearman_is_the_fisher_z_bound():
  # tanh((z_0.975 + z_0.8) sqrt(1.06 / 12)) at 15 points, by hand: 2.8016 x 0.29721 = 0.83266.
  assert power.spearman(15) == pytest.approx(math.tanh(0.83266), abs=1e-4)
  assert power.spearman(15) == pytest.approx(0.6819, abs=1e-4)
  assert power.spearman(60) < power.spearman(15) and power.spearman(3) is None


def test_kruskal_detects_a_spread_of_means_at_its_power():
  # Four arches of 5 runs with means at -s, -s, s, s (standard deviation s): the test rejects about 80 %.
  s = power.kruskal([5] * 4, 1.0)
  rng = np.random.default_rng(2)
  groups = rng.normal(np.array([-1, -1, 1, 1])[None, :, None] * s, 1.0, size=(4000, 4, 5))
  rate = float((stats.kruskal(*[groups[:, j] for j in range(4)], axis=1).pvalue < 0.05).mean())
  assert rate == pytest.approx(0.8, abs=0.05)
  assert power.kruskal([5] * 4, 250.0) == pytest.approx(250 * s)  # in the data's units
  assert power.kruskal([5], 1.0) is None
  assert power.pooled_sd([[1.0, 3.0], [10.0, 12.0, 14.0]]) == pytest.approx(math.sqrt((2 + 8) / 3))


@pytest.mark.e2e
def test_spearman_and_wilcoxon_approximations_hold_in_simulation():
  """The Fisher z bound and the efficiency-scaled signed-rank bound against the tests run on simulated data."""
  rng = np.random.default_rng(3)
  rho = power.spearman(15)
  r = 2 * math.sin(math.pi * rho / 6)  # Pearson correlation of a normal pair whose Spearman rho is `rho`
  hits = [stats.spearmanr(*rng.multivariate_normal([0, 0], [[1, r], [r, 1]], size=15).T).pvalue < 0.05
          for _ in range(2000)]
  assert 0.75 <= np.mean(hits) <= 0.9  # the Fisher z bound errs on the safe side at 15 points
  delta = power.wilcoxon(12, 1.0)
  p = stats.wilcoxon(rng.normal(delta, 1.0, size=(20_000, 12)), axis=1).pvalue
  assert float((p < 0.05).mean()) == pytest.approx(0.8, abs=0.04)
