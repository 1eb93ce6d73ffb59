"""A trend across an ordered setting (e.g. the sliding window), judged over every seed at once.

A claim such as "a larger window delays formation" is about an order, not about two means: `trend` takes one point
per run (x: the setting, y: the measured quantity), computes Spearman's rank correlation rho over all of them (ties
share ranks), a two-sided permutation p-value (the y values shuffled across the x values, so nothing is assumed
about their distribution) and a percentile bootstrap interval (runs resampled with replacement). `judge` reads it
against the claim's direction: 'reproduced' when rho has the claimed sign at p < ALPHA, 'not reproduced' when the
opposite sign is significant or the interval excludes a trend of at least MIN_RHO in the claimed direction, else
'not separable'.
"""

import numpy as np
from scipy import stats

ALPHA = 0.05
MIN_RHO = 0.3  # The smallest rank correlation that counts as a trend (a weak one by the usual reading).
RESAMPLES = 4999


def _rho(x, y) -> np.ndarray:
  """Spearman's rho of each row of x [k, n] with the same row of y [k, n] (ties share ranks); 0 for a row where
  either side is constant (no order to follow)."""
  rx, ry = (stats.rankdata(np.atleast_2d(v), axis=-1) for v in (x, y))
  rx, ry = rx - rx.mean(-1, keepdims=True), ry - ry.mean(-1, keepdims=True)
  norm = np.sqrt((rx ** 2).sum(-1) * (ry ** 2).sum(-1))
  return np.where(norm > 0, (rx * ry).sum(-1) / np.where(norm > 0, norm, 1.0), 0.0)


def trend(x, y, *, seed: int = 0, resamples: int = RESAMPLES) -> dict:
  """{'n', 'rho', 'p', 'interval': [low, high]} of y against x (pairs with a None dropped); rho None unless there
  are two settings with at least two runs at every setting (one run per setting measures no spread)."""
  pairs = [(float(a), float(b)) for a, b in zip(x, y) if a is not None and b is not None]
  counts = np.unique([a for a, _ in pairs], return_counts=True)[1]
  if len(counts) < 2 or counts.min() < 2:
    return {'n': len(pairs), 'rho': None, 'p': None, 'interval': None}
  xs, ys = map(np.asarray, zip(*pairs))
  rho = float(_rho(xs, ys)[0])
  rng = np.random.default_rng(seed)
  permuted = _rho(xs, rng.permuted(np.tile(ys, (resamples, 1)), axis=1))
  p = (1 + np.sum(np.abs(permuted) >= abs(rho) - 1e-12)) / (resamples + 1)
  index = rng.integers(0, len(xs), size=(resamples, len(xs)))
  low, high = np.percentile(_rho(xs[index], ys[index]), [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
  return {'n': len(pairs), 'rho': rho, 'p': float(p), 'interval': [float(low), float(high)]}


def judge(result: dict, expected: str) -> str:
  """'reproduced' | 'not reproduced' | 'not separable' for a claim that y `expected`s ('increasing' or
  'decreasing') with x."""
  if expected not in ('increasing', 'decreasing'):
    raise ValueError(f'expected={expected!r}: use increasing or decreasing')
  if result['rho'] is None:
    return 'not separable'
  sign = 1.0 if expected == 'increasing' else -1.0
  rho, _, high = sign * result['rho'], *sorted(sign * np.asarray(result['interval']))
  if result['p'] < ALPHA:
    return 'reproduced' if rho > 0 else 'not reproduced'
  return 'not reproduced' if high < MIN_RHO else 'not separable'


def describe(result: dict) -> str:
  """'Spearman rho = 0.62 (p = 0.004, 95% interval 0.31 to 0.85, n = 15)'."""
  if result['rho'] is None:
    return f"no rank correlation (n = {result['n']}: needs two settings with two runs or more at each)"
  low, high = result['interval']
  return (f"Spearman rho = {result['rho']:.2f} (permutation p = {result['p']:.3g}, 95% bootstrap interval "
          f"{low:.2f} to {high:.2f}, n = {result['n']})")
