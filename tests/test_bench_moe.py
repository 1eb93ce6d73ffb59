"""`bench moe` (the MoE dispatch benchmark): its rows, table and JSON at tiny shapes, and its flags' one-line
refusals. Nothing here asserts a time."""

import json

import pytest

from hybrid_jax.bench import moe as bench_moe
from hybrid_jax.commands import bench as bench_command

FAST = ['--repeats', '1', '--min-seconds', '0']


def _run(tmp_path, impls):
  out = tmp_path / 'moe.json'
  code = bench_command.main(['moe', '--shapes', '48x16x24x4x2,32x8x8x2x1', '--impls', impls, *FAST,
                             '--json', str(out)])
  return code, json.loads(out.read_text())


def test_moe_bench_prints_a_row_per_shape_and_dispatch(tmp_path, capsys):
  code, result = _run(tmp_path, 'ragged_dot,dense')
  assert code == 0
  rows = result['rows']
  assert [(r['shape'], r['impl']) for r in rows] == [('48x16x24x4x2', 'ragged_dot'), ('48x16x24x4x2', 'dense'),
                                                     ('32x8x8x2x1', 'ragged_dot'), ('32x8x8x2x1', 'dense')]
  for r in rows:
    assert 'error' not in r and r['fwd_ms'] > 0 and r['fwd_bwd_ms'] > 0 and r['fwd_tflops'] > 0
    assert r['fwd_vs_dense'] > 0 and r['fwd_bwd_vs_dense'] > 0
  assert rows[1]['fwd_vs_dense'] == 1.0
  assert result['meta']['args']['shapes'] == ['48x16x24x4x2', '32x8x8x2x1']
  text = capsys.readouterr().out
  assert '| shape (T x D x F x E x k) | impl | fwd ms |' in text
  assert sum(line.startswith('| 48x16x24x4x2 |') for line in text.splitlines()) == 2


def test_the_model_flops_are_the_layers():
  shape = bench_moe.parse_shape('48x16x24x4x2')
  # Router 16 x 4, then 2 experts of 3 matrices 16 x 24 per token; 2 FLOPs a multiply-add.
  assert bench_moe.forward_flops(shape) == 2 * 48 * (16 * 4 + 2 * 3 * 16 * 24)


@pytest.mark.e2e
def test_moe_bench_times_gmm_in_interpret_mode_on_cpu(tmp_path):
  code, result = _run(tmp_path, 'gmm,dense')
  assert code == 0 and all('error' not in r and r['fwd_bwd_ms'] > 0 for r in result['rows'])


@pytest.mark.parametrize('argv, needle', [
    (['--shapes', '64x16x24'], "argument --shapes: '64x16x24' is invalid: a shape is five positive integers"),
    (['--shapes', '64x16x24x4x8'], "'64x16x24x4x8' is invalid: top_k 8 is more than the 4 experts"),
    (['--shapes', '64x16x0x4x2'], 'is invalid: a shape is five positive integers'),
    (['--impls', 'ragged_dot,cuda'], "'cuda' not among the MoE dispatches ragged_dot, gmm, dense"),
    (['--repeats', '0'], 'argument --repeats'),
    (['--dtype', 'float16'], 'argument --dtype'),
])
def test_a_bad_flag_is_one_error_line(argv, needle, capsys):
  with pytest.raises(SystemExit) as exit_:
    bench_command.main(['moe', *argv])
  assert exit_.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1 and needle in err, err
