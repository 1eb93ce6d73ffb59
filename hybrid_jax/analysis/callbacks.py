"""The during-training retrieval probe: watch retrieval heads form while the model trains.

The study traced saved checkpoints afterwards; this probe logs, every `train.retrieval_probe_every` steps, to the
run's metrics (prefix 'probe'), on needle prompts (any source but 'recall'):
- niah_accuracy and niah_accuracy_depth_<d> for needle depths 0.1, 0.5 and 0.9 (teacher-forced greedy match of
  the answer, see needle_probe.py) on fixed prompts of the study's generator;
- retrieval_top_score (with retrieval_top_layer / retrieval_top_head): the best attention-mass retrieval score
  among the heads of the full-attention layers (absent when the model has none);
or, with data.source='recall', on 8 * train.retrieval_probe_samples held-out recall documents instead (the task
the model trains on; hybrid_jax.eval.recall), bucketed by the configured distance ranges (edges 0 and each
range's upper end):
- recall_accuracy and recall_accuracy_<lo>_<hi>;
- recall_mass_layer<i>_<lo>_<hi>: the best head's attention mass on the pair's record, for every attention layer i,
  so each full-attention layer's retrieval head is seen forming;
- recall_ablation_layer<i>_<lo>_<hi> and qk_grad_layer<i>_<lo>_<hi> for every layer i with full heads: the recall
  lost by ablating its most needed full head, and the gradient that long-range answers send to its queries and
  keys (hybrid_jax.eval.recall_mechanism);
and always
- seconds: the probe's own wall time, so its cost shows next to train/step_time_s.

The prompts are built once, with a 7-digit value per prompt, seeded by config.seed; one jitted forward pass over
all of them (len(DEPTHS) * train.retrieval_probe_samples sequences) is the whole cost of a probe.
"""

import time

import numpy as np

from hybrid_jax.analysis import needle_probe, needles
from hybrid_jax.config import ConfigError
from hybrid_jax.data.tokenizers import get_tokenizer

DEPTHS = (0.1, 0.5, 0.9)
RECALL_DOCUMENTS_PER_SAMPLE = 8


def recall_edges(distance_ranges) -> list[int]:
  """The probe's distance buckets: 0 and the upper end of every (low, high) distance range."""
  return sorted({0, *(int(hi) for _, hi in distance_ranges)})


class RetrievalProbe:
  """Callable on the train state's params -> a dict of scalar metrics."""

  def __init__(self, config, model_def, mesh=None):
    t = config.train
    self.recall = None
    if config.data.source == 'recall':
      from hybrid_jax.eval import recall, recall_mechanism  # pylint: disable=g-import-not-at-top
      held = recall.held_out(config.data, RECALL_DOCUMENTS_PER_SAMPLE * int(t.retrieval_probe_samples))
      edges = recall_edges(config.data.recall.distance_ranges)
      self.recall = recall.RecallEval(model_def, config.model, held, edges, mesh=mesh)
      self.mechanism = recall_mechanism.RecallMechanism(model_def, config.model, held, edges)
      return
    self.length = int(t.retrieval_probe_length or config.data.seq_len)
    tokenizer = get_tokenizer(config.data.tokenizer)
    try:
      samples = needles.study_samples(len(DEPTHS) * int(t.retrieval_probe_samples), length=self.length,
                                      tokenizer=tokenizer, seed=int(config.seed), values=None, depths=DEPTHS)
    except needles.NeedleError as e:
      raise ConfigError(f'config.train.retrieval_probe_length={t.retrieval_probe_length} (0 = data.seq_len) is '
                        f'invalid for the retrieval probe: {e}') from None
    self.depths = np.asarray([s['depth'] for s in samples])
    self.batch = needles.batch([needles.encode(s, tokenizer) for s in samples], pad_id=tokenizer.eos_id)
    self.probe = needle_probe.NeedleProbe(model_def, config.model, mesh=mesh)
    self.full_rows = [i for i, layer in enumerate(self.probe.layers) if layer.role == 'full']

  def __call__(self, params) -> dict:
    tic = time.perf_counter()
    if self.recall is not None:
      return {**recall_metrics(self.recall(params)),
              **mechanism_metrics(self.mechanism.ablation(params), self.mechanism.gradient_signal(params),
                                  self.recall.edges),
              'seconds': time.perf_counter() - tic}
    stats = self.probe(params, self.batch)
    correct = stats['correct'].astype(float)
    metrics = {'niah_accuracy': float(correct.mean())}
    for depth in DEPTHS:
      metrics[f'niah_accuracy_depth_{depth:g}'] = float(correct[np.isclose(self.depths, depth)].mean())
    if self.full_rows:
      mass = stats['mass'].mean(axis=0)[self.full_rows]  # [full layers, heads]
      row, head = np.unravel_index(int(np.argmax(mass)), mass.shape)
      metrics.update(retrieval_top_score=float(mass[row, head]),
                     retrieval_top_layer=self.probe.layers[self.full_rows[row]].index, retrieval_top_head=int(head))
    metrics['seconds'] = time.perf_counter() - tic
    return metrics


def recall_metrics(result: dict) -> dict:
  """Flat probe metrics of a RecallEval result (buckets without queries are left out)."""
  metrics = {'recall_accuracy': result['accuracy']}
  for j, b in enumerate(result['buckets']):
    if b['accuracy'] is None:
      continue
    name = f"{b['low']}_{b['high']}"
    metrics[f'recall_accuracy_{name}'] = b['accuracy']
    for layer in result['layers']:
      metrics[f"recall_mass_layer{layer['index']}_{name}"] = float(max(layer['mass'][j]))
  return metrics


def mechanism_metrics(ablation: dict, signal: dict, edges) -> dict:
  """Flat probe metrics of RecallMechanism results, per full-attention layer i and bucket <lo>_<hi> (buckets
  without queries left out): recall_ablation_layer<i>_<lo>_<hi> (the largest drop from ablating one of its full
  heads), recall_ablation_layer<i>_all_<lo>_<hi> (all of them at once) and qk_grad_layer<i>_<lo>_<hi>."""
  names = [f'{lo}_{hi}' for lo, hi in zip(edges, edges[1:])]
  metrics = {}
  for layer, scores in ablation['layers'].items():
    for j, name in enumerate(names):
      for key, values in ((f'recall_ablation_layer{layer}', scores['best']),
                          (f'recall_ablation_layer{layer}_all', scores['all']), (f'qk_grad_layer{layer}', signal[layer])):
        if values[j] is not None:
          metrics[f'{key}_{name}'] = values[j]
  return metrics


def make_retrieval_probe(config, model_def, mesh=None):
  """The probe when config.train.retrieval_probe_every > 0, else None (the training loop's hook)."""
  if not config.train.retrieval_probe_every:
    return None
  return RetrievalProbe(config, model_def, mesh)
