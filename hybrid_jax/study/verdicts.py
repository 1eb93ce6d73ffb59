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
(laziness, the gradient signal behind it) are read as a trend over every run instead (hybrid_jax.study.trend). A claim whose precondition fails (the
arch never learned to recall where the claim is about) is 'not assessable' and says why.

Everything here works on the report's summary (hybrid_jax.study.mini_scoring.summarize), so the logic is tested on
hand-built summaries without training anything.
"""

import dataclasses

import numpy as np
from scipy import stats

from hybrid_jax.study import trend

REPRODUCED = 'reproduced'
NOT_REPRODUCED = 'not reproduced'
NOT_SEPARABLE = 'not separable at this spread'
NOT_ASSESSABLE = 'not assessable'

# Smallest effects that count: recall accuracy (a fraction of queries) and held-out loss (nats per byte). A
# formation step's smallest effect is one probe interval (the probe cannot resolve less).
MIN_ACCURACY_EFFECT = 0.1
MIN_LOSS_EFFECT = 0.01
LEARNED = 0.5  # Recall accuracy (seed mean) from which an arch counts as retrieving in a bucket.


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


@dataclasses.dataclass(frozen=True)
class Verdict:
  name: str
  claim: str  # What the study says, in the mini-study's terms.
  status: str
  evidence: list  # One sentence per part, with its numbers.
  measured: str = ''  # One cell of the report's table: the numbers the status is read from, with the statistic.

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
  parts, evidence, cells = [], [], []
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
    evidence.append(f'{label} {bucket}: recall {pm(entry["accuracy"][bucket])} as trained, '
                    f'{pm(entry["restricted"][bucket])} with its full layers restricted '
                    f'(drop {pm(entry["drop"][bucket])}: {status(outcome)}).')
    cells.append(f'{label} {bucket} {pm(entry["drop"][bucket])}')
  if not cells:
    return Verdict(name, _WHERE_CLAIM, NOT_ASSESSABLE, ['none of these arches was run.'], 'n/a')
  seeds = sorted({len(summary[label]['seeds']) for label, _ in cases if label in summary})
  measured = (f"recall drop when the full layers see only the small window (mean ± std over {'/'.join(map(str, seeds))}"
              f" seeds; counts when ≥ {MIN_ACCURACY_EFFECT} and beyond 1 std): " + '; '.join(cells))
  return Verdict(name, _WHERE_CLAIM, combine(parts), evidence + ([caveat] if caveat else []), measured)


_WHERE_CLAIM = ('long-range retrieval is carried by the full-attention layers, even where an efficient layer could '
                'serve it, so restricting them to the small window lowers recall.')


_TREND_STATUS = {'reproduced': REPRODUCED, 'not reproduced': NOT_REPRODUCED, 'not separable': NOT_SEPARABLE}


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
              f'Trend of that step with the window: {trend.describe(heads)}: {verdict}.',
              f'The first step at which recall beyond the large window reaches the formation threshold: '
              f'{trend.describe(first)}.']
  measured = f'formation step by window: {per_arch}; {trend.describe(heads)}'
  return Verdict('Large-window laziness', _LAZY_CLAIM, verdict, evidence + ([caveat] if caveat else []), measured)


_LAZY_CLAIM = 'a larger sliding window delays the formation of retrieval heads in the full-attention layers.'


def gradient_mechanism(summary: dict, window_labels, bucket: str, signal_until: int, caveat: str = '') -> Verdict:
  """The study's explanation of laziness: the gradient that long-range answers (here: those in `bucket`, where a
  larger window starts to serve them) send to the full layers' queries and keys before formation shrinks as the
  window grows. A trend over every run of `window_labels`; the signal is summary[label]['gradient_signal']."""
  present = [label for label in window_labels if label in summary]
  values = lambda e: e['gradient_signal'][bucket]['values']
  if len(present) < 2 or not any(values(summary[label]) for label in present):
    return Verdict('Gradient signal behind laziness', _SIGNAL_CLAIM, NOT_ASSESSABLE,
                   ['needs the probe\'s gradient signal for at least two window sizes.'], 'n/a')
  result = trend.trend(*_points(summary, present, values))
  verdict = _TREND_STATUS[trend.judge(result, 'decreasing')]
  per_arch = ', '.join(f"{label} (window {summary[label]['window']}) "
                       f"{pm(summary[label]['gradient_signal'][bucket], 4)}" for label in present)
  evidence = [f'norm of the gradient that answers {bucket} send to the full layers\' query and key projections, '
              f'mean over the probes up to step {signal_until}: {per_arch}.',
              f'Trend with the window: {trend.describe(result)}: {verdict}.']
  return Verdict('Gradient signal behind laziness', _SIGNAL_CLAIM, verdict, evidence + ([caveat] if caveat else []),
                 f'q/k gradient norm {bucket}, steps ≤ {signal_until}: {per_arch}; {trend.describe(result)}')


_SIGNAL_CLAIM = ('a larger window weakens the gradient that long-range answers send to the full-attention layers '
                 'early in training, which is why they form their retrieval heads later.')


def emergence_vs_final(summary: dict) -> Verdict:
  """Formation steps differ by arch (Kruskal-Wallis over the arches' per-seed recall-based formation steps,
  p < trend.ALPHA) while final recall converges (the best and the worst arch's overall recall are the 'same' by
  `compare`); final recall that differs beyond the spreads is 'not reproduced'."""
  labels = [label for label, e in summary.items() if len(e['formation']['first']['step']['values']) >= 2]
  if len(labels) < 2:
    return Verdict('Emergence differs, final recall converges', _EMERGENCE_CLAIM, NOT_ASSESSABLE,
                   ['needs two arches with at least two seeds each.'], 'n/a')
  groups = [summary[label]['formation']['first']['step']['values'] for label in labels]
  pooled = [v for g in groups for v in g]
  p = 1.0 if max(pooled) == min(pooled) else float(stats.kruskal(*groups).pvalue)
  finals = {label: summary[label]['accuracy']['all'] for label in labels}
  best = max(labels, key=lambda label: finals[label]['mean'])
  worst = min(labels, key=lambda label: finals[label]['mean'])
  final = compare(finals[best], finals[worst], MIN_ACCURACY_EFFECT)
  if final == 'greater':
    verdict = NOT_REPRODUCED
  else:
    verdict = REPRODUCED if p < trend.ALPHA and final == 'same' else NOT_SEPARABLE
  steps = ', '.join(f"{label} {pm(summary[label]['formation']['first']['step'], 0)}" for label in labels)
  evidence = [f'formation step (recall beyond the large window reaches the threshold): {steps}; Kruskal-Wallis '
              f'p = {p:.3g} across {len(labels)} arches.',
              f"final recall (all queries): best {best} {pm(finals[best])}, worst {worst} {pm(finals[worst])}: "
              f"{'the same' if final == 'same' else 'apart' if final == 'greater' else 'not separable'}."]
  return Verdict('Emergence differs, final recall converges', _EMERGENCE_CLAIM, verdict, evidence,
                 f'formation steps by arch (Kruskal-Wallis p = {p:.3g}); final recall {pm(finals[worst])} '
                 f'({worst}) to {pm(finals[best])} ({best})')


_EMERGENCE_CLAIM = ('the hybrids differ in when long-range retrieval emerges during training, while their final '
                    'retrieval accuracy converges.')


def nope(summary: dict, extrapolation_bucket: str) -> Verdict:
  """NoPE on the full layers of the small-window hybrid recalls more beyond the training context (documents of
  twice the training length) than RoPE full layers, at no cost in held-out loss at the training length."""
  if not {'SWA-128', 'SWA-128-NoPE'} <= set(summary):
    return Verdict('NoPE on full layers', _NOPE_CLAIM, NOT_ASSESSABLE, ['needs SWA-128 and SWA-128-NoPE.'], 'n/a')
  rope, no_pe = summary['SWA-128'], summary['SWA-128-NoPE']
  long_outcome = compare(no_pe['extrapolation'][extrapolation_bucket], rope['extrapolation'][extrapolation_bucket],
                         MIN_ACCURACY_EFFECT)
  loss_outcome = compare(no_pe['held_out_loss'], rope['held_out_loss'], MIN_LOSS_EFFECT)
  # No cost: NoPE's loss is not higher (same or lower); higher is a cost.
  loss_status = NOT_SEPARABLE if loss_outcome == 'unclear' else (
      NOT_REPRODUCED if loss_outcome == 'greater' else REPRODUCED)
  evidence = [
      f"recall {extrapolation_bucket}: SWA-128-NoPE {pm(no_pe['extrapolation'][extrapolation_bucket])}, SWA-128 "
      f"{pm(rope['extrapolation'][extrapolation_bucket])}: {status(long_outcome)}.",
      f"held-out loss at the training length (nats per byte): SWA-128-NoPE {pm(no_pe['held_out_loss'], 4)}, "
      f"SWA-128 {pm(rope['held_out_loss'], 4)}: {loss_status}."]
  measured = (f"recall {extrapolation_bucket}: {pm(no_pe['extrapolation'][extrapolation_bucket])} NoPE vs "
              f"{pm(rope['extrapolation'][extrapolation_bucket])} RoPE; held-out loss {pm(no_pe['held_out_loss'], 3)}"
              f" vs {pm(rope['held_out_loss'], 3)} ({len(no_pe['seeds'])}/{len(rope['seeds'])} seeds)")
  return Verdict('NoPE on full layers', _NOPE_CLAIM, combine([status(long_outcome), loss_status]), evidence,
                 measured)


_NOPE_CLAIM = ('removing positional encoding from the full-attention layers of a small-window hybrid improves '
               'long-context recall (here: beyond the training context) at no short-context cost.')
