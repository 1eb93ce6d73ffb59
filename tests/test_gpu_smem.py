"""The shared-memory model of the Pallas GPU kernels and the block/chunk choices made with it (CPU only).

The model must reproduce what an H200 reported (the two scan kernels that did not compile) and agree with the
configurations that did compile there; every configuration the dispatcher can choose must fit the budget.
"""

import itertools

import jax.numpy as jnp
import pytest

from hybrid_jax.kernels import gpu_smem
from hybrid_jax.kernels.attention import config
from hybrid_jax.kernels import pallas_scan_common as pc
from hybrid_jax.kernels import scan_checks as scan_api

BUDGETS = (gpu_smem.H100_BUDGET, gpu_smem.A100_BUDGET)
HEAD_DIMS = (32, 64, 128, 256)
CHUNKS = (16, 32, 64, 128)
DTYPES = (jnp.float32, jnp.bfloat16)
SCANS = ('linear_scan', 'gated_delta_rule')


def test_model_reproduces_the_h200_failures():
  # device-results 2026-11-30-h200/scan_parity.txt: float32, K = V = 128, chunk 64, block_v 64, 2 stages.
  assert gpu_smem.scan('linear_scan', 64, 128, 128, 64, 4)['linear_scan.grads'] == 278528
  assert gpu_smem.scan('gated_delta_rule', 64, 128, 128, 64, 4)['gated_delta_rule.grads'] == 327680


@pytest.mark.parametrize('kernel,d,chunk', [(k, d, c) for k in SCANS for d, c in ((128, 16), (128, 32), (128, 64),
                                                                                   (64, 64))])
def test_model_admits_what_compiled_on_the_h200(kernel, d, chunk):
  # The same run compiled (and passed) bf16 at these head dims and chunks.
  assert gpu_smem.worst(gpu_smem.scan(kernel, chunk, d, d, 64, 2))[1] <= gpu_smem.H100_BUDGET


def test_model_admits_the_attention_blocks_that_compiled_on_the_h200():
  # attn_parity.txt: the table entries at d 64/128, bf16 and fp32 up to 64-blocks, all compiled.
  for d in (64, 128):
    assert gpu_smem.worst(gpu_smem.attention(d, 2, config.GPU_BLOCKS[d]))[1] <= gpu_smem.H100_BUDGET
    blocks = config.GPU_BLOCKS[d]._replace(fwd_q=64)
    assert gpu_smem.worst(gpu_smem.attention(d, 4, blocks))[1] <= gpu_smem.H100_BUDGET


@pytest.mark.parametrize('budget', BUDGETS)
def test_every_attention_choice_fits(budget):
  seen = 0
  for d, dtype, t in itertools.product(HEAD_DIMS, DTYPES, config.BLOCK_CAP_TS):
    it = jnp.dtype(dtype).itemsize
    blocks = config.gpu_blocks(d, t, itemsize=it, budget=budget)
    need = gpu_smem.attention(d, it, blocks)
    assert max(need.values()) <= budget, (d, dtype, t, blocks, need)
    assert all(b >= config.MIN_BLOCK and not b & (b - 1) for b in config.block_sizes(blocks))
    assert min(blocks.fwd_stages, blocks.bwd_stages) >= 1
    seen += 1
  assert seen == len(HEAD_DIMS) * len(DTYPES) * len(config.BLOCK_CAP_TS)


def test_attention_keeps_the_table_entry_when_it_fits_and_shrinks_when_not():
  long = 1 << 15
  assert config.gpu_blocks(128, long, itemsize=2, budget=gpu_smem.H100_BUDGET) == config.GPU_BLOCKS[128]
  f32 = config.gpu_blocks(128, long, itemsize=4, budget=gpu_smem.H100_BUDGET)
  assert f32 != config.GPU_BLOCKS[128]
  assert gpu_smem.attention(128, 4, config.GPU_BLOCKS[128])['attention.forward'] > gpu_smem.H100_BUDGET
  # Stages drop before blocks shrink.
  assert f32.fwd_stages == 2 and (f32.fwd_q, f32.fwd_k) == (128, 64)
  a100 = config.gpu_blocks(128, long, itemsize=4, budget=gpu_smem.A100_BUDGET)
  assert a100.fwd_q < f32.fwd_q or a100.bwd_q < f32.bwd_q


def test_attention_refuses_blocks_that_cannot_fit():
  with pytest.raises(ValueError, match='shared memory'):
    config.gpu_blocks(128, 4096, config.GpuBlocks(128, 128, 128, 128), itemsize=4, budget=gpu_smem.H100_BUDGET)
  with pytest.raises(ValueError, match='no attention block configuration fits 1000 bytes'):
    config.gpu_blocks(128, 4096, itemsize=4, budget=1000)


@pytest.mark.parametrize('budget', BUDGETS)
@pytest.mark.parametrize('kernel', SCANS)
def test_every_scan_choice_fits(kernel, budget):
  supported = 0
  for d, chunk, dtype in itertools.product(HEAD_DIMS, CHUNKS, DTYPES):
    it = jnp.dtype(dtype).itemsize
    got = gpu_smem.scan_chunk(kernel, chunk, d, d, pc.GPU_BLOCK_V, it, budget=budget)
    if got is None:
      assert gpu_smem.worst(gpu_smem.scan(kernel, 16, d, d, pc.GPU_BLOCK_V, it))[1] > budget
      continue
    supported += 1
    assert 16 <= got <= chunk and chunk % got == 0
    assert gpu_smem.worst(gpu_smem.scan(kernel, got, d, d, pc.GPU_BLOCK_V, it))[1] <= budget
    if got < chunk:  # The largest fitting chunk: twice it did not fit.
      assert gpu_smem.worst(gpu_smem.scan(kernel, 2 * got, d, d, pc.GPU_BLOCK_V, it))[1] > budget
  assert supported >= len(CHUNKS) * len(DTYPES) * 2  # At least head dims 32 and 64 everywhere.


def test_the_failing_h200_cases_now_fit():
  for kernel in SCANS:
    got = gpu_smem.scan_chunk(kernel, 64, 128, 128, pc.GPU_BLOCK_V, 4, budget=gpu_smem.H100_BUDGET)
    assert got == 32
  q = jnp.zeros((1, 64, 1, 128), jnp.float32)
  cfg = pc.make_cfg('gpu', q, q, kernel='gated_delta_rule', scale=1.0, chunk_size=64, block_v=None,
                    interpret=True, budget=gpu_smem.H100_BUDGET)
  assert cfg.chunk == 32


def test_scan_refuses_what_cannot_fit_and_the_dispatcher_knows():
  q = jnp.zeros((1, 64, 1, 256), jnp.float32)
  message = r"no chunk <= 64 whose linear_scan kernels fit .*\(use implementation='xla'\)"
  with pytest.raises(ValueError, match=message):
    pc.make_cfg('gpu', q, q, kernel='linear_scan', scale=1.0, chunk_size=64, block_v=None, interpret=True,
                budget=gpu_smem.H100_BUDGET)
  assert not scan_api.supports('pallas_gpu', jnp.float32, 64, (256, 256))
  assert scan_api.supports('pallas_gpu', jnp.float32, 64, (128, 128), 'gated_delta_rule')


def test_device_budget_by_capability():
  class Gpu:
    def __init__(self, capability):
      self.compute_capability = capability
  assert gpu_smem.device_budget(Gpu('9.0')) == 232448
  assert gpu_smem.device_budget(Gpu('8.0')) == 166912
  assert gpu_smem.device_budget(Gpu('7.5')) == min(gpu_smem.BUDGET_BY_CAPABILITY.values())
