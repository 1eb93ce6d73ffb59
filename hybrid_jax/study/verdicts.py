"""The mini-study's verdicts on the study's three mechanistic claims, judged against the spread over seeds.

Each claim is a direction ("restricting the full layers lowers recall", "a larger window delays the full layers'
retrieval heads", "NoPE full layers recall more beyond the training context"). `compare` turns two measured
quantities (mean, standard deviation and per-seed values over seeds) into one of four outcomes:
- 'greater' / 'less': the means differ by at least the smallest effect that counts, and by more than the two
  standard deviations together;
- 'same': the means differ by less than the smallest effect and the spreads together are smaller than it too, so an
  effect of that size would have shown;
- 'unclear': anything else, including fewer than two seeds (no spread measured).
A verdict then reads 'reproduced' when the study's direction comes out, 'not reproduced' when the opposite or no
effect does, and 'not separable at this spread' when the seeds cannot tell. Claims about an order across windows
(laziness, the gradient signal behind it) are read as a trend over every run instead (hybrid_jax.study.trend). The
claims about converged models (emergence vs final recall, NoPE) are read on the runs that formed by the stopping rule,
seed by seed, with the statistics of hybrid_jax.study.convergence. A claim whose precondition fails (the
arch never learned to recall where the claim is about) is 'not assessable' and says why.

Every verdict states its power (hybrid_jax.study.power): the smallest effect its test would have found at 80 % power
and alpha 0.05 with these seeds and this spread, so "not separable (p 0.10); the design detects >= 0.31 at 80 %
power" tells a design too small for the effect from an effect that is absent. `Verdict.power` holds the numbers
(report.json, 'verdict_power').

Everything here works on the report's summary (hybrid_jax.study.mini_scoring.summarize), so the logic is tested on
hand-built summaries without training anything.
"""

import dataclasses

import numpy as np
from scipy import stats

from hybrid_jax.study import convergence, power, trend

REPRODUCED = 'reproduced'
NOT_REPRODUCED = 'not reproduced'
NOT_SEPARABLE = 'not separable at this spread'
NOT_ASSESSABLE = 'not assessable'

# Smallest effects that count: recall accuracy (a fraction of queries) and held-out loss (nats per byte). A
# formation step's smallest effect is one probe interval (the probe cannot resolve less).
MIN_ACCURACY_EFFECT = 0.1
MIN_LOSS_EFFECT = 0.01
LEARNED = 0.5  # Recall accuracy (seed mean) from which an arch counts as retrieving in a bucket.
FINAL_MARGIN = 0.05  # Formed runs' final recall within this of the best arch's counts as converged.
MIN_PAIRS = 5  # Seeds formed in both arches that a paired comparison needs: with fewer, one seed's luck decides.


def spread(values) -> dict:
  """{'mean', 'std', 'values'} of the non-None values (std over seeds, ddof 0); mean None when there are none."""
  values = [float(v) for v in values if v is not None]
  if not values:
    return {'mean': None, 'std': None, 'values': []}
  return {'mean': float(np.mean(values)), 'std': float(np.std(values)), 'values': values}


def constant(value: float) -> dict:
  """A reference value known exactly (no spread), e.g. 'no drop' = 0."""
  return {'mean': float(value), 'std': 0.0, 'values': None}


def pm(s: dict, digits: int = 2) -> str:
  """'mean ± std' (or 'n/a')."""
  if s['mean'] is None:
    return 'n/a'
  return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def compare(a: dict, b: dict, min_effect: float) -> str:
  """'greater' | 'less' | 'same' | 'unclear': how mean a stands to mean b given both spreads (module doc)."""
  for s in (a, b):
    if s['mean'] is None or (s['values'] is not None and len(s['values']) < 2):
      return 'unclear'
  gap, noise = a['mean'] - b['mean'], a['std'] + b['std']
  if abs(gap) >= min_effect and abs(gap) > noise:
    return 'greater' if gap > 0 else 'less'
  if abs(gap) < min_effect and noise < min_effect:
    return 'same'
  return 'unclear'


def status(outcome: str, expected: str = 'greater') -> str:
  """The verdict of a comparison outcome for a claim that expects `expected` ('greater', 'less' or 'same')."""
  if outcome == 'unclear':
    return NOT_SEPARABLE
  return REPRODUCED if outcome == expected else NOT_REPRODUCED


def combine(statuses) -> str:
  """One verdict from several parts: not reproduced if any part is not; reproduced only if every part is; else not
  separable if a part is, else not assessable (a part could not be measured)."""
  statuses = list(statuses)
  if NOT_REPRODUCED in statuses:
    return NOT_REPRODUCED
  if statuses and all(s == REPRODUCED for s in statuses):
    return REPRODUCED
  return NOT_SEPARABLE if NOT_SEPARABLE in statuses else NOT_ASSESSABLE


def unseparated(p: float, effect, digits: int = 2, what: str = '', unit: str = '') -> str:
  """'not separable (p 0.10); the design detects >= 0.31 at 80 % power': a verdict that cannot tell, with what it
  could have told."""
  return f'not separable (p {p:.2g}); {power.detects(effect, digits, what, unit)}'


def _finite(effect):
  """A detectable effect for report.json: None for 'detects nothing' (math.inf)."""
  return None if effect is None or effect == float('inf') else float(effect)


def _paired_power(result: dict) -> dict:
  """The power numbers of a convergence.paired result, for report.json."""
  design = result.get('power') or {}
  return {'test': 'paired t (signed-rank beside it)', 'pairs': result['n'], 'sd_of_differences': design.get('sd'),
          'detectable': _finite(design.get('paired_t')), 'wilcoxon_detectable': _finite(design.get('wilcoxon')),
          'wilcoxon_smallest_p': design.get('wilcoxon_min_p'), 'power': power.POWER, 'alpha': power.ALPHA}


def _unseparated_pairs(result: dict, digits: int = 2) -> str:
  """'not separable (p 0.10); the design detects >= 0.31 at 80 % power (paired t; the signed-rank test ...)' of a
  convergence.paired result."""
  design = result.get('power') or {}
  wilcoxon = design.get('wilcoxon')
  if wilcoxon == float('inf'):
    signed = f"cannot reach p < {power.ALPHA} at {result['n']} pairs (smallest p {design['wilcoxon_min_p']:.3g})"
  else:
    signed = power.detects(wilcoxon, digits).replace('the design ', '')
  return f"{unseparated(result['p'], design.get('paired_t'), digits)} (paired t; the signed-rank test {signed})"


@dataclasses.dataclass(frozen=True)
class Verdict:
  name: str
  claim: str  # What the study says, in the mini-study's terms.
  status: str
  evidence: list  # One sentence per part, with its numbers.
  measured: str = ''  # One cell of the report's table: the numbers the status is read from, with the statistic.
  power: dict = dataclasses.field(default_factory=dict)  # What each part's test detects (hybrid_jax.study.power).

  def text(self) -> str:
    return f"{self.name}: {self.status.upper()}. The study: {self.claim} Here: {' '.join(self.evidence)}"


def table(verdicts) -> list[str]:
  """The report's lead table in Markdown: study claim | what the mini-study measured | verdict."""
  lines = ['| study claim | measured here | verdict |', '| --- | --- | --- |']
  cell = lambda text: text.replace('|', '/').replace('\n', ' ')
  return lines + [f'| {cell(v.name)}: {cell(v.claim)} | {cell(v.measured)} | {v.status} |' for v in verdicts]


def _learned(entry: dict, bucket: str) -> bool:
  mean = entry['accuracy'][bucket]['mean']
  return mean is not None and mean >= LEARNED


def where_retrieval_lives(summary: dict, cases, caveat: str = '', name: str = 'Where retrieval lives') -> Verdict:
  """Restricting the full layers to the small window lowers recall in each (label, bucket) of `cases` where the arch
  recalls: between the windows for a large-window hybrid (its sliding layers could serve it there, yet its full
  layers do), beyond the small window for the small-window and recurrent hybrids (a recurrent state reaches every
  distance, so this is where a recurrent layer could carry the pair instead). `caveat` joins the evidence."""
  parts, evidence, cells, powers = [], [], [], {}
  for label, bucket in cases:
    if label not in summary:
      continue
    entry = summary[label]
    if not _learned(entry, bucket):
      parts.append(NOT_ASSESSABLE)
      evidence.append(f'{label} {bucket}: not assessable, it recalls only {pm(entry["accuracy"][bucket])} there.')
      cells.append(f'{label} {bucket}: n/a')
      continue
    outcome = compare(entry['drop'][bucket], constant(0.0), MIN_ACCURACY_EFFECT)
    parts.append(status(outcome))
    drop = entry['drop'][bucket]
    # The rule (compare) separates a drop of at least MIN_ACCURACY_EFFECT and beyond one standard deviation.
    smallest = max(MIN_ACCURACY_EFFECT, drop['std']) if drop['std'] is not None else None
    powers[f'{label} {bucket}'] = {'test': f'mean drop >= {MIN_ACCURACY_EFFECT} and beyond 1 std over seeds',
                                   'seeds': len(drop['values'] or []), 'smallest_separable_drop': smallest}
    why = (f'; at this spread the rule separates drops of at least {smallest:.2f}'
           if outcome == 'unclear' and smallest is not None and len(drop['values'] or []) >= 2 else '')
    evidence.append(f'{label} {bucket}: recall {pm(entry["accuracy"][bucket])} as trained, '
                    f'{pm(entry["restricted"][bucket])} with its full layers restricted '
                    f'(drop {pm(drop)}: {status(outcome)}{why}).')
    cells.append(f'{label} {bucket} {pm(entry["drop"][bucket])}')
  if not cells:
    return Verdict(name, _WHERE_CLAIM, NOT_ASSESSABLE, ['none of these arches was run.'], 'n/a')
  seeds = sorted({len(summary[label]['seeds']) for label, _ in cases if label in summary})
  measured = (f"recall drop when the full layers see only the small window (mean ± std over {'/'.join(map(str, seeds))}"
              f" seeds; counts when ≥ {MIN_ACCURACY_EFFECT} and beyond 1 std): " + '; '.join(cells))
  return Verdict(name, _WHERE_CLAIM, combine(parts), evidence + ([caveat] if caveat else []), measured, powers)


_WHERE_CLAIM = ('long-range retrieval is carried by the full-attention layers, even where an efficient layer could '
                'serve it, so restricting them to the small window lowers recall.')


_TREND_STATUS = {'reproduced': REPRODUCED, 'not reproduced': NOT_REPRODUCED, 'not separable': NOT_SEPARABLE}


def _trend_power(result: dict) -> dict:
  return {'test': 'Spearman rank trend (permutation p)', 'runs': result['n'],
          'detectable_rho': power.spearman(result['n']), 'power': power.POWER, 'alpha': power.ALPHA}


def _trend_verdict_text(result: dict, verdict: str) -> str:
  """The verdict of a trend, with what the design detects when it cannot separate."""
  if verdict != NOT_SEPARABLE or result['rho'] is None:
    return verdict
  return unseparated(result['p'], power.spearman(result['n']), what='|rho| ')


def _points(summary: dict, labels, values) -> tuple[list, list]:
  """(window per run, value per run) over the arches `labels`; values(entry) gives an arch's per-seed values."""
  xs, ys = [], []
  for label in labels:
    if label in summary:
      vals = values(summary[label])
      xs += [summary[label]['window']] * len(vals)
      ys += vals
  return xs, ys


def laziness(summary: dict, window_labels, probe_every: int, steps: int, caveat: str = '') -> Verdict:
  """A larger window delays the formation of the full layers' retrieval heads: the rank correlation between the
  window and the formation step over every run of the arches `window_labels` (small to large windows), read as a
  trend (hybrid_jax.study.trend). The formation step of a run is summary[label]['formation']['ablation'] (a full
  layer whose ablation costs recall beyond the large window); runs in which it never formed count as
  `steps + probe_every`. The recall-based formation step ('first') is reported beside it."""
  present = [label for label in window_labels if label in summary]
  if len(present) < 2:
    return Verdict('Large-window laziness', _LAZY_CLAIM, NOT_ASSESSABLE,
                   [f'needs at least two of {", ".join(window_labels)}.'], 'n/a')
  formation = lambda kind: (lambda e: e['formation'][kind]['step']['values'])
  if all(summary[label]['formation']['ablation']['never'] == len(summary[label]['seeds']) for label in present):
    return Verdict('Large-window laziness', _LAZY_CLAIM, NOT_ASSESSABLE,
                   [f'no run formed long-range retrieval in its full layers within {steps} steps.'], 'n/a')
  heads = trend.trend(*_points(summary, present, formation('ablation')))
  first = trend.trend(*_points(summary, present, formation('first')))
  verdict = _TREND_STATUS[trend.judge(heads, 'increasing')]
  per_arch = ', '.join(f"{label} (window {summary[label]['window']}) step "
                       f"{pm(summary[label]['formation']['ablation']['step'], 0)}" +
                       (f" ({summary[label]['formation']['ablation']['never']} never)"
                        if summary[label]['formation']['ablation']['never'] else '') for label in present)
  evidence = [f'first probe (every {probe_every} steps) at which ablating the full heads of a layer costs recall '
              f'beyond the large window: {per_arch}; censored runs count as step {steps + probe_every}.',
              f'Trend of that step with the window: {trend.describe(heads)}: {_trend_verdict_text(heads, verdict)}.',
              f'The first step at which recall beyond the large window reaches the formation threshold: '
              f'{trend.describe(first)}.']
  measured = f'formation step by window: {per_arch}; {trend.describe(heads)}{_detects_rho(heads)}'
  return Verdict('Large-window laziness', _LAZY_CLAIM, verdict, evidence + ([caveat] if caveat else []), measured,
                 {'trend': _trend_power(heads)})


def _detects_rho(result: dict) -> str:
  rho = power.spearman(result['n'])
  return '' if rho is None else f'; detects |rho| >= {rho:.2f} at {power.POWER * 100:.0f} % power'


_LAZY_CLAIM = 'a larger sliding window delays the formation of retrieval heads in the full-attention layers.'


def gradient_mechanism(summary: dict, window_labels, bucket: str, caveat: str = '') -> Verdict:
  """The study's explanation of laziness: before formation, long-range answers (here: those in `bucket`, where a
  larger window starts to serve them) carry a smaller share of the gradient into the full layers' queries and keys
  as the window grows. Each run's value is its gradient share in `bucket` (per_seed 'gradient_share', see
  hybrid_jax.study.mini_scoring.gradient_share) averaged over the probes before the earliest formation among the
  runs of `window_labels` (every probe when none formed), so every run is read at the same point of training and
  before any formed; a trend over every run (hybrid_jax.study.trend)."""
  present = [label for label in window_labels if label in summary]
  steps = [r['formation_step'] for label in present for r in _formed(summary[label]).values()]
  until = min(steps) if steps else None

  def share(run):
    early = [v for step, v in run['gradient_share'].get(bucket, []) if until is None or step < until]
    return float(np.mean(early)) if early else None

  values = {label: [share(r) for r in summary[label]['per_seed'].values()] for label in present}
  if len(present) < 2 or not any(v is not None for vs in values.values() for v in vs):
    when = f'before step {until}, the earliest formation' if until is not None else 'at any probe'
    return Verdict('Gradient signal behind laziness', _SIGNAL_CLAIM, NOT_ASSESSABLE,
                   [f"needs the probe's gradient share {when} for at least two window sizes."], 'n/a')
  xs = [summary[label]['window'] for label in present for _ in values[label]]
  result = trend.trend(xs, [v for label in present for v in values[label]])
  verdict = _TREND_STATUS[trend.judge(result, 'decreasing')]
  per_arch = ', '.join(f"{label} (window {summary[label]['window']}) {pm(spread(values[label]), 3)}"
                       for label in present)
  read = 'every probe (no run formed)' if until is None else f'the probes before step {until}'
  evidence = [f"share of the gradient into the full layers' query and key projections that answers {bucket} send "
              f"(their norm over the sum of every bucket's norm), mean over {read}"
              f"{'' if until is None else ', the earliest formation among these runs'}: {per_arch}.",
              f'Trend with the window: {trend.describe(result)}: {_trend_verdict_text(result, verdict)}.']
  return Verdict('Gradient signal behind laziness', _SIGNAL_CLAIM, verdict, evidence + ([caveat] if caveat else []),
                 f'q/k gradient share {bucket}, {read}: {per_arch}; {trend.describe(result)}{_detects_rho(result)}',
                 {'trend': _trend_power(result)})


_SIGNAL_CLAIM = ('a larger window weakens the gradient that long-range answers send to the full-attention layers '
                 'early in training, which is why they form their retrieval heads later.')


def _formed(entry: dict) -> dict:
  """{seed: per-seed record} of the runs that formed by the stopping rule."""
  return {seed: r for seed, r in entry['per_seed'].items() if r['formed']}


def _capped(entry: dict) -> int:
  return sum(r['formed'] is False for r in entry['per_seed'].values())


def _rule() -> str:
  return (f'recall beyond the large window at least {convergence.THRESHOLD} at {convergence.CONSECUTIVE} '
          'consecutive probes')


def _rate(label: str, entry: dict) -> str:
  rate = convergence.formation_rate(len(_formed(entry)), len(entry['per_seed']))
  if rate['rate'] is None:
    return f'{label} no runs'
  low, high = rate['interval']
  return f"{label} {rate['formed']} of {rate['total']} (95% exact interval {low:.2f} to {high:.2f})"


def _paired_text(result: dict, digits: int = 2) -> str:
  """'+0.42 (95% t interval 0.30 to 0.54; paired t p = 0.001, Wilcoxon p = 0.06; 5 pairs, detects >= 0.12)':
  detects, the paired t's smallest effect at 80 % power (hybrid_jax.study.power)."""
  if result['mean'] is None:
    return f"not measured ({result['n']} pairs)"
  low, high = result['interval']
  wilcoxon = 'n/a' if result['wilcoxon_p'] is None else f"{result['wilcoxon_p']:.3g}"
  dropped = f", {result['dropped']} seed(s) unpaired" if result['dropped'] else ''
  detectable = (result.get('power') or {}).get('paired_t')
  detects = '' if detectable is None else f', detects >= {detectable:.{digits}f}'
  return (f"{result['mean']:+.{digits}f} (95% t interval {low:.{digits}f} to {high:.{digits}f}; paired t p = "
          f"{result['p']:.3g}, Wilcoxon p = {wilcoxon}; {result['n']} pairs{dropped}{detects})")


def emergence_vs_final(summary: dict) -> Verdict:
  """On runs trained until formed (hybrid_jax.study.convergence): formation steps differ by arch (Kruskal-Wallis
  over the formed runs' formation steps, p < trend.ALPHA) while the formed runs' final recall (all queries) is
  equivalent across arches (convergence.equivalence within FINAL_MARGIN of the best). Runs capped without forming are
  counted per arch and left out; an arch with fewer than two formed runs is not judged. Final recall 'apart' is not
  reproduced; reproduced only with both parts; else not separable."""
  name = 'Emergence differs, final recall converges'
  formed = {label: _formed(entry) for label, entry in summary.items()}
  counts = ', '.join(f"{label} {len(formed[label])} of {len(e['per_seed'])}" +
                     (f" ({_capped(e)} capped)" if _capped(e) else '') for label, e in summary.items())
  labels = [label for label in summary if len(formed[label]) >= 2]
  unjudged = [label for label in summary if label not in labels]
  trained = f'runs trained until {_rule()}, formed per arch: {counts}; capped runs are not averaged in.'
  if len(labels) < 2:
    return Verdict(name, _EMERGENCE_CLAIM, NOT_ASSESSABLE,
                   [trained, 'needs two arches with at least two formed runs each.'], 'n/a')
  groups = {label: [r['formation_step'] for r in formed[label].values()] for label in labels}
  pooled = [v for g in groups.values() for v in g]
  p = 1.0 if max(pooled) == min(pooled) else float(stats.kruskal(*groups.values()).pvalue)
  final = convergence.equivalence({label: [r['recall']['all'] for r in formed[label].values()] for label in labels},
                                  FINAL_MARGIN)
  if final['verdict'] == 'apart':
    verdict = NOT_REPRODUCED
  else:
    verdict = REPRODUCED if p < trend.ALPHA and final['verdict'] == 'equivalent' else NOT_SEPARABLE
  best = final['best']
  gaps = ', '.join(f"{label} {a['difference']:.3f} ({a['interval'][0]:.3f} to {a['interval'][1]:.3f})"
                   for label, a in final['arches'].items() if label != best)
  steps = ', '.join(f'{label} {pm(spread(groups[label]), 0)}' for label in labels)
  spread_of_means = power.kruskal([len(g) for g in groups.values()], power.pooled_sd(groups.values()))
  finals = {label: [r['recall']['all'] for r in formed[label].values() if r['recall']['all'] is not None]
            for label in labels}
  sd = lambda values: float(np.std(values, ddof=1)) if len(values) >= 2 else None
  margins = {label: power.equivalence_margin(len(finals[best]), sd(finals[best]), len(v), sd(v))
             for label, v in finals.items() if label != best and len(v) >= 2 and len(finals[best]) >= 2}
  provable = max((m for m in margins.values() if m is not None), default=None)
  emerge = (f'Kruskal-Wallis p = {p:.3g} across {len(labels)} arches' + (
      f': {unseparated(p, spread_of_means, 0, "arch means spread by a standard deviation ", " steps")}'
      if p >= trend.ALPHA else ''))
  within = (f'; at this spread the design shows equivalence within >= {provable:.3f} at {power.POWER * 100:.0f} % '
            'power (were the arches equal)') if final['verdict'] == 'undecided' and provable else ''
  evidence = [trained,
              f'formation step of the formed runs: {steps}; {emerge}.',
              f"final recall (all queries) of the formed runs: best {best} "
              f"{final['arches'][best]['mean']:.3f}; below it by (95% Welch interval): {gaps}: {final['verdict']} "
              f'within {FINAL_MARGIN}{within}.']
  powers = {'kruskal_wallis': {'test': 'Kruskal-Wallis over formation steps', 'runs': [len(g) for g in groups.values()],
                               'pooled_sd': power.pooled_sd(groups.values()),
                               'detectable_sd_of_means': spread_of_means, 'power': power.POWER, 'alpha': power.ALPHA},
            'equivalence': {'test': 'Welch interval of best - arch below the margin', 'margin': FINAL_MARGIN,
                            'provable_margin': provable, 'per_arch': margins, 'power': power.POWER}}
  if unjudged:
    evidence.append(f"not judged (fewer than two formed runs): {', '.join(unjudged)}.")
  detects = ('' if spread_of_means is None else
             f', detects arch means spread by a standard deviation >= {spread_of_means:.0f} steps')
  shows = '' if provable is None else f', shows equivalence within >= {provable:.3f}'
  return Verdict(name, _EMERGENCE_CLAIM, verdict, evidence,
                 f"formation step of formed runs: {steps} (Kruskal-Wallis p = {p:.3g}{detects}); final recall below "
                 f"the best ({best}) by {gaps}: {final['verdict']} within {FINAL_MARGIN}{shows}; formed: {counts}",
                 powers)


_EMERGENCE_CLAIM = ('the hybrids differ in when long-range retrieval emerges during training, while their final '
                    'retrieval accuracy converges.')


def nope(summary: dict, buckets, fixed_steps: bool = False) -> Verdict:
  """NoPE on the full layers of the small-window hybrid recalls more beyond the training context than RoPE full
  layers, at no cost in held-out loss at the training length. Paired by seed (hybrid_jax.study.convergence.paired,
  two-sided): recall in each of `buckets` (extrapolation buckets beyond the training context, e.g. at 2x and 4x the
  training length) and held-out loss. Runs trained until formed pair over the seeds where both arches formed;
  `fixed_steps` (a preset that trains every run the same steps, e.g. mini-5k) pairs every seed, formed or not, and
  reads recall in context (all queries at the training length, where a cost would show) beside them: the comparison
  at a matched budget. Fewer than MIN_PAIRS pairs is not separable. Each arch's formation rate is reported beside
  it, and each part what its tests detect (hybrid_jax.study.power)."""
  name = 'NoPE on full layers'
  if not {'SWA-128', 'SWA-128-NoPE'} <= set(summary):
    return Verdict(name, _NOPE_CLAIM, NOT_ASSESSABLE, ['needs SWA-128 and SWA-128-NoPE.'], 'n/a')
  if fixed_steps:
    rope, no_pe = summary['SWA-128']['per_seed'], summary['SWA-128-NoPE']['per_seed']
    rates = (f"Runs of the same steps each; formed by {_rule()} (not required here): "
             f"{_rate('SWA-128-NoPE', summary['SWA-128-NoPE'])}, {_rate('SWA-128', summary['SWA-128'])}.")
    scope, lacking = 'every seed pair (the same steps each, formed or not)', 'seed pair(s)'
  else:
    rope, no_pe = _formed(summary['SWA-128']), _formed(summary['SWA-128-NoPE'])
    rates = (f"Runs trained until {_rule()}, formed: {_rate('SWA-128-NoPE', summary['SWA-128-NoPE'])}, "
             f"{_rate('SWA-128', summary['SWA-128'])}.")
    scope, lacking = 'seeds where both formed', 'seed(s) formed in both arches'
  both = len(set(rope) & set(no_pe))
  if both < MIN_PAIRS:
    return Verdict(name, _NOPE_CLAIM, NOT_SEPARABLE,
                   [f'only {both} {lacking}; the paired comparison needs {MIN_PAIRS}.', rates],
                   f'{both} {"pairs" if fixed_steps else "formed pairs"} (needs {MIN_PAIRS})',
                   {'pairs': both, 'needs': MIN_PAIRS})
  parts, evidence, cells, powers = [], [], [], {}

  def judged(result, part, digits=2):
    """'<part>', or 'not separable (p ..); the design detects ...' when the part cannot tell."""
    return _unseparated_pairs(result, digits) if part == NOT_SEPARABLE else part

  def no_cost(result, worse):
    """The status of a 'no cost' part: `worse` ('greater' for loss, 'less' for recall) is a cost."""
    if result['n'] < MIN_PAIRS:
      return NOT_ASSESSABLE
    return NOT_SEPARABLE if result['outcome'] == 'unclear' else NOT_REPRODUCED if result['outcome'] == worse else \
        REPRODUCED

  if fixed_steps:
    context = convergence.paired({s: r['recall'].get('all') for s, r in no_pe.items()},
                                 {s: r['recall'].get('all') for s, r in rope.items()}, MIN_ACCURACY_EFFECT)
    part = no_cost(context, 'less')
    parts.append(part)
    powers['recall in context'] = _paired_power(context)
    evidence.append(f'recall in context (all queries at the training length), SWA-128-NoPE minus SWA-128 seed by '
                    f'seed: {_paired_text(context)}: {judged(context, part)}.')
    cells.append(f'recall in context {_paired_text(context)}')
  for bucket in buckets:
    result = convergence.paired({s: r['extrapolation'].get(bucket) for s, r in no_pe.items()},
                                {s: r['extrapolation'].get(bucket) for s, r in rope.items()}, MIN_ACCURACY_EFFECT)
    part = status(result['outcome']) if result['n'] >= MIN_PAIRS else NOT_ASSESSABLE
    parts.append(part)
    powers[f'recall {bucket}'] = _paired_power(result)
    evidence.append(f'recall {bucket}, SWA-128-NoPE minus SWA-128 seed by seed: {_paired_text(result)}: '
                    f'{judged(result, part)}.')
    cells.append(f"recall {bucket} {_paired_text(result)}")
  loss = convergence.paired({s: r['held_out_loss'] for s, r in no_pe.items()},
                            {s: r['held_out_loss'] for s, r in rope.items()}, MIN_LOSS_EFFECT)
  # No cost: NoPE's loss is not higher (same or lower); higher is a cost.
  loss_status = no_cost(loss, 'greater')
  powers['held-out loss'] = _paired_power(loss)
  evidence += [f'held-out loss at the training length (nats per byte), SWA-128-NoPE minus SWA-128: '
               f'{_paired_text(loss, 4)}: {judged(loss, loss_status, 4)}.', rates]
  measured = f'NoPE minus RoPE over {scope}: ' + '; '.join(cells + [f'loss {_paired_text(loss, 4)}'])
  return Verdict(name, _NOPE_CLAIM, combine(parts + [loss_status]), evidence, measured, powers)


_NOPE_CLAIM = ('removing positional encoding from the full-attention layers of a small-window hybrid improves '
               'long-context recall (here: beyond the training context) at no short-context cost.')
