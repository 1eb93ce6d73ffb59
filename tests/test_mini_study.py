"""The mini-study's machinery end to end in smoke mode (a few steps per arch); the real preset is a slow test."""

import json

import pytest

from hybrid_jax.study import mini


def _check_report(out, preset, seeds=1):
  report = json.loads((out / 'report.json').read_text())
  assert (out / 'report.png').stat().st_size > 0
  p = mini.PRESETS[preset]
  assert report['preset'] == preset and report['seeds'] == list(range(seeds))
  assert len(report['runs']) == len(mini.ARCHES) * seeds and set(report['summary']) == set(mini.ARCHES)
  names = mini._probe_names(p)
  for r in report['runs'].values():
    assert r['status'] == 'completed' and r['steps'] == p.steps
    arch, window = mini.ARCHES[r['label']]
    assert r['arch'] == arch
    assert r['window'] == {'small': p.small_window, 'large': p.large_window, None: None}[window]
    steps = [s for s, _ in r['curves']['probe_recall_accuracy']]
    assert steps == list(range(p.probe_every, p.steps + 1, p.probe_every))
    for name in ('recall', 'restricted'):
      assert [(b['low'], b['high']) for b in r[name]['buckets']] == list(zip(p.edges, p.edges[1:]))
      assert sum(b['queries'] for b in r[f'{name}_fine']['buckets']) == r[name]['queries']
    full = [l['index'] for l in r['recall']['layers'] if l['role'] == 'full']
    assert full  # every arch has full-attention layers, each with its probe curve per bucket
    for layer in full:
      assert all(f'probe_recall_mass_layer{layer}_{n}' in r['curves'] for n in names)
  for label, e in report['summary'].items():
    assert set(e['accuracy']) == set(mini.BUCKETS) | {'all'} and len(e['seeds']) == seeds
    assert e['full_layers'] and any(label in line for line in report['findings'])
  return report


def test_smoke_study_runs_end_to_end(tmp_path, capsys):
  out = tmp_path / 'study'
  assert mini.main(['--preset', 'smoke', '--out', str(out)]) == 0
  _check_report(out, 'smoke')
  assert 'restricted to the last' in capsys.readouterr().out


def test_summary_over_seeds_hand_computed():
  def run(label, seed, acc, res, mass):
    bucket = lambda values: {'buckets': [{'accuracy': v} for v in values], 'accuracy': sum(values) / 3,
                             'layers': [{'index': 1, 'role': 'full', 'mass': [[m, 0.0] for m in mass]},
                                        {'index': 0, 'role': 'efficient', 'mass': [[9.0]] * 3}]}
    return {'label': label, 'seed': seed, 'recall': bucket(acc), 'restricted': bucket(res)}
  runs = {'a': run('Full', 0, [1.0, 0.8, 0.4], [1.0, 0.2, 0.0], [0.1, 0.5, 0.7]),
          'b': run('Full', 1, [1.0, 0.6, 0.2], [1.0, 0.2, 0.2], [0.1, 0.3, 0.5])}
  e = mini.summarize(runs, mini.PRESETS['smoke'])['Full']
  between, beyond = mini.BUCKETS[1:]
  assert e['accuracy'][between] == {'mean': pytest.approx(0.7), 'std': pytest.approx(0.1), 'values': [0.8, 0.6]}
  assert e['drop'][between]['mean'] == pytest.approx(0.5) and e['drop'][between]['std'] == pytest.approx(0.1)
  assert e['drop'][beyond]['values'] == pytest.approx([0.4, 0.0])
  assert list(e['full_layers']) == ['1']  # the efficient layer is not reported
  assert e['full_layers']['1'][beyond]['mean'] == pytest.approx(0.6)


def test_windows_and_distances_follow_the_preset():
  for p in mini.PRESETS.values():
    assert mini.run_config('SWA-128', p).model.window == p.small_window
    assert mini.run_config('SWA-2048', p).model.window == p.large_window
    assert mini.run_config('SWA-128-NoPE', p).model.rope_full is False
    assert list(mini.run_config('Full', p).model.cycle) == ['full']
    highs = [hi for _, hi in p.distance_ranges]
    lows = [lo for lo, _ in p.distance_ranges]
    # One range per bucket: inside the small window, between the windows, beyond the large one.
    assert highs[:2] == [p.small_window, p.large_window] and highs[2] <= p.seq_len
    assert lows[1] > p.small_window and lows[2] > p.large_window


@pytest.mark.slow
def test_mini_preset(tmp_path):
  """The real preset (about 21 minutes on 2 cores, BENCHMARKS.md)."""
  assert mini.main(['--preset', 'mini', '--out', str(tmp_path)]) == 0
  _check_report(tmp_path, 'mini', seeds=mini.PRESETS['mini'].seeds)


def test_verdicts_need_two_seeds_and_a_gap_beyond_the_spreads():
  def arch(acc_beyond, drop_between, n):
    spread = lambda m: {'mean': m, 'std': 0.05, 'values': [m] * n}
    return {'accuracy': {b: spread(0.9 if b != mini.BUCKETS[2] else acc_beyond) for b in mini.BUCKETS},
            'drop': {b: spread(drop_between) for b in mini.BUCKETS}}
  one = {'SWA-128': arch(0.9, 0.8, 1), 'SWA-2048': arch(0.3, 0.0, 1)}
  assert mini._verdicts(one, 1e-4, {})[0].startswith('One seed')
  two = {'SWA-128': arch(0.9, 0.8, 2), 'SWA-2048': arch(0.3, 0.0, 2)}
  lines = mini._verdicts(two, 1e-4, {})
  assert 'hurts SWA-128' in lines[0] and 'laziness appears' in lines[1]
  close = {'SWA-128': arch(0.9, 0.1, 2), 'SWA-2048': arch(0.85, 0.05, 2)}  # gaps inside the spreads
  assert 'not established' in mini._verdicts(close, 1e-4, {})[1]
