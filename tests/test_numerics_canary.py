"""The numerics canary (hybrid_jax.train.canary): a kernel that computes something else is reported, by layer, once;
correct kernels (a Pallas scan interpreted, the reference attention, bfloat16 against float32) stay under their
tolerances; the cadence resolves by platform; bad values of its keys are one line."""

import logging
import types

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hybrid_jax import standard_hooks
from hybrid_jax.config import ConfigError, validate
from hybrid_jax.kernels.attention import api as attention_api
from hybrid_jax.train import canary, hooks, metrics, state as state_lib
from tests.cli_walk import assert_one_line, run_main
from tests.conftest import small_config

NOISE = 1e-2


def _scaled_reference(full_only=False, seen=None):
  """The reference attention with its output multiplied by 1 + NOISE (on full-causal layers only, if asked): the
  layer's output, linear in it, is then off by exactly NOISE relative. `seen` collects the q shapes it traced."""

  def attention(q, k, v, *, window=None, **kwargs):
    if seen is not None:
      seen.append(q.shape)
    o = attention_api.reference.attention(q, k, v, window=window, **kwargs)
    return o * (1 + NOISE) if window is None or not full_only else o

  return attention


def _shardings():
  mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
  return types.SimpleNamespace(mesh=mesh, replicated=NamedSharding(mesh, PartitionSpec()))


@pytest.fixture(scope='module')
def params():
  """Initial parameters of `small_config()`'s model (float32 master weights, whatever the compute dtype)."""
  return state_lib.init_model(small_config().model, 0)[1]


def _gaps(config, params=None, rows=2, tokens=0):
  """The canary's gaps for config's model (at `params`, else its initial parameters) on `_batch(config)`."""
  model_def = state_lib.make_model_def(config.model)
  params = state_lib.init_model(config.model, 0)[1] if params is None else params
  batch = _batch(config)
  check = canary.make_check(config.model, model_def, _shardings(), rows, tokens or config.data.seq_len)
  return {name: float(gap) for name, gap in check(params, batch['inputs'], batch['segment_ids']).items()}


def _canary_warnings(caplog):
  return [r.getMessage() for r in caplog.records
          if r.levelno == logging.WARNING and r.getMessage().startswith('numerics canary')]


def _batch(config):
  """Random tokens of config's batch shape, each row two documents."""
  b, t = config.train.batch_size, config.data.seq_len
  inputs = np.random.default_rng(0).integers(0, 256, (b, t), dtype=np.int32)
  return {'inputs': inputs, 'segment_ids': np.repeat(np.array([[1, 2]], np.int32), t // 2, axis=1).repeat(b, axis=0)}


def test_a_perturbed_kernel_is_logged_and_warned_about_once_per_layer(params, monkeypatch, caplog):
  """Three checks: both attention layers' gaps are NOISE each time, written as canary metrics, and each layer is
  warned about once, at the first check, naming layer, kind, implementation, step and gap."""
  monkeypatch.setitem(attention_api._IMPLEMENTATIONS, 'reference', _scaled_reference())
  c = validate(small_config(attention_implementation='reference'))
  model_def = state_lib.make_model_def(c.model)
  written = []
  context = hooks.LoopContext(config=c, workdir=None, lead=True, mesh=_shardings().mesh, model_def=model_def,
                              shardings=_shardings(), train_step=None, eval_step=None,
                              write=lambda step, values, prefix: written.append((step, prefix, values)))
  hook = canary.NumericsCanary(context)
  with caplog.at_level(logging.WARNING):
    for step in (5, 10, 15):
      hook.after_step(step, {'params': params}, _batch(c))
  assert [(step, prefix, sorted(values)) for step, prefix, values in written] == [
      (step, 'canary', ['layer0_swa_gap', 'layer1_full_gap']) for step in (5, 10, 15)]
  assert all(gap == pytest.approx(NOISE, rel=1e-3) for _, _, values in written for gap in values.values())
  warned = _canary_warnings(caplog)
  assert len(warned) == 2, warned
  for message, (index, kind) in zip(warned, [(0, 'swa'), (1, 'full')]):
    assert f'layer {index} ({kind})' in message and "model.attention_implementation='reference'" in message
    assert 'at step 5 ' in message and f'by {NOISE:.3g}' in message


def test_training_wires_the_canary_at_step_1_and_its_cadence(monkeypatch):
  """standard_hooks.wire adds the canary at steps 1, N, 2N, ... for train.numerics_canary_every=N, and none for
  'auto' on CPU (the hooks themselves stand in: what they compute is tested above)."""
  monkeypatch.setattr(standard_hooks, 'HeldOutEval', lambda context: hooks.Hook())
  stand_in = hooks.Hook()
  monkeypatch.setattr(canary, 'NumericsCanary', lambda context: stand_in)
  for every, due in (('auto', None), (0, None), (7, [1, 7, 14])):
    c = small_config()
    c.train.numerics_canary_every = every
    context = types.SimpleNamespace(config=validate(c), model_def=None, mesh=_shardings().mesh)
    wired = [h for h in standard_hooks.wire(context) if getattr(h, 'hook', None) is stand_in]
    assert (due is None and not wired) or [s for s in range(1, 15) if wired[0].due(s)] == due


@pytest.mark.e2e
def test_a_training_run_records_the_gaps_in_metrics_and_tensorboard(tmp_path, monkeypatch, caplog):
  """Through the command's loop: canary records at steps 1 and 2 (every 2 and at step 1) in metrics.jsonl and
  TensorBoard, NOISE each, and one warning per layer."""
  from tensorboard.backend.event_processing import event_accumulator
  monkeypatch.setitem(attention_api._IMPLEMENTATIONS, 'reference', _scaled_reference())
  c = small_config(attention_implementation='reference')
  c.eval.documents = 0
  c.train.update(steps=2, warmup_steps=1, checkpoint_every=2, numerics_canary_every=2)
  with caplog.at_level(logging.WARNING):
    standard_hooks.train(c, tmp_path)
  records = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['kind'] == 'canary']
  assert [r['step'] for r in records] == [1, 2]
  assert all(r[name] == pytest.approx(NOISE, rel=1e-3) for r in records
             for name in ('layer0_swa_gap', 'layer1_full_gap'))
  events = event_accumulator.EventAccumulator(str(tmp_path / 'tensorboard'))
  events.Reload()
  assert [e.step for e in events.Scalars('canary/layer1_full_gap')] == [1, 2]
  assert len(_canary_warnings(caplog)) == 2


def test_the_gap_is_the_layers_own_and_on_the_slice_asked_for(params, monkeypatch):
  """Noise on the full-attention layer only: its gap is NOISE, the SWA layer's is 0; the kernel sees 1 row of 32
  tokens (twice: configured and reference), not the 2 x 64 batch."""
  seen = []
  monkeypatch.setitem(attention_api._IMPLEMENTATIONS, 'reference', _scaled_reference(full_only=True, seen=seen))
  c = small_config(attention_implementation='reference')
  gaps = _gaps(c, params, rows=1, tokens=32)
  assert gaps['layer1_full_gap'] == pytest.approx(NOISE, rel=1e-3)
  assert gaps['layer0_swa_gap'] < 1e-6
  assert {shape[:2] for shape in seen} == {(1, 32)} and len(seen) == 2


def test_correct_kernels_stay_under_the_tolerance(params):
  """The reference attention agrees with the float32 'xla' kernel well under 1e-4; in bfloat16 the layers differ
  from float32 (they do run in bfloat16) by less than 2e-2, the default tolerance of bfloat16."""
  gaps = _gaps(small_config(attention_implementation='reference'), params)
  assert set(gaps) == {'layer0_swa_gap', 'layer1_full_gap'} and max(gaps.values()) < 1e-5, gaps
  c = small_config(dtype='bfloat16')
  gaps = _gaps(c, params)
  assert canary.tolerance(validate(c)) == 2e-2 and all(1e-4 < gap < 2e-2 for gap in gaps.values()), gaps


def test_float32_is_held_to_its_tolerance_where_its_dots_are_float32():
  """On GPU and TPU a float32 model's dots round to TF32 or bfloat16 at the default precision: the half precisions'
  tolerance, unless the matmul precision asks for float32."""
  c = validate(small_config())
  assert [canary.tolerance(c, p) for p in ('cpu', 'gpu', 'tpu')] == [1e-4, 2e-2, 2e-2]
  with jax.default_matmul_precision('highest'):
    assert canary.tolerance(c, 'tpu') == 1e-4
  c.model.dtype = 'float16'
  assert canary.tolerance(c, 'cpu') == 2e-2


@pytest.mark.e2e
@pytest.mark.parametrize('settings', [dict(dtype='bfloat16'), dict(recurrent_implementation='pallas_tpu')])
def test_a_gdn_layer_stays_under_the_tolerance(settings):
  """GDN in bfloat16 against float32 (under 2e-2), and the TPU Pallas scan interpreted against 'xla' (under 1e-5)."""
  gaps = _gaps(small_config('gdn', **settings))
  assert set(gaps) == {'layer0_gdn_gap', 'layer1_full_gap'}
  low, high = (1e-4, 2e-2) if settings.get('dtype') else (0, 1e-5)
  assert low < max(gaps.values()) < high, gaps


def test_the_checked_layers_are_the_first_of_each_kind_that_mixes_positions():
  c = small_config('gdn', cycle=('gdn', 'mlp', 'gdn', 'full', 'mlp', 'full'), block_mlp=False, num_layers=6)
  assert [(layer.index, layer.kind) for layer in canary.checked_layers(c.model)] == [(0, 'gdn'), (3, 'full')]


def test_the_cadence_is_off_on_cpu_and_on_at_gpu_and_tpu_by_default():
  t = validate(small_config()).train
  assert t.numerics_canary_every == 'auto'
  assert [canary.every(t, p) for p in ('cpu', 'gpu', 'tpu')] == [0, 500, 500]
  assert canary.every(t, jax.devices()) == 0  # These tests run on CPU.
  for value, steps in ((0, 0), (25, 25), ('25', 25)):  # '25': as a command line gives it.
    c = small_config()
    c.train.numerics_canary_every = value
    assert canary.every(validate(c).train, 'tpu') == steps


@pytest.mark.parametrize('key, value', [
    ('numerics_canary_every', -5), ('numerics_canary_every', '-5'), ('numerics_canary_every', 2.5),
    ('numerics_canary_every', 'often'), ('numerics_canary_every', True),
    ('numerics_canary_rows', 0), ('numerics_canary_rows', -2), ('numerics_canary_tokens', -1),
    ('numerics_canary_tolerance_float32', 0.0), ('numerics_canary_tolerance_bfloat16', -0.02),
])
def test_bad_values_are_one_line_naming_the_key(key, value):
  c = small_config()
  c.train[key] = value
  with pytest.raises(ConfigError, match=rf'^config\.train\.{key}=\S+ is invalid: [^\n]+$'):
    validate(c)


def test_a_bad_cadence_on_the_command_line_is_one_error_line(capsys):
  status, err = run_main(['params', '--config.train.numerics_canary_every=-3'], capsys)
  assert_one_line(status, err, "config.train.numerics_canary_every='-3' is invalid", "'auto'")
