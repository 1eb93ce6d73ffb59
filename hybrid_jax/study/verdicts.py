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
effect does, and 'not separable at this spread' when the seeds cannot tell. A claim whose precondition fails (the
arch never learned to recall where the claim is about) is 'not assessable' and says why.

Everything here works on the report's summary (hybrid_jax.study.mini.summarize), so the logic is tested on
hand-built summaries without training anything.
"""

import dataclasses

import numpy as np

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

  def text(self) -> str:
    return f"{self.name}: {self.status.upper()}. The study: {self.claim} Here: {' '.join(self.evidence)}"


def _learned(entry: dict, bucket: str) -> bool:
  mean = entry['accuracy'][bucket]['mean']
  return mean is not None and mean >= LEARNED


def where_retrieval_lives(summary: dict, buckets, caveat: str = '') -> Verdict:
  """Restricting the full layers to the small window lowers recall: between the windows for the large-window
  hybrid (its sliding layers could serve it there, yet its full layers do), and beyond the small window for the
  small-window hybrids (only their full layers reach there). `caveat` (a sentence) is added to the evidence."""
  between, beyond = buckets[1], buckets[2]
  parts, evidence = [], []
  cases = [('SWA-2048', between)] + [(label, b) for label in ('SWA-128', 'SWA-128-NoPE') for b in (between, beyond)]
  for label, bucket in cases:
    if label not in summary:
      continue
    entry = summary[label]
    if not _learned(entry, bucket):
      parts.append(NOT_ASSESSABLE)
      evidence.append(f'{label} {bucket}: not assessable, it recalls only {pm(entry["accuracy"][bucket])} there.')
      continue
    outcome = compare(entry['drop'][bucket], constant(0.0), MIN_ACCURACY_EFFECT)
    parts.append(status(outcome))
    evidence.append(f'{label} {bucket}: recall {pm(entry["accuracy"][bucket])} as trained, '
                    f'{pm(entry["restricted"][bucket])} with its full layers restricted '
                    f'(drop {pm(entry["drop"][bucket])}: {status(outcome)}).')
  return Verdict('Where retrieval lives', 'long-range retrieval is carried by the full-attention layers, even where '
                 'a large window could serve it, so restricting them to the small window lowers recall.',
                 combine(parts), evidence + ([caveat] if caveat else []))


def laziness(summary: dict, probe_every: int, steps: int, caveat: str = '') -> Verdict:
  """A larger window delays the step at which the full layers' long-range retrieval forms (the first probe at which
  recall beyond the large window, which only full attention reaches, crosses a threshold; per seed in
  summary[label]['formation']['step'], a spread; runs in which it never formed count as `steps + probe_every`).
  `caveat` (a sentence) is added to the evidence."""
  if not {'SWA-128', 'SWA-2048'} <= set(summary):
    return Verdict('Large-window laziness', _LAZY_CLAIM, NOT_ASSESSABLE, ['needs SWA-128 and SWA-2048.'])
  small, large = summary['SWA-128']['formation'], summary['SWA-2048']['formation']
  if all(f['never'] and f['never'] == len(f['step']['values']) for f in (small, large)):
    return Verdict('Large-window laziness', _LAZY_CLAIM, NOT_ASSESSABLE,
                   [f'neither arch learned to recall beyond the large window within {steps} steps.'])
  outcome = compare(large['step'], small['step'], probe_every)
  censored = [f"{label} never did in {f['never']} of {len(f['step']['values'])} seeds (counted as step "
              f'{steps + probe_every})' for label, f in (('SWA-2048', large), ('SWA-128', small)) if f['never']]
  evidence = [f"first probe at which recall beyond the large window (only the full layers reach there) reaches "
              f"{small['threshold']}: SWA-2048 step {pm(large['step'], 0)}, SWA-128 step "
              f"{pm(small['step'], 0)} (probe every {probe_every} steps): {status(outcome)}" +
              (f"; {'; '.join(censored)}" if censored else '') + '.']
  if 'SWA-128-NoPE' in summary:
    evidence.append(f"SWA-128-NoPE: step {pm(summary['SWA-128-NoPE']['formation']['step'], 0)}.")
  if 'Full' in summary:
    evidence.append(f"Full: step {pm(summary['Full']['formation']['step'], 0)}.")
  return Verdict('Large-window laziness', _LAZY_CLAIM, status(outcome), evidence + ([caveat] if caveat else []))


_LAZY_CLAIM = 'a larger sliding window delays the formation of retrieval heads in the full-attention layers.'


def nope(summary: dict, extrapolation_bucket: str) -> Verdict:
  """NoPE on the full layers of the small-window hybrid recalls more beyond the training context (documents of
  twice the training length) than RoPE full layers, at no cost in held-out loss at the training length."""
  if not {'SWA-128', 'SWA-128-NoPE'} <= set(summary):
    return Verdict('NoPE on full layers', _NOPE_CLAIM, NOT_ASSESSABLE, ['needs SWA-128 and SWA-128-NoPE.'])
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
  return Verdict('NoPE on full layers', _NOPE_CLAIM, combine([status(long_outcome), loss_status]), evidence)


_NOPE_CLAIM = ('removing positional encoding from the full-attention layers of a small-window hybrid improves '
               'long-context recall (here: beyond the training context) at no short-context cost.')
