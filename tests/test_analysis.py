"""The `analyze` tools end to end on the session's tiny trained run: each writes its JSON and PNG; CLI errors."""

import json

import pytest

from hybrid_jax import commands
from hybrid_jax.commands import analyze as cli, parsing

FAST = ['--no-progress', '--batch-size', '8']


def _analyze(*argv):
  return cli.main(list(argv) + FAST)


def _outputs(workdir, name):
  data = json.loads((workdir / 'analysis' / f'{name}.json').read_text())
  assert (workdir / 'analysis' / f'{name}.png').stat().st_size > 1000
  return data


def test_analyze_is_registered():
  assert commands.COMMANDS['analyze'][0] == 'hybrid_jax.commands.analyze'


def test_retrieval_heads_end_to_end(tiny_run):
  assert _analyze('retrieval-heads', '--workdir', str(tiny_run), '--source', 'study', '--length', '256',
                  '--samples', '6') == 0
  data = _outputs(tiny_run, 'retrieval_heads')
  assert [l['kind'] for l in data['layers']] == ['swa', 'full'] and all(l['scored'] for l in data['layers'])
  assert len(data['top_heads']['mass']) == 4 and len(data['layers'][1]['copy']) == 4
  assert all(0 <= h <= 1 for l in data['layers'] for h in l['mass'])
  assert data['step'] == 12 and data['num_samples'] == 6


def test_tracing_and_overlay_end_to_end(tiny_run, tmp_path):
  assert _analyze('tracing', '--workdir', str(tiny_run), '--length', '256', '--samples', '4') == 0
  data = _outputs(tiny_run, 'tracing')
  assert data['steps'] == [4, 8, 12] and data['reference_step'] == 12 and len(data['heads']) == 4
  for head in data['heads']:
    assert head['q_distance'][-1] == 0 and head['k_relative'][-1] == 0  # The reference is the final step.
    assert head['q_distance'][0] > 0 and all(0 <= e <= 1 for e in head['entropy'])
  assert cli.main(['tracing-overlay', '--runs', str(tiny_run), str(tiny_run / 'analysis' / 'tracing.json'),
                   '--labels', 'a', 'b', '--out', str(tmp_path)]) == 0
  overlay = json.loads((tmp_path / 'tracing_overlay.json').read_text())
  assert [r['label'] for r in overlay['runs']] == ['a', 'b'] and (tmp_path / 'tracing_overlay.png').exists()


def test_restriction_end_to_end(tiny_run):
  assert _analyze('restriction', '--workdir', str(tiny_run), '--windows', '8', '--sinks', '2',
                  '--length', '256', '--samples', '4', '--batches', '1') == 0
  data = _outputs(tiny_run, 'restriction')
  rows = {r['restriction']: r for r in data['rows']}
  assert set(rows) == {'none', 'full W=8 S=2', 'efficient W=8 S=2'}
  for row in rows.values():  # The window-invariance cases are in test_analysis_units.py.
    assert len(row['loss_by_position']) == 4 and 0 <= row['niah_accuracy'] <= 1 and row['loss'] > 0
  assert rows['full W=8 S=2']['loss'] != pytest.approx(rows['none']['loss'], abs=1e-6)
  assert '| restriction |' in (tiny_run / 'analysis' / 'restriction.md').read_text()


def test_probing_end_to_end(tiny_run):
  assert _analyze('probing', '--workdir', str(tiny_run), '--samples', '40', '--length', '256') == 0
  data = _outputs(tiny_run, 'probing')
  assert len(data['residual']) == len(data['delta']) == 2 and data['chance'] == 1 / 8
  assert [l['role'] for l in data['layers']] == ['efficient', 'full']
  assert all(0 <= a <= 1 for a in data['residual'] + data['delta'])


def test_gradient_influence_end_to_end(tiny_run):
  assert _analyze('gradient-influence', '--workdir', str(tiny_run), '--samples', '4', '--batch-size', '4') == 0
  data = _outputs(tiny_run, 'gradient_influence')
  assert data['distance'][0] == 1 and len(data['G']) == data['context'] == 64 and data['num_samples'] == 4
  assert all(g > 0 for g in data['G'])  # Full attention reaches every earlier token.


def _status(argv) -> int:
  """The exit status of `analyze ARGV` as the command line reports it (a user error: one line, status 2)."""
  try:
    return parsing.run(cli.main, argv)
  except SystemExit as e:  # A bad flag, refused while parsing.
    return e.code


def test_cli_errors(tiny_run, tmp_path, capsys):
  assert _status(['no-such-tool', '--workdir', str(tiny_run)]) == 2
  assert _status(['probing', '--workdir', str(tmp_path / 'missing')]) == 2
  assert 'missing: does not exist' in capsys.readouterr().err
  empty = tmp_path / 'empty'
  empty.mkdir()
  assert _status(['probing', '--workdir', str(empty)]) == 2
  assert 'no config.json' in capsys.readouterr().err
  assert _status(['restriction', '--workdir', str(tiny_run), '--windows', '0']) == 2
  assert "argument --windows: '0' is invalid: must be a positive integer" in capsys.readouterr().err
  assert _status(['restriction', '--workdir', str(tiny_run), '--windows', '8', '--targets', 'mlp']) == 2
  assert "target 'mlp' is invalid" in capsys.readouterr().err
  assert _status(['tracing', '--workdir', str(tiny_run), '--heads', '0:9']) == 2
  assert 'head 9' in capsys.readouterr().err
