"""The stopping rule for training until long-range retrieval has formed.

A verdict about converged models needs each run trained until its retrieval has formed, not for a fixed number of
steps that leaves slow formers half way. Formation counts when the probe's recall (in the mini-study: recall beyond
the large window, `probe_recall_accuracy_<lo>_<hi>`) is at least THRESHOLD at CONSECUTIVE probes in a row: one good
probe can be luck on few documents, two in a row rarely are. A probe with no value (None or NaN) breaks a streak.

One rule, read two ways. A training hook (hybrid_jax/standard_hooks.py) calls `should_stop(history)` after each probe with
the (step, value) pairs probed so far and stops training when it is True; a run that never stops is capped at its
step budget. After training, `formed_at` and `formation_step` read the same rule off a run's probe curve (both call
`should_stop`, so the two cannot disagree).
"""

import math

THRESHOLD = 0.95
CONSECUTIVE = 2


def _reached(value, threshold: float) -> bool:
  return value is not None and not math.isnan(value) and value >= threshold


def should_stop(history, threshold: float = THRESHOLD, consecutive: int = CONSECUTIVE) -> bool:
  """True when the last `consecutive` probes of `history` ([(step, value)] in the order probed) all reach
  `threshold`."""
  if consecutive < 1:
    raise ValueError(f'consecutive={consecutive}: must be >= 1')
  last = list(history)[-consecutive:]
  return len(last) == consecutive and all(_reached(value, threshold) for _, value in last)


def _confirmed(steps, values, threshold: float, consecutive: int) -> tuple[list, int | None]:
  """(the probes in step order, the index of the probe at which the rule first stops, or None). A step logged
  twice (a resumed run probes it again) counts once, with its last value."""
  history = sorted(dict(zip(steps, values)).items())
  stop = next((i for i in range(len(history)) if should_stop(history[:i + 1], threshold, consecutive)), None)
  return history, stop


def formed_at(steps, values, threshold: float = THRESHOLD, consecutive: int = CONSECUTIVE) -> int | None:
  """The step at which formation is confirmed (the last of the first `consecutive` probes in a row that reach
  `threshold`: where a hook calling should_stop stops training), or None if it never is."""
  history, stop = _confirmed(steps, values, threshold, consecutive)
  return None if stop is None else history[stop][0]


def formation_step(steps, values, threshold: float = THRESHOLD, consecutive: int = CONSECUTIVE) -> int | None:
  """The step at which retrieval formed: the first probe of the streak that formed_at confirms, or None."""
  history, stop = _confirmed(steps, values, threshold, consecutive)
  return None if stop is None else history[stop - consecutive + 1][0]
