"""compile-check: the fit verdict against a memory limit, the verified fix, the roofline estimate, multislice."""

import json
import os
import subprocess
import sys

import jax
import pytest

from hybrid_jax import cli
from hybrid_jax.config import validate
from hybrid_jax.compile_check import fit as compile_check
from hybrid_jax.parallel import chips, mesh as mesh_lib
from tests.conftest import ROOT, study_config


def tiny(batch=8, seq_len=128):
  c = study_config('swa128')
  c.model.update(dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, d_ff=128, window=32,
                      vocab_size=256))
  c.data.seq_len = seq_len
  c.train.update(dict(batch_size=batch, warmup_steps=1, steps=4))
  return validate(c)


CPU = compile_check.Target('cpu x 1', tuple(jax.devices('cpu')[:1]))


def test_a_step_over_the_limit_is_fixed_by_a_change_that_is_compiled_and_fits():
  config = tiny()
  whole = compile_check.compile_step(config, CPU)['per_device_bytes']['peak']
  one_row = tiny()
  one_row.train.grad_accum = 8
  smallest = compile_check.compile_step(one_row, CPU)['per_device_bytes']['peak']
  assert smallest < whole  # Activations of one sequence instead of eight.
  limit = (smallest + whole) / 2
  row = compile_check.check(config, CPU, memory_limit=limit)
  assert row['fits'] is False and row['per_device_bytes']['peak'] == whole
  fix = row['fix']
  assert list(fix['overrides']) == ['train.grad_accum'] and fix['per_device_bytes']['peak'] <= limit
  accum = fix['overrides']['train.grad_accum']
  assert fix['change'] == f'train.grad_accum={accum} (micro-batch {8 // accum} per chip)'
  # The fewest accumulation steps that fit: the next smaller count was compiled and did not fit.
  tried = {t['overrides']['train.grad_accum']: t for t in fix['tried']
           if list(t['overrides']) == ['train.grad_accum']}
  assert tried[accum]['fits']
  if accum > 2:
    assert tried[accum // 2]['fits'] is False


def test_nothing_fits_a_limit_below_the_parameters():
  row = compile_check.check(tiny(), CPU, memory_limit=1000)
  assert row['fits'] is False and 'change' not in row['fix'] and row['fix']['tried']
  assert all(t['fits'] is False for t in row['fix']['tried'])


def test_the_cli_prints_the_fix_as_flags_that_set_it(monkeypatch, capsys):
  """The fix search and the advice without compiling: a stand-in compiler lets a step fit from 4 accumulation
  steps up, so the least change is grad_accum=4, and the printed flags load into a config that has it."""
  def compile_step(config, target, memory_limit=None):
    accum = int(config.train.grad_accum)
    return {'arch': config.model.arch, 'scale': config.model.scale, 'seq_len': config.data.seq_len, 'target': target.name,
            'chips': 1, 'mesh': {'data': 1, 'fsdp': 1, 'tensor': 1}, 'per_chip_batch': 8, 'grad_accum': accum,
            'compile_s': 0.0, 'fits': accum >= 4, 'per_device_bytes': {'peak': 2**30 // accum}}
  monkeypatch.setattr(compile_check, 'compile_step', compile_step)
  argv = [f'--config={ROOT}/configs/hybrid.py:arch=swa128,scale=tiny', '--devices=1',
          '--config.train.batch_size=8', '--config.data.seq_len=64']
  assert cli._run_config_command('compile-check', argv) == 3
  advice = capsys.readouterr().err.split('; fits with ')[1].strip()
  assert advice == 'train.grad_accum=4 (micro-batch 2 per chip): add --config.train.grad_accum=4'
  fixed = cli.load_config(argv[0].split('=', 1)[1], argv[2:] + advice.split(': add ')[1].split())
  assert fixed.train.grad_accum == 4 and compile_step(fixed, CPU)['fits']


@pytest.fixture(scope='module')
def tpu():
  try:
    return compile_check.tpu_target('v5e:2x2')
  except mesh_lib.MeshError as e:
    if os.environ.get('HYBRID_JAX_REQUIRE_LIBTPU'):
      raise
    pytest.skip(f"libtpu is missing ({e}); pip install -e '.[tpu]'")


def test_tpu_row_fits_and_its_estimate_is_the_roofline(tpu):
  config = tiny()
  config.parallel.fsdp = 2
  row = compile_check.check(config, tpu)
  spec = chips.chip('TPU v5 lite')
  assert row['device_kind'] == 'TPU v5 lite' and row['hbm_bytes'] == spec.hbm_bytes and row['fits'] is True
  assert row['mesh'] == {'data': 2, 'fsdp': 2, 'tensor': 1} and row['per_chip_batch'] == 2
  compute = row['model_flops_per_chip'] / (spec.peak_bf16_tflops * 1e12)
  memory = row['xla_bytes_accessed_per_chip'] / spec.hbm_bytes_per_s
  assert row['estimate']['step_s'] == pytest.approx(max(compute, memory))
  assert row['estimate']['bound'] == ('compute' if compute >= memory else 'memory')
  assert row['estimate']['tokens_per_s'] == pytest.approx(8 * 128 / max(compute, memory))


def test_multislice_compiles_with_data_parallelism_across_slices(tmp_path):
  """Two v5e:2x2 slices: the DCN axis becomes data parallelism when the config sets no across-slice shape."""
  pytest.importorskip('libtpu')
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--topology=v5e:2x2', '--num_slices=2',
          f'--config={ROOT}/configs/hybrid.py:arch=gdn,scale=tiny', '--config.model.num_layers=2',
          '--config.model.d_model=64', '--config.data.seq_len=128', f'--json={tmp_path}/rows.json']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  [row] = json.loads((tmp_path / 'rows.json').read_text())
  assert row['chips'] == 8 and row['target'] == 'v5e:2x2 x 2 slices' and row['fits'] is True
  assert row['mesh'] == {'data': 8, 'fsdp': 1, 'tensor': 1}
  assert 'libtpu' not in out.stderr.lower() and 'TPU_' not in out.stderr  # Quiet on a host without TPUs.


def test_no_import_arrow_runs_up_to_the_tool():
  """compile-check builds and compiles the train step, so it sits above train/ and models/: neither they, nor
  parallel/ (which models/ imports), may import it, and parallel/ imports neither train/ nor models/."""
  import ast
  below = {'parallel': ('compile_check', 'train', 'models'), 'models': ('compile_check', 'train'),
           'train': ('compile_check',), 'kernels': ('compile_check', 'train', 'models')}
  found = []
  for package, forbidden in below.items():
    for path in sorted((ROOT / 'hybrid_jax' / package).rglob('*.py')):
      for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
        found += [f'{path.relative_to(ROOT)} imports {n}' for n in names
                  if any(n == f'hybrid_jax.{f}' or n.startswith(f'hybrid_jax.{f}.') for f in forbidden)]
  assert not found
