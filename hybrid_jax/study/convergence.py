"""Deciding the study's claims on runs trained until formed.

A run trained for a fixed budget mixes two questions: when retrieval forms, and what it reaches once formed. Trained
until formed (the stopping rule of hybrid_jax.analysis.formation, re-exported here), each run either formed or was
capped, and the claims about converged models are read on the runs that formed:
- `equivalence`: whether final recall is the same across arches, as a statement with intervals (every arch within
  a margin of the best), not as the absence of a significant difference;
- `paired`: two arches compared seed by seed (the same seed reads the same documents in the same order);
- `formation_rate`: how many runs formed, with its interval, reported beside what was measured on them.
Plain Python and numpy in, plain dicts out, so every verdict is tested on hand-built numbers.
"""

import math
import warnings

import numpy as np
from scipy import stats

from hybrid_jax.analysis.formation import CONSECUTIVE, THRESHOLD, formation_step, formed_at, should_stop
from hybrid_jax.study import power, trend

__all__ = ['CONSECUTIVE', 'THRESHOLD', 'formation_step', 'formed_at', 'should_stop', 'equivalence', 'paired',
           'formation_rate']


def _number(value) -> bool:
  return value is not None and not math.isnan(value)


def _values(values) -> list[float]:
  return [float(v) for v in values if _number(v)]


def _quiet(test):
  """`test()` without the warnings scipy gives for samples without spread (their result is handled here)."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', RuntimeWarning)
    return test()


def equivalence(finals: dict, margin: float = 0.05, confidence: float = 0.95) -> dict:
  """Whether every arch's mean is within `margin` of the best arch's mean.

  finals: {label: [per-seed values]} (None and NaN dropped). For each arch with two values or more: its mean, the
  difference best mean - its mean, and the Welch t interval of that difference at `confidence`. Welch's t rather
  than a bootstrap: with 3-5 seeds an arch, resampling so few values gives intervals too narrow to trust, while the
  t interval widens for them; and Welch does not assume the arches spread alike. Seeds that agree exactly give an
  interval of width zero.

  'verdict' is 'equivalent' when every arch's interval lies below `margin` (equivalence in the two one-sided tests'
  sense, at the stricter two-sided `confidence`), 'apart' when some arch's interval lies at or above `margin`, else
  'undecided'. An arch with fewer than two values is listed under 'unjudged' ({label: count}) and leaves the
  verdict at most 'undecided', since it is not shown to be within the margin; so does having fewer than two arches.
  """
  clean = {label: _values(v) for label, v in finals.items()}
  judged = {label: v for label, v in clean.items() if len(v) >= 2}
  out = {'margin': margin, 'confidence': confidence, 'best': None, 'arches': {},
         'unjudged': {label: len(v) for label, v in clean.items() if len(v) < 2}}
  if not judged:
    return {**out, 'verdict': 'undecided'}
  best = max(judged, key=lambda label: np.mean(judged[label]))
  for label, values in judged.items():
    ci = _quiet(lambda: stats.ttest_ind(judged[best], values, equal_var=False).confidence_interval(confidence))
    difference = float(np.mean(judged[best]) - np.mean(values))
    out['arches'][label] = {'n': len(values), 'mean': float(np.mean(values)), 'difference': difference,
                            'interval': [float(ci.low), float(ci.high)]}
  lows, highs = zip(*(a['interval'] for a in out['arches'].values()))
  if max(lows) >= margin:
    verdict = 'apart'
  elif max(highs) < margin and len(judged) >= 2 and not out['unjudged']:
    verdict = 'equivalent'
  else:
    verdict = 'undecided'
  return {**out, 'best': best, 'verdict': verdict}


def paired(a: dict, b: dict, min_effect: float, alternative: str = 'two-sided', confidence: float = 0.95) -> dict:
  """a against b seed by seed: {seed: value} each, paired by seed key (None and NaN dropped).

  Returns 'n' (pairs), 'dropped' (seeds that could not be paired), 'seeds', 'mean' (mean of a - b), 'interval' (its
  two-sided t interval at `confidence`), 'p' (paired t test, `alternative` as scipy's: 'two-sided', 'greater' or
  'less'), 'wilcoxon_p' (the signed-rank test beside it), 'power' (what each test detects over these pairs at their
  spread, hybrid_jax.study.power.paired_design; None below two pairs) and 'outcome' in verdicts.compare's terms:
  - 'greater' / 'less': p < trend.ALPHA and the mean difference at least `min_effect` in that direction (a one-sided
    `alternative` can find only its own direction);
  - 'same': the whole interval inside ±min_effect, so an effect that counts would have shown;
  - 'unclear': anything else, fewer than two pairs included.
  The t test decides: with 5 pairs the signed-rank test's smallest two-sided p is 1/16, so it could never reach
  0.05; it is reported as a check that the t test's answer does not rest on one outlying seed.
  """
  seeds = sorted(s for s in set(a) & set(b) if _number(a[s]) and _number(b[s]))
  out = {'n': len(seeds), 'dropped': len(set(a) | set(b)) - len(seeds), 'seeds': seeds, 'alternative': alternative,
         'mean': None, 'interval': None, 'p': None, 'wilcoxon_p': None, 'power': None, 'outcome': 'unclear'}
  if len(seeds) < 2:
    return out
  x, y = (np.asarray([float(side[s]) for s in seeds]) for side in (a, b))
  mean = float(np.mean(x - y))
  ci = _quiet(lambda: stats.ttest_rel(x, y).confidence_interval(confidence))
  p = _quiet(lambda: float(stats.ttest_rel(x, y, alternative=alternative).pvalue))
  p = 1.0 if math.isnan(p) else p  # No difference at any seed.
  wilcoxon = _quiet(lambda: float(stats.wilcoxon(x, y, alternative=alternative).pvalue))
  interval = [float(ci.low), float(ci.high)]
  if p < trend.ALPHA and mean >= min_effect and alternative != 'less':
    outcome = 'greater'
  elif p < trend.ALPHA and mean <= -min_effect and alternative != 'greater':
    outcome = 'less'
  elif -min_effect < interval[0] and interval[1] < min_effect:
    outcome = 'same'
  else:
    outcome = 'unclear'
  return {**out, 'mean': mean, 'interval': interval, 'p': p,
          'wilcoxon_p': None if math.isnan(wilcoxon) else wilcoxon, 'outcome': outcome,
          'power': power.paired_design(x, y, alternative)}


def formation_rate(formed: int, total: int, confidence: float = 0.95) -> dict:
  """{'formed', 'total', 'rate', 'interval'}: the share of runs that formed, with its exact (Clopper-Pearson)
  interval, which never covers less than `confidence` however few the runs; rate and interval None without runs."""
  if total == 0:
    return {'formed': formed, 'total': total, 'rate': None, 'interval': None}
  ci = stats.binomtest(formed, total).proportion_ci(confidence, method='exact')
  return {'formed': formed, 'total': total, 'rate': formed / total, 'interval': [float(ci.low), float(ci.high)]}
