"""The mini-study's machinery end to end in smoke mode (a few steps per arch); the real preset is a slow test."""

import json

import pytest

from hybrid_jax.study import mini


def _check_report(out, preset):
  report = json.loads((out / 'report.json').read_text())
  assert (out / 'report.png').stat().st_size > 0
  assert report['preset'] == preset and set(report['runs']) == set(mini.ARCHES)
  p = mini.PRESETS[preset]
  for label, r in report['runs'].items():
    assert r['status'] == 'completed' and r['steps'] == p.steps
    arch, window = mini.ARCHES[label]
    assert r['arch'] == arch
    assert r['window'] == {'small': p.small_window, 'large': p.large_window, None: None}[window]
    steps = [s for s, _ in r['curves']['probe_niah_accuracy']]
    assert steps == list(range(p.probe_every, p.steps + 1, p.probe_every))
    assert r['curves']['probe_retrieval_top_score']  # every arch has full-attention layers
    assert 0.0 <= r['final_probe']['niah_accuracy'] <= 1.0
    assert any(label in line for line in report['findings'])
  return report


def test_smoke_study_runs_end_to_end(tmp_path, capsys):
  out = tmp_path / 'study'
  assert mini.main(['--preset', 'smoke', '--out', str(out)]) == 0
  _check_report(out, 'smoke')
  assert 'Held-out loss' in capsys.readouterr().out


def test_windows_follow_the_preset():
  p = mini.PRESETS['mini']
  assert mini.run_config('SWA-128', p).model.window == p.small_window
  assert mini.run_config('SWA-2048', p).model.window == p.large_window
  assert mini.run_config('SWA-128-NoPE', p).model.rope_full is False
  assert list(mini.run_config('Full', p).model.cycle) == ['full']


@pytest.mark.slow
def test_mini_preset(tmp_path):
  """The real preset (about 25 minutes on 2 cores)."""
  assert mini.main(['--preset', 'mini', '--out', str(tmp_path)]) == 0
  _check_report(tmp_path, 'mini')
