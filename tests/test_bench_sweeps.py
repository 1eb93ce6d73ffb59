"""The kernel and decode benchmark programs' machinery (not their speed): a failed measurement of a sweep keeps its
whole error in the JSON while the others still run and the command exits non-zero; decode rows report the real
decode state."""

import json

import jax
import pytest

from hybrid_jax.bench import attention as bench_attention
from hybrid_jax.bench import scan as bench_scan
from hybrid_jax.commands import bench as bench_command

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
  code = bench_command.main(['attention', '--seq-lens', '16', '--windows', 'full', '--heads', '1', '--head-dim', '8',
                             '--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--impls', 'xla,reference',
                             '--json', str(out)])
  assert code == 1
  _check_rows(json.loads(out.read_text())['rows'], 'reference', capsys)


def test_scan_bench_keeps_the_whole_error_and_exits_nonzero(tmp_path, monkeypatch, capsys):
  kernels = dict(bench_scan.KERNELS)
  monkeypatch.setitem(bench_scan.KERNELS, 'linear_scan', _failing_for('reference', kernels['linear_scan']))
  out = tmp_path / 'scan.json'
  code = bench_command.main(['scan', '--seq-lens', '16', '--kernels', 'linear_scan', '--impls', 'xla,reference',
                             '--baseline', 'xla', '--batch', '1', '--heads', '1', '--head-dim', '8',
                             '--chunk-size', '16', '--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--no-bwd',
                             '--json', str(out)])
  assert code == 1
  _check_rows(json.loads(out.read_text())['rows'], 'reference', capsys)


@pytest.mark.parametrize('bench', ['attention', 'scan'])
def test_a_sweep_without_failures_exits_zero(tmp_path, bench):
  argv = {'attention': ['--seq-lens', '16', '--windows', 'full', '--heads', '1', '--head-dim', '8', '--impls', 'xla'],
          'scan': ['--seq-lens', '16', '--kernels', 'linear_scan', '--impls', 'xla', '--baseline', 'xla',
                   '--batch', '1', '--heads', '1', '--head-dim', '8', '--chunk-size', '16', '--no-bwd']}[bench]
  out = tmp_path / 'out.json'
  flags = ['--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--json', str(out)]
  assert bench_command.main([bench, *argv, *flags]) == 0
  assert all('error' not in r for r in json.loads(out.read_text())['rows'])


def test_decode_bench_reports_the_state_it_decodes_with(tmp_path, monkeypatch):
  """`bench decode` for one arch and context (a 2-layer model keeps it fast): its row's state size is the model's
  own decode state for that context plus the steps it decodes, however long the steps took."""
  from hybrid_jax.bench import decode as bench_decode
  from hybrid_jax.train import state as state_lib
  from tests.conftest import small_config
  monkeypatch.setattr(bench_decode, 'load_config_file', lambda spec: small_config('full'))
  out = tmp_path / 'decode.json'
  assert bench_command.main(['decode', '--arches', 'full', '--contexts', '32', '--steps', '2', '--json', str(out)]) == 0
  [row] = json.loads(out.read_text())
  assert (row['arch'], row['layers'], row['context']) == ('full', 'full', 32) and row['ms_per_token'] > 0
  model_def, params = state_lib.init_model(small_config('full').model, 0)
  state = jax.eval_shape(lambda p: model_def.bind(p).init_decode_state(1, 32 + 2), params)
  assert row['state_mib'] * 2**20 == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))


def test_a_measurement_past_its_timeout_becomes_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
  import time  # pylint: disable=import-outside-toplevel
  real = bench_scan.KERNELS['linear_scan']

  def stuck_reference(*args, implementation=None, **kwargs):
    if implementation == 'reference':
      time.sleep(30)  # Interrupted by the 0.5 s limit; never reached in a passing run.
    return real(*args, implementation=implementation, **kwargs)

  monkeypatch.setitem(bench_scan.KERNELS, 'linear_scan', stuck_reference)
  out = tmp_path / 'scan.json'
  code = bench_command.main(['scan', '--seq-lens', '16', '--kernels', 'linear_scan', '--impls', 'reference,xla',
                             '--baseline', 'xla', '--batch', '1', '--heads', '1', '--head-dim', '8',
                             '--chunk-size', '16', '--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--no-bwd',
                             '--timeout', '0.5', '--json', str(out)])
  assert code == 1
  stuck, fine = json.loads(out.read_text())['rows']
  assert stuck['impl'] == 'reference' and stuck['timed_out'] and 'timed out after 0.5 s' in stuck['error']
  assert stuck['wall_s'] < 30
  assert fine['impl'] == 'xla' and 'error' not in fine and fine['fwd_ms'] > 0 and fine['fwd_compile_s'] > 0


@pytest.mark.parametrize('bench', ['attention', 'scan'])
def test_each_row_is_written_the_moment_it_is_measured(tmp_path, monkeypatch, bench):
  out = tmp_path / 'out.json'
  seen = []  # What the JSON held when each later measurement started.
  if bench == 'attention':
    real = bench_attention.attention

    def spy(*args, **kwargs):
      seen.append(len(json.loads(out.read_text())['rows']) if out.exists() else 0)
      return real(*args, **kwargs)
    monkeypatch.setattr(bench_attention, 'attention', spy)
    argv = ['--seq-lens', '16,32', '--windows', 'full', '--heads', '1', '--head-dim', '8', '--impls', 'xla']
    name = 'attention'
  else:
    real = bench_scan.KERNELS['linear_scan']

    def spy(*args, **kwargs):
      seen.append(len(json.loads(out.read_text())['rows']) if out.exists() else 0)
      return real(*args, **kwargs)
    monkeypatch.setitem(bench_scan.KERNELS, 'linear_scan', spy)
    argv = ['--seq-lens', '16,32', '--kernels', 'linear_scan', '--impls', 'xla', '--baseline', 'xla', '--batch',
            '1', '--heads', '1', '--head-dim', '8', '--chunk-size', '16', '--no-bwd']
    name = 'scan'
  flags = ['--gemm', '8', '--repeats', '1', '--min-seconds', '0', '--json', str(out)]
  assert bench_command.main([name, *argv, *flags]) == 0
  # Tracing the second T's measurement happens after the first row was written.
  assert seen[0] == 0 and seen[-1] == 1
