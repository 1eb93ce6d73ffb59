"""Splash's block tables built in closed form (`splash_tables`) against splash's own builder, which evaluates the
mask block pair by block pair: every array, dtype and shape equal, forward and dkv, over lengths, unequal q/kv
blocks, windows on and off block edges (and ones whose corner block holds a single visible key), window 1, sinks inside and across blocks; and the kernel the TPU path
builds equals `make_splash_mha`'s for any head count."""

import itertools

import jax
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as info_lib

from hybrid_jax.kernels.attention import pallas_tpu
from hybrid_jax.kernels.attention import splash_tables


def splash_mask(t, window, sinks):
  shape = (t, t)
  if window is None:
    return mask_lib.CausalMask(shape)
  if sinks:
    return pallas_tpu._SinkWindowMask(shape, window, sinks)  # pylint: disable=protected-access
  return mask_lib.LocalMask(shape, window_size=(window - 1, 0), offset=0)


def assert_same_info(got, want):
  for field in want._fields:
    a, b = getattr(got, field), getattr(want, field)
    assert (a is None) == (b is None), field
    if b is not None:
      assert (a.dtype, a.shape) == (b.dtype, b.shape), field
      np.testing.assert_array_equal(a, b, err_msg=field)


CASES = [(t, bq, bk, window, sinks)
         for t, (bq, bk), window, sinks in itertools.product(
             [256, 1024], [(128, 128), (128, 256), (256, 128)], [None, 1, 2, 5, 128, 129, 130, 256, 300, 2000], [0, 4, 130])
         if not (window is None and sinks) and not t % bq and not t % bk]


@pytest.mark.parametrize('dkv', [False, True], ids=['fwd', 'dkv'])
def test_tables_equal_splash_builder(dkv):
  process = info_lib.process_mask_dkv if dkv else info_lib.process_mask
  for t, bq, bk, window, sinks in CASES:
    want, _ = process(mask_lib.MultiHeadMask([splash_mask(t, window, sinks)] * 2), (bq, bk), head_shards=1,
                      q_seq_shards=1)
    got = splash_tables.mask_info(t, bq, bk, window=window, sinks=sinks, dkv=dkv)
    assert_same_info(got, want)


def test_block_classes_against_the_dense_mask():
  t, block, window, sinks = 768, 128, 200, 70
  dense = np.asarray(splash_mask(t, window, sinks)[:, :])
  blocks = dense.reshape(t // block, block, t // block, block).transpose(0, 2, 1, 3).reshape(t // block, t // block, -1)
  want = np.where(blocks.all(-1), splash_tables.FULL, np.where(blocks.any(-1), splash_tables.PARTIAL,
                                                                splash_tables.EMPTY))
  np.testing.assert_array_equal(splash_tables.block_classes(t, block, block, window, sinks), want)


@pytest.mark.parametrize('window,sinks,heads', [(None, 0, 3), (100, 0, 2), (60, 4, 4)])
def test_kernel_equals_make_splash_mha(window, sinks, heads):
  t, block = 512, 128
  mine = pallas_tpu._kernel(t, window, sinks, block, True)  # pylint: disable=protected-access
  want = splash.make_splash_mha(mask_lib.MultiHeadMask([splash_mask(t, window, sinks)] * heads),
                                block_sizes=mine.kwargs['block_sizes'], head_shards=1, q_seq_shards=1, interpret=True)
  got_leaves, want_leaves = jax.tree.leaves(mine), jax.tree.leaves(want)
  assert len(got_leaves) == len(want_leaves)
  for a, b in zip(got_leaves, want_leaves):
    assert (a.dtype, a.shape) == (b.dtype, b.shape)
    np.testing.assert_array_equal(a, b)
  without_fn = lambda kernel: {k: v for k, v in kernel.kwargs.items() if k != 'mask_function'}
  assert without_fn(mine) == without_fn(want)
  q, k = np.arange(t)[:, None], np.arange(t)[None, :]
  np.testing.assert_array_equal(mine.kwargs['mask_function'](q, k), want.kwargs['mask_function'](q, k))
