"""The mini-study's verdict logic on hand-built summaries: an effect present, absent, and inside the spreads."""

import pytest

from hybrid_jax.study import mini, verdicts
from hybrid_jax.study.verdicts import NOT_ASSESSABLE, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, spread

BETWEEN, BEYOND = mini.BUCKETS[1], mini.BUCKETS[2]


def test_spread_is_the_mean_and_population_std_over_seeds():
  s = spread([0.2, 0.4, None, 0.9])
  assert s['mean'] == pytest.approx(0.5) and s['std'] == pytest.approx(0.2943920288775949)
  assert s['values'] == [0.2, 0.4, 0.9]
  assert spread([None])['mean'] is None


@pytest.mark.parametrize('a, b, expected', [
    ([0.9, 0.8, 0.85], [0.1, 0.2, 0.15], 'greater'),   # far apart, tight spreads
    ([0.1, 0.2, 0.15], [0.9, 0.8, 0.85], 'less'),
    ([0.5, 0.52, 0.51], [0.5, 0.49, 0.5], 'same'),     # tight spreads, gap below the smallest effect
    ([0.9, 0.1, 0.5], [0.3, 0.35, 0.4], 'unclear'),    # gap 0.15 inside the spreads (0.33 + 0.04)
    ([0.3, 0.31, 0.3], [0.25, 0.26, 0.25], 'same'),    # apart beyond their spreads, but by less than 0.1
    ([0.9], [0.1], 'unclear'),                         # one seed: no spread measured
])
def test_compare(a, b, expected):
  assert verdicts.compare(spread(a), spread(b), 0.1) == expected


def test_compare_against_a_constant_needs_spread_only_on_the_measured_side():
  assert verdicts.compare(spread([0.6, 0.7]), verdicts.constant(0.0), 0.1) == 'greater'
  assert verdicts.compare(spread([0.6]), verdicts.constant(0.0), 0.1) == 'unclear'


def _entry(accuracy, restricted, extrapolation=None, loss=None, formation=None, never=0):
  """A summary entry from per-seed values: accuracy / restricted {bucket: [per seed]}."""
  buckets = mini.BUCKETS
  acc = {b: spread(accuracy.get(b, [1.0, 1.0, 1.0])) for b in buckets}
  res = {b: spread(restricted.get(b, accuracy.get(b, [1.0, 1.0, 1.0]))) for b in buckets}
  drop = {b: spread([x - y for x, y in zip(acc[b]['values'], res[b]['values'])]) for b in buckets}
  ext = {b: spread((extrapolation or {}).get(b, [0.0, 0.0, 0.0])) for b in mini.EXTRAPOLATION_BUCKETS}
  return {'accuracy': acc, 'restricted': res, 'drop': drop, 'extrapolation': ext,
          'held_out_loss': spread(loss or [0.5, 0.5, 0.5]),
          'formation': {'threshold': 0.5, 'step': spread(formation or [500, 500, 500]), 'never': never}}


def _where(summary):
  return verdicts.where_retrieval_lives(summary, mini.BUCKETS)


def test_where_retrieval_lives_reproduced_absent_and_inside_the_spreads():
  small = _entry({}, {BETWEEN: [0.0, 0.1, 0.0], BEYOND: [0.0, 0.0, 0.05]})
  # Present: restricting SWA-2048's full layers costs recall between the windows.
  present = {'SWA-128': small, 'SWA-128-NoPE': small,
             'SWA-2048': _entry({}, {BETWEEN: [0.3, 0.2, 0.25]})}
  assert _where(present).status == REPRODUCED
  # Absent: SWA-2048's sliding layers carry it (no drop, tight spread).
  absent = dict(present, **{'SWA-2048': _entry({}, {BETWEEN: [0.98, 1.0, 0.99]})})
  v = _where(absent)
  assert v.status == NOT_REPRODUCED and 'SWA-2048 between the windows' in ' '.join(v.evidence)
  # Inside the spreads: one seed drops, two do not.
  unclear = dict(present, **{'SWA-2048': _entry({}, {BETWEEN: [0.1, 1.0, 0.95]})})
  assert _where(unclear).status == NOT_SEPARABLE
  # An arch that never learned there cannot speak to it, and the claim is then not judged as a whole.
  never = dict(present, **{'SWA-2048': _entry({BETWEEN: [0.1, 0.0, 0.2]}, {BETWEEN: [0.0, 0.0, 0.0]})})
  v = _where(never)
  assert v.status == NOT_ASSESSABLE and 'SWA-2048 between the windows: not assessable' in v.text()
  assert 'SWA-128 beyond the large window' in v.text() and REPRODUCED in v.evidence[-1]


def test_where_retrieval_lives_uses_the_mean_not_one_seed():
  # Seed 0 alone shows a large drop; the mean over seeds is inside the spread.
  summary = {'SWA-2048': _entry({BETWEEN: [1.0, 1.0, 1.0]}, {BETWEEN: [0.2, 1.0, 1.0]})}
  assert _where(summary).status == NOT_SEPARABLE


def test_laziness_reproduced_opposite_and_inside_the_spreads():
  lazy = {'SWA-128': _entry({}, {}, formation=[500, 750, 500]),
          'SWA-2048': _entry({}, {}, formation=[2000, 2250, 2500])}
  assert verdicts.laziness(lazy, 250, 3000).status == REPRODUCED
  opposite = {'SWA-128': lazy['SWA-2048'], 'SWA-2048': lazy['SWA-128']}
  assert verdicts.laziness(opposite, 250, 3000).status == NOT_REPRODUCED
  same = {'SWA-128': _entry({}, {}, formation=[500, 500, 500]), 'SWA-2048': _entry({}, {}, formation=[500, 500, 500])}
  assert verdicts.laziness(same, 250, 3000).status == NOT_REPRODUCED
  noisy = {'SWA-128': _entry({}, {}, formation=[500, 2500, 500]),
           'SWA-2048': _entry({}, {}, formation=[1500, 1750, 1000])}
  assert verdicts.laziness(noisy, 250, 3000).status == NOT_SEPARABLE
  # A caveat is stated with the evidence and leaves the status alone.
  with_caveat = verdicts.laziness(lazy, 250, 3000, 'One cycle only.')
  assert with_caveat.status == REPRODUCED and with_caveat.evidence[-1] == 'One cycle only.'


def test_laziness_counts_runs_that_never_formed_and_says_so():
  summary = {'SWA-128': _entry({}, {}, formation=[500, 500, 750]),
             'SWA-2048': _entry({}, {}, formation=[3250, 3250, 3250], never=3)}
  v = verdicts.laziness(summary, 250, 3000)
  assert v.status == REPRODUCED and 'SWA-2048 never did in 3 of 3 seeds' in v.text()
  both = {'SWA-128': _entry({}, {}, formation=[3250] * 3, never=3),
          'SWA-2048': _entry({}, {}, formation=[3250] * 3, never=3)}
  assert verdicts.laziness(both, 250, 3000).status == NOT_ASSESSABLE


def test_nope_needs_long_recall_and_no_loss_cost():
  far = mini.BEYOND_CONTEXT
  rope = _entry({}, {}, extrapolation={far: [0.1, 0.15, 0.05]}, loss=[0.50, 0.51, 0.50])
  good = _entry({}, {}, extrapolation={far: [0.8, 0.9, 0.85]}, loss=[0.50, 0.505, 0.50])
  assert verdicts.nope({'SWA-128': rope, 'SWA-128-NoPE': good}, far).status == REPRODUCED
  costly = _entry({}, {}, extrapolation={far: [0.8, 0.9, 0.85]}, loss=[0.60, 0.61, 0.62])
  assert verdicts.nope({'SWA-128': rope, 'SWA-128-NoPE': costly}, far).status == NOT_REPRODUCED
  no_gain = _entry({}, {}, extrapolation={far: [0.1, 0.12, 0.08]}, loss=[0.50, 0.50, 0.51])
  assert verdicts.nope({'SWA-128': rope, 'SWA-128-NoPE': no_gain}, far).status == NOT_REPRODUCED
  noisy = _entry({}, {}, extrapolation={far: [0.9, 0.0, 0.2]}, loss=[0.50, 0.50, 0.51])
  assert verdicts.nope({'SWA-128': rope, 'SWA-128-NoPE': noisy}, far).status == NOT_SEPARABLE


def test_one_seed_is_never_judged():
  one = lambda **kw: {k: {b: spread(v[b]['values'][:1]) for b in v} if k in ('accuracy', 'restricted', 'drop',
                                                                              'extrapolation') else v
                      for k, v in _entry({}, {BETWEEN: [0.0, 0.0, 0.0]}, **kw).items()}
  summary = {'SWA-128': one(), 'SWA-2048': one(), 'SWA-128-NoPE': one()}
  for entry in summary.values():
    entry['formation'] = {'threshold': 0.5, 'step': spread([500]), 'never': 0}
    entry['held_out_loss'] = spread([0.5])
  for v in mini.judge(summary, mini.PRESETS['smoke']):
    assert v.status == NOT_SEPARABLE, v.text()


def test_one_cycle_presets_state_why_two_verdicts_are_weak_and_deeper_ones_do_not():
  """mini (swa, full) cannot let a sliding layer retrieve alone, so the report says so beside where retrieval lives
  and laziness; gpu-small (two cycles) can, and carries no such caveat."""
  summary = {'SWA-128': _entry({}, {BETWEEN: [0.1] * 3, BEYOND: [0.1] * 3}, formation=[500, 750, 500]),
             'SWA-2048': _entry({}, {BETWEEN: [0.1] * 3, BEYOND: [0.1] * 3}, formation=[2000, 2250, 2500])}
  where, lazy, _ = mini.judge(summary, mini.PRESETS['mini'])
  assert 'cannot do both hops' in where.evidence[-1] and "study's mechanism" in lazy.evidence[-1]
  where, lazy, _ = mini.judge(summary, mini.PRESETS['gpu-small'])
  assert not any('cannot do both hops' in line for line in where.evidence + lazy.evidence)
