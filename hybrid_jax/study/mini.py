"""The mini-study (`python -m hybrid_jax study --preset mini`): the study's core comparison, small enough to run.

SWA-128, SWA-2048, SWA-128-NoPE and Full are trained with the during-training retrieval probe, then evaluated on
held-out loss by position and a needle probe at three depths; one report (report.json + report.png) puts the
curves side by side and states what the numbers show.

Scaled down, windows keep their role rather than their size: at a 512-token context a 2048-token window would
be full attention, so each preset maps the study's small and large windows onto its own context (the report
states the mapping). Every run directory is a normal run: rerunning the command resumes unfinished runs and
re-evaluates finished ones.
"""

import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

from hybrid_jax import command_line, runs as runs_lib, training
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from hybrid_jax.eval import position, suite
from hybrid_jax.train import metrics as metrics_lib

# Study label -> (arch in configs/hybrid.py, which window it uses: 'small' | 'large' | None).
ARCHES = {'SWA-128': ('swa128', 'small'), 'SWA-2048': ('swa2048', 'large'),
          'SWA-128-NoPE': ('swa128_nope', 'small'), 'Full': ('full', None)}


@dataclasses.dataclass(frozen=True)
class Preset:
  scale: str
  seq_len: int
  small_window: int
  large_window: int
  steps: int
  batch_size: int
  probe_every: int
  probe_samples: int = 4
  final_probe_samples: int = 16
  model: tuple = ()  # Extra model overrides (key, value).
  lr: float = 3e-3
  eval_batches: int = 4
  note: str = ''


PRESETS = {
    # ~25 minutes on 2 CPU cores (4 runs of 400 steps at ~0.6 s/step, probes and evaluation included).
    'mini': Preset(scale='tiny', seq_len=512, small_window=16, large_window=128, steps=400, batch_size=8,
                   probe_every=50, note='2 CPU cores, under 30 minutes'),
    # Sized for about 10 minutes on one H200 (not yet measured there): S1 shapes, byte vocabulary, 4K context.
    'gpu-small': Preset(scale='s1', seq_len=4096, small_window=32, large_window=512, steps=1500, batch_size=16,
                        probe_every=100, model=(('vocab_size', 257),), lr=1e-3, note='one H200, ~10 minutes'),
    # Seconds per run: exercises the machinery only (tests); its numbers mean nothing.
    'smoke': Preset(scale='tiny', seq_len=256, small_window=8, large_window=64, steps=4, batch_size=2,
                    probe_every=2, probe_samples=1, final_probe_samples=1, eval_batches=1,
                    model=(('d_model', 32), ('num_layers', 2), ('num_heads', 2), ('num_kv_heads', 1),
                           ('head_dim', 16), ('d_ff', 64)), note='machinery check only'),
}


def run_config(label: str, preset: Preset, seed: int = 0):
  """The validated train config of one arch of the preset."""
  arch, window = ARCHES[label]
  c = load_config_file(f'{BASE_CONFIG.parent / "hybrid.py"}:arch={arch},scale={preset.scale}')
  c.name = f'mini_{arch}'
  c.seed = seed
  c.data.tokenizer, c.data.seq_len = 'byte', preset.seq_len
  c.model.update(dict(preset.model))
  c.model.window = {'small': preset.small_window, 'large': preset.large_window, None: c.model.window}[window]
  c.train.update(dict(steps=preset.steps, batch_size=preset.batch_size, lr=preset.lr,
                      warmup_steps=max(1, preset.steps // 10), eval_every=max(1, preset.steps // 4),
                      checkpoint_every=max(1, preset.steps // 2), log_every=max(1, min(10, preset.steps // 4)),
                      eval_batches=preset.eval_batches, retrieval_probe_every=preset.probe_every,
                      retrieval_probe_samples=preset.probe_samples, retrieval_probe_length=preset.seq_len,
                      progress=False))
  c.eval.batches = preset.eval_batches
  return validate(c)


def _final_probe(run, samples: int) -> dict:
  """Needle accuracy per depth and retrieval-head score of the final parameters, on more prompts than in training."""
  from hybrid_jax.analysis import callbacks  # pylint: disable=g-import-not-at-top
  config = run.config.copy_and_resolve_references()
  config.train.retrieval_probe_samples = samples
  config.train.retrieval_probe_every = 1
  return callbacks.make_retrieval_probe(config, run.model_def)(run.params)


def _curves(workdir) -> dict:
  records = metrics_lib.read_jsonl(pathlib.Path(workdir) / 'metrics.jsonl')
  pick = lambda kind, key: [(r['step'], r[key]) for r in records if r['kind'] == kind and key in r]
  return {'train_loss': pick('train', 'loss'), 'eval_packed_loss': pick('eval', 'packed_loss'),
          'probe_niah_accuracy': pick('probe', 'niah_accuracy'),
          'probe_retrieval_top_score': pick('probe', 'retrieval_top_score'),
          'probe_seconds': pick('probe', 'seconds'), 'step_time_s': pick('train', 'step_time_s')}


def run_study(preset_name: str, out_dir, *, seed: int = 0, progress: bool = True) -> dict:
  """Trains (or resumes), evaluates and reports every arch of the preset; returns the report dict."""
  preset = PRESETS[preset_name]
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  results, started = {}, time.perf_counter()
  for label in ARCHES:
    config = run_config(label, preset, seed)
    workdir = out_dir / config.name
    if progress:
      print(f'[{label}] training {preset.steps} steps in {workdir}', flush=True)
    train_report = training.train(config, workdir)
    run = runs_lib.load_run(workdir)
    settings = suite.Settings(context_lengths=[preset.seq_len], batch_size=preset.batch_size,
                              ppl_batches=preset.eval_batches, progress=False, seed=seed)
    evaluated, _ = suite.run_tasks(run, [('ppl', [])], settings)
    ppl = evaluated['ppl']['by_context'][str(preset.seq_len)]
    results[label] = {
        'arch': config.model.arch, 'window': config.model.window if ARCHES[label][1] else None,
        'workdir': str(workdir), 'steps': train_report['steps'], 'status': train_report['status'],
        'wall_time_s': train_report.get('wall_time_s'), 'held_out_loss': ppl['loss'],
        'packed_held_out_loss': ppl['packed_loss'], 'documents': ppl['documents'],
        'loss_by_position': ppl['loss_by_position'], 'final_probe': _final_probe(run, preset.final_probe_samples),
        'curves': _curves(workdir)}
  report = {'preset': preset_name, 'settings': dataclasses.asdict(preset), 'seed': seed,
            'wall_time_s': time.perf_counter() - started, 'runs': results}
  report['findings'] = findings(report)
  (out_dir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  plot_report(report, out_dir / 'report.png')
  return report


def _formation_step(curve, threshold: float):
  """First probed step whose value reaches `threshold` (None if never)."""
  return next((step for step, value in curve if value >= threshold), None)


def findings(report: dict) -> list[str]:
  """Plain statements of what the measured numbers show, and the limits of what they can show."""
  runs = report['runs']
  p = report['settings']
  lines = [f"Setup: {p['scale']} scale, context {p['seq_len']} bytes, {p['steps']} steps of {p['batch_size']} "
           f"sequences, one seed ({report['seed']}). SWA-128 and SWA-128-NoPE use a {p['small_window']}-token window "
           f"and SWA-2048 a {p['large_window']}-token window (the study's small and large windows, scaled to this "
           'context).']
  order = sorted(runs, key=lambda k: runs[k]['held_out_loss'])
  documents = next(iter(runs.values()))['documents']
  lines.append(f"Held-out loss (nats/byte) over the first {p['seq_len']} bytes of {documents} held-out documents, "
               'best first: ' + ', '.join(f"{k} {runs[k]['held_out_loss']:.4f}" for k in order) +
               '; over packed held-out rows: ' +
               ', '.join(f"{k} {runs[k]['packed_held_out_loss']:.4f}" for k in order) + '.')
  for k, r in runs.items():
    first, last = r['loss_by_position'][0], r['loss_by_position'][-1]
    lines.append(f"{k}: loss {first['loss']:.3f} ± {first['stderr']:.3f} in the first position bucket, "
                 f"{last['loss']:.3f} ± {last['stderr']:.3f} in the last "
                 f"({'falls' if last['loss'] < first['loss'] else 'does not fall'} with position; ± one standard "
                 'error across documents).')
  acc = {k: r['final_probe'].get('niah_accuracy') for k, r in runs.items()}
  lines.append('Final needle accuracy (teacher-forced, depths 0.1/0.5/0.9): ' +
               ', '.join(f'{k} {v:.2f}' for k, v in acc.items() if v is not None) + '.')
  for k, r in runs.items():
    curve = r['curves']['probe_retrieval_top_score']
    if curve:
      formed = _formation_step(curve, 0.5)
      lines.append(f"{k}: top full-attention retrieval-head score {curve[0][1]:.3f} at step {curve[0][0]} -> "
                   f"{curve[-1][1]:.3f} at step {curve[-1][0]}; "
                   + (f'first >= 0.5 at step {formed}.' if formed is not None else 'never reached 0.5.'))
  lines.append('Not shown: anything about the study\'s scales, token budgets or 16K context; with one seed, '
               'differences smaller than seed-to-seed variation (not measured here) are not established.')
  return lines


def plot_report(report: dict, path) -> None:
  """Four panels: train loss, loss by position, needle accuracy vs step, retrieval-head score vs step."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(11, 8))
  axes = fig.subplots(2, 2).ravel()
  panels = [('train_loss', 'train loss'), (None, 'held-out loss by position in whole documents'),
            ('probe_niah_accuracy', 'needle accuracy (probe)'),
            ('probe_retrieval_top_score', 'top retrieval-head score (full layers)')]
  for ax, (key, title) in zip(axes, panels):
    ax.set_title(title)
    if key is None:
      position.plot(ax, report['runs'])
      continue
    for label, r in report['runs'].items():
      if r['curves'][key]:
        steps, values = zip(*r['curves'][key])
        ax.plot(steps, values, marker='.' if key.startswith('probe') else None, label=label)
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(f"mini-study, preset {report['preset']}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def main(argv) -> int:
  """Run the mini-study: train, evaluate and report SWA-128, SWA-2048, SWA-128-NoPE and Full."""
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax study', description=__doc__)
  parser.add_argument('--preset', choices=sorted(PRESETS), default='mini', help='the study size')
  parser.add_argument('--out', default=None, help='output directory (default: runs/study_<preset>)')
  parser.add_argument('--seed', type=int, default=0, help='seed of every run')
  args = parser.parse_args(argv)
  out = args.out or f'runs/study_{args.preset}'
  try:
    report = run_study(args.preset, out, seed=args.seed)
  except (ConfigError, runs_lib.RunError, suite.EvalError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print('\n'.join(report['findings']))
  print(f'report: {out}/report.json, {out}/report.png')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
