"""The mini-study's verdicts and plain findings, read from the summary over seeds (hybrid_jax.study.mini_scoring)."""

from hybrid_jax.study import convergence, load, verdicts
from hybrid_jax.study.presets import (ARCHES, BEYOND_CONTEXT, BUCKETS, EXTRAPOLATION_BUCKETS, PRESETS,
                                      RECURRENT_ARCHES, WINDOW_ARCHES, Preset, at_factor, run_config)
from hybrid_jax.study.verdicts import pm

_BETWEEN, _BEYOND = BUCKETS[1], BUCKETS[2]


def restriction_cases(labels) -> list[tuple[str, str]]:
  """(label, bucket) pairs the restriction verdict tests: between the windows for a hybrid whose window reaches
  there (the middle and large windows), between the windows and beyond the large one for the others (their efficient
  layers reach those distances only through a recurrent state, or not at all)."""
  cases = []
  for label in [label for label in ARCHES if label in labels and label != 'Full']:  # The report's order.
    role = ARCHES[label][1]
    cases += [(label, _BETWEEN)] if role in ('middle', 'large') else [(label, _BETWEEN), (label, _BEYOND)]
  return cases


def judge(summary: dict, preset: Preset) -> list:
  """The verdicts (hybrid_jax.study.verdicts) on a summary, in the order of the report's table."""
  config = run_config('SWA-2048', preset)
  where_caveat = lazy_caveat = ''
  if config.model.num_layers <= len(config.model.cycle):  # One cycle: the sliding layer lies only below the full one.
    alone = ('With one sliding layer under one full layer, the sliding layer cannot do both hops of the recall circuit '
             '(gather the value, match the key) alone')
    where_caveat = (f'{alone}, so a drop between the windows is expected here by construction; the two-cycle preset '
                    '(mini-deep) puts a sliding layer above a full one.')
    lazy_caveat = (f"{alone}, so the study's mechanism (sliding layers that retrieve inside their window leave the "
                   'full layers lazy) cannot act here; the steps compare how fast the two-layer circuit forms under a '
                   'wider first layer.')
  sliding = [label for label in summary if label not in RECURRENT_ARCHES]
  recurrent = [label for label in summary if label in RECURRENT_ARCHES]
  return [verdicts.where_retrieval_lives(summary, restriction_cases(sliding), where_caveat,
                                         'Where retrieval lives (sliding-window hybrids)'),
          verdicts.where_retrieval_lives(summary, restriction_cases(recurrent), '',
                                         'Where retrieval lives (recurrent hybrids)'),
          verdicts.laziness(summary, WINDOW_ARCHES, preset.probe_every, preset.steps, lazy_caveat),
          verdicts.gradient_mechanism(summary, WINDOW_ARCHES, _BETWEEN, lazy_caveat),
          verdicts.emergence_vs_final(summary),
          verdicts.nope(summary, [at_factor(BEYOND_CONTEXT, f) for f in preset.extrapolation_factors],
                        fixed_steps=not preset.stop_when_formed)]


def loads(labels, preset: Preset) -> dict:
  """{label: recall_load} of each arch (hybrid_jax.study.load): the records its recurrent layers are asked to hold
  per key dimension; {} for an arch without a recurrent layer."""
  out = {}
  for label in labels:
    config = run_config(label, preset)
    out[label] = load.recall_load(config.data, config.model)
  return out


def _formed(f: dict, what: str, steps: int, probe_every: int, seeds: int) -> str:
  if f['never'] == seeds:
    return f'{what}: never in {steps} steps'
  return (f"{what}: step {pm(f['step'], 0)}" +
          (f" (never in {f['never']} seed(s), counted as step {steps + probe_every})" if f['never'] else ''))


def _converged(e: dict) -> str:
  runs = list(e['per_seed'].values())
  steps = [r['formation_step'] for r in runs if r['formed']]
  capped = sum(r['formed'] is False for r in runs)
  return (f"by the stopping rule (recall {_BEYOND} at least {convergence.THRESHOLD} at {convergence.CONSECUTIVE} "
          f"consecutive probes) formed in {len(steps)} of {len(runs)} seed(s)" +
          (f" at step {pm(verdicts.spread(steps), 0)}" if steps else '') + (f", {capped} capped" if capped else ''))


def findings(report: dict) -> list[str]:
  """Plain statements of what the measured numbers show, before the verdicts."""
  p, summary = report['settings'], report['summary']
  preset = PRESETS[report['preset']]
  recall = dict(p['recall'])
  r = run_config('Full', preset).data.recall
  chance = 1 / r.value_chars ** r.value_length
  n = len(report['seeds'])
  pairs = f'{r.pairs_min} to {r.pairs}' if r.pairs_min and r.pairs_min != r.pairs else f'{r.pairs}'
  held = f' (held-out documents {r.eval_pairs or r.pairs})' if pairs != f'{r.eval_pairs or r.pairs}' else ''
  lines = [
      f"Setup: {p['scale']} scale {dict(p['model']) or ''}, {p['steps']} steps of {p['batch_size']} rows of "
      f"{p['seq_len']} bytes, {n} seed(s). Recall documents hold {pairs}{held} key-value pairs (keys of {r.key_length} "
      f"of {r.key_chars} letters, values of {r.value_length} of {r.value_chars} digits: chance {chance:.3f}), "
      f"{r.text_fraction:.0%} of documents are ordinary text{'; ' + str(recall) if recall else ''}. The study's "
      f"windows 128 / 512 / 2048 are {p['small_window']} / {p['middle_window']} / {p['large_window']} tokens here. "
      f"Distance buckets: inside the small window (d <= {p['small_window']}), between the windows "
      f"({p['small_window']} < d <= {p['large_window']}), beyond the large window (d > {p['large_window']}), and at "
      f"{' and '.join(f'{f}x' for f in p['extrapolation_factors'])} the training length {BEYOND_CONTEXT} "
      f"(d > {p['seq_len']}); a query is correct when every answer byte is the argmax under teacher forcing; "
      f"{p['eval_documents']} held-out documents per run; ± is the standard deviation across seeds."]
  for label, e in summary.items():
    lines.append(f'{label}: recall ' + ', '.join(f'{b} {pm(e["accuracy"][b])}' for b in BUCKETS) +
                 ' (answer bytes right: ' + ', '.join(pm(e['byte_accuracy'][b]) for b in BUCKETS) + ')' +
                 f"; with its full-attention layers restricted to the last {p['small_window']} tokens: " +
                 ', '.join(f'{b} {pm(e["restricted"][b])}' for b in BUCKETS) + '; drop ' +
                 ', '.join(f'{b} {pm(e["drop"][b])}' for b in BUCKETS[1:]) +
                 ''.join(f"; at {x['length']} tokens: " +
                         ', '.join(f'{b} {pm(e["extrapolation"][at_factor(b, x["factor"])])}'
                                   for b in EXTRAPOLATION_BUCKETS) for x in report['extrapolation']) +
                 f"; held-out loss {pm(e['held_out_loss'], 4)}.")
  for label, e in summary.items():
    mass = [f"layer {layer}: {_BETWEEN} {pm(by_bucket[_BETWEEN])}, {_BEYOND} {pm(by_bucket[_BEYOND])}"
            for layer, by_bucket in e['full_layers'].items()]
    ablation = [f"layer {layer}: one head {pm(a['best'][_BEYOND])}, all its full heads {pm(a['all'][_BEYOND])}"
                for layer, a in e['ablation'].items()]
    f = e['formation']
    lines.append(
        f"{label}: final retrieval-head scores of its full-attention heads, attention mass on the queried record "
        f"(best head): " + '; '.join(mass) + f"; recall lost {_BEYOND} by ablating " + '; '.join(ablation) + '. ' +
        _formed(f['first'], f"recall {_BEYOND} reached {f['threshold']}", p['steps'], p['probe_every'], n) + '; ' +
        _formed(f['ablation'], f"ablating a layer's full heads first cost {f['ablation_threshold']} there",
                p['steps'], p['probe_every'], n) + '; ' + _converged(e) +
        f"; gradient to the full layers' queries and keys up to step {p['signal_until']}: " +
        ', '.join(f"{b} {pm(e['gradient_signal'][b], 4)}" for b in BUCKETS) + '.')
  described = {label: load.describe(x) for label, x in (report.get('load') or {}).items() if x}
  if described:
    lines.append('Load (records per recurrent key dimension, hybrid_jax.study.load): ' +
                 '; '.join(f'{label}: {text}' for label, text in described.items()) + '.')
  lines.append("Not shown: anything about the study's scales, token budgets, natural-text retrieval or 16K context.")
  return lines
