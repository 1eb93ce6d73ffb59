"""The mini-study's numbers: one trained run scored, and the runs of each arch summarised over seeds.

A run is scored on held-out recall documents by distance bucket (hybrid_jax.study.presets.BUCKETS): as trained,
with its full-attention layers restricted to the small window (hybrid_jax.inspection.windowed), on documents of 2x
and 4x the training length, and by head ablation (hybrid_jax.eval.recall_mechanism). Its probe curves (logged during
training) give when retrieval formed and the gradient signal that reached the full layers before it did; whether a
run formed by the stopping rule (hybrid_jax.study.convergence) is read from the same curves.
"""

import math
import pathlib
import re

import numpy as np

from hybrid_jax.analysis import callbacks
from hybrid_jax.inspection.windowed import Restriction
from hybrid_jax.eval import recall as recall_eval, recall_mechanism
from hybrid_jax.study import convergence
from hybrid_jax.study.presets import ARCHES, BUCKETS, EXTRAPOLATION_BUCKETS, Preset, at_factor, extrapolation_data
from hybrid_jax.study.verdicts import spread
from hybrid_jax.train import metrics as metrics_lib


def curves(workdir) -> dict:
  """Train loss and every probe metric, as [(step, value)] lists."""
  records = metrics_lib.read_jsonl(pathlib.Path(workdir) / 'metrics.jsonl')
  out = {'train_loss': [(r['step'], r['loss']) for r in records if r['kind'] == 'train' and 'loss' in r]}
  for r in records:
    if r['kind'] == 'probe':
      for key, value in r.items():
        if key not in ('step', 'kind') and isinstance(value, (int, float)):
          out.setdefault(f'probe_{key}', []).append((r['step'], value))
  return out


def evaluate(run, preset: Preset) -> dict:
  """Recall by distance as trained, with the full-attention layers restricted to the small window, on documents
  of each extrapolation factor x the training length, and the recall each full head carries (head ablation)."""
  held = recall_eval.held_out(run.config.data, preset.eval_documents)
  out = {}
  for name, restriction in (('recall', None), ('restricted', Restriction('full', preset.small_window))):
    evaluator = recall_eval.RecallEval(run.model_def, run.config.model, held, preset.edges, restriction=restriction)
    correct, mass = evaluator.run(run.params)
    out[name] = evaluator.summary(correct, mass)
    out[f'{name}_fine'] = recall_eval.score(correct, held.distances, preset.fine_edges)
  out['extrapolation'] = []
  for factor in preset.extrapolation_factors:
    long_held = recall_eval.held_out(extrapolation_data(run.config.data, preset, factor), preset.eval_documents)
    edges = preset.extrapolation_edges(factor)
    correct, _ = recall_eval.RecallEval(run.model_def, run.config.model, long_held, edges).run(run.params)
    out['extrapolation'].append({'factor': factor, **recall_eval.score(correct, long_held.distances, edges)})
  out['ablation'] = recall_mechanism.RecallMechanism(run.model_def, run.config.model, held, preset.edges).ablation(
      run.params)
  return out


def probe_names(preset: Preset) -> list[str]:
  """Probe metric suffix of each bucket of BUCKETS ('<lo>_<hi>' over the probe's edges)."""
  edges = callbacks.recall_edges(preset.distance_ranges)
  return [f'{lo}_{hi}' for lo, hi in zip(edges, edges[1:])]


def _formation_step(curve, threshold: float):
  """First probed step whose value reaches `threshold` (None if never)."""
  return next((step for step, value in curve if value >= threshold), None)


def formation(run_curves: dict, full_layers, preset: Preset) -> dict:
  """When the full layers' long-range retrieval formed, from the probe (None: never):
  - 'first': the first step at which recall beyond the large window (only full attention reaches there) is at
    least the preset's formation threshold;
  - 'layers': per layer with full heads, the first step at which ablating its full heads lowers recall beyond the
    large window by at least the preset's ablation threshold (the layer has become the one that retrieves);
  - 'ablation': the first of those over the layers (the laziness trend is read from it);
  - 'mass_layers': per layer, the first step at which its best head's attention mass on the record there reaches
    the formation threshold. Mass misses a full layer that reads the record from the positions a sliding layer
    copied it to (docs/notebook/mini_study.md, "Why the hybrids did not learn the 1-pair task"), which is why
    ablation decides. Whole layers, not single heads: in 4 of 15 runs that recall every query, no single head's
    ablation cost more than 0.19 (heads that back each other up)."""
  name = probe_names(preset)[2]
  step = lambda key, threshold: _formation_step(run_curves.get(key, []), threshold)
  layers = {str(i): step(f'probe_recall_ablation_layer{i}_all_{name}', preset.ablation_threshold)
            for i in full_layers}
  formed = [s for s in layers.values() if s is not None]
  return {'first': step(f'probe_recall_accuracy_{name}', preset.formation_threshold), 'layers': layers,
          'ablation': min(formed) if formed else None,
          'mass_layers': {str(i): step(f'probe_recall_mass_layer{i}_{name}', preset.formation_threshold)
                          for i in full_layers}}


def gradient_signal(run_curves: dict, full_layers, preset: Preset) -> list:
  """Per bucket of BUCKETS: the gradient that answers there sent to the full layers' queries and keys (the norm
  over every full layer), averaged over the probes up to the preset's signal_until step; None without probes."""
  out = []
  for name in probe_names(preset):
    per_step = {}
    for layer in full_layers:
      for step, value in run_curves.get(f'probe_qk_grad_layer{layer}_{name}', []):
        if step <= preset.signal_until:
          per_step.setdefault(step, []).append(value ** 2)
    out.append(float(np.mean([np.sqrt(sum(v)) for v in per_step.values()])) if per_step else None)
  return out


def converged(run_curves: dict, preset: Preset) -> dict:
  """Whether the run formed by the stopping rule (hybrid_jax.analysis.formation), read from its probe curve of
  recall beyond the large window: {'formed': True, or False for a run that reached its step budget without forming
  (capped), or None without that curve; 'formation_step' and 'formed_at': the first probe of the streak and the
  probe that confirmed it}."""
  curve = run_curves.get(f'probe_recall_accuracy_{probe_names(preset)[2]}')
  if not curve:
    return {'formed': None, 'formation_step': None, 'formed_at': None}
  steps, values = zip(*curve)
  at = convergence.formed_at(steps, values)
  return {'formed': at is not None, 'formation_step': convergence.formation_step(steps, values), 'formed_at': at}


def gradient_share(run_curves: dict, preset: Preset) -> list:
  """Per bucket of BUCKETS, [(step, share)] at every probe: the norm of the gradient that the bucket's answers send
  to the full layers' queries and keys (over every full layer), over the sum of that norm over the buckets.

  The claim is about how much of the full layers' training signal long-range answers carry, so the norm is taken
  relative to all answers'. The probe logs one norm per bucket (of the gradient of that bucket's mean answer loss),
  neither the gradient of all answers together nor the buckets' query counts, so the sum of the buckets' norms
  stands for all answers' gradient (unweighted: each bucket's answers count alike)."""
  names = probe_names(preset)
  values = {}  # step -> {(bucket, layer): value}; a step probed twice (a resumed run) keeps its last values.
  for key, curve in run_curves.items():
    for j, name in enumerate(names):
      match = re.fullmatch(rf'probe_qk_grad_layer(\d+)_{name}', key)
      if match:
        for step, value in curve:
          values.setdefault(step, {})[(j, match.group(1))] = value
  shares = [[] for _ in names]
  for step, by_layer in sorted(values.items()):
    norms = [math.sqrt(sum(v ** 2 for (b, _), v in by_layer.items() if b == j)) for j in range(len(names))]
    if sum(norms) > 0:
      for j, norm in enumerate(norms):
        shares[j].append((step, norm / sum(norms)))
  return shares


def per_seed(run: dict, preset: Preset) -> dict:
  """What the verdicts on converged runs read of one run (hybrid_jax.study.verdicts pairs runs by seed): how it
  formed (converged), its final recall by bucket ('all': every query), recall at the extrapolation length by
  bucket, held-out loss, and its gradient share by bucket (gradient_share)."""
  recall = {bucket: run['recall']['buckets'][j]['accuracy'] for j, bucket in enumerate(BUCKETS)}
  extrapolation = extrapolation_recall(run)
  curves = run.get('curves', {})
  return {**converged(curves, preset), 'steps': run.get('steps'),
          'recall': {**recall, 'all': run['recall']['accuracy']}, 'extrapolation': extrapolation,
          'held_out_loss': run.get('packed_held_out_loss'),
          'gradient_share': dict(zip(BUCKETS, gradient_share(curves, preset)))}


def extrapolation_recall(run: dict) -> dict:
  """A run's recall at each extrapolation length by bucket, keyed by presets.at_factor names."""
  return {at_factor(bucket, score['factor']): score['buckets'][j]['accuracy']
          for score in run.get('extrapolation', ()) for j, bucket in enumerate(EXTRAPOLATION_BUCKETS)}


def _full_layers(result: dict) -> list[int]:
  """Indices of the layers with full-attention heads (full layers and head-wise layers)."""
  return [int(layer) for layer in result['ablation']['layers']]


def score_run(run, run_curves: dict, preset: Preset) -> dict:
  """Everything the report reads of one trained run (besides its identity)."""
  scores = evaluate(run, preset)
  full = _full_layers(scores)
  return {**scores, 'formation': formation(run_curves, full, preset),
          'gradient_signal': gradient_signal(run_curves, full, preset), 'curves': run_curves}


def summarize(runs: dict, preset: Preset) -> dict:
  """Per arch, over seeds (mean, standard deviation across seeds, and the per-seed values): accuracy by bucket as
  trained and restricted, the drop, recall at the extrapolation length, held-out loss, each full layer's final
  retrieval-head scores by bucket (attention mass and head ablation), when retrieval formed, and the early
  gradient signal to the full layers' queries and keys; and 'per_seed': {seed: per_seed(run)}, for the verdicts
  that pair runs by seed or read only the runs that formed."""
  out = {}
  late = preset.steps + preset.probe_every  # A head that never formed counts as forming after the run.
  for label in ARCHES:
    seeds = [r for r in runs.values() if r['label'] == label]
    if not seeds:
      continue
    entry = {'seeds': [r['seed'] for r in seeds], 'window': seeds[0].get('window'), 'accuracy': {},
             'byte_accuracy': {}, 'restricted': {}, 'drop': {}, 'extrapolation': {}, 'full_layers': {},
             'ablation': {}, 'gradient_signal': {}}
    for j, bucket in enumerate(BUCKETS):
      acc = [r['recall']['buckets'][j]['accuracy'] for r in seeds]
      res = [r['restricted']['buckets'][j]['accuracy'] for r in seeds]
      entry['accuracy'][bucket] = spread(acc)
      entry['byte_accuracy'][bucket] = spread([r['recall']['buckets'][j].get('byte_accuracy') for r in seeds])
      entry['restricted'][bucket] = spread(res)
      entry['drop'][bucket] = spread([a - b for a, b in zip(acc, res) if a is not None and b is not None])
      entry['gradient_signal'][bucket] = spread([r['gradient_signal'][j] for r in seeds if 'gradient_signal' in r])
    entry['accuracy']['all'] = spread([r['recall']['accuracy'] for r in seeds])
    extrapolation = [extrapolation_recall(r) for r in seeds]
    for name in preset.extrapolation_names:
      entry['extrapolation'][name] = spread([e[name] for e in extrapolation if name in e])
    entry['held_out_loss'] = spread([r.get('packed_held_out_loss') for r in seeds])
    for layer in seeds[0]['recall']['layers']:
      if layer['role'] not in ('full', 'headwise'):  # The layers with full-attention heads.
        continue
      rows = [next(l for l in r['recall']['layers'] if l['index'] == layer['index']) for r in seeds]
      entry['full_layers'][str(layer['index'])] = {
          bucket: spread([max(row['mass'][j]) if row['mass'][j] else None for row in rows])
          for j, bucket in enumerate(BUCKETS)}
    for layer in (seeds[0].get('ablation') or {}).get('layers', {}):
      entry['ablation'][layer] = {
          kind: {bucket: spread([r['ablation']['layers'][layer][kind][j] for r in seeds]) for j, bucket in
                 enumerate(BUCKETS)} for kind in ('best', 'all')}
    entry['formation'] = {'threshold': preset.formation_threshold, 'ablation_threshold': preset.ablation_threshold}
    for kind in ('first', 'ablation'):
      steps = [r['formation'].get(kind) for r in seeds if 'formation' in r]
      entry['formation'][kind] = {'step': spread([late if s is None else s for s in steps]),
                                  'never': sum(s is None for s in steps)}
    entry['per_seed'] = {r['seed']: per_seed(r, preset) for r in seeds}
    out[label] = entry
  return out
