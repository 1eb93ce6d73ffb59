"""Expert parallelism: an MoE's experts split over the 'expert' mesh axis compute what one device computes.

On 8 fake CPU devices (subprocesses: the device count is fixed when jax starts), float32 and dropless: the MoE
layer's output and gradients at expert 1, 2 and 4 (beside data parallelism) equal the unsplit layer's, relative
1e-5; with a capacity they equal the same batch split without the expert axis (the capacity is per device where
the tokens are). The end-to-end tier trains an MoE hybrid of each mixer kind (sliding-window attention, GDN,
Mamba-2, Lightning) 3 steps at sequence 2 beside expert 2 (sliding-window attention also at expert 2 and 4) to the
losses and gradient norms of data parallelism. In process: the config's one-line refusals, the mesh's axes, the
layouts, and compile-check's candidate and its price.
"""

import json

import pytest

from hybrid_jax import config as config_lib
from hybrid_jax.compile_check import estimate as estimate_lib, fit as compile_check
from hybrid_jax.errors import ConfigError
from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import state as state_lib
from tests.conftest import small_config
from tests.test_parallel import run_with_devices

TOLERANCE = 1e-5
MOE = dict(blocks='all', num_experts=8, top_k=2, expert_d_ff=16)


def moe_config(arch='swa128', **moe_overrides):
  """small_config(arch) in float32 with every block's MLP an MoE of 8 experts, top 2."""
  c = small_config(arch, dtype='float32')
  c.model.moe.update({**MOE, **moe_overrides})
  return c


# ------------------------------------------------------------------------------------------------- in process
@pytest.mark.parametrize('parallel, moe_blocks, needle', [
    (dict(expert=3), 'all', 'config.parallel.expert=3 is invalid: must divide model.moe.num_experts=8'),
    (dict(expert=2, dcn_expert=3), 'all', 'config.parallel.expert=2 is invalid: must divide model.moe.num_experts=8 '
                                          '(times parallel.dcn_expert=3: 6 ways)'),
    (dict(expert=2), 'none', 'config.parallel.expert=2 is invalid: needs MoE layers, and the model has none'),
    (dict(dcn_expert=2), 'none', 'config.parallel.dcn_expert=2 is invalid: needs MoE layers'),
    (dict(expert=-1, data=1), 'all', 'config.parallel.expert=-1 is invalid: must be a positive integer'),
])
def test_a_bad_expert_axis_is_one_config_line_naming_the_key(parallel, moe_blocks, needle):
  c = moe_config(blocks=moe_blocks)
  c.parallel.update(parallel)
  with pytest.raises(ConfigError) as error:
    config_lib.validate(c)
  assert needle in str(error.value) and '\n' not in str(error.value), str(error.value)


def test_the_expert_axis_is_in_the_mesh_only_when_it_splits():
  c = moe_config()
  assert mesh_lib.mesh_shape(c.parallel, 8)[0] == {'data': 8, 'fsdp': 1, 'sequence': 1, 'tensor': 1}
  c.parallel.update(dict(expert=4, sequence=2))
  c.train.batch_size = 8
  config_lib.validate(c)
  ici, dcn = mesh_lib.mesh_shape(c.parallel, 8)
  assert list(ici.items()) == [('data', 1), ('fsdp', 1), ('expert', 4), ('sequence', 2), ('tensor', 1)]
  assert dcn == dict.fromkeys(ici, 1)


def test_experts_split_over_the_expert_axis_and_the_batch_over_data_fsdp_expert():
  c = moe_config()
  rules = rules_lib.parse_rules(c.parallel.rules)
  shape = {'data': 2, 'fsdp': 1, 'expert': 4, 'sequence': 1, 'tensor': 1}
  specs = {p.name: tuple(p.layout.spec) for p in mesh_lib.param_layouts(state_lib.make_model_def(c.model), rules,
                                                                          shape)}
  experts = {name: spec for name, spec in specs.items() if name.endswith(('mlp/gate', 'mlp/up', 'mlp/down'))}
  assert experts and all(spec[-3] == 'expert' for spec in experts.values()), experts
  assert sum('expert' in spec for spec in specs.values()) == len(experts) + sum(n.endswith('router') for n in specs)
  assert rules_lib.layout('x', (8, 64), ('batch', 'seq'), rules, shape).spec[0] == ('data', 'expert')


def test_compile_check_offers_expert_parallelism_to_moe_models_and_prices_its_exchange():
  """Data ways become expert ways (2, 4, 8: each divides the 8 experts); a dense model is offered none. On 4 chips
  of expert 4, a float32 2-layer MoE (d_model 32, k 2) exchanges 3 x n x (2 x 32 x 8 + 13 x 2) bytes per layer for
  the n = 2 x 64 tokens of a chip, and only the experts' weights leave the gradient's all-reduce."""
  c = config_lib.validate(moe_config())
  offered = [o for o in compile_check.candidates(c, per_chip=2, data_ways=8) if 'parallel.expert' in o]
  assert offered == [{'parallel.expert': 2}, {'parallel.expert': 4}, {'parallel.expert': 8}]
  assert not any('parallel.expert' in o for o in compile_check.candidates(
      config_lib.validate(moe_config(blocks='none')), per_chip=2, data_ways=8))
  mesh = {'data': 1, 'fsdp': 1, 'expert': 4, 'sequence': 1, 'tensor': 1}
  assert estimate_lib.expert_exchange_bytes(c.model, 64, 2, mesh) == 2 * 3 * 128 * (2 * 32 * 8 + 13 * 2)
  assert estimate_lib.expert_exchange_bytes(c.model, 64, 2, {**mesh, 'expert': 1}) == 0
  sent = estimate_lib.collective_bytes(1000, mesh, 1, expert_bytes=400, expert_exchanges=7)
  assert sent == {'gradient_reduction': 2 * 3 / 4 * 600, 'fsdp_gathers': 0, 'sequence_exchanges': 0,
                  'expert_exchanges': 7}
  row = dict(arch='swa128', scale='tiny', seq_len=64, target='cpu x 8', chips=8, per_chip_batch=1, grad_accum=1,
             compile_s=1.0, mesh={'data': 2, 'fsdp': 1, 'expert': 4, 'sequence': 1, 'tensor': 1})
  head, _, line = compile_check.table([row]).splitlines()
  assert 'mesh (data/fsdp/sequence/tensor)' in head and '| 2/1/1/1, expert 4 |' in line


# ------------------------------------------------------------------------------------------ the layer, 8 devices
_LAYER = '''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from hybrid_jax.config import validate
from hybrid_jax.models import moe
from hybrid_jax.parallel import activations, mesh as mesh_lib, rules as rules_lib
from tests.test_expert_parallel import moe_config

def rel(a, b):  # Relative to the largest entry (all-zero leaves, such as dropless drops, by their difference).
  a, b = np.asarray(a), np.asarray(b)  # Laid out on different meshes.
  return float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(a))), 1e-30)

def case(implementation, dropless, unsplit, activation, meshes):
  c = moe_config(implementation=implementation, dropless=dropless, capacity_factor=0.6, activation=activation)
  cfg = validate(c).model
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: moe.MoE(cfg, rngs=nnx.Rngs(params=0))))
  rng = np.random.default_rng(0)  # Parameters from numpy: an eager init compiles each of its random ops.
  params = jax.tree.map(lambda a: jnp.asarray(0.3 * rng.normal(size=a.shape), a.dtype), abstract)
  x = jnp.asarray(rng.normal(size=(8, 6, cfg.d_model)), jnp.float32)

  def loss(p, x):
    y, stats = nnx.merge(graphdef, p).with_stats(x)
    return jnp.sum(y * jnp.cos(y)), (y, stats['dropped'], stats['load'])

  grad = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  # The reference: the unsplit layer, or the first mesh's (expert 1; with a capacity, drops are per device).
  want = jax.jit(grad)(params, x) if unsplit else None
  for data, expert, sequence in meshes:
    c.parallel.data, c.parallel.expert, c.parallel.sequence = data, expert, sequence
    mesh, rules = mesh_lib.make_mesh(c.parallel), rules_lib.parse_rules(c.parallel.rules)

    def sharded(p, x):
      with activations.sharded(mesh, rules):
        return grad(p, x)

    got = jax.jit(sharded)(params, x)
    want = got if want is None else want
    print(json.dumps({'case': [implementation, dropless, unsplit, activation], 'mesh': [data, expert, sequence],
                      'dropped': float(jnp.sum(got[0][1][1])),
                      'rel': max(rel(a, b) for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)))}), flush=True)

for args in json.loads(sys.argv[1]):
  case(*args)
'''


def _layer(cases) -> list[dict]:
  code = f'import sys; sys.argv = ["", {json.dumps(json.dumps(cases))}]\n' + _LAYER
  return [json.loads(line) for line in run_with_devices(8, code).splitlines() if line.startswith('{')]


EXPERT_1_2_4 = [[8, 1, 1], [4, 2, 1], [2, 4, 1]]  # data, expert, sequence


def test_the_moe_layer_at_expert_2_and_4_equals_expert_1():
  rows = _layer([['ragged_dot', True, False, 'swiglu', EXPERT_1_2_4]])
  assert [r['mesh'] for r in rows] == EXPERT_1_2_4
  for r in rows:
    assert r['rel'] <= TOLERANCE, r


@pytest.mark.e2e
def test_every_dispatch_at_every_expert_split_equals_the_unsplit_layer():
  """The grouped and dense dispatch, expert biases (gpt-oss) and relu2 experts, at expert 1, 2, 4, 8 (the whole
  mesh) and 4 beside sequence 2, against the unsplit layer; with a capacity, some drops, and the same as expert 1
  with each device's tokens the same (the capacity is per device: data 8 for whole rows, data 4 x sequence 2 for
  half rows)."""
  whole_rows = EXPERT_1_2_4 + [[1, 8, 1]]
  meshes = whole_rows + [[1, 4, 2]]
  rows = _layer([['ragged_dot', True, True, 'swiglu', meshes], ['dense', True, True, 'swiglu', meshes],
                 ['ragged_dot', True, True, 'swiglu_oai', meshes], ['ragged_dot', True, True, 'relu2', meshes],
                 ['ragged_dot', False, False, 'swiglu', whole_rows], ['ragged_dot', False, False, 'swiglu',
                                                                     [[4, 1, 2], [1, 4, 2]]]])
  assert len(rows) == 4 * len(meshes) + len(whole_rows) + 2
  for r in rows:
    assert r['rel'] <= TOLERANCE, r
    assert (r['dropped'] > 0) == (not r['case'][1]), r


# --------------------------------------------------------------------------------------- training, 8 devices
_TRAIN = '''
import json, sys
import jax, numpy as np
from hybrid_jax.config import validate
from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import optim, state as state_lib, step as step_lib
from tests.test_expert_parallel import moe_config

def train(arch, data, expert, sequence):
  c = moe_config(arch)
  c.train.batch_size = 8
  c.parallel.data, c.parallel.expert, c.parallel.sequence = data, expert, sequence
  c = validate(c)
  md, tx = state_lib.make_model_def(c.model), optim.make_optimizer(c.train)
  sh = mesh_lib.train_shardings(md, tx, mesh_lib.make_mesh(c.parallel), rules_lib.parse_rules(c.parallel.rules))
  state = state_lib.init_sharded_train_state(c.model, c.seed, tx, sh.state)
  step = step_lib.make_train_step(md, tx, c.train, sh)
  rng, out = np.random.default_rng(0), []
  for _ in range(3):
    toks = rng.integers(0, c.model.vocab_size, (8, c.data.seq_len + 1)).astype(np.int32)
    state, m = step(state, {k: jax.device_put(v, sh.batch) for k, v in (('inputs', toks[:, :-1]),
                                                                         ('targets', toks[:, 1:]))})
    out.append([float(m['loss']), float(m['grad_norm'])])
  split = sum("'expert'" in str(s.sharding.spec) for s in jax.tree.leaves(state['params']))
  return {'arch': arch, 'mesh': [data, expert, sequence], 'steps': out, 'split_over_expert': split}

for arch, meshes in json.loads(sys.argv[1]):
  for mesh in meshes:
    print(json.dumps(train(arch, *mesh)), flush=True)
'''

MIXER_ARCHES = ('swa128', 'gdn', 'mamba2', 'lightning')  # Sliding-window attention (beside full), GDN, Mamba-2, Lightning.
# The experts' split is the same whatever mixer sits before them, so swa128 trains at every expert split and the scans
# at the one where their own exchange runs beside it (sequence 2 beside expert 2), each against data parallelism.
TRAIN_MESHES = {arch: [[8, 1, 1], [2, 2, 2]] for arch in MIXER_ARCHES} | {'swa128': EXPERT_1_2_4 + [[2, 2, 2]]}


@pytest.mark.e2e
@pytest.mark.parametrize('arch', MIXER_ARCHES)
def test_an_moe_hybrid_trains_to_the_same_losses_and_gradient_norms_at_every_expert_split(arch):
  code = f'import sys; sys.argv = ["", {json.dumps(json.dumps([[arch, TRAIN_MESHES[arch]]]))}]\n'
  rows = [json.loads(line) for line in run_with_devices(8, code + _TRAIN).splitlines() if line.startswith('{')]
  rows = {tuple(r['mesh']): r for r in rows}
  assert sorted(rows) == sorted(map(tuple, TRAIN_MESHES[arch]))
  reference = rows[(8, 1, 1)]
  assert reference['split_over_expert'] == 0
  for mesh, row in rows.items():
    if mesh[1] > 1:
      assert row['split_over_expert'] >= 3 * 2, row  # gate, up and down of both blocks' MoEs.
    for (loss, norm), (want_loss, want_norm) in zip(row['steps'], reference['steps']):
      assert abs(loss - want_loss) <= TOLERANCE * abs(want_loss), (mesh, row, reference)
      assert abs(norm - want_norm) <= TOLERANCE * abs(want_norm), (mesh, row, reference)
