"""The trend statistic behind the mini-study's laziness and gradient-signal verdicts, on hand-built points."""

import numpy as np
import pytest
from scipy import stats

from hybrid_jax.study import trend

WINDOWS = [8] * 5 + [16] * 5 + [32] * 5


def _steps(means, rng, noise=100.0):
  return [m + noise * rng.standard_normal() for m in means for _ in range(5)]


def test_rho_matches_scipy_with_ties_and_is_zero_for_a_constant_side():
  rng = np.random.default_rng(0)
  y = rng.integers(0, 4, size=15).astype(float)  # many ties
  assert trend._rho(np.asarray(WINDOWS, float), y)[0] == pytest.approx(stats.spearmanr(WINDOWS, y).statistic)
  assert trend._rho(np.asarray(WINDOWS, float), np.ones(15))[0] == 0.0


def test_present_absent_reversed_and_noisy():
  rng = np.random.default_rng(1)
  present = trend.trend(WINDOWS, _steps([500, 1250, 2000], rng))
  assert present['rho'] > 0.8 and present['p'] < 0.01 and present['interval'][0] > 0.5
  assert trend.judge(present, 'increasing') == 'reproduced'
  assert trend.judge(present, 'decreasing') == 'not reproduced'
  # Mutation: the windows in reverse order turn the same steps into the opposite trend.
  reversed_ = trend.trend(WINDOWS[::-1], _steps([500, 1250, 2000], np.random.default_rng(1)))
  assert reversed_['rho'] == pytest.approx(-present['rho'])
  assert trend.judge(reversed_, 'increasing') == 'not reproduced'
  absent = trend.trend(WINDOWS, [1000.0] * 15)
  assert absent['rho'] == 0.0 and absent['p'] == 1.0 and trend.judge(absent, 'increasing') == 'not reproduced'
  noisy = trend.trend([8] * 3 + [16] * 3 + [32] * 3, [500, 2500, 1000, 1500, 750, 2000, 1000, 1750, 750])
  assert noisy['rho'] is not None and noisy['p'] > 0.05 and noisy['interval'][1] > trend.MIN_RHO, noisy
  assert trend.judge(noisy, 'increasing') == 'not separable'


def test_the_permutation_p_value_is_calibrated_under_no_trend():
  """Under no trend, p < 0.05 about 5% of the time (the test is neither blind nor trigger-happy)."""
  rng = np.random.default_rng(2)
  ps = [trend.trend(WINDOWS, rng.standard_normal(15), seed=k, resamples=499)['p'] for k in range(200)]
  assert 0.01 <= np.mean(np.asarray(ps) < 0.05) <= 0.10


def test_too_few_runs_measure_no_trend():
  assert trend.trend([8, 16, 32], [1, 2, 3])['rho'] is None  # one run per window
  assert trend.trend([8, 8, 8], [1, 2, 3])['rho'] is None  # one window
  assert trend.trend([8, 8, 16, 16, None], [1, 2, 3, None, 5])['rho'] is None  # a None drops its run
  none = trend.trend([8, 16], [1, 2])
  assert trend.judge(none, 'increasing') == 'not separable' and 'needs two settings' in trend.describe(none)
  with pytest.raises(ValueError, match='increasing or decreasing'):
    trend.judge(none, 'up')
