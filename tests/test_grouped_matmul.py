"""The Pallas grouped matmul (megablox, hybrid_jax.kernels.grouped_matmul) and the MoE dispatch through it
(model.moe.implementation='gmm').

On CPU the kernels run in Pallas interpret mode: forward and gradients equal jax.lax.ragged_dot's (float32, exact up
to summation order) for groups of any size, experts with no rows, rows past the groups (dropped assignments) and a
row count that is no multiple of the row tile; the MoE layer through 'gmm' equals it through 'ragged_dot', values
and gradients, with an expert no token chooses and with a capacity's drops; with the experts split over the
'expert' mesh axis (8 fake devices, most rows past this device's groups) it equals the unsplit layer. 'auto' picks
'gmm' on a TPU target only. With libtpu the kernels lower through Mosaic for a v5p chip at the S1 twins' expert
shapes (d_model 384, expert width 479: no multiple of 128), forward and backward, and compile; a tiny MoE hybrid's
sharded train step with the experts split compiles through them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hybrid_jax.kernels import grouped_matmul, platform
from hybrid_jax.models import moe
from tests.conftest import with_libtpu
from tests.test_moe import built

KERNEL = 'tpu_custom_call'


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(b))), 1e-30)


def test_gmm_equals_ragged_dot_values_and_gradients():
  m, k, n, groups = 45, 16, 24, 5  # 45 rows: padded to the 48-row tile inside.
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (m, k))
  w = jax.random.normal(keys[1], (groups, k, n))
  cotangent = jax.random.normal(keys[2], (m, n))

  @jax.jit
  def both(sizes):
    out = []
    for matmul in (grouped_matmul.gmm, jax.lax.ragged_dot):
      y, vjp = jax.vjp(lambda a, b: matmul(a, b, sizes), x, w)
      out.append((y, *vjp(cotangent)))
    return out

  cases = [[9, 0, 20, 16, 0],  # Every row in a group; two experts with none.
           [3, 0, 7, 0, 11],  # 24 rows past the groups (dropped assignments: zero, no NaN).
           [45, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]
  for sizes in cases:
    got, want = both(jnp.asarray(sizes, jnp.int32))
    for name, a, b in zip(('values', 'd lhs', 'd rhs'), got, want):
      assert np.isfinite(np.asarray(a)).all(), (sizes, name)
      assert float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) <= 1e-5 * max(1.0, float(np.max(np.abs(b)))), (
          sizes, name)
    past = sum(sizes)
    assert not np.asarray(got[0][past:]).any() and not np.asarray(got[1][past:]).any(), sizes
    empty = [g for g, s in enumerate(sizes) if s == 0]
    assert not np.asarray(got[2])[empty].any(), sizes  # An expert with no rows gets a zero weight gradient.


def test_gmm_runs_bfloat16_and_refuses_a_gpu_target():
  x = jnp.ones((20, 8), jnp.bfloat16)
  w = jnp.ones((2, 8, 4), jnp.bfloat16)
  sizes = jnp.asarray([12, 6], jnp.int32)
  y = grouped_matmul.gmm(x, w, sizes)
  assert y.dtype == jnp.bfloat16 and y.shape == (20, 4)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(jax.lax.ragged_dot(x, w, sizes), np.float32))
  with platform.targeting('gpu'), pytest.raises(RuntimeError, match="needs a TPU target.*'ragged_dot'"):
    grouped_matmul.gmm(x, w, sizes)


def test_the_tiles_fit_the_shapes():
  assert grouped_matmul.row_tile(45) == 48 and grouped_matmul.row_tile(10**6) == grouped_matmul.ROW_TILE
  assert grouped_matmul.tiles(1024, 384, 479) == (512, 384, 479)  # Whole widths below the tile.
  assert grouped_matmul.tiles(48, 4096, 2730) == (48, 1024, 1024)  # Wider: partial last tiles, masked by megablox.


@pytest.mark.parametrize('where, want', [('tpu', 'gmm'), ('gpu', 'ragged_dot'), ('cpu', 'ragged_dot')])
def test_auto_picks_the_pallas_grouped_matmul_on_tpu_only(where, want):
  with platform.targeting(where):
    assert moe.implementation('auto') == want
  assert moe.implementation('gmm') == 'gmm'


@pytest.mark.parametrize('overrides', [
    pytest.param(dict(activation='swiglu_oai', router='topk_softmax'), id='dropless_biases',  # Each row's bias.
                 marks=pytest.mark.e2e),
    pytest.param(dict(dropless=False, capacity_factor=0.5), id='capacity'),  # Drops sorted past every group.
])
def test_the_moe_through_gmm_equals_ragged_dot(overrides):
  """Values and gradients of the MoE layer (router, experts, input) through 'gmm' and 'ragged_dot'; expert 3 is
  never chosen (its logit far below the others), so it has no rows and no gradient."""
  cfg, layer = built(**overrides)
  layer.router.value = layer.router[...].at[:, 3].set(0.0).at[0, 3].set(-100.0)  # x[..., 0] = 4: logit -400.
  x = jax.random.normal(jax.random.key(3), (2, 11, cfg.d_model)).at[..., 0].set(4.0)
  graphdef, params = nnx.split(layer)

  def loss(params, x, impl):
    model = nnx.merge(graphdef, params)
    model.implementation = impl
    y, stats = model.with_stats(x)
    return jnp.sum(jnp.sin(y)), (y, stats['dropped'], stats['load'])

  grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)
  (g_gmm, (y_gmm, dropped, load)), (g_ragged, (y_ragged, dropped_ragged, _)) = (
      grad(params, x, impl) for impl in ('gmm', 'ragged_dot'))
  assert float(load[3]) == 0.0 and float(dropped) == float(dropped_ragged)
  if not overrides.get('dropless', True):
    assert float(dropped) > 0
  assert rel(y_gmm, y_ragged) < 1e-5
  for a, b in zip(jax.tree.leaves(g_gmm), jax.tree.leaves(g_ragged)):
    assert np.isfinite(np.asarray(a)).all()
    if np.abs(np.asarray(b)).max() > 0:
      assert rel(a, b) < 1e-5
  assert not np.asarray(g_gmm[0]['up'][...][3]).any()


@pytest.mark.e2e
def test_the_moe_through_gmm_with_experts_split_equals_the_unsplit_layer():
  """8 fake devices, the experts over expert 2 and 4 (beside data parallelism): 'gmm' values and gradients equal
  the unsplit layer's; most of each device's rows are other devices' experts', past its groups."""
  from tests.test_expert_parallel import EXPERT_1_2_4, TOLERANCE, _layer
  rows = _layer([['gmm', True, True, 'swiglu', EXPERT_1_2_4]])
  assert len(rows) == 3 and all(r['rel'] < TOLERANCE for r in rows), rows


# ------------------------------------------------------------------------------------------ TPU, through libtpu
@pytest.fixture(scope='module')
def tpu_devices():
  from hybrid_jax.parallel import mesh as mesh_lib
  enabled = jax.config.jax_enable_compilation_cache  # TPU executables compiled without a TPU: no cache.
  jax.config.update('jax_enable_compilation_cache', False)
  try:
    yield with_libtpu(lambda: mesh_lib.topology_devices('v5p:2x2x1'))
  finally:
    jax.config.update('jax_enable_compilation_cache', enabled)


def test_gmm_lowers_through_mosaic_at_the_s1_twins_shapes(tpu_devices):
  """Gate/up ([m, 384] x [8, 384, 479]) and down ([m, 479] x [8, 479, 384]) in bfloat16 for one v5p chip: the
  forward is one Mosaic kernel and the backward two more (gmm for the rows, tgmm for the weights); each compiles."""
  mesh = Mesh(tpu_devices[:1], ('one',))
  one = NamedSharding(mesh, P())
  for k, n in ((384, 479), (479, 384)):
    x = jax.ShapeDtypeStruct((4000, k), jnp.bfloat16, sharding=one)
    w = jax.ShapeDtypeStruct((8, k, n), jnp.bfloat16, sharding=one)
    sizes = jax.ShapeDtypeStruct((8,), jnp.int32, sharding=one)
    loss = lambda x, w, s: jnp.sum(jnp.square(grouped_matmul.gmm(x, w, s).astype(jnp.float32)))
    with platform.targeting(tpu_devices[:1]), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, w, sizes)
    assert lowered.as_text().count(f'@{KERNEL}(') == 3, (k, n)
    assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


@pytest.mark.e2e
def test_an_moe_hybrid_train_step_with_split_experts_compiles_through_gmm(tpu_devices):
  """A tiny MoE GDN hybrid's sharded train step on v5p:2x2x1 at data 2 x expert 2, the dispatch chosen by 'auto':
  Mosaic kernels take each device's 2 of the 4 experts' matrices ([2, 64, 96] gate/up, [2, 96, 64] down) and its
  expert group's rows (2 devices x 1,024 tokens x top 2 = 4,096), beside the GDN scan's kernels; it compiles."""
  from hybrid_jax.config import validate
  from tests.test_tpu_compile import kernel_operand_shapes, lowered_steps, tiny
  config = tiny('gdn')
  config.model.moe.update(dict(blocks='all', num_experts=4, top_k=2, expert_d_ff=96))
  config.parallel.update(dict(data=2, fsdp=1, expert=2))
  train = lowered_steps(validate(config), tpu_devices)[0]
  shapes = set(kernel_operand_shapes(train.as_text()))
  assert {(2, 64, 96), (2, 96, 64), (4096, 64), (4096, 96)} <= shapes, sorted(shapes)
  assert train.compile().memory_analysis().temp_size_in_bytes > 0
