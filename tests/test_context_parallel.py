"""Context parallelism: a row split over the 'sequence' mesh axis computes what the whole row computes.

For every kind of layer of the study grid, on 8 fake CPU devices with sequence 2 (beside data 4), 4 (beside fsdp
2) and 8, and for a few with sequence 4 beside tensor 2, the sharded forward logits and parameter gradients equal the
unsharded ones (float32, relative error <= 1e-5), on packed rows whose documents cross shard boundaries (one starts
exactly at one) with a window of 24 tokens, three shards long at sequence 8. The Pallas kernels run interpreted
inside the shard map. All cases run in one interpreter (the device count is fixed when jax starts).

The default tier checks a sliding window's halo and the gated delta rule's state passing once (sequence 4 beside
FSDP); the whole grid, the Pallas kernels interpreted inside the shard map (the GDN kernel over eight shards too) and
the training run are the end-to-end tier's.
"""

import json
import shutil

import pytest

from hybrid_jax import config as config_lib
from hybrid_jax.errors import ConfigError
from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
from tests.conftest import small_config
from tests.test_parallel import run_with_devices, train_on_devices

TOLERANCE = 1e-5
MESHES = ((4, 1, 2, 1), (1, 2, 4, 1), (1, 1, 8, 1))  # data, fsdp, sequence, tensor
PALLAS_ARCHES = ('swa128', 'full', 'lightning', 'mamba2', 'gdn')
WITH_TENSOR = (1, 1, 4, 2)  # Heads split over 'tensor' too: the full layers' all-to-all pads what is left.
TENSOR_ARCHES = ('swa128_headwise', 'mamba2', 'gdn')
# One study arch per kind of layer a split sequence sees: the window (24 tokens here, so swa512 and swa2048 are
# swa128's program), SWA and full heads in one layer, full attention, and the three scans. swa128_nope drops the
# shard's RoPE offset that swa128 checks; swa128_1to3 stacks swa128's layers and full's.
MIXER_KINDS = ('swa128', 'swa128_headwise', 'full', 'lightning', 'mamba2', 'gdn')

_SCRIPT = '''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from hybrid_jax.parallel import activations, mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import state as state_lib
from tests.conftest import small_config

def segment_ids(b, t, rng):
  ids = np.cumsum(rng.random((b, t)) < 0.1, axis=1)
  ids[:, t // 4:] += 1  # A document starts exactly at a shard boundary of sequence 4 and 8.
  ids[:, t // 2] = ids[:, t // 2 - 1]  # One crosses the boundary of sequence 2.
  ids[:, t // 2 + 1:] = np.maximum(ids[:, t // 2 + 1:], ids[:, t // 2:t // 2 + 1])
  return jnp.asarray(ids, jnp.int32)

def case(arch, meshes, implementation):
  c = small_config(arch, dtype='float32', window=24, num_layers=max(2, len(small_config(arch).model.cycle)))
  c.model.attention_implementation = c.model.recurrent_implementation = implementation
  model_def, params = state_lib.init_model(c.model, 0)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, c.model.vocab_size, (2, 64)), jnp.int32)
  seg = segment_ids(2, 64, rng)
  ramp = jnp.asarray(rng.normal(size=(2, 64, c.model.vocab_size)), jnp.float32)

  def loss(p):
    logits = model_def.bind(p)(tokens, None, seg)
    return jnp.sum(logits * ramp), logits

  (_, want), want_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  for shape in meshes:
    c.parallel.data, c.parallel.fsdp, c.parallel.sequence, c.parallel.tensor = shape
    mesh, rules = mesh_lib.make_mesh(c.parallel), rules_lib.parse_rules(c.parallel.rules)

    def sharded(p):
      with activations.sharded(mesh, rules):
        return jax.value_and_grad(loss, has_aux=True)(p)

    (_, got), grads = jax.jit(sharded)(params)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a)))
    print(json.dumps({'arch': arch, 'implementation': implementation, 'mesh': shape, 'logits': rel(want, got),
                      'grads': max(rel(a, b) for a, b in zip(jax.tree.leaves(want_grads), jax.tree.leaves(grads)))}),
          flush=True)

for arch, meshes, implementation in json.loads(sys.argv[1]):
  case(arch, [tuple(m) for m in meshes], implementation)
'''


def _run(cases) -> list[dict]:
  out = run_with_devices(8, f'import sys; sys.argv = ["", {json.dumps(json.dumps(cases))}]\n' + _SCRIPT)
  return [json.loads(line) for line in out.splitlines() if line.startswith('{')]


# The default tier's representatives at the mesh of sequence 4: a sliding window's halo exchange and the gated
# delta rule's state passing (every mixer kind at every mesh: test_every_mixer_kind_over_a_split_sequence_...).
EACH_KIND = ('swa128', 'gdn')


@pytest.fixture(scope='module')
def each_kind():
  return _run([(arch, [MESHES[1]], 'auto') for arch in EACH_KIND])


@pytest.mark.parametrize('arch', EACH_KIND)
def test_each_mixer_kind_over_a_split_sequence_equals_the_whole_row(each_kind, arch):
  (row,) = _rows(each_kind, arch, 'auto')
  assert row['logits'] <= TOLERANCE and row['grads'] <= TOLERANCE, row


@pytest.fixture(scope='module')
def results():
  cases = [(arch, MESHES, 'auto') for arch in MIXER_KINDS]
  cases += [(arch, [MESHES[1]], impl) for impl in ('pallas_tpu', 'pallas_gpu') for arch in PALLAS_ARCHES]
  cases += [('gdn', [MESHES[2]], 'pallas_tpu')]  # A Pallas scan's state passed along eight shards.
  cases += [(arch, [WITH_TENSOR], 'xla') for arch in TENSOR_ARCHES]
  return _run(cases)


def _rows(results, arch, implementation):
  rows = [r for r in results if r['arch'] == arch and r['implementation'] == implementation]
  assert rows, f'no result for {arch} ({implementation})'
  return rows


@pytest.mark.e2e
@pytest.mark.parametrize('arch', MIXER_KINDS)
def test_every_mixer_kind_over_a_split_sequence_equals_the_whole_row(results, arch):
  rows = _rows(results, arch, 'auto')
  assert sorted(tuple(r['mesh']) for r in rows) == sorted(MESHES)
  for r in rows:
    assert r['logits'] <= TOLERANCE and r['grads'] <= TOLERANCE, r


@pytest.mark.e2e
@pytest.mark.parametrize('implementation', ['pallas_tpu', 'pallas_gpu'])
@pytest.mark.parametrize('arch', PALLAS_ARCHES)
def test_the_pallas_kernels_interpreted_inside_the_shard_map(results, arch, implementation):
  rows = _rows(results, arch, implementation)
  assert len(rows) == 1 + ((arch, implementation) == ('gdn', 'pallas_tpu')), rows
  for r in rows:
    assert r['logits'] <= TOLERANCE and r['grads'] <= TOLERANCE, r


@pytest.mark.e2e
@pytest.mark.parametrize('arch', TENSOR_ARCHES)
def test_a_split_sequence_beside_tensor_parallelism(results, arch):
  (row,) = _rows(results, arch, 'xla')
  assert tuple(row['mesh']) == WITH_TENSOR and row['logits'] <= TOLERANCE and row['grads'] <= TOLERANCE, row


def test_a_length_the_sequence_axis_does_not_divide_is_one_line():
  c = small_config('gdn')
  c.parallel.data, c.parallel.sequence = 1, 3
  with pytest.raises(ConfigError) as error:
    config_lib.validate(c)
  assert 'data.seq_len' in str(error.value) and '64' in str(error.value) and '3' in str(error.value)
  assert '\n' not in str(error.value)
  rules = rules_lib.parse_rules(c.parallel.rules)
  with pytest.raises(mesh_lib.MeshError) as error:
    mesh_lib.check_sequence(100, {'data': 1, 'fsdp': 1, 'sequence': 8, 'tensor': 1}, rules)
  assert 'seq_len=100' in str(error.value) and '8 sequence shards' in str(error.value)
  mesh_lib.check_sequence(96, {'data': 1, 'fsdp': 1, 'sequence': 8, 'tensor': 1}, rules)


def _train(n_devices, workdir, shape, steps):
  return train_on_devices(n_devices, workdir, dict(zip(('data', 'fsdp', 'sequence', 'tensor'), shape)), steps,
                          arch='gdn', batch_size=4, loss_chunk=16)


@pytest.mark.e2e
def test_training_over_a_split_sequence_resumes_on_one_device_with_the_same_losses(tmp_path):
  """The trainer on data 2 x sequence 4 (packed documents, chunked loss) checkpoints at step 3; one device resumed
  from it trains steps 4-6 to the same losses, so the batches, the loss and the update are the whole row's."""
  reference = _train(8, tmp_path / 'ref', [2, 1, 4, 1], 6)
  assert reference['mesh'] == {'data': 2, 'fsdp': 1, 'sequence': 4, 'tensor': 1}
  workdir = tmp_path / 'on1'
  shutil.copytree(tmp_path / 'ref', workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')
  got = _train(1, workdir, [1, 1, 1, 1], 6)
  assert got['resumed_from'] == 3
  for step in ('4', '5', '6'):
    assert abs(got['losses'][step] - reference['losses'][step]) < 1e-5, (step, got, reference)
