"""The mini-study's machinery end to end in smoke mode (a few steps per arch); the real preset is a slow test."""

import dataclasses
import json
import os

import numpy as np
import pytest

from hybrid_jax.commands import study as study_command
from hybrid_jax.config import ConfigError, load_config_file, resolve_spec
from hybrid_jax.data import pipeline, recall, recall_store
from hybrid_jax.errors import UserError
from hybrid_jax.models import counting, pattern
from hybrid_jax.models.mixers import attention
from hybrid_jax.study import mini, mini_scoring as scoring, presets
from hybrid_jax.commands import sweep as sweep_cli
from hybrid_jax.sweep import members as sweep_members


def _check_report(out, preset, seeds=1):
  report = json.loads((out / 'report.json').read_text())
  assert (out / 'report.png').stat().st_size > 0
  p = presets.PRESETS[preset]
  assert report['preset'] == preset and report['seeds'] == list(range(seeds))
  assert len(report['runs']) == len(p.arches) * seeds and list(report['summary']) == list(p.arches)
  names = scoring.probe_names(p)
  for r in report['runs'].values():
    assert r['status'] == 'completed' and r['steps'] == p.steps
    arch, window = presets.ARCHES[r['label']]
    assert r['arch'] == arch
    assert r['window'] == {'small': p.small_window, 'middle': p.middle_window, 'large': p.large_window,
                           None: None}[window]
    steps = [s for s, _ in r['curves']['probe_recall_accuracy']]
    assert steps == list(range(p.probe_every, p.steps + 1, p.probe_every))
    for name in ('recall', 'restricted'):
      assert [(b['low'], b['high']) for b in r[name]['buckets']] == list(zip(p.edges, p.edges[1:]))
      assert sum(b['queries'] for b in r[f'{name}_fine']['buckets']) == r[name]['queries']
    full = [l['index'] for l in r['recall']['layers'] if l['role'] in ('full', 'headwise')]
    assert full  # every arch has full-attention heads, each layer with its probe curves per bucket
    assert set(r['ablation']['layers']) == set(r['formation']['layers']) == {str(i) for i in full}
    for layer in full:
      for n in names:
        for key in ('recall_mass_layer', 'recall_ablation_layer', 'qk_grad_layer'):
          assert f'probe_{key}{layer}_{n}' in r['curves'], (key, layer, n)
    assert len(r['gradient_signal']) == 3 and all(g > 0 for g in r['gradient_signal'])
    # Documents of 2x and 4x the training length, scored by distance up to beyond the training context.
    assert [x['factor'] for x in r['extrapolation']] == list(p.extrapolation_factors) == [2, 4]
    for x in r['extrapolation']:
      edges = p.extrapolation_edges(x['factor'])
      assert [(b['low'], b['high']) for b in x['buckets']] == list(zip(edges, edges[1:]))
      assert x['buckets'][-1]['queries'] > 0 and x['buckets'][-1]['low'] == p.seq_len
  for label, e in report['summary'].items():
    assert set(e['accuracy']) == set(presets.BUCKETS) | {'all'} and len(e['seeds']) == seeds
    assert list(e['extrapolation']) == p.extrapolation_names and e['held_out_loss']['mean'] > 0
    assert e['full_layers'] and any(label in line for line in report['findings'])
  assert [v.split(':')[0] for v in report['verdicts']] == [
      'Where retrieval lives (sliding-window hybrids)', 'Where retrieval lives (recurrent hybrids)',
      'Large-window laziness', 'Gradient signal behind laziness', 'Emergence differs, final recall converges',
      'NoPE on full layers']
  assert report['table'][0] == '| study claim | measured here | verdict |' and len(report['table']) == 8
  return report


@pytest.mark.e2e
def test_smoke_study_runs_end_to_end(tmp_path, capsys, monkeypatch):
  out = tmp_path / 'study'
  assert study_command.main(['--preset', 'smoke', '--out', str(out)]) == 0
  _check_report(out, 'smoke')
  printed = capsys.readouterr().out
  assert 'restricted to the last' in printed and 'NoPE on full layers:' in printed
  assert printed.startswith('| study claim | measured here | verdict |') or '\n| study claim |' in printed
  # The runs' training documents were generated once, into the study's store; the environment is as it was.
  config = presets.run_config('Full', presets.PRESETS['smoke'])
  store = recall_store.load(out / mini.STORE_DIR, recall.settings(config.data), 'train')
  assert np.isin(pipeline.training_document_indices(config, 4 * 2), store.indices).all()
  assert 'training documents of seed(s) [0]' in printed and recall_store.ENV not in os.environ
  # A rerun reads finished runs (no training, no scoring); --arches keeps a subset.
  workdir = out / 'mini_full_seed0'
  before = {f: (workdir / f).read_bytes() for f in ('metrics.jsonl', 'report.json', mini.RESULT_FILE)}
  assert study_command.main(['--preset', 'smoke', '--out', str(out), '--arches', 'full']) == 0
  assert 'finished earlier' in capsys.readouterr().out
  assert {f: (workdir / f).read_bytes() for f in before} == before
  report = json.loads((out / 'report.json').read_text())
  assert list(report['summary']) == ['Full'] and len(report['runs']) == 1
  # Other preset settings: the run is scored again (not retrained: same training record).
  monkeypatch.setitem(presets.PRESETS, 'smoke', dataclasses.replace(presets.PRESETS['smoke'], eval_documents=3))
  assert study_command.main(['--preset', 'smoke', '--out', str(out), '--arches', 'Full']) == 0
  assert 'finished earlier' not in capsys.readouterr().out
  assert (workdir / 'metrics.jsonl').read_bytes() == before['metrics.jsonl']
  assert json.loads((workdir / mini.RESULT_FILE).read_text())['key']['preset']['eval_documents'] == 3


def test_arches_are_chosen_by_label_or_arch_name():
  assert presets.select_arches(None) == list(presets.ARCHES)
  assert presets.select_arches(None, presets.PRESETS['mini']) == list(presets.PRESETS['mini'].arches)
  assert 'SWA-128-1:3' not in presets.PRESETS['mini'].arches and 'GDN' in presets.PRESETS['mini'].arches
  assert presets.select_arches(None, presets.PRESETS['mini-deep']) == list(presets.ARCHES)
  assert presets.select_arches('full, swa128_nope,SWA-128') == ['SWA-128', 'SWA-128-NoPE', 'Full']
  with pytest.raises(ConfigError, match="'swa64' is not one of"):
    presets.select_arches('full,swa64')


def _numbers(out) -> dict:
  """A study report without what timing or the output folder changes (training is deterministic per seed)."""
  report = json.loads((out / 'report.json').read_text())
  runs = {name: {**{k: v for k, v in r.items() if k not in ('wall_time_s', 'workdir')},
                 'curves': {k: v for k, v in r['curves'].items() if k != 'probe_seconds'}}
          for name, r in report['runs'].items()}
  return {**{k: v for k, v in report.items() if k != 'wall_time_s'}, 'runs': runs}


@pytest.mark.e2e
def test_parallel_study_trains_through_the_sweep_runner_to_the_same_numbers(tmp_path, capsys):
  """--parallel 2 trains the runs in two `train` processes of the sweep runner (the sweep `mini`) and scores them
  here: the report equals --parallel 1's, and the sweep reads the study's run directories as its own."""
  serial, parallel = tmp_path / 'serial', tmp_path / 'parallel'
  study = ['--preset', 'smoke', '--arches', 'full,swa128']
  assert study_command.main([*study, '--out', str(serial)]) == 0
  assert study_command.main([*study, '--out', str(parallel), '--parallel', '2']) == 0
  printed = capsys.readouterr().out
  assert printed.count('training 4 steps') == 2  # In this process: the serial study's runs only.
  assert 'sweep mini,preset=smoke,seeds=1: 2/2 completed' in printed, printed
  for name in ('mini_swa128_seed0', 'mini_full_seed0'):
    assert json.loads((parallel / name / 'sweep.json').read_text())['state'] == 'completed'
    assert '--config=mini:arch=' in (parallel / name / 'sweep.log').read_text()  # The packaged config, by name.
  assert _numbers(parallel) == _numbers(serial)
  # The sweep finds the runs the study trained in this process completed, the others pending; an override that
  # changes a key defining the trained runs is refused for them.
  sweep = ['--sweep=sweep:mini,preset=smoke', f'--root={serial}', '--dry-run']
  assert sweep_cli.main(['run', *sweep]) == 0
  decisions = [line for line in capsys.readouterr().out.splitlines() if line.startswith('# ')]
  started = [presets.ARCHES[label][0] for label in presets.PRESETS['smoke'].arches
             if label not in ('SWA-128', 'Full')]
  assert decisions == (['# mini_swa128_seed0: completed at step 4'] + [f'# mini_{a}_seed0: starts' for a in started] +
                       ['# mini_full_seed0: completed at step 4'])
  assert sweep_cli.main(['run', *sweep, '--config.model.d_ff=96']) == 0
  refused = [line for line in capsys.readouterr().out.splitlines() if 'define the run: model.d_ff' in line]
  assert [line.split(':')[0] for line in refused] == ['# mini_swa128_seed0', '# mini_full_seed0']


def test_the_mini_config_file_and_sweep_hold_the_studys_runs(tmp_path):
  for preset_name, preset in presets.PRESETS.items():
    for label in preset.arches + ('SWA-128-NoPE',):
      arch = presets.ARCHES[label][0]
      expected = presets.run_config(label, preset, 2).to_dict()
      for name in (arch, label):  # An arch name or a study label.
        config = load_config_file(resolve_spec(f'mini:arch={name},preset={preset_name},seed=2'))
        assert config.to_dict() == expected and config.name == f'mini_{arch}_seed2'
  smoke = presets.PRESETS['smoke']
  members = sweep_members.load('sweep:mini,preset=smoke,seeds=2', tmp_path)
  expected = [presets.run_config(label, smoke, seed) for seed in range(2) for label in smoke.arches]
  assert [m.name for m in members] == [c.name for c in expected]
  assert [m.workdir for m in members] == [tmp_path / c.name for c in expected]  # The study's run directories.
  assert [m.config.to_dict() for m in members] == [c.to_dict() for c in expected]
  assert members[0].tags[0] == 'sweep:mini,preset=smoke,seeds=2'
  default = sweep_members.load('sweep:mini', tmp_path)
  assert len(default) == len(presets.PRESETS['mini'].arches) * presets.PRESETS['mini'].seeds
  assert default[0].config.to_dict() == presets.run_config('SWA-128', presets.PRESETS['mini']).to_dict()


@pytest.mark.parametrize('spec, message', [
    ('mini:arch=swa64', "mini config: arch='swa64' is invalid: 'swa64' is not one of SWA-128"),
    ('mini:arch=full,preset=huge', "mini config: preset='huge' is unknown; allowed: mini"),
    ('mini:arch=full,seed=-1', "mini config: seed='-1' is invalid: must be an integer >= 0"),
    ('mini:arch=full,steps=5', "mini config: bad argument 'steps=5'"),
    ('mini', 'mini config: give arch=NAME'),
    ('mini:arch=swa128_1to3', "preset 'mini' cannot hold SWA-128-1:3: its 2-layer stack of swa/swa/swa/full"
                              ' has no full-attention layer; presets with it: mini-deep'),
    ('sweep:mini,seeds=0', "sweep mini: seeds='0' is invalid: must be a positive integer"),
    ('sweep:mini,preset=huge', "preset='huge' is unknown"),
    ('sweep:mini,arch=full', "sweep mini: bad argument 'arch=full'; expected mini,preset=...,seeds=..."),
    ('sweep:main,seeds=2', "sweep main: bad argument 'seeds=2'; expected main (it takes no arguments)"),
])
def test_bad_mini_config_and_sweep_arguments_are_one_line(spec, message):
  with pytest.raises(UserError) as error:
    if spec.startswith('mini'):
      load_config_file(resolve_spec(spec))
    else:
      sweep_members.load(spec, '/nonexistent')
  assert message in str(error.value) and '\n' not in str(error.value)


def test_summary_over_seeds_hand_computed():
  def run(label, seed, acc, res, mass):
    bucket = lambda values: {'buckets': [{'accuracy': v} for v in values], 'accuracy': sum(values) / 3,
                             'layers': [{'index': 1, 'role': 'full', 'mass': [[m, 0.0] for m in mass]},
                                        {'index': 0, 'role': 'efficient', 'mass': [[9.0]] * 3}]}
    return {'label': label, 'seed': seed, 'recall': bucket(acc), 'restricted': bucket(res)}
  runs = {'a': run('Full', 0, [1.0, 0.8, 0.4], [1.0, 0.2, 0.0], [0.1, 0.5, 0.7]),
          'b': run('Full', 1, [1.0, 0.6, 0.2], [1.0, 0.2, 0.2], [0.1, 0.3, 0.5])}
  e = scoring.summarize(runs, presets.PRESETS['smoke'])['Full']
  between, beyond = presets.BUCKETS[1:]
  assert e['accuracy'][between] == {'mean': pytest.approx(0.7), 'std': pytest.approx(0.1), 'values': [0.8, 0.6]}
  assert e['drop'][between]['mean'] == pytest.approx(0.5) and e['drop'][between]['std'] == pytest.approx(0.1)
  assert e['drop'][beyond]['values'] == pytest.approx([0.4, 0.0])
  assert list(e['full_layers']) == ['1']  # the efficient layer is not reported
  assert e['full_layers']['1'][beyond]['mean'] == pytest.approx(0.6)


def test_windows_and_distances_follow_the_preset():
  for p in presets.PRESETS.values():
    assert presets.run_config('SWA-128', p).model.window == p.small_window
    assert presets.run_config('SWA-2048', p).model.window == p.large_window
    assert presets.run_config('SWA-512', p).model.window == p.middle_window
    assert p.small_window < p.middle_window < p.large_window
    headwise = presets.run_config('Head-wise', p).model
    assert headwise.headwise_full_kv_heads == headwise.num_kv_heads // 2  # the study's half-and-half layers
    assert presets.run_config('SWA-128-NoPE', p).model.rope_full is False
    assert list(presets.run_config('Full', p).model.cycle) == ['full']
    highs = [hi for _, hi in p.distance_ranges]
    lows = [lo for lo, _ in p.distance_ranges]
    # One range per bucket: inside the small window, between the windows, beyond the large one.
    assert highs[:2] == [p.small_window, p.large_window] and highs[2] <= p.seq_len
    assert lows[1] > p.small_window and lows[2] > p.large_window
    for factor in p.extrapolation_factors:  # valid, and beyond the training context
      long = presets.extrapolation_data(presets.run_config('Full', p).data, p, factor)
      lo, hi = long.recall.distance_ranges[-1]
      assert long.seq_len == factor * p.seq_len and lo > p.seq_len and hi <= (factor - 0.5) * p.seq_len


def test_recurrent_mixers_match_the_attention_layer_within_5_percent():
  """The study sizes each recurrent mixer to the attention layer it replaces; so does every preset but smoke."""
  for name, p in presets.PRESETS.items():
    if name == 'smoke':
      continue
    for label in presets.RECURRENT_ARCHES:
      model = presets.run_config(label, p).model
      ratio = counting.mixer_params(model, pattern.layer_spec(model, 0)) / attention.attention_params(model)
      assert abs(ratio - 1) <= 0.05, (name, label, ratio)


def test_the_two_cycle_preset_puts_a_sliding_layer_above_a_full_one():
  deep = presets.PRESETS['mini-deep']
  for label in ('SWA-128', 'SWA-128-1:3', 'GDN'):
    model = presets.run_config(label, deep).model
    kinds = [pattern.layer_spec(model, i).kind for i in range(model.num_layers)]
    assert 'full' in kinds and any(k != 'full' for k in kinds[kinds.index('full') + 1:]) or label == 'SWA-128-1:3'
  one_to_three = presets.run_config('SWA-128-1:3', deep).model
  assert [pattern.layer_spec(one_to_three, i).kind for i in range(4)] == ['swa', 'swa', 'swa', 'full']
