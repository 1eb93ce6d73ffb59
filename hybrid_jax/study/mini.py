"""The mini-study (`python -m hybrid_jax study --preset mini`): the study's core comparison, small enough to run.

SWA-128, SWA-2048, SWA-128-NoPE and Full train on the synthetic recall task (hybrid_jax/data/recall.py: key-value
records whose query comes back from a controlled distance, mixed with ordinary text), with the during-training
probe logging recall accuracy and each attention layer's retrieval-head score per distance bucket. At the end
every run is scored on held-out recall documents by distance (inside the small window, between the windows,
beyond the large window): as trained, with its full-attention layers restricted to the small window
(hybrid_jax.analysis.windowed), and on documents twice the training length (distances beyond the training
context). Over seeds, hybrid_jax.study.verdicts judges the study's three mechanistic claims (where retrieval lives,
large-window laziness, NoPE on the full layers) as reproduced, not reproduced or not separable at the measured
spread; one report (report.json + report.png) holds the numbers and the verdicts.

Scaled down, windows keep their role rather than their size: at a 64-token context a 2048-token window would be
full attention, so each preset maps the study's small and large windows onto its own context (the report states
the mapping), and its distance ranges onto those windows. Every run directory is a normal run: rerunning the
command resumes unfinished runs and reuses the scores of finished ones (`mini_result.json` in the run directory,
kept only while the preset's settings are unchanged). The runs are also the sweep `mini` of configs/sweep.py (run
directories of the same names), so `sweep run` can train them and the study then only scores them; `--parallel N`
does this itself, N runs at a time.
"""

import contextlib
import copy
import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np

from hybrid_jax import checks, command_line, cores, runs as runs_lib, training
from hybrid_jax.analysis import callbacks
from hybrid_jax.analysis.windowed import Restriction
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.data import pipeline, recall as recall_data, recall_store
from hybrid_jax.eval import recall as recall_eval
from hybrid_jax.study import verdicts
from hybrid_jax.study.verdicts import pm, spread
from hybrid_jax.sweep import local as sweep_local, members as sweep_members, record as sweep_record
from hybrid_jax.sweep import runner as sweep_runner
from hybrid_jax.train import metrics as metrics_lib

# Study label -> (arch in configs/hybrid.py, which window it uses: 'small' | 'large' | None).
ARCHES = {'SWA-128': ('swa128', 'small'), 'SWA-2048': ('swa2048', 'large'),
          'SWA-128-NoPE': ('swa128_nope', 'small'), 'Full': ('full', None)}
BUCKETS = ('inside the small window', 'between the windows', 'beyond the large window')
BEYOND_CONTEXT = 'beyond the training context'
EXTRAPOLATION_BUCKETS = BUCKETS + (BEYOND_CONTEXT,)
RESULT_FILE = 'mini_result.json'
STORE_DIR = 'recall_documents'  # Under the output directory: the training documents, generated once for all runs.
SWEEP_FILE = BASE_CONFIG.parent / 'sweep.py'  # Its sweep `mini` holds the study's runs (configs/mini.py).


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
  parallel: int = 1  # Default of --parallel: runs trained at a time (one tiny model leaves CPU cores idle).
  recall: tuple = ()  # Other data.recall overrides (key, value).
  probe_samples: int = 4  # The probe scores 8 x this many held-out recall documents.
  eval_documents: int = 128  # Held-out recall documents scored at the end (each holds data.recall.pairs queries).
  model: tuple = ()  # Extra model overrides (key, value).
  train: tuple = ()  # Extra train overrides (key, value).
  lr: float = 3e-3
  eval_batches: int = 2
  # Long-range retrieval counts as formed at the first probe where recall beyond the large window (where only full
  # attention reaches) is at least this (the per-layer retrieval-head scores use the same threshold).
  formation_threshold: float = 0.5
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

  @property
  def extrapolation_length(self) -> int:
    """Length of the documents that test recall beyond the training context: twice the training length."""
    return 2 * self.seq_len

  @property
  def extrapolation_edges(self) -> list[int]:
    return self.edges + [self.extrapolation_length]

  def extrapolation_ranges(self, longest: int) -> tuple:
    """The training distance ranges plus one beyond the training context, up to `longest` (the longest distance a
    record fits at the extrapolation length) and at most 1.5 x the training length (room for every pair)."""
    return tuple(self.distance_ranges) + ((self.seq_len + 1, min(longest, self.seq_len + self.seq_len // 2)),)


# The mini task: 4 key-value records per document, keys of one of 16 letters, one-digit values (chance 0.1), written
# `VALUEKEY` in '.' filler and asked `KEYVALUE` later; 10% of documents are text. Why one digit and several pairs
# (BENCHMARKS.md): with one multi-digit pair per document the full layers learn the shortcut "attend to the only
# digits there are", which cannot tell the first digit from the others (byte accuracy 0.1-0.3, exact match 0 after
# 3000 steps for every hybrid); several pairs force the key match, and a one-digit value needs no ordering circuit.
# Two distractor records (never asked) per document: without them every record is asked once, so "the value of the
# nearest record not asked yet" answers most queries with no key match, and Full (whose first layer sees every
# record) learned that rule and stayed at 0.58 between the windows; with them every arch, Full included, learns the
# key match (BENCHMARKS.md, "the mini-study with distractors").
_TASK = (('pairs', 4), ('key_chars', 16), ('value_length', 1), ('filler', '.'), ('text_fraction', 0.1),
         ('distractors', 2))
# Two layers (one cycle: a sliding or full layer under a full one) with 8 heads of width 16, each with its own keys
# and values. Eight heads, not four: the recall circuit (a head that copies the value into its key's position, and a
# head that matches the query's key against it) forms in whichever head starts closest, so more heads make its
# formation less of a lottery. With four heads, 5 of 12 runs learned every bucket in 4,000 steps; with eight, the
# SWA-128 seed that had stayed at 0.38 reached 0.98 by step 1,750, and every hybrid of seed 0 learned every bucket
# (1.00); Full learns every bucket once the task has distractors (above). Wider heads (d_model 128, head width 32)
# did not help.
_SMALL_MODEL = (('d_model', 64), ('num_layers', 2), ('num_heads', 8), ('num_kv_heads', 8), ('head_dim', 16),
                ('d_ff', 160), ('dtype', 'float32'))  # float32: on a CPU, bfloat16 matmuls are emulated, ~1.8x slower.
# The study's warmup-stable-decay schedule without weight decay: weight decay kept the late formers (Full, SWA-2048)
# at chance through 3,000 steps, and a decaying rate lifted a partly formed circuit that a constant one had left flat
# for 1,000 steps (Full at 0.68 rose to 0.88 in 1,000 decaying steps).
_OPTIMIZER = (('weight_decay', 0.0),)
# 6,000 steps: with distractors, 2 of 8 runs (seed 1's Full and SWA-128-NoPE) had not formed the circuit by step
# 4,000 (0.79 / 0.34 / 0.50 and 0.91 / 0.78 / 0.67); trained to 6,000 they reach 1.00 / 1.00 / 1.00 and 0.99 / 1.00 /
# 0.98 (BENCHMARKS.md). 17–21 minutes per seed on 2 idle CPU cores (1,042–1,231 s, by the host's speed; 3 seeds:
# 11 of 12 runs at 1.00 everywhere).
PRESETS = {
    'mini': Preset(scale='tiny', seq_len=64, small_window=8, large_window=32, steps=6000, batch_size=32,
                   probe_every=250, distance_ranges=((3, 8), (12, 32), (36, 56)), seeds=1, recall=_TASK,
                   model=_SMALL_MODEL, train=_OPTIMIZER, parallel=2, note='2 CPU cores, two runs at a time'),
    # The mini preset's task and heads at a 256-byte context, d_model 128, 4 layers (two cycles, so a
    # sliding layer sits above a full one), 8 records per document, 2 seeds: 8 runs on one H200, sized by
    # arithmetic from the CPU runs (not yet measured there; BENCHMARKS.md).
    'gpu-small': Preset(scale='tiny', seq_len=256, small_window=16, large_window=128, steps=3000, batch_size=64,
                        probe_every=250, distance_ranges=((3, 16), (24, 128), (144, 248)), seeds=2,
                        recall=_TASK + (('pairs', 8),), train=_OPTIMIZER, note='one H200, ~7 minutes',
                        model=(('num_heads', 8), ('num_kv_heads', 8), ('head_dim', 16))),
    # Seconds per run: exercises the machinery only (tests); its numbers mean nothing.
    'smoke': Preset(scale='tiny', seq_len=64, small_window=8, large_window=32, steps=4, batch_size=2,
                    probe_every=2, distance_ranges=((3, 8), (12, 32), (36, 58)), probe_samples=1,
                    eval_documents=4, eval_batches=1, recall=(('pairs', 2),),
                    model=(('d_model', 32), ('num_layers', 2), ('num_heads', 2), ('num_kv_heads', 1),
                           ('head_dim', 16), ('d_ff', 64)), note='machinery check only'),
}


def label_of(name: str, what: str) -> str:
  """The study label `name` stands for (a label or an arch name, any case), for --arches and configs/mini.py alike;
  ConfigError naming `what` (the flag or argument and its whole value) otherwise."""
  names = {label.lower(): label for label in ARCHES} | {arch: label for label, (arch, _) in ARCHES.items()}
  if name.strip().lower() not in names:
    raise ConfigError(f'{what} is invalid: {name.strip()!r} is not one of '
                      f'{", ".join(ARCHES)} (or {", ".join(a for a, _ in ARCHES.values())})')
  return names[name.strip().lower()]


def select_arches(spec: str | None) -> list[str]:
  """Study labels named by `--arches` (labels or arch names, comma-separated, any case); all when None."""
  if spec is None:
    return list(ARCHES)
  chosen = {label_of(item, f'--arches={spec!r}') for item in spec.split(',')}
  return [label for label in ARCHES if label in chosen]  # The report's order.


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
  c.train.update(dict(preset.train))
  c.eval.update(dict(batches=preset.eval_batches, documents=0))
  return validate(c)


def extrapolation_data(data_cfg, preset: Preset):
  """The run's data config at the extrapolation length, with a distance range beyond the training context."""
  data = copy.deepcopy(data_cfg)
  r = data.recall
  longest = preset.extrapolation_length - r.key_length - 2 * r.value_length + 1
  data.seq_len = preset.extrapolation_length
  data.recall.distance_ranges = preset.extrapolation_ranges(longest)
  data.recall.distance_weights = (1.0,) * len(data.recall.distance_ranges)
  recall_data.settings(data)  # Checked here, so an impossible preset fails before any training.
  return data


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
  """Recall by distance as trained, with the full-attention layers restricted to the small window, and on
  documents of twice the training length."""
  held = recall_eval.held_out(run.config.data, preset.eval_documents)
  out = {}
  for name, restriction in (('recall', None), ('restricted', Restriction('full', preset.small_window))):
    evaluator = recall_eval.RecallEval(run.model_def, run.config.model, held, preset.edges, restriction=restriction)
    correct, mass = evaluator.run(run.params)
    out[name] = evaluator.summary(correct, mass)
    out[f'{name}_fine'] = recall_eval.score(correct, held.distances, preset.fine_edges)
  long_held = recall_eval.held_out(extrapolation_data(run.config.data, preset), preset.eval_documents)
  correct, _ = recall_eval.RecallEval(run.model_def, run.config.model, long_held, preset.extrapolation_edges).run(
      run.params)
  out['extrapolation'] = recall_eval.score(correct, long_held.distances, preset.extrapolation_edges)
  return out


def probe_names(preset: Preset) -> list[str]:
  """Probe metric suffix of each bucket of BUCKETS ('<lo>_<hi>' over the probe's edges)."""
  edges = callbacks.recall_edges(preset.distance_ranges)
  return [f'{lo}_{hi}' for lo, hi in zip(edges, edges[1:])]


def _formation_step(curve, threshold: float):
  """First probed step whose value reaches `threshold` (None if never)."""
  return next((step for step, value in curve if value >= threshold), None)


def formation(curves: dict, full_layers, preset: Preset) -> dict:
  """When the full layers' long-range retrieval formed: 'first' is the first probe step at which recall beyond the
  large window (where only full attention reaches) is at least the preset's threshold; 'layers' gives, per full
  layer, the first step at which its retrieval-head score there (attention mass on the record) is (None: never).

  Recall, not the attention score, decides: a full layer above a sliding layer can read a record from the filler
  positions just after it, into which the sliding layer has copied it (BENCHMARKS.md), so its mass on the record
  itself can stay near 0 while it retrieves every query."""
  name = probe_names(preset)[2]
  layers = {str(i): _formation_step(curves.get(f'probe_recall_mass_layer{i}_{name}', []), preset.formation_threshold)
            for i in full_layers}
  return {'layers': layers,
          'first': _formation_step(curves.get(f'probe_recall_accuracy_{name}', []), preset.formation_threshold)}


def _settings_key(label: str, preset: Preset, seed: int) -> dict:
  return json.loads(json.dumps({'label': label, 'seed': seed, 'preset': dataclasses.asdict(preset)}))


def _finished(workdir: pathlib.Path, steps: int) -> dict | None:
  """The training report of a run that completed `steps` steps, else None."""
  try:
    report = json.loads((workdir / 'report.json').read_text())
  except (OSError, ValueError):
    return None
  return report if report.get('status') == 'completed' and report.get('steps') == steps else None


def run_one(label: str, preset: Preset, seed: int, out_dir: pathlib.Path, progress: bool = True) -> dict:
  """Trains (or resumes) and scores one arch and seed; a finished run with its scores saved is only read."""
  config = run_config(label, preset, seed)
  workdir = out_dir / config.name
  key = _settings_key(label, preset, seed)
  saved = workdir / RESULT_FILE
  train_report = _finished(workdir, preset.steps)
  if train_report is not None and saved.exists():
    try:
      stored = json.loads(saved.read_text())
    except ValueError:
      stored = {}
    if stored.get('key') == key:
      if progress:
        print(f'[{label} seed {seed}] finished earlier: scores read from {saved}', flush=True)
      return stored['result']
  if train_report is None:
    if progress:
      print(f'[{label} seed {seed}] training {preset.steps} steps in {workdir}', flush=True)
    train_report = training.train(config, workdir)
  run = runs_lib.load_run(workdir)
  curves = _curves(workdir)
  scores = _evaluate(run, preset)
  full_layers = [layer['index'] for layer in scores['recall']['layers'] if layer['role'] == 'full']
  result = {
      'label': label, 'arch': config.model.arch, 'seed': seed,
      'window': config.model.window if ARCHES[label][1] else None,
      'workdir': str(workdir), 'steps': train_report['steps'], 'status': train_report['status'],
      'wall_time_s': train_report.get('wall_time_s'),
      'packed_held_out_loss': (train_report.get('eval') or {}).get('packed_loss'),
      **scores, 'formation': formation(curves, full_layers, preset), 'curves': curves}
  saved.write_text(json.dumps({'key': key, 'result': result}) + '\n')
  if progress:
    print(f'[{label} seed {seed}] recall ' + ', '.join(
        f"{b['low']}<d<={b['high']}: {b['accuracy']}" for b in result['recall']['buckets']), flush=True)
  return result


def summarize(runs: dict, preset: Preset) -> dict:
  """Per arch, over seeds (mean, standard deviation across seeds, and the per-seed values): accuracy by bucket as
  trained and restricted, the drop, recall at the extrapolation length, held-out loss, each full layer's final
  retrieval-head score by bucket, and the step at which a full layer's retrieval head formed."""
  out = {}
  late = preset.steps + preset.probe_every  # A head that never formed counts as forming after the run.
  for label in ARCHES:
    seeds = [r for r in runs.values() if r['label'] == label]
    if not seeds:
      continue
    entry = {'seeds': [r['seed'] for r in seeds], 'accuracy': {}, 'byte_accuracy': {}, 'restricted': {}, 'drop': {},
             'extrapolation': {}, 'full_layers': {}}
    for j, bucket in enumerate(BUCKETS):
      acc = [r['recall']['buckets'][j]['accuracy'] for r in seeds]
      res = [r['restricted']['buckets'][j]['accuracy'] for r in seeds]
      entry['accuracy'][bucket] = spread(acc)
      entry['byte_accuracy'][bucket] = spread([r['recall']['buckets'][j].get('byte_accuracy') for r in seeds])
      entry['restricted'][bucket] = spread(res)
      entry['drop'][bucket] = spread([a - b for a, b in zip(acc, res) if a is not None and b is not None])
    entry['accuracy']['all'] = spread([r['recall']['accuracy'] for r in seeds])
    for j, bucket in enumerate(EXTRAPOLATION_BUCKETS):
      entry['extrapolation'][bucket] = spread([r['extrapolation']['buckets'][j]['accuracy'] for r in seeds
                                               if 'extrapolation' in r])
    entry['held_out_loss'] = spread([r.get('packed_held_out_loss') for r in seeds])
    for layer in seeds[0]['recall']['layers']:
      if layer['role'] != 'full':
        continue
      rows = [next(l for l in r['recall']['layers'] if l['index'] == layer['index']) for r in seeds]
      entry['full_layers'][str(layer['index'])] = {
          bucket: spread([max(row['mass'][j]) if row['mass'][j] else None for row in rows])
          for j, bucket in enumerate(BUCKETS)}
    firsts = [r['formation']['first'] for r in seeds if 'formation' in r]
    entry['formation'] = {'threshold': preset.formation_threshold,
                          'step': spread([late if s is None else s for s in firsts]),
                          'never': sum(s is None for s in firsts)}
    out[label] = entry
  return out


def train_in_parallel(preset_name: str, seeds: int, labels: list[str], out_dir: pathlib.Path, parallel: int,
                      progress: bool = True) -> None:
  """Trains the study's runs not yet finished, `parallel` at a time in processes of their own, through the sweep
  runner's local backend (sweep `mini` of configs/sweep.py: run_config's configs in run_one's run directories): one
  small model's training does not keep every core busy. run_one then only scores them."""
  preset = PRESETS[preset_name]
  arches = {ARCHES[label][0] for label in labels}
  sweep = f'mini,preset={preset_name},seeds={seeds}'
  members = [m for m in sweep_members.load(f'{SWEEP_FILE}:{sweep}', out_dir)
             if m.config.model.arch in arches and _finished(m.workdir, preset.steps) is None]
  if not members:
    return
  say = (lambda line: print(line, flush=True)) if progress else (lambda line: None)
  runner = sweep_runner.Runner(members, sweep_local.LocalBackend(parallel), sweep=sweep, say=say)
  if runner.run() != 0:
    rows = [sweep_record.describe(m.workdir, preset.steps) for m in members]
    lines = [f"{r['run']}: {runner.results.get(r['run'], r['state'])}" + (f": {r['cause']}" if r['cause'] else '')
             for r in rows if r['state'] != 'completed']
    raise runs_lib.RunError(f'--parallel={parallel}: {len(lines)} of {len(members)} runs did not finish training '
                            f'(the output of each is RUN/sweep.log under {out_dir}; rerun to resume):\n' +
                            '\n'.join(lines))


@contextlib.contextmanager
def shared_documents(preset: Preset, seeds: int, labels: list[str], out_dir: pathlib.Path, progress: bool = True):
  """While open, every run of the study reads its training documents from one store (hybrid_jax.data.recall_store,
  under out_dir/STORE_DIR), generated here by one process per core: the arches of a seed read the same documents in
  the same order, so each document is generated once instead of once per arch. Only the seeds with a run still to
  train are generated; runs started here inherit the store through the environment."""
  pending = {}  # Seed -> the config of one of its runs still to train (the arches of a seed read the same order).
  for seed in range(seeds):
    for label in labels:
      config = run_config(label, preset, seed)
      if _finished(out_dir / config.name, preset.steps) is None:
        pending[seed] = config
        break
  directory = out_dir / STORE_DIR
  if pending:
    reads = preset.steps * preset.batch_size + 4 * preset.batch_size  # The input pipeline reads a little ahead.
    indices = np.concatenate([pipeline.training_document_indices(seed_config, reads)
                              for seed_config in pending.values()])
    tic = time.perf_counter()
    data = next(iter(pending.values())).data  # The seed is not a data setting: one store serves every seed.
    path = recall_store.build(data, 'train', indices, directory, cores.count())
    if progress:
      print(f'{len(np.unique(indices)):,} training documents of seed(s) {list(pending)} in {path} '
            f'({time.perf_counter() - tic:.0f} s)', flush=True)
  before = os.environ.get(recall_store.ENV)
  os.environ[recall_store.ENV] = str(directory)
  try:
    yield directory
  finally:
    if before is None:
      os.environ.pop(recall_store.ENV, None)
    else:
      os.environ[recall_store.ENV] = before


def run_study(preset_name: str, out_dir, *, seeds: int | None = None, arches: list[str] | None = None,
              progress: bool = True, parallel: int = 1) -> dict:
  """Trains (or resumes), evaluates and reports the chosen arches (default: all four) of the preset for each seed;
  returns the report. With `parallel` > 1 the runs train in that many processes first (train_in_parallel)."""
  preset = PRESETS[preset_name]
  seeds = preset.seeds if seeds is None else seeds
  if seeds < 1:
    raise ConfigError(f'--seeds={seeds} is invalid: must be >= 1')
  arches = list(ARCHES) if arches is None else arches
  extrapolation_data(run_config(arches[0], preset).data, preset)  # An impossible preset fails before training.
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  results, started = {}, time.perf_counter()
  with shared_documents(preset, seeds, arches, out_dir, progress):
    if parallel > 1:
      train_in_parallel(preset_name, seeds, arches, out_dir, parallel, progress)
    for seed in range(seeds):
      for label in arches:
        tic = time.perf_counter()
        result = run_one(label, preset, seed, out_dir, progress)
        results[pathlib.Path(result['workdir']).name] = result
        if progress:
          print(f'[{label} seed {seed}] {time.perf_counter() - tic:.0f} s', flush=True)
  report = {'preset': preset_name, 'settings': dataclasses.asdict(preset), 'seeds': list(range(seeds)),
            'arches': list(ARCHES), 'edges': preset.edges, 'buckets': list(BUCKETS), 'fine_edges': preset.fine_edges,
            'extrapolation_length': preset.extrapolation_length, 'extrapolation_edges': preset.extrapolation_edges,
            'extrapolation_buckets': list(EXTRAPOLATION_BUCKETS), 'probe_names': probe_names(preset),
            'formation_threshold': preset.formation_threshold,
            'wall_time_s': time.perf_counter() - started, 'runs': results}
  report['summary'] = summarize(results, preset)
  judged = judge(report['summary'], preset)
  report['verdicts'] = [v.text() for v in judged]
  report['verdict_status'] = {v.name: v.status for v in judged}
  report['findings'] = findings(report) + report['verdicts']
  (out_dir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  from hybrid_jax.study import mini_plot  # pylint: disable=g-import-not-at-top  (matplotlib only when plotting)
  mini_plot.plot_report(report, out_dir / 'report.png')
  return report


def judge(summary: dict, preset: Preset) -> list:
  """The three verdicts (hybrid_jax.study.verdicts) on a summary."""
  config = run_config('SWA-2048', preset)
  where_caveat = lazy_caveat = ''
  if config.model.num_layers <= len(config.model.cycle):  # One cycle: the sliding layer lies only below the full one.
    alone = ('With one sliding layer under one full layer, the sliding layer cannot do both hops of the recall circuit '
             '(gather the value, match the key) alone')
    where_caveat = (f'{alone}, so a drop between the windows is expected here by construction; a deeper preset '
                    '(gpu-small) puts a sliding layer above a full one.')
    lazy_caveat = (f"{alone}, so the study's mechanism (sliding layers that retrieve inside their window leave the "
                   'full layers lazy) cannot act here; the steps compare how fast the two-layer circuit forms under a '
                   'wider first layer.')
  return [verdicts.where_retrieval_lives(summary, BUCKETS, where_caveat),
          verdicts.laziness(summary, preset.probe_every, preset.steps, lazy_caveat),
          verdicts.nope(summary, BEYOND_CONTEXT)]


def findings(report: dict) -> list[str]:
  """Plain statements of what the measured numbers show, before the verdicts."""
  p, summary = report['settings'], report['summary']
  preset = PRESETS[report['preset']]
  recall = dict(p['recall'])
  r = run_config('Full', preset).data.recall
  chance = 1 / r.value_chars ** r.value_length
  n = len(report['seeds'])
  lines = [
      f"Setup: {p['scale']} scale {dict(p['model']) or ''}, {p['steps']} steps of {p['batch_size']} rows of "
      f"{p['seq_len']} bytes, {n} seed(s). Recall documents hold {r.pairs} key-value pairs (keys of {r.key_length} "
      f"of {r.key_chars} letters, values of {r.value_length} of {r.value_chars} digits: chance {chance:.3f}), "
      f"{r.text_fraction:.0%} of documents are ordinary text{'; ' + str(recall) if recall else ''}. SWA-128 and "
      f"SWA-128-NoPE use a {p['small_window']}-token window, SWA-2048 a {p['large_window']}-token window. Distance "
      f"buckets: inside the small window (d <= {p['small_window']}), between the windows ({p['small_window']} < d <= "
      f"{p['large_window']}), beyond the large window (d > {p['large_window']}), and at twice the training length "
      f"{BEYOND_CONTEXT} (d > {p['seq_len']}); a query is correct when every answer byte is the argmax under teacher "
      f"forcing; {p['eval_documents']} held-out documents per run; ± is the standard deviation across seeds."]
  for label, e in summary.items():
    lines.append(f'{label}: recall ' + ', '.join(f'{b} {pm(e["accuracy"][b])}' for b in BUCKETS) +
                 ' (answer bytes right: ' + ', '.join(pm(e['byte_accuracy'][b]) for b in BUCKETS) + ')' +
                 f"; with its full-attention layers restricted to the last {p['small_window']} tokens: " +
                 ', '.join(f'{b} {pm(e["restricted"][b])}' for b in BUCKETS) + '; drop ' +
                 ', '.join(f'{b} {pm(e["drop"][b])}' for b in BUCKETS[1:]) +
                 f"; at {report['extrapolation_length']} tokens: " +
                 ', '.join(f'{b} {pm(e["extrapolation"][b])}' for b in EXTRAPOLATION_BUCKETS) +
                 f"; held-out loss {pm(e['held_out_loss'], 4)}.")
  for label, e in summary.items():
    parts = [f"layer {layer}: {BUCKETS[1]} {pm(by_bucket[BUCKETS[1]])}, {BUCKETS[2]} {pm(by_bucket[BUCKETS[2]])}"
             for layer, by_bucket in e['full_layers'].items()]
    f = e['formation']
    formed = (f"never reached {f['threshold']} in {p['steps']} steps" if f['never'] == len(e['seeds']) else
              f"first reached {f['threshold']} at step {pm(f['step'], 0)}" +
              (f" (never in {f['never']} seed(s), counted as step {p['steps'] + p['probe_every']})"
               if f['never'] else ''))
    lines.append(f"{label}: retrieval-head score of each full-attention layer (best head's attention mass on the "
                 "queried record, final parameters): " + '; '.join(parts) +
                 f"; recall beyond the large window (probe) {formed}.")
  lines.append("Not shown: anything about the study's scales, token budgets, natural-text retrieval or 16K context.")
  return lines


def main(argv) -> int:
  """Run the mini-study: train, evaluate and report SWA-128, SWA-2048, SWA-128-NoPE and Full on the recall task."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax study', description=__doc__)
  parser.add_argument('--preset', choices=sorted(PRESETS), default='mini', help='the study size')
  parser.add_argument('--out', default=None, type=checks.OUT_DIR,
                      help='output directory (default: runs/study_<preset>)')
  parser.add_argument('--seeds', type=checks.POSITIVE_INT, default=None,
                      help="number of seeds (0, 1, ...) per arch (default: the preset's)")
  parser.add_argument('--arches', default=None,
                      help=f'comma-separated subset of {", ".join(ARCHES)} (or their arch names; default: all)')
  parser.add_argument('--parallel', type=checks.POSITIVE_INT, default=None,
                      help="runs trained at a time (default: the preset's): above 1, the runs not yet trained train "
                      'in that many processes through the sweep runner (sweep run --sweep configs/sweep.py:mini), '
                      'then are scored here')
  args = parser.parse_args(argv)
  out = args.out or f'runs/study_{args.preset}'
  parallel = PRESETS[args.preset].parallel if args.parallel is None else args.parallel
  report = run_study(args.preset, out, seeds=args.seeds, arches=select_arches(args.arches), parallel=parallel)
  print('\n'.join(report['findings']))
  print(f'report: {out}/report.json, {out}/report.png')
  return 0


if __name__ == '__main__':
  sys.exit(command_line.run(main, sys.argv[1:]))
