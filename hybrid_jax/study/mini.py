"""The mini-study (`python -m hybrid_jax study --preset mini`): the study's core comparison, small enough to run.

SWA-128, SWA-2048, SWA-128-NoPE and Full train on the synthetic recall task (hybrid_jax/data/recall.py: key-value
records whose query comes back from a controlled distance, mixed with ordinary text), with the during-training
probe logging recall accuracy and each attention layer's retrieval-head score per distance bucket. At the end
every run is scored on held-out recall documents by distance (inside the small window, between the windows,
beyond the large window), once as trained and once with its full-attention layers restricted to the small window
(hybrid_jax.analysis.windowed): where accuracy then drops, the full layers carried that retrieval; where it does
not, they were not needed ("lazy"). Several seeds give mean and spread; one report (report.json + report.png)
states what the numbers show.

Scaled down, windows keep their role rather than their size: at a 256-token context a 2048-token window would
be full attention, so each preset maps the study's small and large windows onto its own context (the report
states the mapping), and its distance ranges onto those windows. Every run directory is a normal run: rerunning
the command resumes unfinished runs and re-evaluates finished ones.
"""

import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

from hybrid_jax import command_line, runs as runs_lib, training
from hybrid_jax.analysis import callbacks
from hybrid_jax.analysis.windowed import Restriction
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.eval import recall as recall_eval
from hybrid_jax.train import metrics as metrics_lib

# Study label -> (arch in configs/hybrid.py, which window it uses: 'small' | 'large' | None).
ARCHES = {'SWA-128': ('swa128', 'small'), 'SWA-2048': ('swa2048', 'large'),
          'SWA-128-NoPE': ('swa128_nope', 'small'), 'Full': ('full', None)}
BUCKETS = ('inside the small window', 'between the windows', 'beyond the large window')


@dataclasses.dataclass(frozen=True)
class Preset:
  scale: str
  seq_len: int
  small_window: int
  large_window: int
  steps: int
  batch_size: int
  probe_every: int
  # Distance ranges of the recall task, one per bucket of BUCKETS: their upper ends are the small window, the
  # large window and at most seq_len, so the probe's buckets (0 and each upper end) are the report's.
  distance_ranges: tuple
  seeds: int = 1  # Default of --seeds.
  recall: tuple = ()  # Other data.recall overrides (key, value).
  probe_samples: int = 4  # The probe scores 8 x this many held-out recall documents.
  eval_documents: int = 128  # Held-out recall documents scored at the end.
  model: tuple = ()  # Extra model overrides (key, value).
  lr: float = 3e-3
  eval_batches: int = 2
  note: str = ''

  @property
  def edges(self) -> list[int]:
    """Distance-bucket edges of BUCKETS."""
    return [0, self.small_window, self.large_window, self.seq_len]

  @property
  def fine_edges(self) -> list[int]:
    """Finer buckets: powers of two and the windows."""
    powers = [2 ** k for k in range(1, 31) if 2 ** k < self.seq_len]
    return sorted({0, *powers, self.small_window, self.large_window, self.seq_len})


_SMALL_MODEL = (('d_model', 64), ('num_heads', 4), ('num_kv_heads', 2), ('head_dim', 16), ('d_ff', 160))
# One pair (a needle: no other key to tell apart) of a 1-letter key and a 4-digit value in '.' filler, 10% text:
# the easiest retrieval the task offers; Full learns it between steps 2000 and 3000, harder settings stayed at
# chance in ~1000 steps (BENCHMARKS.md). 3000 steps leave time for one seed on 2 cores.
_TASK = (('pairs', 1), ('key_chars', 8), ('value_length', 4), ('filler', '.'), ('text_fraction', 0.1))
PRESETS = {
    'mini': Preset(scale='tiny', seq_len=64, small_window=8, large_window=32, steps=3000, batch_size=32,
                   probe_every=500, distance_ranges=((3, 8), (12, 32), (36, 56)), seeds=1, recall=_TASK,
                   model=_SMALL_MODEL, note='2 CPU cores, under 30 minutes'),
    # Sized by arithmetic, not yet measured on a GPU: the mini preset's task at a 256-byte context with the tiny
    # shapes (d_model 128), twice its rows per step and 4000 steps (the CPU Full run learned at 2000-3000 steps of
    # 32 x 64 bytes), 2 seeds: 8 runs of about a minute each on one H200.
    'gpu-small': Preset(scale='tiny', seq_len=256, small_window=16, large_window=128, steps=4000, batch_size=64,
                        probe_every=500, distance_ranges=((3, 16), (24, 128), (144, 248)), seeds=2, recall=_TASK,
                        note='one H200, ~10 minutes'),
    # Seconds per run: exercises the machinery only (tests); its numbers mean nothing.
    'smoke': Preset(scale='tiny', seq_len=64, small_window=8, large_window=32, steps=4, batch_size=2,
                    probe_every=2, distance_ranges=((3, 8), (12, 32), (36, 58)), probe_samples=1,
                    eval_documents=4, eval_batches=1, recall=(('pairs', 2),),
                    model=(('d_model', 32), ('num_layers', 2), ('num_heads', 2), ('num_kv_heads', 1),
                           ('head_dim', 16), ('d_ff', 64)), note='machinery check only'),
}


def run_config(label: str, preset: Preset, seed: int = 0):
  """The validated train config of one arch of the preset."""
  arch, window = ARCHES[label]
  c = load_config_file(f'{BASE_CONFIG.parent / "hybrid.py"}:arch={arch},scale={preset.scale}')
  c.name = f'mini_{arch}_seed{seed}'
  c.seed = seed
  c.data.update(dict(source='recall', tokenizer='byte', seq_len=preset.seq_len, long_short_ratio=0.0))
  c.data.recall.distance_ranges = preset.distance_ranges
  c.data.recall.update(dict(preset.recall))
  c.model.update(dict(preset.model))
  c.model.window = {'small': preset.small_window, 'large': preset.large_window, None: c.model.window}[window]
  c.train.update(dict(steps=preset.steps, batch_size=preset.batch_size, lr=preset.lr,
                      warmup_steps=max(1, preset.steps // 10), eval_every=0,
                      checkpoint_every=max(1, preset.steps // 2), log_every=max(1, min(10, preset.steps // 4)),
                      eval_batches=preset.eval_batches, retrieval_probe_every=preset.probe_every,
                      retrieval_probe_samples=preset.probe_samples, retrieval_probe_length=preset.seq_len,
                      progress=False))
  c.eval.update(dict(batches=preset.eval_batches, documents=0))
  return validate(c)


def _curves(workdir) -> dict:
  """Train loss and every probe metric, as [(step, value)] lists."""
  records = metrics_lib.read_jsonl(pathlib.Path(workdir) / 'metrics.jsonl')
  curves = {'train_loss': [(r['step'], r['loss']) for r in records if r['kind'] == 'train' and 'loss' in r]}
  for r in records:
    if r['kind'] == 'probe':
      for key, value in r.items():
        if key not in ('step', 'kind') and isinstance(value, (int, float)):
          curves.setdefault(f'probe_{key}', []).append((r['step'], value))
  return curves


def _evaluate(run, preset: Preset) -> dict:
  """Recall by distance as trained and with the full-attention layers restricted to the small window."""
  held = recall_eval.held_out(run.config.data, preset.eval_documents)
  out = {}
  for name, restriction in (('recall', None), ('restricted', Restriction('full', preset.small_window))):
    evaluator = recall_eval.RecallEval(run.model_def, run.config.model, held, preset.edges, restriction=restriction)
    correct, mass = evaluator.run(run.params)
    out[name] = evaluator.summary(correct, mass)
    out[f'{name}_fine'] = recall_eval.score(correct, held.distances, preset.fine_edges)
  return out


def _spread(values) -> dict:
  values = [v for v in values if v is not None]
  if not values:
    return {'mean': None, 'std': None, 'values': []}
  return {'mean': float(np.mean(values)), 'std': float(np.std(values)), 'values': [float(v) for v in values]}


def summarize(runs: dict, preset: Preset) -> dict:
  """Per arch, over seeds: accuracy by bucket as trained and restricted, the drop, and each full layer's final
  retrieval-head score by bucket (mean, standard deviation across seeds, and the per-seed values)."""
  out = {}
  for label in ARCHES:
    seeds = [r for r in runs.values() if r['label'] == label]
    if not seeds:
      continue
    entry = {'seeds': [r['seed'] for r in seeds], 'accuracy': {}, 'byte_accuracy': {}, 'restricted': {}, 'drop': {},
             'full_layers': {}}
    for j, bucket in enumerate(BUCKETS):
      acc = [r['recall']['buckets'][j]['accuracy'] for r in seeds]
      res = [r['restricted']['buckets'][j]['accuracy'] for r in seeds]
      entry['accuracy'][bucket] = _spread(acc)
      entry['byte_accuracy'][bucket] = _spread([r['recall']['buckets'][j].get('byte_accuracy') for r in seeds])
      entry['restricted'][bucket] = _spread(res)
      entry['drop'][bucket] = _spread([a - b for a, b in zip(acc, res) if a is not None and b is not None])
    entry['accuracy']['all'] = _spread([r['recall']['accuracy'] for r in seeds])
    for layer in seeds[0]['recall']['layers']:
      if layer['role'] != 'full':
        continue
      rows = [next(l for l in r['recall']['layers'] if l['index'] == layer['index']) for r in seeds]
      entry['full_layers'][str(layer['index'])] = {
          bucket: _spread([max(row['mass'][j]) if row['mass'][j] else None for row in rows])
          for j, bucket in enumerate(BUCKETS)}
    out[label] = entry
  return out


def run_study(preset_name: str, out_dir, *, seeds: int | None = None, progress: bool = True) -> dict:
  """Trains (or resumes), evaluates and reports every arch of the preset for each seed; returns the report."""
  preset = PRESETS[preset_name]
  seeds = preset.seeds if seeds is None else seeds
  if seeds < 1:
    raise ConfigError(f'--seeds={seeds} is invalid: must be >= 1')
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  results, started = {}, time.perf_counter()
  for seed in range(seeds):
    for label in ARCHES:
      config = run_config(label, preset, seed)
      workdir = out_dir / config.name
      if progress:
        print(f'[{label} seed {seed}] training {preset.steps} steps in {workdir}', flush=True)
      train_report = training.train(config, workdir)
      run = runs_lib.load_run(workdir)
      results[config.name] = {
          'label': label, 'arch': config.model.arch, 'seed': seed,
          'window': config.model.window if ARCHES[label][1] else None,
          'workdir': str(workdir), 'steps': train_report['steps'], 'status': train_report['status'],
          'wall_time_s': train_report.get('wall_time_s'),
          'packed_held_out_loss': (train_report.get('eval') or {}).get('packed_loss'),
          **_evaluate(run, preset), 'curves': _curves(workdir)}
      if progress:
        r = results[config.name]['recall']
        print(f"[{label} seed {seed}] recall " + ', '.join(
            f"{b['low']}<d<={b['high']}: {b['accuracy']}" for b in r['buckets']), flush=True)
  report = {'preset': preset_name, 'settings': dataclasses.asdict(preset), 'seeds': list(range(seeds)),
            'edges': preset.edges, 'buckets': list(BUCKETS), 'fine_edges': preset.fine_edges,
            'wall_time_s': time.perf_counter() - started, 'runs': results}
  report['summary'] = summarize(results, preset)
  report['findings'] = findings(report)
  (out_dir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  plot_report(report, out_dir / 'report.png')
  return report


def _probe_names(preset: Preset) -> list[str]:
  """Probe metric suffix of each bucket of BUCKETS ('<lo>_<hi>' over the probe's edges)."""
  edges = callbacks.recall_edges(preset.distance_ranges)
  return [f'{lo}_{hi}' for lo, hi in zip(edges, edges[1:])]


def mean_curve(report: dict, label: str, key: str) -> list:
  """[(step, mean over seeds)] of curve `key` of arch `label` (steps every seed logged)."""
  curves = [dict(r['curves'].get(key, [])) for r in report['runs'].values() if r['label'] == label]
  steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
  return [(s, float(np.mean([c[s] for c in curves]))) for s in steps]


def _formation_step(curve, threshold: float):
  """First probed step whose value reaches `threshold` (None if never)."""
  return next((step for step, value in curve if value >= threshold), None)


def _pm(s: dict) -> str:
  return 'n/a' if s['mean'] is None else f"{s['mean']:.2f} ± {s['std']:.2f}"


def _apart(a: dict, b: dict) -> bool:
  """Whether mean a exceeds mean b by more than both spreads (one standard deviation each) together; never with
  fewer than two seeds on a side (no spread measured)."""
  if len(a['values']) < 2 or len(b['values']) < 2:
    return False
  return a['mean'] - a['std'] > b['mean'] + b['std']


FORMED = 0.3  # Retrieval-head score (attention mass on the record) counted as a formed head in the findings.


def findings(report: dict) -> list[str]:
  """Plain statements of what the measured numbers show, and the limits of what they can show."""
  p, summary = report['settings'], report['summary']
  preset = PRESETS[report['preset']]
  recall = dict(p['recall'])
  config = run_config('Full', preset)
  r = config.data.recall
  chance = 1 / r.value_chars ** r.value_length
  n = len(report['seeds'])
  lines = [
      f"Setup: {p['scale']} scale {dict(p['model']) or ''}, {p['steps']} steps of {p['batch_size']} rows of "
      f"{p['seq_len']} bytes, {n} seed(s). Recall documents hold {r.pairs} key-value pairs (keys of {r.key_length} "
      f"of {r.key_chars} letters, values of {r.value_length} of {r.value_chars} digits: chance {chance:.3f}), "
      f"{r.text_fraction:.0%} of documents are ordinary text{'; ' + str(recall) if recall else ''}. SWA-128 and "
      f"SWA-128-NoPE use a {p['small_window']}-token window, SWA-2048 a {p['large_window']}-token window. Distance "
      f"buckets: inside the small window (d <= {p['small_window']}), between the windows ({p['small_window']} < d <= "
      f"{p['large_window']}), beyond the large window (d > {p['large_window']}); a query is correct when every answer "
      f"byte is the argmax under teacher forcing; {p['eval_documents']} held-out documents per run; ± is the "
      'standard deviation across seeds.']
  for label, e in summary.items():
    lines.append(f'{label}: recall ' + ', '.join(f'{b} {_pm(e["accuracy"][b])}' for b in BUCKETS) +
                 ' (answer bytes right: ' + ', '.join(_pm(e['byte_accuracy'][b]) for b in BUCKETS) + ')' +
                 f"; with its full-attention layers restricted to the last {p['small_window']} tokens: " +
                 ', '.join(f'{b} {_pm(e["restricted"][b])}' for b in BUCKETS) + '; drop ' +
                 ', '.join(f'{b} {_pm(e["drop"][b])}' for b in BUCKETS[1:]) + '.')
  names = _probe_names(preset)
  for label, e in summary.items():
    parts = []
    for layer, by_bucket in e['full_layers'].items():
      formed = [_formation_step(mean_curve(report, label, f'probe_recall_mass_layer{layer}_{names[j]}'), FORMED)
                for j in (1, 2)]
      parts.append(f"layer {layer}: {BUCKETS[1]} {_pm(by_bucket[BUCKETS[1]])}, {BUCKETS[2]} "
                   f"{_pm(by_bucket[BUCKETS[2]])} (first probe with a seed-mean score >= {FORMED}: " +
                   ', '.join('never' if f is None else f'step {f}' for f in formed) + ')')
    lines.append(f'{label}: retrieval-head score of each full-attention layer (best head\'s attention mass on the '
                 'queried record, final parameters): ' + '; '.join(parts) + '.')
  lines += _verdicts(summary, chance, p)
  lines.append('Not shown: anything about the study\'s scales, token budgets, natural-text retrieval or 16K context; '
               f'with {n} seed(s), differences within one standard deviation of each other are not established.')
  return lines


def _verdicts(summary: dict, chance: float, p: dict) -> list[str]:
  """Large-window laziness and the NoPE design, stated only as far as the spreads allow."""
  if not {'SWA-128', 'SWA-2048'} <= set(summary):
    return []
  small, large = summary['SWA-128'], summary['SWA-2048']
  between, beyond = BUCKETS[1], BUCKETS[2]
  out = []
  learned = {k: e['accuracy'][between]['mean'] is not None and e['accuracy'][between]['mean'] > 2 * chance + 0.1
             for k, e in summary.items()}
  if not any(learned.values()):
    return [f'No arch learned to retrieve beyond the small window (accuracy there within 0.1 of chance '
            f'{chance:.3f} for all): this run cannot speak to laziness.']
  if len(small['accuracy'][between]['values']) < 2:
    return [f"One seed, so no spread to judge differences by: between the windows the restriction drop is "
            f"{_pm(small['drop'][between])} for SWA-128 and {_pm(large['drop'][between])} for SWA-2048; beyond the "
            f"large window recall is {_pm(small['accuracy'][beyond])} for SWA-128, {_pm(large['accuracy'][beyond])} "
            f"for SWA-2048" + (f", {_pm(summary['SWA-128-NoPE']['accuracy'][beyond])} for SWA-128-NoPE"
                                if 'SWA-128-NoPE' in summary else '') + '. Rerun with --seeds 3 to judge them.']
  if _apart(small['drop'][between], large['drop'][between]):
    out.append(f"Between the windows, restricting the full layers hurts SWA-128 (drop {_pm(small['drop'][between])}) "
               f"more than SWA-2048 (drop {_pm(large['drop'][between])}): there SWA-2048's retrieval does not live in "
               'its full-attention layers (its sliding-window layers serve it).')
  else:
    out.append(f"Between the windows the restriction drop of SWA-128 ({_pm(small['drop'][between])}) and SWA-2048 "
               f"({_pm(large['drop'][between])}) are not apart by more than their spreads.")
  if _apart(small['accuracy'][beyond], large['accuracy'][beyond]):
    out.append(f"Beyond the large window, where only full attention can retrieve, SWA-2048 recalls less "
               f"({_pm(large['accuracy'][beyond])}) than SWA-128 ({_pm(small['accuracy'][beyond])}): large-window "
               'laziness appears (its full layers learned less long-range retrieval in the same steps).')
  elif _apart(large['accuracy'][beyond], small['accuracy'][beyond]):
    out.append(f"Beyond the large window SWA-2048 recalls more ({_pm(large['accuracy'][beyond])}) than SWA-128 "
               f"({_pm(small['accuracy'][beyond])}): the opposite of large-window laziness at this size.")
  else:
    out.append(f"Beyond the large window SWA-2048 ({_pm(large['accuracy'][beyond])}) and SWA-128 "
               f"({_pm(small['accuracy'][beyond])}) are within their spreads: large-window laziness is not "
               'established here.')
  if 'SWA-128-NoPE' in summary:
    nope = summary['SWA-128-NoPE']
    cmp = ('more than' if _apart(nope['accuracy'][beyond], small['accuracy'][beyond]) else
           'less than' if _apart(small['accuracy'][beyond], nope['accuracy'][beyond]) else 'within the spread of')
    out.append(f"NoPE on the full layers: SWA-128-NoPE recalls {_pm(nope['accuracy'][beyond])} beyond the large "
               f"window, {cmp} SWA-128 ({_pm(small['accuracy'][beyond])}).")
  return out


def plot_report(report: dict, path) -> None:
  """Six panels: train loss; final recall by bucket as trained and restricted; recall and each full layer's
  retrieval-head score over training (means over seeds)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  preset = PRESETS[report['preset']]
  names = _probe_names(preset)
  labels = list(report['summary'])
  colors = {label: f'C{i}' for i, label in enumerate(ARCHES)}
  fig = Figure(figsize=(16, 9))
  axes = fig.subplots(2, 3)
  ax = axes[0, 0]
  for label in labels:
    steps, values = zip(*mean_curve(report, label, 'train_loss'))
    ax.plot(steps, values, color=colors[label], label=label)
  ax.set(title='train loss (mean over seeds)', xlabel='step')
  for ax, key, title in ((axes[0, 1], 'accuracy', 'recall accuracy, as trained'),
                         (axes[0, 2], 'restricted', f'full layers restricted to {preset.small_window} tokens')):
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
      stats = [report['summary'][label][key][b] for b in BUCKETS]
      ax.bar(np.arange(len(BUCKETS)) + i * width, [s['mean'] or 0 for s in stats], width,
             yerr=[s['std'] or 0 for s in stats], color=colors[label], label=label, capsize=3)
    ax.set_xticks(np.arange(len(BUCKETS)) + 0.4 - width / 2,
                  [f'{b}\n({lo} < d <= {hi})' for b, lo, hi in zip(BUCKETS, preset.edges, preset.edges[1:])],
                  fontsize=7)
    ax.set(title=title, ylim=(0, 1.05), ylabel='exact-match accuracy')
  ax = axes[1, 0]
  for label in labels:
    for j, style in zip(range(3), ('-', '--', ':')):
      curve = mean_curve(report, label, f'probe_recall_accuracy_{names[j]}')
      if curve:
        ax.plot(*zip(*curve), style, color=colors[label], marker='.', label=f'{label}, {BUCKETS[j]}')
  ax.set(title='recall accuracy over training (probe)', xlabel='step', ylim=(0, 1.05))
  for ax, j in ((axes[1, 1], 1), (axes[1, 2], 2)):
    for label in labels:
      for k, layer in enumerate(report['summary'][label]['full_layers']):
        curve = mean_curve(report, label, f'probe_recall_mass_layer{layer}_{names[j]}')
        if curve:
          ax.plot(*zip(*curve), ('-', '--', ':', '-.')[k % 4], color=colors[label], marker='.',
                  label=f'{label} layer {layer}')
    ax.set(title=f'retrieval-head score of each full layer\n{BUCKETS[j]}', xlabel='step', ylim=(0, 1.05))
  for ax in axes.ravel():
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.suptitle(f"mini-study on the recall task, preset {report['preset']}, seeds {report['seeds']}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(argv) -> int:
  """Run the mini-study: train, evaluate and report SWA-128, SWA-2048, SWA-128-NoPE and Full on the recall task."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax study', description=__doc__)
  parser.add_argument('--preset', choices=sorted(PRESETS), default='mini', help='the study size')
  parser.add_argument('--out', default=None, help='output directory (default: runs/study_<preset>)')
  parser.add_argument('--seeds', type=int, default=None,
                      help="number of seeds (0, 1, ...) per arch (default: the preset's)")
  args = parser.parse_args(argv)
  out = args.out or f'runs/study_{args.preset}'
  try:
    report = run_study(args.preset, out, seeds=args.seeds)
  except (ConfigError, runs_lib.RunError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('\n'.join(report['findings']))
  print(f'report: {out}/report.json, {out}/report.png')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
