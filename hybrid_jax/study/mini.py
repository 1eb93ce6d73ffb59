"""The mini-study (`python -m hybrid_jax study --preset mini`): the study's core comparison, small enough to run.

Every hybrid of the study (SWA at the small, middle and large windows, SWA-128-NoPE, 1:3 where the stack holds it,
head-wise, Lightning, Mamba-2, GDN) and Full train on the synthetic recall task (hybrid_jax/data/recall.py:
key-value records whose query comes back from a controlled distance, mixed with ordinary text), with the
during-training probe logging recall, each full layer's retrieval scores (attention mass and head ablation) and the
gradient that long-range answers send to its queries and keys, per distance bucket. At the end every run is scored
(hybrid_jax.study.mini_scoring) and, over seeds, the study's claims are judged (hybrid_jax.study.mini_report,
hybrid_jax.study.verdicts) as reproduced, not reproduced or not separable at the measured spread; one report
(report.json + report.png) leads with a table of claim, measurement and verdict.

Presets and arches live in hybrid_jax.study.presets. Every run directory is a normal run: rerunning the command
resumes unfinished runs and reuses the scores of finished ones (`mini_result.json` in the run directory, kept only
while the preset's settings are unchanged). The runs are also the sweep `mini` of the packaged `sweep` (run directories
of the same names), so `sweep run` can train them and the study then only scores them; `--parallel N` does this
itself, N runs at a time.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import time

import numpy as np

from hybrid_jax import cores, standard_hooks

from hybrid_jax.train import runs as runs_lib
from hybrid_jax.config import CONFIG_DIR, ConfigError
from hybrid_jax.data import pipeline, recall, recall_store
from hybrid_jax.study import mini_report, mini_scoring as scoring, verdicts
from hybrid_jax.study.presets import (ARCHES, BUCKETS, EXTRAPOLATION_BUCKETS, PRESETS, Preset, at_factor,
                                      extrapolation_data, run_config)
from hybrid_jax.sweep import local as sweep_local, members as sweep_members, record as sweep_record
from hybrid_jax.sweep import runner as sweep_runner

RESULT_FILE = 'mini_result.json'
STORE_DIR = 'recall_documents'  # Under the output directory: the training documents, generated once for all runs.
SWEEP_FILE = CONFIG_DIR / 'sweep.py'  # Its sweep `mini` holds the study's runs (packaged config `mini`).


# Preset fields that leave training as it was while the stop and the dense probes are off: left out of the settings
# key then, so the scores of runs a preset trained without them stay valid.
_UNTIL_FORMED_FIELDS = ('stop_when_formed', 'formed_threshold', 'formed_probes', 'dense_probe_every',
                        'dense_probe_until')


def _settings_key(label: str, preset: Preset, seed: int) -> dict:
  settings = dataclasses.asdict(preset)
  if not (preset.stop_when_formed or preset.dense_probe_every):
    settings = {k: v for k, v in settings.items() if k not in _UNTIL_FORMED_FIELDS}
  return json.loads(json.dumps({'label': label, 'seed': seed, 'preset': settings}))


def _finished(workdir: pathlib.Path, steps: int) -> dict | None:
  """The training report of a run done under a cap of `steps`: completed at the cap, or stopped early by its
  stopping rule within it. None for a run to train or resume, one trained to a smaller cap included."""
  try:
    report = json.loads((workdir / 'report.json').read_text())
  except (OSError, ValueError):
    return None
  if report.get('status') != 'completed':
    return None
  done = report.get('steps') == steps or (report.get('stopped_early') and report.get('steps', 0) <= steps)
  return report if done else None


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
      until = f'until formed, at most {preset.steps}' if preset.stop_when_formed else f'{preset.steps}'
      print(f'[{label} seed {seed}] training {until} steps in {workdir}', flush=True)
    train_report = standard_hooks.train(config, workdir)
  run = runs_lib.load_run(workdir)
  result = {
      'label': label, 'arch': config.model.arch, 'seed': seed,
      'window': preset.window(ARCHES[label][1]),
      'workdir': str(workdir), 'steps': train_report['steps'], 'status': train_report['status'],
      'stopped_early': train_report.get('stopped_early'),  # {'step', 'reason'}: the stopping rule ended it.
      'outcome': _outcome(train_report, preset),
      'wall_time_s': train_report.get('wall_time_s'),
      'packed_held_out_loss': (train_report.get('eval') or {}).get('packed_loss'),
      **scoring.score_run(run, scoring.curves(workdir), preset)}
  saved.write_text(json.dumps({'key': key, 'result': result}) + '\n')
  if progress:
    formed = {'formed': f"formed at step {result['steps']}, ", 'capped': 'capped, '}.get(result['outcome'], '')
    print(f'[{label} seed {seed}] {formed}recall ' + ', '.join(
        f"{b['low']}<d<={b['high']}: {b['accuracy']}" for b in result['recall']['buckets']), flush=True)
  return result


def _outcome(train_report: dict, preset: Preset) -> str | None:
  """'formed' (the stop once formed ended the run) or 'capped' (it reached the preset's cap unformed) when the
  preset trains until formed; None when it trains a fixed number of steps (or has not finished)."""
  if not preset.stop_when_formed:
    return None
  if train_report.get('stopped_early'):
    return 'formed'
  return 'capped' if train_report.get('status') == 'completed' and train_report['steps'] >= preset.steps else None


def train_in_parallel(preset_name: str, seeds: int, labels: list[str], out_dir: pathlib.Path, parallel: int,
                      progress: bool = True) -> None:
  """Trains the study's runs not yet finished, `parallel` at a time in processes of their own, through the sweep
  runner's local backend (sweep `mini` of the packaged `sweep`: run_config's configs in run_one's run directories): one
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
    path = recall.build_store(data, 'train', indices, directory, cores.count())
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
  """Trains (or resumes), evaluates and reports the chosen arches (default: the preset's) for each seed;
  returns the report. With `parallel` > 1 the runs train in that many processes first (train_in_parallel)."""
  preset = PRESETS[preset_name]
  seeds = preset.seeds if seeds is None else seeds
  if seeds < 1:
    raise ConfigError(f'--seeds={seeds} is invalid: must be >= 1')
  arches = list(preset.arches) if arches is None else arches
  data = run_config(arches[0], preset).data
  for factor in preset.extrapolation_factors:  # An impossible preset fails before training.
    extrapolation_data(data, preset, factor)
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
            'extrapolation': [{'factor': f, 'length': preset.extrapolation_length(f),
                               'edges': preset.extrapolation_edges(f),
                               'buckets': [at_factor(b, f) for b in EXTRAPOLATION_BUCKETS]}
                              for f in preset.extrapolation_factors],
            'probe_names': scoring.probe_names(preset),
            'formation_threshold': preset.formation_threshold,
            'wall_time_s': time.perf_counter() - started, 'runs': results}
  report['summary'] = scoring.summarize(results, preset)
  report['load'] = mini_report.loads(arches, preset)
  judged = mini_report.judge(report['summary'], preset)
  report['table'] = verdicts.table(judged)
  report['verdicts'] = [v.text() for v in judged]
  report['verdict_status'] = {v.name: v.status for v in judged}
  report['verdict_power'] = {v.name: v.power for v in judged}  # What each verdict's tests detect (study/power.py).
  report['findings'] = mini_report.findings(report) + report['verdicts']
  (out_dir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  from hybrid_jax.study import mini_plot  # pylint: disable=g-import-not-at-top  (matplotlib only when plotting)
  mini_plot.plot_report(report, out_dir / 'report.png')
  mini_plot.plot_seeds(report, out_dir / 'report_seeds.png')
  return report

