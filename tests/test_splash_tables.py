"""Splash's block tables built in closed form (`splash_tables`) against splash's own builder, which evaluates the
mask block pair by block pair: every array, dtype and shape equal, forward and dkv, over whole rows and query
chunks, unequal q/kv blocks, windows on and off block edges (and ones whose corner block holds a single visible
key), window 1, sinks inside and across blocks; the kernel the TPU path builds equals `make_splash_mha`'s for any
head count; a row attended in query chunks equals the row attended whole and lowers through Mosaic. The computed
work read from the tables (every listed block computed whole) against a brute-force count of the dense mask, and
the block each window gets so that it stays within 2x of the visible pairs."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info_lib

from hybrid_jax.kernels.attention import config
from hybrid_jax.kernels.attention import pallas_tpu
from hybrid_jax.kernels.attention import splash_tables
from hybrid_jax.parallel import mesh as mesh_lib
from tests.conftest import with_libtpu


def assert_same_info(got, want):
  for field in want._fields:
    a, b = getattr(got, field), getattr(want, field)
    assert (a is None) == (b is None), field
    if b is not None:
      assert (a.dtype, a.shape) == (b.dtype, b.shape), field
      np.testing.assert_array_equal(a, b, err_msg=field)


CASES = [(start, length, bq, bk, window, sinks)
         for (start, length), (bq, bk), window, sinks in itertools.product(
             [(0, 256), (0, 1024), (512, 512), (768, 256)], [(128, 128), (128, 256), (256, 128)],
             [None, 1, 2, 5, 128, 129, 130, 256, 300, 2000], [0, 4, 130])
         if not (window is None and sinks) and not (start % bq or length % bq or (start + length) % bk)]


@pytest.mark.parametrize('dkv', [False, True], ids=['fwd', 'dkv'])
def test_tables_equal_splash_builder(dkv):
  process = info_lib.process_mask_dkv if dkv else info_lib.process_mask
  for start, length, bq, bk, window, sinks in CASES:
    head = pallas_tpu.SplashMask(start, length, window, sinks)
    want, _ = process(mask_lib.MultiHeadMask([head] * 2), (bq, bk), head_shards=1, q_seq_shards=1)
    got = splash_tables.mask_info(start, length, bq, bk, window=window, sinks=sinks, dkv=dkv)
    assert_same_info(got, want)


def test_block_classes_against_the_dense_mask():
  start, length, block, window, sinks = 256, 768, 128, 200, 70
  dense = np.asarray(pallas_tpu.SplashMask(start, length, window, sinks)[:, :])
  n, m = length // block, (start + length) // block
  blocks = dense.reshape(n, block, m, block).transpose(0, 2, 1, 3).reshape(n, m, -1)
  want = np.where(blocks.all(-1), splash_tables.FULL,
                  np.where(blocks.any(-1), splash_tables.PARTIAL, splash_tables.EMPTY))
  got = splash_tables.block_classes(start, length, start + length, block, block, window, sinks)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('start,window,sinks,heads', [(0, None, 0, 3), (256, None, 0, 1), (0, 100, 0, 2),
                                                      (128, 60, 4, 4)])
def test_kernel_equals_make_splash_mha(start, window, sinks, heads):
  length, block = 512, 128
  mine = pallas_tpu._kernel(start, length, window, sinks, block, True)  # pylint: disable=protected-access
  want = splash.make_splash_mha(mask_lib.MultiHeadMask([pallas_tpu.SplashMask(start, length, window, sinks)] * heads),
                                block_sizes=mine.kwargs['block_sizes'], head_shards=1, q_seq_shards=1, interpret=True)
  got_leaves, want_leaves = jax.tree.leaves(mine), jax.tree.leaves(want)
  assert len(got_leaves) == len(want_leaves)
  for a, b in zip(got_leaves, want_leaves):
    assert (a.dtype, a.shape) == (b.dtype, b.shape)
    np.testing.assert_array_equal(a, b)
  without_fn = lambda kernel: {k: v for k, v in kernel.kwargs.items() if k != 'mask_function'}
  assert without_fn(mine) == without_fn(want)
  q, k = start + np.arange(length)[:, None], np.arange(start + length)[None, :]
  np.testing.assert_array_equal(mine.kwargs['mask_function'](q, k), want.kwargs['mask_function'](q, k))


@pytest.mark.parametrize('window,sinks', [(None, 0), (100, 0), (100, 4)])
def test_table_bytes_are_the_tables_and_chunks_fit_the_budget(window, sinks):
  t = 4096
  for start, length, block in ((0, t, 128), (0, t, 512), (1024, 2048, 256)):
    infos = [splash_tables.mask_info(start, length, block, block, window=window, sinks=sinks, dkv=dkv)
             for dkv in (False, True)]
    assert splash_tables.table_bytes(start, length, block, window, sinks) == max(
        info.data_next.nbytes + info.block_mask.nbytes for info in infos)
  budget = splash_tables.table_bytes(t - 1024, 1024, 128, window, sinks)
  chunk = splash_tables.query_chunk(t, 128, budget, window, sinks)
  assert chunk % 128 == 0 and splash_tables.table_bytes(t - chunk, chunk, 128, window, sinks) <= budget
  assert chunk == t or splash_tables.table_bytes(t - 2 * chunk, 2 * chunk, 128, window, sinks) > budget


def test_at_a_million_tokens_only_causal_and_sink_rows_are_chunked():
  million, budget = 1 << 20, config.TPU_TABLE_BYTES
  assert splash_tables.query_chunk(million, 512, budget) == 65536
  assert splash_tables.query_chunk(million, 512, budget, 128) == million
  assert splash_tables.query_chunk(million, 512, budget, 128, 4) < million  # Every query sees key 0.
  assert splash_tables.query_chunk(262144, 512, budget) == 262144


@pytest.mark.parametrize('window,sinks,documents', [(None, 0, False), (200, 3, False), (None, 0, True)])
def test_a_row_in_query_chunks_equals_the_row_whole(monkeypatch, window, sinks, documents):
  """Forward and gradients, in interpret mode; T = 1000 pads to 1024, so the last chunk holds the padding."""
  t, h, d = 1000, 2, 16
  rng = np.random.default_rng(0)
  q, k, v, do = (jnp.asarray(rng.standard_normal((1, t, h, d)), jnp.float32) for _ in range(4))
  seg = jnp.asarray(np.sort(rng.integers(0, 5, (1, t))), jnp.int32) if documents else None

  def run():
    f = lambda q, k, v: pallas_tpu.attention(q, k, v, window=window, sinks=sinks, segment_ids=seg, block=128)
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(do))

  whole = run()
  monkeypatch.setattr(config, 'TPU_TABLE_BYTES', splash_tables.table_bytes(768, 256, 128, window, sinks))
  assert splash_tables.query_chunk(1024, 128, config.TPU_TABLE_BYTES, window, sinks) == 256
  for got, want in zip(run(), whole):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_chunked_row_compiles_for_tpu_through_mosaic(monkeypatch):
  """Each query chunk lowers to its own splash kernels (forward, dq, dkv), and the step compiles for a TPU chip."""
  device = with_libtpu(lambda: mesh_lib.topology_devices('v5e:2x2'))[0]
  t, block = 2048, 128
  monkeypatch.setattr(config, 'TPU_TABLE_BYTES', splash_tables.table_bytes(t - 512, 512, block))
  assert splash_tables.query_chunk(t, block, config.TPU_TABLE_BYTES) == 512
  spec = jax.ShapeDtypeStruct((1, t, 2, 64), jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(device))
  loss = lambda q, k, v: pallas_tpu.attention(q, k, v, block=block, interpret=False).astype(jnp.float32).sum()
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(spec, spec, spec)
  assert lowered.as_text().count('@tpu_custom_call(') == 3 * (t // 512)
  assert lowered.compile().memory_analysis().temp_size_in_bytes > 0


@pytest.mark.parametrize('t,window,sinks', [(1000, None, 0), (1000, 128, 0), (1000, 200, 3), (640, 1, 0),
                                            (512, 130, 130), (300, 512, 4), (900, 256, 300)])
def test_computed_work_against_a_brute_force_count_of_the_dense_mask(t, window, sinks):
  """visible_pairs counts the dense [T, T] mask; the tables' computed pairs are the area of the padded dense mask's
  blocks that hold a visible pair, forward and dkv, whole and in query chunks."""
  visible = int(np.asarray(pallas_tpu.SplashMask(0, t, window, sinks)[:, :]).sum())
  assert splash_tables.visible_pairs(t, window, sinks) == visible
  for block in (128, 256):
    tp = -(-t // block) * block
    dense = np.asarray(pallas_tpu.SplashMask(0, tp, window, sinks)[:, :])
    n = tp // block
    area = int(dense.reshape(n, block, n, block).any(axis=(1, 3)).sum()) * block * block
    for chunk, dkv in itertools.product((None, block, 2 * block), (False, True)):
      infos = [splash_tables.mask_info(s, min(chunk or tp, tp - s), block, block, window=window, sinks=sinks,
                                       dkv=dkv) for s in range(0, tp, chunk or tp)]
      assert splash_tables.computed_pairs(infos, block, block) == area
      assert splash_tables.work_ratio(t, block, window, sinks, chunk, dkv) == area / visible


@pytest.mark.parametrize('t', [16384, 32768])
def test_blocks_follow_the_window_so_computed_work_stays_within_2x(t):
  """Windows 128 / 512 / 2048 and full causal compute at most twice their visible pairs (512-blocks at a window of
  128 computed 8x); sink keys beside a narrow window take the block of least work."""
  want = {128: (128, 2.0), 512: (512, 2.0), 2048: (512, 1.25), None: (512, 1 + 512 / t)}
  for window, (block, ratio) in want.items():
    assert pallas_tpu.block_for(t, window) == block
    assert splash_tables.work_ratio(t, block, window) == pytest.approx(ratio, rel=1e-3)
  assert pallas_tpu.block_for(t, 128, 4) == 128 and 2.8 < splash_tables.work_ratio(t, 128, 128, 4) < 2.95
  assert pallas_tpu.block_for(t, 512, 4) == 256 and splash_tables.work_ratio(t, 256, 512, 4) < 2
  assert pallas_tpu.block_for(t, t) == pallas_tpu.block_for(t, None)  # A window >= T is full causal.
  assert pallas_tpu.block_for(200, 128) == 128 and pallas_tpu.block_for(300, None) == 128  # Short rows.


def test_an_explicit_block_that_is_no_multiple_of_the_lanes_is_refused():
  q = jnp.zeros((1, 256, 1, 16), jnp.float32)
  with pytest.raises(ValueError, match='multiples of 128'):
    pallas_tpu.attention(q, q, q, block=192)
