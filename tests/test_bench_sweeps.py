"""The kernel and decode benchmark programs' machinery (not their speed): a failed measurement of a sweep keeps its
whole error in the JSON while the others still run and the command exits non-zero; decode rows report the real
decode state."""

import json

import jax
import pytest

from hybrid_jax.bench import attention as bench_attention
from hybrid_jax.bench import scan as bench_scan

# Long and multi-line, as XLA's and Mosaic's errors are: nothing of it may be cut.
LONG_ERROR = 'the kernel cannot be lowered:\n' + '\n'.join(f'  line {i}: ' + 'x' * 150 for i in range(4))


def _failing_for(impl, real):
  def call(*args, implementation=None, **kwargs):
    if implementation == impl:
      raise RuntimeError(LONG_ERROR)
    return real(*args, implementation=implementation, **kwargs)
  return call


def _check_rows(rows, failing_impl, capsys):
  failed = [r for r in rows if r['impl'] == failing_impl]
  measured = [r for r in rows if r['impl'] != failing_impl]
  assert failed and all(r['error'] == f'RuntimeError: {LONG_ERROR}' for r in failed)
  assert all('raise RuntimeError(LONG_ERROR)' in r['traceback'] for r in failed)
  assert measured and all('error' not in r and r['fwd_ms'] > 0 for r in measured)
  err = capsys.readouterr().err
  assert f'{len(failed)} ' in err and 'failed' in err


def test_attention_bench_keeps_the_whole_error_and_exits_nonzero(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(bench_attention, 'attention', _failing_for('reference', bench_attention.attention))
  out = tmp_path / 'attention.json'
  code = bench_attention.main(['--seq-lens', '16', '--windows', 'full', '--heads', '1', '--head-dim', '8',
                               '--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--impls', 'xla,reference',
                               '--json', str(out)])
  assert code == 1
  _check_rows(json.loads(out.read_text())['rows'], 'reference', capsys)


def test_scan_bench_keeps_the_whole_error_and_exits_nonzero(tmp_path, monkeypatch, capsys):
  kernels = dict(bench_scan.KERNELS)
  monkeypatch.setitem(bench_scan.KERNELS, 'linear_scan', _failing_for('reference', kernels['linear_scan']))
  out = tmp_path / 'scan.json'
  code = bench_scan.main(['--seq-lens', '16', '--kernels', 'linear_scan', '--impls', 'xla,reference',
                          '--baseline', 'xla', '--batch', '1', '--heads', '1', '--head-dim', '8', '--chunk-size', '16',
                          '--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--no-bwd', '--json', str(out)])
  assert code == 1
  _check_rows(json.loads(out.read_text())['rows'], 'reference', capsys)


@pytest.mark.parametrize('bench', ['attention', 'scan'])
def test_a_sweep_without_failures_exits_zero(tmp_path, bench):
  argv = {'attention': ['--seq-lens', '16', '--windows', 'full', '--heads', '1', '--head-dim', '8', '--impls', 'xla'],
          'scan': ['--seq-lens', '16', '--kernels', 'linear_scan', '--impls', 'xla', '--baseline', 'xla',
                   '--batch', '1', '--heads', '1', '--head-dim', '8', '--chunk-size', '16', '--no-bwd']}[bench]
  main = {'attention': bench_attention.main, 'scan': bench_scan.main}[bench]
  out = tmp_path / 'out.json'
  assert main(argv + ['--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--json', str(out)]) == 0
  assert all('error' not in r for r in json.loads(out.read_text())['rows'])


def test_decode_bench_reports_the_state_it_decodes_with(tmp_path, monkeypatch):
  """`bench decode` for one arch and context (a 2-layer model keeps it fast): its row's state size is the model's
  own decode state for that context plus the steps it decodes, however long the steps took."""
  from hybrid_jax.bench import decode as bench_decode
  from hybrid_jax.train import state as state_lib
  from tests.conftest import small_config
  monkeypatch.setattr(bench_decode, 'load_config_file', lambda spec: small_config('full'))
  out = tmp_path / 'decode.json'
  assert bench_decode.main(['--arches', 'full', '--contexts', '32', '--steps', '2', '--json', str(out)]) == 0
  [row] = json.loads(out.read_text())
  assert (row['arch'], row['layers'], row['context']) == ('full', 'full', 32) and row['ms_per_token'] > 0
  model_def, params = state_lib.init_model(small_config('full').model, 0)
  state = jax.eval_shape(lambda p: model_def.bind(p).init_decode_state(1, 32 + 2), params)
  assert row['state_mib'] * 2**20 == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
