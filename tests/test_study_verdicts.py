"""The mini-study's verdict logic on hand-built summaries: an effect present, absent, and inside the spreads."""

import pytest

from hybrid_jax.study import mini_report, presets, verdicts
from hybrid_jax.study.verdicts import NOT_ASSESSABLE, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, spread

BETWEEN, BEYOND = presets.BUCKETS[1], presets.BUCKETS[2]


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


WINDOWS = {'SWA-128': 8, 'SWA-512': 16, 'SWA-2048': 32}


def _entry(accuracy, restricted, extrapolation=None, loss=None, formation=None, never=0, signal=None, window=None,
           first=None):
  """A summary entry from per-seed values: accuracy / restricted {bucket: [per seed]}; `formation` the
  ablation-based formation steps, `first` the recall-based ones (default: the same), `signal` the gradient signal
  between the windows (also its gradient share at step 250); 'per_seed' holds the same values seed by seed, every
  run formed at its `first` step (the converged verdicts in depth: tests/test_convergence_verdicts.py)."""
  buckets = presets.BUCKETS
  acc = {b: spread(accuracy.get(b, [1.0, 1.0, 1.0])) for b in buckets}
  acc['all'] = spread(accuracy.get('all', [1.0, 1.0, 1.0]))
  res = {b: spread(restricted.get(b, accuracy.get(b, [1.0, 1.0, 1.0]))) for b in buckets}
  drop = {b: spread([x - y for x, y in zip(acc[b]['values'], res[b]['values'])]) for b in buckets}
  ext = {b: spread((extrapolation or {}).get(b, [0.0, 0.0, 0.0])) for b in presets.EXTRAPOLATION_BUCKETS}
  heads = formation or [500, 500, 500]
  loss = spread(loss or [0.5, 0.5, 0.5])
  pick = lambda s, i: s['values'][i] if i < len(s['values']) else None
  per_seed = {i: {'formed': True, 'formation_step': step, 'formed_at': step, 'held_out_loss': pick(loss, i),
                  'recall': {b: pick(acc[b], i) for b in acc}, 'extrapolation': {b: pick(ext[b], i) for b in ext},
                  'gradient_share': {BETWEEN: [(250, signal[i])] if signal else []}}
              for i, step in enumerate(first or heads)}
  return {'seeds': list(range(len(heads))), 'window': window, 'accuracy': acc, 'restricted': res, 'drop': drop,
          'extrapolation': ext, 'held_out_loss': loss, 'per_seed': per_seed,
          'gradient_signal': {b: spread(signal if b == BETWEEN and signal else [1.0] * len(heads)) for b in buckets},
          'formation': {'threshold': 0.5, 'ablation_threshold': 0.25,
                        'ablation': {'step': spread(heads), 'never': never},
                        'first': {'step': spread(first or heads), 'never': never}}}


def _windowed(formations, **kw):
  """A summary of the three window arches, small to large, with per-seed formation steps."""
  return {label: _entry({}, {}, formation=steps, window=WINDOWS[label], **kw)
          for label, steps in zip(WINDOWS, formations)}


def _where(summary):
  return verdicts.where_retrieval_lives(summary, mini_report.restriction_cases(summary))


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


def test_where_retrieval_lives_in_recurrent_hybrids_is_a_real_test():
  """A recurrent state reaches every distance: when restricting the full layers costs nothing beyond the small
  window, the recurrent layer carried the pair and the claim is not reproduced for that mixer."""
  cases = mini_report.restriction_cases(['GDN', 'Lightning', 'Full'])
  assert cases == [('Lightning', BETWEEN), ('Lightning', BEYOND), ('GDN', BETWEEN), ('GDN', BEYOND)]
  dropping = _entry({}, {BETWEEN: [0.1, 0.12, 0.1], BEYOND: [0.1, 0.1, 0.08]})
  carried = _entry({}, {BETWEEN: [0.97, 0.99, 1.0], BEYOND: [0.98, 0.99, 0.97]})
  assert verdicts.where_retrieval_lives({'GDN': dropping, 'Lightning': dropping}, cases).status == REPRODUCED
  v = verdicts.where_retrieval_lives({'GDN': carried, 'Lightning': dropping}, cases)
  assert v.status == NOT_REPRODUCED and 'GDN beyond the large window 0.02 ± 0.01' in v.measured
  assert verdicts.where_retrieval_lives({}, cases).status == NOT_ASSESSABLE


def test_where_retrieval_lives_uses_the_mean_not_one_seed():
  # Seed 0 alone shows a large drop; the mean over seeds is inside the spread.
  summary = {'SWA-2048': _entry({BETWEEN: [1.0, 1.0, 1.0]}, {BETWEEN: [0.2, 1.0, 1.0]})}
  assert _where(summary).status == NOT_SEPARABLE


def _lazy(summary, caveat=''):
  return verdicts.laziness(summary, presets.WINDOW_ARCHES, 250, 3000, caveat)


def test_laziness_is_a_trend_over_windows_present_absent_reversed_and_noisy():
  present = _windowed([[500, 750, 500, 500, 750], [1250, 1000, 1500, 1250, 1000], [2000, 2250, 2500, 2000, 2250]])
  v = _lazy(present)
  assert v.status == REPRODUCED and 'Spearman rho = 0.9' in v.measured, v.text()
  # Mutation: the windows' order reversed (the large window forming first) reverses the verdict.
  reversed_ = _windowed([[2000, 2250, 2500, 2000, 2250], [1250, 1000, 1500, 1250, 1000], [500, 750, 500, 500, 750]])
  assert _lazy(reversed_).status == NOT_REPRODUCED
  absent = _windowed([[1000] * 5] * 3)
  assert _lazy(absent).status == NOT_REPRODUCED
  noisy = _windowed([[500, 2500, 1000], [1500, 750, 2000], [1000, 1750, 750]])
  assert _lazy(noisy).status == NOT_SEPARABLE
  # A caveat is stated with the evidence and leaves the status alone.
  with_caveat = _lazy(present, 'One cycle only.')
  assert with_caveat.status == REPRODUCED and with_caveat.evidence[-1] == 'One cycle only.'


def test_laziness_reads_the_window_of_each_arch_not_the_order_of_the_summary():
  present = _windowed([[500, 750, 500], [1250, 1000, 1500], [2000, 2250, 2500]])
  shuffled = {label: present[label] for label in ('SWA-2048', 'SWA-128', 'SWA-512')}
  assert _lazy(shuffled).status == REPRODUCED


def test_laziness_counts_runs_that_never_formed_and_says_so():
  summary = _windowed([[500, 500, 750], [1000, 1250, 1000], [3250, 3250, 3250]])
  summary['SWA-2048']['formation']['ablation']['never'] = 3
  v = _lazy(summary)
  assert v.status == REPRODUCED and '(3 never)' in v.text()
  never = _windowed([[3250] * 3] * 3, never=3)
  assert _lazy(never).status == NOT_ASSESSABLE
  assert _lazy({'SWA-128': summary['SWA-128']}).status == NOT_ASSESSABLE


def test_gradient_signal_must_shrink_as_the_window_grows():
  kw = dict(formation=[500] * 5)
  summary = lambda signals: {label: _entry({}, {}, window=WINDOWS[label], signal=values, **kw)
                             for label, values in zip(WINDOWS, signals)}
  shrinking = summary([[0.9, 1.0, 0.8, 0.95, 0.85], [0.5, 0.6, 0.55, 0.45, 0.5], [0.1, 0.2, 0.15, 0.1, 0.12]])
  run = lambda s: verdicts.gradient_mechanism(s, presets.WINDOW_ARCHES, BETWEEN)
  assert run(shrinking).status == REPRODUCED
  growing = summary([[0.1, 0.2, 0.15, 0.1, 0.12], [0.5, 0.6, 0.55, 0.45, 0.5], [0.9, 1.0, 0.8, 0.95, 0.85]])
  assert run(growing).status == NOT_REPRODUCED
  assert run(summary([[0.5] * 5] * 3)).status == NOT_REPRODUCED
  assert 'q/k gradient share between the windows, the probes before step 500' in run(shrinking).measured


def test_emergence_differs_while_final_recall_converges():
  def summary(steps, finals):
    return {label: _entry({'all': final}, {}, first=s, formation=s) for label, s, final in
            zip(('SWA-128', 'SWA-2048', 'Full', 'GDN'), steps, finals)}
  apart = [[500, 750, 500, 500], [1500, 1750, 1500, 1750], [2500, 2750, 2500, 2500], [3500, 3750, 3500, 3750]]
  same = [[1.0, 0.99, 1.0, 1.0]] * 4
  assert verdicts.emergence_vs_final(summary(apart, same)).status == REPRODUCED
  diverging = same[:3] + [[0.3, 0.35, 0.3, 0.3]]
  assert verdicts.emergence_vs_final(summary(apart, diverging)).status == NOT_REPRODUCED
  together = [[1000, 1250, 1000, 1250]] * 4
  assert verdicts.emergence_vs_final(summary(together, same)).status == NOT_SEPARABLE


def test_nope_needs_long_recall_and_no_loss_cost():
  far, kw = presets.BEYOND_CONTEXT, dict(formation=[500] * 5)
  nope = lambda no_pe: verdicts.nope({'SWA-128': rope, 'SWA-128-NoPE': no_pe}, [far])
  rope = _entry({}, {}, extrapolation={far: [0.1, 0.15, 0.05, 0.1, 0.12]}, loss=[0.50, 0.51, 0.50, 0.5, 0.5], **kw)
  good = _entry({}, {}, extrapolation={far: [0.8, 0.9, 0.85, 0.8, 0.82]}, loss=[0.50, 0.505, 0.50, 0.5, 0.5], **kw)
  assert nope(good).status == REPRODUCED
  costly = _entry({}, {}, extrapolation={far: [0.8, 0.9, 0.85, 0.8, 0.82]}, loss=[0.60, 0.61, 0.62, 0.6, 0.6], **kw)
  assert nope(costly).status == NOT_REPRODUCED
  no_gain = _entry({}, {}, extrapolation={far: [0.1, 0.12, 0.08, 0.1, 0.11]}, loss=[0.50, 0.50, 0.51, 0.5, 0.5], **kw)
  assert nope(no_gain).status == NOT_REPRODUCED
  noisy = _entry({}, {}, extrapolation={far: [0.9, 0.0, 0.2, 0.5, 0.1]}, loss=[0.50, 0.50, 0.51, 0.5, 0.5], **kw)
  assert nope(noisy).status == NOT_SEPARABLE
  three = _entry({}, {}, extrapolation={far: [0.8, 0.9, 0.85]}, loss=[0.50, 0.505, 0.50])  # Fewer than 5 pairs.
  assert nope(three).status == NOT_SEPARABLE and 'only 3 seed(s)' in nope(three).text()


def test_one_seed_is_never_judged():
  one = lambda label: _windowed([[500]] * 3)[label] if label in WINDOWS else _entry({}, {}, formation=[500])
  summary = {label: one(label) for label in ('SWA-128', 'SWA-512', 'SWA-2048', 'SWA-128-NoPE', 'GDN')}
  for entry in summary.values():
    for key in ('accuracy', 'restricted', 'drop', 'extrapolation'):
      entry[key] = {b: spread(v['values'][:1]) for b, v in entry[key].items()}
    entry['held_out_loss'] = spread([0.5])
    entry['drop'][BETWEEN] = entry['drop'][BEYOND] = spread([0.9])
  for v in mini_report.judge(summary, presets.PRESETS['smoke']):
    assert v.status in (NOT_SEPARABLE, NOT_ASSESSABLE), v.text()


def test_one_cycle_presets_state_why_two_verdicts_are_weak_and_deeper_ones_do_not():
  """mini (swa, full) cannot let a sliding layer retrieve alone, so the report says so beside where retrieval lives
  and laziness; the two-cycle presets can, and carry no such caveat."""
  summary = _windowed([[500, 750, 500], [1000, 1250, 1000], [2000, 2250, 2500]])
  for entry in summary.values():
    entry['restricted'][BETWEEN] = entry['restricted'][BEYOND] = spread([0.1] * 3)
    entry['drop'][BETWEEN] = entry['drop'][BEYOND] = spread([0.9] * 3)
  where, _, lazy, *_ = mini_report.judge(summary, presets.PRESETS['mini'])
  assert 'cannot do both hops' in where.evidence[-1] and "study's mechanism" in lazy.evidence[-1]
  for deep in ('mini-deep', 'gpu-small'):
    where, _, lazy, *_ = mini_report.judge(summary, presets.PRESETS[deep])
    assert not any('cannot do both hops' in line for line in where.evidence + lazy.evidence)


def test_the_table_has_one_row_per_verdict_with_its_numbers():
  summary = _windowed([[500, 750, 500], [1000, 1250, 1000], [2000, 2250, 2500]])
  judged = mini_report.judge(summary, presets.PRESETS['mini'])
  rows = verdicts.table(judged)
  assert rows[:2] == ['| study claim | measured here | verdict |', '| --- | --- | --- |']
  assert len(rows) == 2 + len(judged)
  for row, v in zip(rows[2:], judged):
    assert row.count(' | ') == 2 and row.endswith(f'| {v.status} |') and v.name in row
  assert 'formation step by window: SWA-128 (window 8)' in rows[4]


def test_a_trend_that_cannot_separate_states_the_rho_its_runs_detect():
  noisy = _windowed([[500, 2500, 1000], [1500, 750, 2000], [1000, 1750, 750]])
  v = verdicts.laziness(noisy, presets.WINDOW_ARCHES, 250, 5000)
  assert v.status == NOT_SEPARABLE
  # Fisher z at 9 runs, by hand: tanh((1.95996 + 0.84162) x sqrt(1.06 / 6)) = tanh(1.17757) = 0.8266.
  assert v.power['trend']['runs'] == 9 and v.power['trend']['detectable_rho'] == pytest.approx(0.8266, abs=1e-4)
  line = next(e for e in v.evidence if e.startswith('Trend of that step'))
  assert 'not separable (p ' in line and 'the design detects |rho| >= 0.83 at 80 % power' in line
  assert 'detects |rho| >= 0.83 at 80 % power' in v.measured
  present = verdicts.laziness(_windowed([[500, 750, 500], [1000, 1250, 1000], [2000, 2250, 2500]]),
                              presets.WINDOW_ARCHES, 250, 5000)
  assert present.status == REPRODUCED and not any('not separable' in e for e in present.evidence)


def test_a_drop_inside_its_spread_states_the_drop_the_rule_separates():
  noisy = {'SWA-2048': _entry({}, {BETWEEN: [0.95, 0.3, 0.95]})}  # drops 0.05, 0.7, 0.05: mean 0.27, std 0.31
  v = _where(noisy)
  assert v.status == NOT_SEPARABLE
  assert 'at this spread the rule separates drops of at least 0.31' in v.text()
  assert v.power[f'SWA-2048 {BETWEEN}']['smallest_separable_drop'] == pytest.approx(0.3064, abs=1e-4)
  clear = _where({'SWA-2048': _entry({}, {BETWEEN: [0.3, 0.2, 0.25]})})
  assert clear.status == REPRODUCED and 'rule separates' not in clear.text()
