"""The verdicts on runs trained until formed, on hand-built inputs: the stopping rule, the equivalence statement, the
paired test across seeds, the formation rate, the summary's per-seed records and the three verdicts end to end."""

import math

import pytest
from scipy import optimize, stats

from hybrid_jax.analysis import formation
from hybrid_jax.study import convergence, mini_scoring as scoring, presets, verdicts
from hybrid_jax.study.verdicts import NOT_ASSESSABLE, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED

BETWEEN = presets.BUCKETS[1]
FAR, FARTHER = presets.at_factor(presets.BEYOND_CONTEXT, 2), presets.at_factor(presets.BEYOND_CONTEXT, 4)
STEPS = [250, 500, 750, 1000, 1250]


# The stopping rule.

@pytest.mark.parametrize('values, confirmed, first', [
    ([0.1, 0.96, 0.97, 0.99, 1.0], 750, 500),     # forms
    ([0.96, 0.5, 0.96, 0.97, 0.2], 1000, 750),    # dips after one probe, re-forms; a later dip changes nothing
    ([0.96, 0.5, 0.96, 0.5, 0.96], None, None),   # never two in a row
    ([0.96, None, 0.96, 0.97, 0.1], 1000, 750),   # a missing probe breaks a streak
    ([0.96, math.nan, 0.96, 0.2, 0.3], None, None),
    ([0.5, 0.95, 0.95, 0.5, 0.5], 750, 500),      # exactly the threshold counts
    ([0.94, 0.949, 0.9499, 0.9, 0.5], None, None),
])
def test_the_stopping_rule(values, confirmed, first):
  assert convergence.formed_at(STEPS, values) == confirmed
  assert convergence.formation_step(STEPS, values) == first
  # A hook that calls should_stop after each probe stops where formed_at says, and never before.
  history, stopped = [], None
  for step, value in zip(STEPS, values):
    history.append((step, value))
    if convergence.should_stop(history):
      stopped = step
      break
  assert stopped == confirmed


def test_the_stopping_rule_reads_probes_in_step_order_and_a_reprobed_step_once():
  # A resumed run probes step 500 again: its last value counts.
  assert convergence.formed_at([500, 250, 750, 500], [0.99, 0.97, 0.98, 0.2]) is None
  assert convergence.formed_at([250, 500, 750, 500], [0.1, 0.2, 0.98, 0.99]) == 750
  assert convergence.formation_step(STEPS, [0.96, 0.1, 0.1, 0.1, 0.1], consecutive=1) == 250
  assert convergence.formed_at(STEPS, [0.96, 0.97, 0.98, 0.1, 0.1], consecutive=3) == 750
  assert not convergence.should_stop([]) and not convergence.should_stop([(250, 0.99)])
  with pytest.raises(ValueError, match='consecutive=0'):
    convergence.should_stop([(250, 0.99)], consecutive=0)
  assert convergence.should_stop is formation.should_stop  # One rule, importable below study/.


# Equivalence of final recall.

def test_equivalence_effect_present_absent_and_noisy():
  apart = convergence.equivalence({'A': [1.0, 0.99, 1.0, 0.98], 'B': [0.7, 0.72, 0.69, 0.71]})
  assert apart['verdict'] == 'apart' and apart['best'] == 'A' and apart['arches']['B']['interval'][0] >= 0.05
  tight = convergence.equivalence({'A': [1.0, 0.99, 1.0, 0.99], 'B': [0.99, 0.98, 1.0, 0.99], 'C': [1.0] * 3})
  assert tight['verdict'] == 'equivalent' and all(a['interval'][1] < 0.05 for a in tight['arches'].values())
  noisy = convergence.equivalence({'A': [1.0, 0.99, 1.0, 0.99, 1.0], 'B': [1.0, 0.9, 1.0, 0.92, 1.0]})
  low, high = noisy['arches']['B']['interval']
  assert noisy['verdict'] == 'undecided' and low < 0.05 <= high
  # The interval is scipy's Welch interval of best - arch.
  welch = stats.ttest_ind([1.0, 0.99, 1.0, 0.99, 1.0], [1.0, 0.9, 1.0, 0.92, 1.0], equal_var=False)
  assert [low, high] == pytest.approx(list(welch.confidence_interval(0.95)))


def test_equivalence_states_which_arches_it_could_not_judge():
  result = convergence.equivalence({'A': [1.0, 0.99, 1.0], 'B': [0.99, 1.0, 1.0], 'C': [0.99, None], 'D': []})
  assert result['unjudged'] == {'C': 1, 'D': 0} and set(result['arches']) == {'A', 'B'}
  assert result['verdict'] == 'undecided'  # C and D are not shown to be within the margin.
  assert convergence.equivalence({'A': [1.0, 1.0]})['verdict'] == 'undecided'
  assert convergence.equivalence({'A': [1.0, 1.0], 'B': [0.5, 0.5]})['verdict'] == 'apart'  # exact: no spread


# The paired test.

ROPE = {0: 0.1, 1: 0.5, 2: 0.3, 3: 0.7, 4: 0.2}  # Seeds differ far more than the effect does.


def _shifted(base, shift, noise=(0.01, -0.01, 0.005, 0.0, -0.005)):
  return {seed: value + shift + e for (seed, value), e in zip(base.items(), noise)}


def test_paired_effect_present_absent_and_reversed():
  present = convergence.paired(_shifted(ROPE, 0.15), ROPE, 0.1)
  assert present['outcome'] == 'greater' and present['p'] < 0.001 and present['interval'][0] > 0.1
  assert present['p'] == pytest.approx(stats.ttest_rel(list(_shifted(ROPE, 0.15).values()), list(ROPE.values())).pvalue)
  assert 0 < present['wilcoxon_p'] <= 0.0625  # 5 pairs: the signed-rank test cannot go below 1/16.
  assert convergence.paired(ROPE, _shifted(ROPE, 0.15), 0.1)['outcome'] == 'less'
  assert convergence.paired(_shifted(ROPE, 0.0), ROPE, 0.1)['outcome'] == 'same'
  noisy = convergence.paired(_shifted(ROPE, 0.05, noise=(0.3, -0.3, 0.2, -0.1, 0.0)), ROPE, 0.1)
  assert noisy['outcome'] == 'unclear'
  # A one-sided test finds only its own direction.
  assert convergence.paired(ROPE, _shifted(ROPE, 0.15), 0.1, alternative='greater')['outcome'] == 'unclear'
  assert convergence.paired(_shifted(ROPE, 0.15), ROPE, 0.1, alternative='greater')['outcome'] == 'greater'
  # Surely there, but surely smaller than the effect that counts: the same, as verdicts.compare has it.
  assert convergence.paired(_shifted(ROPE, 0.05), ROPE, 0.1)['outcome'] == 'same'


def test_paired_pairs_by_seed_not_by_order_and_counts_what_it_drops():
  a = _shifted(ROPE, 0.15)
  b = {seed: ROPE[seed] for seed in (3, 0, 4, 2, 1)}  # Another order.
  result = convergence.paired(a, b, 0.1)
  assert result['outcome'] == 'greater' and result['seeds'] == [0, 1, 2, 3, 4] and result['dropped'] == 0
  assert result['interval'][1] - result['interval'][0] < 0.05
  extra = convergence.paired({**a, 7: 0.9}, {**b, 8: 0.0, 9: None}, 0.1)
  assert extra['n'] == 5 and extra['dropped'] == 3 and extra['outcome'] == 'greater'
  one = convergence.paired({0: 0.5}, {0: 0.1, 1: 0.2}, 0.1)
  assert one['outcome'] == 'unclear' and one['mean'] is None and one['dropped'] == 1


def test_formation_rate_has_an_exact_interval():
  rate = convergence.formation_rate(3, 5)
  assert rate['rate'] == 0.6 and rate['interval'] == pytest.approx([0.1466328, 0.9472550], abs=1e-6)
  assert convergence.formation_rate(5, 5)['interval'][1] == 1.0
  assert convergence.formation_rate(0, 0)['rate'] is None


# The summary's per-seed records.

def test_the_summary_keys_runs_by_seed_with_how_they_formed():
  p = presets.PRESETS['smoke']
  names = scoring.probe_names(p)

  def run(seed, beyond):
    curves = {f'probe_recall_accuracy_{names[2]}': list(zip(STEPS, beyond)),
              **{f'probe_qk_grad_layer1_{n}': [(250, g), (500, g)] for n, g in zip(names, (3.0, 4.0, 5.0))},
              f'probe_qk_grad_layer0_{names[1]}': [(250, 3.0), (500, 3.0)]}
    bucket = {'buckets': [{'accuracy': 1.0}] * 3, 'accuracy': 0.9, 'layers': []}
    return {'label': 'Full', 'seed': seed, 'steps': 1250, 'recall': bucket, 'restricted': bucket, 'curves': curves,
            'extrapolation': [{'factor': 2, 'buckets': [{'accuracy': a} for a in (1.0, 0.9, 0.8, 0.4)]},
                              {'factor': 4, 'buckets': [{'accuracy': a} for a in (1.0, 0.9, 0.7, 0.1)]}],
            'packed_held_out_loss': 1.1}
  runs = {'b': run(3, [0.2, 0.96, 0.97, 1.0, 1.0]), 'a': run(1, [0.2, 0.96, 0.2, 0.96, 0.5])}
  per_seed = scoring.summarize(runs, p)['Full']['per_seed']
  assert set(per_seed) == {1, 3}
  assert per_seed[3]['formed'] and per_seed[3]['formation_step'] == 500 and per_seed[3]['formed_at'] == 750
  assert per_seed[1]['formed'] is False and per_seed[1]['formation_step'] is None  # capped
  assert per_seed[3]['recall']['all'] == 0.9 and per_seed[3]['extrapolation'][FAR] == 0.4
  assert per_seed[3]['extrapolation'][FARTHER] == 0.1  # each length's buckets under its own names
  assert per_seed[3]['extrapolation'][presets.at_factor(BETWEEN, 4)] == 0.9
  assert per_seed[3]['held_out_loss'] == 1.1
  # Gradient share: norm over the full layers per bucket (3, 5, 5), over their sum.
  assert per_seed[3]['gradient_share'][BETWEEN] == [(250, pytest.approx(5 / 13)), (500, pytest.approx(5 / 13))]
  assert scoring.converged({}, p) == {'formed': None, 'formation_step': None, 'formed_at': None}


# The three verdicts end to end.

def _run(step=500, final=1.0, far=None, farther=None, loss=0.5, share=(), formed=True):
  return {'formed': formed, 'formation_step': step if formed else None, 'formed_at': step + 250 if formed else None,
          'recall': {'all': final}, 'extrapolation': {FAR: far, FARTHER: farther}, 'held_out_loss': loss,
          'gradient_share': {BETWEEN: list(share)}}


def _arch(runs, window=None):
  """A summary entry holding what the converged verdicts read: runs {seed: record}."""
  return {'window': window, 'seeds': list(runs), 'per_seed': dict(runs)}


def _emergence(steps, finals, capped=None):
  summary = {}
  for label, s, f in zip(('SWA-128', 'SWA-2048', 'Full', 'GDN'), steps, finals):
    runs = {seed: _run(step, final) for seed, (step, final) in enumerate(zip(s, f))}
    for seed in range(len(runs), len(runs) + (capped or {}).get(label, 0)):
      runs[seed] = _run(final=0.3, formed=False)  # Capped at its budget, recall far below.
    summary[label] = _arch(runs)
  return verdicts.emergence_vs_final(summary)


APART = [[500, 750, 500, 500], [1500, 1750, 1500, 1750], [2500, 2750, 2500, 2500], [3500, 3750, 3500, 3750]]
SAME = [[1.0, 0.99, 1.0, 1.0]] * 4


def test_emergence_vs_final_present_absent_and_undecided():
  v = _emergence(APART, SAME)
  assert v.status == REPRODUCED, v.text()
  assert 'Kruskal-Wallis p = ' in v.measured and 'equivalent within 0.05' in v.measured
  assert _emergence(APART, SAME[:3] + [[0.8, 0.82, 0.79, 0.81]]).status == NOT_REPRODUCED
  assert _emergence([[1000, 1250, 1000, 1250]] * 4, SAME).status == NOT_SEPARABLE  # steps do not differ
  noisy = _emergence(APART, SAME[:3] + [[1.0, 0.85, 1.0, 0.9]])  # within the margin on average, not surely
  assert noisy.status == NOT_SEPARABLE and 'undecided' in noisy.measured


def test_emergence_vs_final_leaves_capped_runs_out_and_says_so():
  v = _emergence(APART, SAME, capped={'Full': 2, 'GDN': 3})
  assert v.status == REPRODUCED, v.text()  # Their recall of 0.3 is not averaged in.
  assert 'Full 4 of 6 (2 capped)' in v.text() and 'GDN 4 of 7 (3 capped)' in v.text()
  one = _emergence(APART[:3] + [[3500]], SAME[:3] + [[1.0]], capped={'GDN': 4})
  assert 'not judged (fewer than two formed runs): GDN' in one.text()
  assert _emergence([[500, 750]], [[1.0, 1.0]]).status == NOT_ASSESSABLE


def _nope(rope, no_pe, buckets=(FAR,)):
  return verdicts.nope({'SWA-128': _arch(rope), 'SWA-128-NoPE': _arch(no_pe)}, buckets)


def _pairs(far, farther=None, loss=None):
  """Runs {seed: record} with per-seed recall beyond the training context (and at 4x), and held-out loss."""
  farther = farther or far
  loss = loss or {seed: 0.5 for seed in far}
  return {seed: _run(far=far[seed], farther=farther[seed], loss=loss[seed]) for seed in far}


def test_nope_paired_by_seed_present_costly_absent_and_reversed():
  rope = dict(reversed(_pairs(ROPE).items()))  # The summary's order of seeds is not the pairing.
  gain = _pairs(_shifted(ROPE, 0.15))
  v = _nope(rope, gain)
  assert v.status == REPRODUCED, v.text()
  assert 'paired t p = ' in v.measured and 'Wilcoxon p = ' in v.measured
  assert 'SWA-128-NoPE 5 of 5 (95% exact interval 0.48 to 1.00)' in v.evidence[-1]
  # Seed by seed the gain is clear; by mean ± std over seeds it would be inside the spread.
  assert verdicts.compare(verdicts.spread(_shifted(ROPE, 0.15).values()), verdicts.spread(ROPE.values()),
                          verdicts.MIN_ACCURACY_EFFECT) == 'unclear'
  costly = _pairs(_shifted(ROPE, 0.15), loss=_shifted({s: 0.6 for s in ROPE}, 0.0, noise=(0.001,) * 5))
  assert _nope(rope, costly).status == NOT_REPRODUCED
  assert _nope(rope, _pairs(_shifted(ROPE, 0.0))).status == NOT_REPRODUCED  # no gain
  assert _nope(rope, _pairs(_shifted(ROPE, -0.15))).status == NOT_REPRODUCED  # a loss of recall
  noisy = _pairs(_shifted(ROPE, 0.05, noise=(0.3, -0.3, 0.2, -0.1, 0.0)))
  assert _nope(rope, noisy).status == NOT_SEPARABLE


def test_nope_reads_every_extrapolation_bucket_it_is_given():
  rope = _pairs(ROPE)
  both = _pairs(_shifted(ROPE, 0.15), farther=_shifted(ROPE, 0.2))
  v = _nope(rope, both, (FAR, FARTHER))
  assert v.status == REPRODUCED and f'recall {FARTHER}' in v.measured
  reversed_far = _pairs(_shifted(ROPE, 0.15), farther=_shifted(ROPE, -0.2))
  assert _nope(rope, reversed_far, (FAR, FARTHER)).status == NOT_REPRODUCED
  assert _nope(rope, both, (FAR, 'a bucket not measured')).status == NOT_ASSESSABLE


def test_nope_pairs_only_seeds_where_both_formed_and_needs_enough_of_them():
  rope = {**_pairs(ROPE), 5: _run(far=0.0)}
  no_pe = {**_pairs(_shifted(ROPE, 0.15)), 5: _run(far=1.0, formed=False), 6: _run(far=1.0)}
  v = _nope(rope, no_pe)
  assert v.status == REPRODUCED and '2 seed(s) unpaired' in v.measured  # 5: NoPE capped; 6: no RoPE run.
  few = {seed: run for seed, run in no_pe.items() if seed != 0}
  few[0] = _run(far=1.0, formed=False)
  v = _nope(rope, few)
  assert v.status == NOT_SEPARABLE and 'only 4 seed(s) formed in both arches' in v.text()
  assert 'SWA-128-NoPE 5 of 7' in v.text() and 'SWA-128 6 of 6' in v.text()
  assert verdicts.nope({'SWA-128': _arch(rope)}, (FAR,)).status == NOT_ASSESSABLE


WINDOWS = {'SWA-128': 8, 'SWA-512': 16, 'SWA-2048': 32}


def _gradient(early, late=None, steps=(750, 1000, 1500), noise=0.01):
  """Window arches with 5 runs each: share `early[arch]` at probes 250 and 500, `late[arch]` at 750 and 1000 (seed k
  adds k * noise at one of each); the arches' runs form at `steps`."""
  late = late or early
  summary = {}
  for (label, window), e, l, step in zip(WINDOWS.items(), early, late, steps):
    runs = {seed: _run(step=step, share=[(250, e + noise * seed), (500, e), (750, l), (1000, l + noise * seed)])
            for seed in range(5)}
    summary[label] = _arch(runs, window)
  return verdicts.gradient_mechanism(summary, presets.WINDOW_ARCHES, BETWEEN)


def test_gradient_share_must_shrink_with_the_window_before_the_earliest_formation():
  v = _gradient([0.6, 0.4, 0.2], late=[0.1, 0.5, 0.9])
  assert v.status == REPRODUCED and 'probes before step 750' in v.measured, v.text()
  # Read after the earliest formation, the late shares (growing with the window) would count.
  assert _gradient([0.6, 0.4, 0.2], late=[0.1, 0.5, 0.9], steps=(1250, 1250, 1500)).status == NOT_REPRODUCED
  assert _gradient([0.2, 0.4, 0.6]).status == NOT_REPRODUCED
  assert _gradient([0.4, 0.4, 0.4], noise=0.0).status == NOT_REPRODUCED


def test_gradient_share_without_formation_reads_every_probe_and_needs_two_windows():
  summary = {label: _arch({seed: _run(share=[(250, s)], formed=False) for seed in range(3)}, window)
             for (label, window), s in zip(WINDOWS.items(), (0.6, 0.4, 0.2))}
  v = verdicts.gradient_mechanism(summary, presets.WINDOW_ARCHES, BETWEEN)
  assert v.status == REPRODUCED and 'every probe (no run formed)' in v.measured
  v = verdicts.gradient_mechanism({'SWA-128': summary['SWA-128']}, presets.WINDOW_ARCHES, BETWEEN)
  assert v.status == NOT_ASSESSABLE
  formed_first = _gradient([0.6, 0.4, 0.2], steps=(250, 750, 750))  # No probe before the earliest formation.
  assert formed_first.status == NOT_ASSESSABLE and 'before step 250' in formed_first.text()



# Power: what a verdict that cannot separate could have detected (hybrid_jax.study.power).

def test_nope_states_what_its_design_detects_when_it_cannot_separate():
  rope = _pairs(ROPE)
  noisy_far = _shifted(ROPE, 0.05, noise=(0.3, -0.3, 0.2, -0.1, 0.0))
  v = _nope(rope, _pairs(noisy_far))
  assert v.status == NOT_SEPARABLE
  differences = [noisy_far[s] - ROPE[s] for s in ROPE]  # the pairing: the spread of the seed-by-seed differences
  sd = stats.tstd(differences)
  # The smallest mean difference whose paired t test (4 df, noncentrality delta / (sd / sqrt 5)) rejects 80 %.
  delta = sd / math.sqrt(5) * optimize.brentq(
      lambda nc: stats.nct.sf(stats.t.ppf(0.975, 4), 4, nc) + stats.nct.cdf(-stats.t.ppf(0.975, 4), 4, nc) - 0.8,
      1.0, 6.0)
  p = stats.ttest_rel(list(noisy_far.values()), list(ROPE.values())).pvalue
  part = next(line for line in v.evidence if line.startswith(f'recall {FAR}'))
  assert f'not separable (p {p:.2g}); the design detects >= {delta:.2f} at 80 % power' in part, part
  assert 'the signed-rank test cannot reach p < 0.05 at 5 pairs (smallest p 0.0625)' in part
  assert v.power[f'recall {FAR}']['detectable'] == pytest.approx(delta, rel=1e-6)
  assert v.power[f'recall {FAR}']['pairs'] == 5 and v.power[f'recall {FAR}']['wilcoxon_detectable'] is None
  assert f', detects >= {delta:.2f})' in v.measured
  # Present and absent effects are told apart from this one: neither is 'not separable'.
  present, absent = _nope(rope, _pairs(_shifted(ROPE, 0.15))), _nope(rope, _pairs(_shifted(ROPE, 0.0)))
  assert present.status == REPRODUCED and absent.status == NOT_REPRODUCED
  assert not any('not separable' in line for line in present.evidence + absent.evidence)
  assert absent.power[f'recall {FAR}']['detectable'] < 0.02  # a tight design: an absent effect, not a blind one


def test_nope_at_a_fixed_budget_pairs_every_seed_in_context_and_beyond():
  """mini-5k trains both arches the same steps: every seed pair counts, formed or not, in context and at 2x."""
  rope = {seed: _run(far=value, formed=seed < 3) for seed, value in ROPE.items()}
  gain = _shifted(ROPE, 0.15)
  no_pe = {seed: _run(far=gain[seed], formed=seed in (0, 1)) for seed in ROPE}
  for seed in no_pe:  # in context NoPE recalls less, seed by seed: a cost
    no_pe[seed]['recall']['all'] = 0.6 + 0.01 * seed
    rope[seed]['recall']['all'] = 0.9 - 0.01 * seed
  summary = {'SWA-128': _arch(rope), 'SWA-128-NoPE': _arch(no_pe)}
  until_formed = verdicts.nope(summary, (FAR,))
  assert until_formed.status == NOT_SEPARABLE and 'only 2 seed(s) formed in both arches' in until_formed.text()
  fixed = verdicts.nope(summary, (FAR,), fixed_steps=True)
  assert 'over every seed pair (the same steps each, formed or not)' in fixed.measured
  assert 'recall in context' in fixed.measured and f'recall {FAR}' in fixed.measured and '5 pairs' in fixed.measured
  assert fixed.status == NOT_REPRODUCED, fixed.text()  # the gain at 2x does not buy off the cost in context
  assert set(fixed.power) == {'recall in context', f'recall {FAR}', 'held-out loss'}
  for seed in no_pe:
    no_pe[seed]['recall']['all'] = rope[seed]['recall']['all']
  assert verdicts.nope(summary, (FAR,), fixed_steps=True).status == REPRODUCED
  # The presets choose: mini trains until formed, mini-5k a fixed budget.
  assert mini_report_nope(summary, 'mini').measured.startswith('2 formed pairs')
  assert 'every seed pair' in mini_report_nope(summary, 'mini-5k').measured


def mini_report_nope(summary, preset):
  """The NoPE verdict as the report judges it for `preset`, on full summary entries carrying these runs."""
  from hybrid_jax.study import mini_report
  from tests.test_study_verdicts import _entry
  full = {label: {**_entry({}, {}, formation=[500] * len(entry['per_seed'])), 'per_seed': entry['per_seed']}
          for label, entry in summary.items()}
  return mini_report.judge(full, presets.PRESETS[preset])[-1]


def test_emergence_states_what_kruskal_wallis_and_the_intervals_detect():
  steps = [[1000, 1250, 1000, 1250]] * 4
  finals = SAME[:3] + [[1.0, 0.85, 1.0, 0.9]]
  v = _emergence(steps, finals)
  assert v.status == NOT_SEPARABLE
  # Kruskal-Wallis: the ANOVA's noncentral F at N x 3/pi runs, times the pooled spread within arches.
  n, k = 16 * 3 / math.pi, 4
  crit = stats.f.ppf(0.95, k - 1, n - k)
  lam = optimize.brentq(lambda x: stats.ncf.sf(crit, k - 1, n - k, x) - 0.8, 0.1, 200)
  pooled = math.sqrt(sum(stats.tvar(s) * 3 for s in steps) / 12)
  detectable = math.sqrt(lam / n) * pooled
  assert f'the design detects arch means spread by a standard deviation >= {detectable:.0f} steps' in v.evidence[1]
  assert v.power['kruskal_wallis']['detectable_sd_of_means'] == pytest.approx(detectable, rel=1e-6)
  # Equivalence: the margin the Welch interval of best - GDN falls below 80 % of the time were they equal.
  best, gdn = SAME[0], finals[3]
  va, vb = stats.tvar(best) / 4, stats.tvar(gdn) / 4
  df = (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 3)
  margin = math.sqrt(va + vb) * (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df))
  assert v.power['equivalence']['provable_margin'] == pytest.approx(margin, rel=1e-6)
  assert f'shows equivalence within >= {margin:.3f} at 80 % power' in v.evidence[2]
