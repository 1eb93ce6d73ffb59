"""Sharded training on fake CPU meshes: rules, mesh shapes, the sharding report, loss equal to one device for
data / FSDP / tensor parallelism, checkpoints restored onto other meshes, and the compile check.

Multi-device runs happen in subprocesses: the device count is fixed when jax starts, and this process has one.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import pytest

from hybrid_jax.config import ConfigError, validate
from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import state as state_lib
from tests.conftest import ROOT, fake_devices_env, small_config

# One arch per way a mixer is sharded: sliding-window and full attention (swa128), windowed and full heads in one
# layer (swa128_headwise) and the three scans. full, swa128_nope and swa128_1to3 only rearrange these layers or drop
# RoPE, which no sharding rule sees.
ARCHES = ('swa128', 'swa128_headwise', 'lightning', 'mamba2', 'gdn')
MESHES = ((8, 1, 1), (1, 8, 1), (2, 2, 2))


def run_with_devices(n: int, code: str, timeout=900) -> str:
  """Runs `code` in a fresh interpreter with `n` fake CPU devices; returns its stdout."""
  env = dict(fake_devices_env(n), PYTHONPATH=str(ROOT))
  out = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout)
  assert out.returncode == 0, out.stderr[-4000:]
  return out.stdout


# ------------------------------------------------------------------------------------------ in-process units
def test_mesh_order_fallback_is_reported_once_with_its_cause(monkeypatch, caplog):
  from jax.experimental import mesh_utils

  def no_topology(shape, devices, allow_split_physical_axes=False):
    split = ', axes split' if allow_split_physical_axes else ''
    raise NotImplementedError(f'no topology for {len(devices)} devices of this kind{split}')

  monkeypatch.setattr(mesh_utils, 'create_device_mesh', no_topology)
  monkeypatch.setattr(mesh_lib, '_FALLBACK_CAUSES_REPORTED', set())
  devices = jax.devices()[:1]
  with caplog.at_level(logging.WARNING):
    for _ in range(3):
      arr = mesh_lib._device_array((1, 1, 1), devices)
      assert arr.shape == (1, 1, 1) and arr.ravel().tolist() == devices
  assert caplog.text.count('could not lay out') == 1
  # It tries splitting torus axes too, and reports what that said.
  assert 'NotImplementedError: no topology for 1 devices of this kind, axes split' in caplog.text
  assert 'order given' in caplog.text

def test_mesh_shape_resolves_minus_one_and_rejects_bad_shapes():
  p = small_config().parallel
  p.update(dict(data=-1, fsdp=2, tensor=2))
  assert mesh_lib.mesh_shape(p, 8)[0] == {'data': 2, 'fsdp': 2, 'sequence': 1, 'tensor': 2}
  p.update(dict(data=3, fsdp=-1, tensor=1))
  with pytest.raises(mesh_lib.MeshError, match='8 devices cannot be split'):
    mesh_lib.mesh_shape(p, 8)
  p.update(dict(data=2, fsdp=2, tensor=1))
  with pytest.raises(mesh_lib.MeshError, match='needs 4 devices, but there are 8'):
    mesh_lib.mesh_shape(p, 8)
  p.update(dict(data=-1, fsdp=1, tensor=1, dcn_data=2))
  assert mesh_lib.mesh_shape(p, 8, num_slices=2) == ({'data': 4, 'fsdp': 1, 'sequence': 1, 'tensor': 1},
                                                      {'data': 2, 'fsdp': 1, 'sequence': 1, 'tensor': 1})


@pytest.mark.parametrize('batch, accum, shape, ok', [
    (8, 1, {'data': 8, 'fsdp': 1, 'tensor': 1}, True), (6, 1, {'data': 8, 'fsdp': 1, 'tensor': 1}, False),
    (8, 2, {'data': 2, 'fsdp': 2, 'tensor': 2}, True), (8, 4, {'data': 2, 'fsdp': 2, 'tensor': 2}, False),
    (6, 1, {'data': 1, 'fsdp': 1, 'tensor': 8}, True), (12, 1, {'data': 4, 'fsdp': 2, 'tensor': 1}, False)])
def test_a_batch_that_does_not_split_over_the_mesh_is_refused_before_compiling(batch, accum, shape, ok):
  t = _train_settings(batch, accum)
  rules = rules_lib.parse_rules(small_config().parallel.rules)
  if ok:
    mesh_lib.check_batch(t, shape, rules)
    return
  with pytest.raises(mesh_lib.MeshError) as error:
    mesh_lib.check_batch(t, shape, rules)
  ways = shape['data'] * shape['fsdp']
  message = str(error.value)
  assert f'batch_size={batch}' in message and f'over the {ways} batch shards' in message and '\n' not in message
  suggested = int(message.split('(e.g. ')[1].split(')')[0])
  mesh_lib.check_batch(_train_settings(suggested, accum), shape, rules)  # the suggestion fits


def _train_settings(batch, accum):
  t = small_config().train
  t.update(dict(batch_size=batch, grad_accum=accum))
  return t


def test_the_trainer_refuses_an_indivisible_batch_with_one_line_before_compiling(tmp_path):
  env = fake_devices_env(8)
  proc = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'train', f'--workdir={tmp_path}',
                         '--config.train.batch_size=6', '--config.train.steps=2'], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=300)
  assert proc.returncode == 2, proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'batch_size=6 gives 6 rows a step' in errors[0] and 'Traceback' not in proc.stderr
  assert not (tmp_path / 'checkpoints').exists()


def test_rule_conflicts_and_unknown_axes_are_config_errors():
  c = small_config()
  c.parallel.rules.vocab = 'fsdp'  # The embedding table is (vocab, embed); embed is on fsdp too.
  with pytest.raises(ConfigError, match="'vocab' and 'embed' both map to mesh axis 'fsdp'"):
    validate(c)
  c = small_config()
  c.parallel.rules.mlp = 'model'
  with pytest.raises(ConfigError, match="unknown mesh axis 'model'"):
    validate(c)
  c = small_config()
  c.parallel.update(dict(data=-1, fsdp=-1))
  with pytest.raises(ConfigError, match='only one of'):
    validate(c)
  c = small_config()
  c.parallel.data = 4  # small_config's batch of 2 cannot split 4 ways.
  with pytest.raises(ConfigError, match='train.batch_size=2 is invalid: must be divisible'):
    validate(c)


def test_heads_the_tensor_axis_does_not_divide_are_named_once_with_both_numbers():
  """2 KV heads over a tensor axis of 4 stay whole on every tensor shard: the run goes on (correct) and one warning
  names the dimension, both numbers and the fix; a mesh that divides everything says nothing."""
  rules = rules_lib.parse_rules(small_config().parallel.rules)
  model_def = state_lib.make_model_def(small_config(vocab_size=256, num_heads=8, num_kv_heads=2).model)
  warning = mesh_lib.unsplit_warning(model_def, rules, {'data': 1, 'fsdp': 1, 'tensor': 4})
  assert 'kv_heads (2 % 4 != 0): 4 tensors' in warning and 'num_kv_heads' in warning  # wk, wv of 2 layers.
  assert 'heads (8 % 4' not in warning  # Query heads divide.
  assert mesh_lib.unsplit_warning(model_def, rules, {'data': 1, 'fsdp': 1, 'tensor': 2}) is None


def test_layouts_follow_the_rules_and_the_report_flags_replicated_tensors():
  c = small_config(scan_layers=True, num_layers=4)
  model_def = state_lib.make_model_def(c.model)
  rules = rules_lib.parse_rules(c.parallel.rules)
  by_name = {p.name: p for p in mesh_lib.param_layouts(model_def, rules, {'data': 1, 'fsdp': 4, 'tensor': 2})}
  assert str(by_name['cycles/blocks/0/mixer/wq'].layout.spec) == str(rules_lib.layout(
      'x', (2, 32, 4, 8), ('layers', 'embed', 'heads', 'head_dim'), rules, {'fsdp': 4, 'tensor': 2}).spec)
  assert tuple(by_name['cycles/blocks/0/mixer/wq'].layout.spec) == (None, 'fsdp', 'tensor', None)
  assert tuple(by_name['embed'].layout.spec) == (None, 'fsdp')  # 257 rows do not split 2 ways.
  assert by_name['embed'].layout.unsplit == ('vocab (257 % 2 != 0)',)
  rows, text = mesh_lib.sharding_report(model_def, rules, {'data': 8, 'fsdp': 1, 'sequence': 1, 'tensor': 1})
  flagged = {r['name']: r['flags'] for r in rows if r['flags']}
  assert 'replicated; could shard' in flagged['lm_head'][0]  # Pure data parallel replicates every weight.
  assert 'parameters' in text.splitlines()[-1]


def test_cli_shardings_report(tmp_path):
  out = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'shardings', '--devices=8',
                        '--config=hybrid:arch=swa128,scale=tiny', '--config.parallel.fsdp=4',
                        '--config.parallel.tensor=2'], capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr
  assert "mesh {'data': 1, 'fsdp': 4, 'sequence': 1, 'tensor': 2}" in out.stdout
  assert 'not split: vocab (257 % 2 != 0)' in out.stdout
  line = next(l for l in out.stdout.splitlines() if l.startswith('tail/0/mlp/gate'))
  assert "P('fsdp', 'tensor')" in line


# --------------------------------------------------------------------------------- multi-device subprocesses
_LOSSES = '''
import json, sys
import jax, numpy as np
from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import optim, state as state_lib, step as step_lib
from tests.conftest import small_config

def config(arch, shape):
  c = small_config(arch, dtype='float32', scan_layers=SCAN, num_layers=LAYERS)
  c.train.batch_size = 8
  c.train.loss_chunk = LOSS_CHUNK if shape != (1, 1, 1) else 0  # The one-device reference is never chunked.
  c.parallel.data, c.parallel.fsdp, c.parallel.tensor = shape
  return c

def losses(cfg, devices, steps=STEPS):
  md = state_lib.make_model_def(cfg.model)
  tx = optim.make_optimizer(cfg.train)
  mesh = mesh_lib.make_mesh(cfg.parallel, devices)
  sh = mesh_lib.train_shardings(md, tx, mesh, rules_lib.parse_rules(cfg.parallel.rules))
  state = state_lib.init_sharded_train_state(cfg.model, cfg.seed, tx, sh.state)
  step = step_lib.make_train_step(md, tx, cfg.train, sh)
  rng = np.random.default_rng(0)
  out = []
  for _ in range(steps):
    toks = rng.integers(0, 256, (cfg.train.batch_size, cfg.data.seq_len + 1)).astype(np.int32)
    batch = {k: jax.device_put(v, sh.batch) for k, v in {'inputs': toks[:, :-1], 'targets': toks[:, 1:]}.items()}
    state, m = step(state, batch)
    out.append(float(m['loss']))
  specs = {str(s.sharding.spec) for s in jax.tree.leaves(state['params'])} if len(devices) > 1 else set()
  return out, sorted(specs)

result = {}
for arch, shapes in json.loads(sys.argv[1]).items():
  result[arch] = {'single': losses(config(arch, (1, 1, 1)), jax.devices()[:1])[0]}
  for shape in shapes:
    result[arch][str(tuple(shape))] = losses(config(arch, tuple(shape)), jax.devices())
print(json.dumps(result))
'''


def _check_matrix(matrix, *, layers=4, scan=True, steps=3, loss_chunk=0):
  code = _LOSSES.replace('json.loads(sys.argv[1])', repr(json.dumps(matrix)).join(['json.loads(', ')']))
  code = code.replace('SCAN', str(scan)).replace('LAYERS', str(layers)).replace('STEPS', str(steps))
  code = code.replace('LOSS_CHUNK', str(loss_chunk))
  result = json.loads(run_with_devices(8, code).splitlines()[-1])
  for arch, shapes in matrix.items():
    single = result[arch]['single']
    for shape in shapes:
      losses, specs = result[arch][str(tuple(shape))]
      assert max(abs(a - b) for a, b in zip(losses, single)) < 1e-5, (arch, shape, losses, single)
      if shape != [8, 1, 1]:
        assert any(('fsdp' in s) or ('tensor' in s) for s in specs), (arch, shape, specs)  # Really sharded.


def test_sharded_loss_matches_one_device_fast():
  """Sharded with the chunked LM head + loss (chunks of 16 of the 64 positions) against one unchunked device."""
  _check_matrix({'swa128': [[2, 2, 2]]}, layers=2, scan=False, steps=2, loss_chunk=16)


@pytest.mark.e2e
def test_sharded_optimizer_state_gives_the_replicated_update():
  """parallel.shard_optimizer on 8 data-parallel chips: the Adam moments are split over 'data', and two steps
  give the parameters and moments of the replicated optimizer state."""
  code = '''
    import jax, numpy as np
    from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
    from hybrid_jax.train import optim, state as state_lib, step as step_lib
    from tests.conftest import small_config
    out = []
    for shard in (False, True):
      c = small_config('swa128', dtype='float32', num_layers=2)
      c.train.batch_size = 8
      md, tx = state_lib.make_model_def(c.model), optim.make_optimizer(c.train)
      sh = mesh_lib.train_shardings(md, tx, mesh_lib.make_mesh(c.parallel), rules_lib.parse_rules(c.parallel.rules),
                                    shard)
      state = state_lib.init_sharded_train_state(c.model, c.seed, tx, sh.state)
      step = step_lib.make_train_step(md, tx, c.train, sh)
      rng = np.random.default_rng(0)
      for _ in range(2):
        toks = rng.integers(0, 256, (8, c.data.seq_len + 1)).astype(np.int32)
        state, _ = step(state, {k: jax.device_put(v, sh.batch) for k, v in (('inputs', toks[:, :-1]),
                                                                             ('targets', toks[:, 1:]))})
      out.append(state)
      specs = [str(s.sharding.spec) for s in jax.tree.leaves(state['opt_state']) if s.ndim >= 2]
      print(shard, sum("'data'" in s for s in specs), len(specs))
    for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    print('same')
  '''
  lines = run_with_devices(8, code).split('\n')
  replicated, sharded = (line.split() for line in lines[:2])
  assert replicated[:2] == ['False', '0'] and sharded[0] == 'True' and int(sharded[1]) >= int(sharded[2]) // 2
  assert lines[2] == 'same'


@pytest.mark.e2e
def test_activations_are_constrained_in_sharded_steps_only():
  """The residual stream and logits carry sharding constraints when the step is sharded, none otherwise."""
  code = '''
    import jax, jax.numpy as jnp
    from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
    from hybrid_jax.train import optim, state as state_lib, step as step_lib
    from tests.conftest import small_config
    c = small_config('swa128', num_layers=3)
    c.parallel.update(dict(data=2, fsdp=2, tensor=2))
    mesh = mesh_lib.make_mesh(c.parallel)
    model_def, tx = state_lib.make_model_def(c.model), optim.make_optimizer(c.train)
    sh = mesh_lib.train_shardings(model_def, tx, mesh, rules_lib.parse_rules(c.parallel.rules))
    abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(c.model, 0, tx), sh.state)
    batch = jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=sh.batch)
    args = (abstract, {'inputs': batch, 'targets': batch})
    sharded = step_lib.make_train_step(model_def, tx, c.train, sh).lower(*args).as_text()
    plain = step_lib.make_train_step(model_def, tx, c.train).lower(*args).as_text()
    count = lambda text: text.count('sharding_constraint') + text.count('@Sharding')  # Shardy or GSPMD lowering
    print(count(sharded), count(plain))
  '''
  sharded, plain = map(int, run_with_devices(8, code).split())
  assert plain == 0
  assert sharded >= 3 + 2  # embeddings, each of the 3 blocks and the logits (backward passes add more)


@pytest.mark.e2e
@pytest.mark.parametrize('arch', ARCHES)
def test_every_mixer_kind_under_every_mesh_matches_one_device(arch):
  _check_matrix({arch: [list(s) for s in MESHES]})


# ----------------------------------------------------------------------------- checkpoints across topologies
_TRAIN = '''
import json, sys
from hybrid_jax import standard_hooks
from hybrid_jax.train import metrics
from tests.conftest import small_config
workdir, settings = sys.argv[1], json.loads(sys.argv[2])
c = small_config(settings['arch'], dtype='float32')
c.train.update(dict(checkpoint_every=3, async_checkpointing=False, **settings['train']))
c.parallel.update(settings['parallel'])
result = standard_hooks.train(c, workdir)
losses = {r['step']: r['loss'] for r in metrics.read_jsonl(workdir + '/metrics.jsonl') if r['kind'] == 'train'}
print(json.dumps({'resumed_from': result['resumed_from'], 'mesh': result['mesh'], 'losses': losses}))
'''


def train_on_devices(n_devices, workdir, parallel: dict, steps: int, arch='swa128_nope', **train) -> dict:
  """{'resumed_from', 'mesh', 'losses'} of `small_config(arch)` (float32, checkpoints every 3 steps) trained to
  `steps` in `workdir` on `n_devices` fake CPU devices with config.parallel sizes `parallel` and train settings
  `train` (batch 8 unless given)."""
  settings = {'arch': arch, 'parallel': parallel, 'train': {'batch_size': 8, **train, 'steps': steps}}
  code = _TRAIN.replace('sys.argv[1]', repr(str(workdir))).replace('sys.argv[2]', repr(json.dumps(settings)))
  return json.loads(run_with_devices(n_devices, code).splitlines()[-1])


def _train(n_devices, workdir, shape, steps):
  return train_on_devices(n_devices, workdir, dict(zip(('data', 'fsdp', 'tensor'), shape)), steps)


def _restored_onto(tmp_path, reference, n_devices, shape):
  workdir = tmp_path / f'on{n_devices}'
  shutil.copytree(tmp_path / 'ref', workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')  # Resume from step 3, written on the 8-device mesh.
  got = _train(n_devices, workdir, shape, 6)
  assert got['resumed_from'] == 3 and got['mesh'] == dict(zip(('data', 'fsdp', 'tensor'), shape), sequence=1)
  for step in ('4', '5', '6'):  # Same batches (data-iterator state restored) and the same losses.
    assert abs(got['losses'][step] - reference['losses'][step]) < 1e-5, (step, got, reference)


@pytest.mark.e2e
def test_checkpoint_from_8_devices_restores_on_1(tmp_path):
  reference = _train(8, tmp_path / 'ref', [2, 2, 2], 6)
  assert reference['resumed_from'] == 0
  _restored_onto(tmp_path, reference, 1, [1, 1, 1])


@pytest.mark.e2e
def test_checkpoint_from_8_devices_restores_on_4_and_1(tmp_path):
  reference = _train(8, tmp_path / 'ref', [2, 2, 2], 6)
  _restored_onto(tmp_path, reference, 4, [1, 4, 1])
  shutil.rmtree(tmp_path / 'on4')
  _restored_onto(tmp_path, reference, 1, [1, 1, 1])


# --------------------------------------------------------------------------------------------- compile check
def test_compile_check_reports_memory_and_flops_and_fails_over_budget(tmp_path):
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--devices=8', '--memory_budget_gib=0.001',
          '--config=hybrid:arch=swa128,scale=tiny', '--config.model.num_layers=2',
          '--config.model.d_model=64', '--config.data.seq_len=64', '--config.parallel.fsdp=4',
          '--config.parallel.tensor=2', '--nofind_fit', f'--json={tmp_path}/rows.json']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 3 and 'over the limit of 0.00 GiB' in out.stderr, out.stderr[-3000:]
  [report] = json.loads((tmp_path / 'rows.json').read_text())
  assert report['mesh'] == {'data': 1, 'fsdp': 4, 'sequence': 1, 'tensor': 2} and report['chips'] == 8
  assert report['fits'] is False and 'fix' not in report
  mem = report['per_device_bytes']
  assert 0 < mem['parameters'] < mem['optimizer'] and mem['peak'] >= mem['arguments'] > mem['parameters']
  assert report['xla_flops_per_chip'] > 0
  assert '| swa128 | tiny | 64 | cpu x 8 | 8 | 1/4/1/2 |' in out.stdout  # The table row.


def test_compile_check_tpu_topology_without_libtpu_is_a_clear_error():
  import importlib.util
  if importlib.util.find_spec('libtpu') is not None:
    pytest.skip('libtpu is installed: the topology path is real here')
  out = subprocess.run([sys.executable, '-m', 'hybrid_jax', 'compile-check', '--topology=v5p:4x4x4'],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode != 0
  assert "cannot describe TPU topology 'v5p:4x4x4'" in out.stderr and 'libtpu' in out.stderr
