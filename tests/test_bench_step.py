"""The step benchmark's machinery (not its speed): config overrides, the JSON it writes, the breakdown rows, and
the MFU helpers the training loop logs with. Nothing here asserts a time."""

import json

import pytest

from hybrid_jax.bench import step as bench_step
from hybrid_jax.commands import bench as bench_command
from hybrid_jax.config import ConfigError
from hybrid_jax.models import flops
from hybrid_jax.train import metrics

SMALL = ['--set', 'model.d_model=32', '--set', 'model.num_layers=2', '--set', 'model.num_heads=4',
         '--set', 'model.head_dim=8', '--set', 'model.d_ff=64', '--set', 'model.window=16']


def test_step_benchmark_writes_json_with_breakdown(tmp_path, capsys):
  """One scanned (2 cycles of [SWA, full]), rematerialised, gradient-accumulated step: the JSON, the model-FLOP
  arithmetic and a profiled breakdown row per block kind and part."""
  out = tmp_path / 'step.json'
  argv = ['--config', 'hybrid:arch=swa128_nope,scale=tiny', '--seq_len', '64',
          '--batch_size', '4', '--grad_accum', '2', '--steps', '2', '--profile-steps', '1',
          '--trace-dir', str(tmp_path / 'trace'), *SMALL,
          '--set', 'model.num_layers=4', '--set', 'model.scan_layers=True', '--set', 'model.remat=save_dots',
          '--json', str(out)]
  assert bench_command.main(['step', *argv]) == 0
  result = json.loads(out.read_text())
  s, c = result['step'], result['config']
  assert (c['seq_len'], c['batch_size'], c['grad_accum'], c['remat'], c['scan_layers']) == (64, 4, 2, 'save_dots',
                                                                                           True)
  assert (c['packing'], c['documents']) == ('documents', 16)  # The config's packing: documents of T // 4 tokens.
  assert len(s['step_s_all']) == 2 and s['step_s_median'] > 0 and s['compile_s'] > 0
  cfg = bench_step.load_config('hybrid:arch=swa128_nope,scale=tiny', seq_len=64,
                               overrides=SMALL[1::2] + ['model.num_layers=4'])
  per_token = flops.training_flops_per_token(cfg.model, 64)
  assert s['model_flops_per_token'] == pytest.approx(per_token)
  assert s['model_flops_per_step'] == pytest.approx(per_token * 4 * 64)
  assert s['tokens_per_s'] == pytest.approx(4 * 64 / s['step_s_median'])
  assert s['tflops_per_device'] == pytest.approx(s['model_flops_per_step'] / s['step_s_median'] / 1e12)
  assert s['memory_bytes_per_device']['compiled_peak'] > 0
  b = s['breakdown']
  rows = {r['part']: r for r in b['parts']}
  blocks = {'block_swa_w16/mixer', 'block_swa_w16/mlp', 'block_full/mixer', 'block_full/mlp'}
  assert blocks | {'lm_head', 'loss', 'optimizer'} <= set(rows)
  assert all(rows[p]['layers'] == 2 and rows[p]['model_tflops'] > 0 for p in blocks)
  assert sum(r['share'] for r in b['parts']) == pytest.approx(1.0)
  assert sum(r['ms_per_step'] for r in b['parts']) == pytest.approx(b['op_ms_per_step'])
  assert b['trace'].startswith(str(tmp_path / 'trace'))
  assert set(result['model_flops_by_kind']) == {'swa', 'full', 'lm_head'}
  text = capsys.readouterr().out
  assert 'tokens/s' in text and '| block_swa_w16/mixer | 2 |' in text

  # Compiling from shapes alone gives the same program (the batch of the same packing): the same compiled memory,
  # and nothing runs.
  same = bench_step.load_config('hybrid:arch=swa128_nope,scale=tiny', seq_len=64, batch_size=4,
                                grad_accum=2, overrides=SMALL[1::2] + ['model.num_layers=4', 'model.scan_layers=True',
                                                                       'model.remat=save_dots'])
  shapes_only = bench_step.compile_only(same)
  assert shapes_only['memory_bytes_per_device'] == dict(s['memory_bytes_per_device'], device_peak_in_use=None)
  assert 'step_s_median' not in shapes_only and shapes_only['model_flops_per_step'] == s['model_flops_per_step']


def test_dry_run_compiles_nothing(capsys):
  argv = ['--config', 'hybrid:arch=gdn,scale=s4', '--batch_size', '8', '--set',
          'model.remat=save_dots', '--dry-run']
  assert bench_command.main(['step', *argv]) == 0
  text = capsys.readouterr().out
  assert 'gdn_s4: config valid (16384 x 8' in text and '| gdn | 9 |' in text


@pytest.mark.parametrize('override, message', [('model.nope=1', 'does not exist'), ('nokey', 'KEY=VALUE'),
                                                ('model.remat=sometimes', 'model.remat'),
                                                ('train.peak_tflops=-1', 'train.peak_tflops')])
def test_bad_overrides_fail_clearly(override, message):
  with pytest.raises(ConfigError, match=message):
    bench_step.load_config('hybrid', overrides=[override])


def test_peak_table_and_mfu():
  assert metrics.peak_tflops('NVIDIA H200') == 989.0
  assert metrics.peak_tflops('NVIDIA H100 80GB HBM3') == 989.0
  assert metrics.peak_tflops('NVIDIA H100 PCIe') == 756.0
  assert metrics.peak_tflops('NVIDIA A100-SXM4-80GB') == 312.0
  assert metrics.peak_tflops('TPU v5 lite') == 197.0 and metrics.peak_tflops('TPU v5') == 459.0
  assert metrics.peak_tflops('TPU v6 lite') == 918.0 and metrics.peak_tflops('TPU v4') == 275.0
  assert metrics.peak_tflops('cpu') is None
  assert metrics.peak_tflops('cpu', override=100.0) == 100.0
  assert metrics.throughput(2e12, 1.0, 2, None) == {'tflops_per_device': 1.0}
  assert metrics.throughput(2e12, 0.5, 1, 8.0) == {'tflops_per_device': 4.0, 'mfu': 0.5}


def test_train_loop_logs_model_tflops_and_mfu(tmp_path):
  """CPU has no peak in the table: TFLOP/s is logged, MFU only once train.peak_tflops names a peak."""
  from hybrid_jax import standard_hooks
  from tests.conftest import small_config
  c = small_config()
  c.train.update(dict(steps=4, checkpoint_every=4, log_every=2, peak_tflops=0.5))
  result = standard_hooks.train(c, tmp_path)
  records = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['kind'] == 'train']
  per_step = flops.training_flops_per_token(c.model, c.data.seq_len) * c.train.batch_size * c.data.seq_len
  for r in records:
    assert r['tflops_per_device'] == pytest.approx(per_step / r['step_time_s'] / 1e12)
    assert r['mfu'] == pytest.approx(r['tflops_per_device'] / 0.5)
  assert result['training_flops_per_token'] == pytest.approx(per_step / (c.train.batch_size * c.data.seq_len))
  assert result['mfu'] == pytest.approx(result['tflops_per_device'] / 0.5)


def test_xla_flop_count_missing_is_none_not_zero():
  # The GPU backend's cost analysis of a step of custom calls has no count (absent or 0): report none, not "0.00 x".
  assert bench_step.xla_flops({}) is None
  assert bench_step.xla_flops({'flops': 0.0}) is None
  assert bench_step.xla_flops({'flops': float('nan')}) is None
  assert bench_step.xla_flops({'flops': 3e12}) == 3e12


def test_the_step_batch_follows_data_packing():
  """With data.packing='documents' the benchmark's rows are documents of --documents tokens (default seq_len // 4)
  laid out as the data pipeline lays out its first packed row of such documents (the same keys, segment ids,
  positions and target segment ids); with 'concat' inputs and targets only; a document length there is refused."""
  import grain  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from hybrid_jax.data import pipeline  # pylint: disable=import-outside-toplevel
  from hybrid_jax.train import step as step_lib  # pylint: disable=import-outside-toplevel
  spec = 'hybrid:arch=gdn,scale=tiny'
  config = bench_step.load_config(spec, seq_len=20, batch_size=1)
  assert config.data.packing == 'documents' and bench_step.document_length(config) == 5
  batch = bench_step.make_batch(config, 1, documents=6)
  assert set(batch) == set(step_lib.BATCH_KEYS['documents'])
  tokens = np.concatenate([batch['inputs'][0], batch['targets'][0, -1:]])
  docs = grain.MapDataset.source([tokens[i:i + 6] for i in range(0, 21, 6)]).to_iter_dataset()
  expected = next(iter(pipeline._pack_and_batch(docs, 20, 1, 'documents')))  # pylint: disable=protected-access
  assert set(expected) == set(batch)
  for key, value in expected.items():
    np.testing.assert_array_equal(batch[key], value, err_msg=key)
  np.testing.assert_array_equal(batch['positions'][0], np.arange(20) % 6)
  # The targets across the three boundaries do not count.
  assert step_lib.target_weights(batch).sum() == 20 - 3
  concat = bench_step.load_config(spec, seq_len=20, batch_size=1, overrides=['data.packing=concat'])
  assert set(bench_step.make_batch(concat, 2)) == {'inputs', 'targets'}
  with pytest.raises(ConfigError, match=r"--documents=6 needs data.packing='documents'"):
    bench_step.make_batch(concat, 2, documents=6)
