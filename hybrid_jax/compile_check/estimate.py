"""The step time a configuration could reach on a chip: a roofline that prices what each memory fix costs.

step_s = max(compute_s, memory_s) + collective_s, per chip:
- compute_s: the model's training FLOPs (models/flops.py, 3 x forward) plus the forward FLOPs that the backward
  computes again under the remat policy and the chunked loss (`flops.recomputed_flops_per_token`), at the chip's
  bf16 peak; so a fix that recomputes the whole forward (model.remat=full) costs what it recomputes.
- memory_s: XLA's bytes accessed per chip times train.grad_accum (XLA counts the accumulation loop's body once), at
  the HBM bandwidth; XLA also counts the layer scan's body once, so this term stays a lower bound.
- collective_s: the bytes each chip sends and receives over the chip-to-chip links (ICI), by ring algorithms: the
  gradient reduction over the axes the parameters are replicated on (batch and sequence) once per step (XLA moves
  it out of the accumulation loop: seen in a compiled v5p step), with FSDP the parameter all-gathers of every
  micro-batch's forward and backward, with context parallelism (parallel.sequence) each mixer's exchange along
  the sequence axis (`sequence_exchange_bytes`), and with expert parallelism (parallel.expert) each MoE layer's
  gather and reduce-scatter of its tokens (`expert_exchange_bytes`), at the chip's bidirectional ICI bandwidth,
  counted as not overlapped with compute (XLA overlaps some of it). Optimizer-state sharding costs nothing here: its
  reduce-scatter plus all-gather move what the all-reduce moves. Tensor-parallel activation collectives are not
  counted.
Kernel efficiency and the smaller matmuls of a micro-batch are not modelled, so fixes that tie here still differ;
compile-check breaks ties by its order of candidates, the ones that change least first.
"""

import math

import jax.numpy as jnp

from hybrid_jax.models import flops as flops_lib, moe, pattern
from hybrid_jax.models.mixers import attention, registry
from hybrid_jax.parallel import rules as rules_lib


def collective_bytes(param_bytes: float, mesh_shape: dict, accum: int, exchanges: float = 0.0, *,
                     expert_bytes: float = 0.0, expert_exchanges: float = 0.0) -> dict:
  """Bytes each chip sends per step (and receives as many) for the parameters' collectives, by kind, and the
  sequence axis' exchanges (`exchanges`, from `sequence_exchange_bytes`); with an expert axis, its exchanges too
  (`expert_exchanges`, from `expert_exchange_bytes`).

  `param_bytes`: all parameters' bytes (the gradients have the same dtype), of which `expert_bytes` are routed
  experts' weights; `mesh_shape`: {'data', 'fsdp', 'expert', 'sequence', 'tensor'} sizes (a missing axis counts 1).
  The parameters are replicated over 'data' and 'sequence' alike, and over 'expert' but for the experts, which it
  splits; so the gradient is reduce-scattered over 'fsdp' and all-reduced over data x sequence (x expert) ((n - 1) /
  n and 2 (n - 1) / n of the bytes per chip); FSDP gathers every weight for each micro-batch's forward and again for
  its backward. Tensor parallelism splits every weight 'tensor' ways.
  """
  d, f, e, s, t = (int(mesh_shape.get(a, 1)) for a in ('data', 'fsdp', 'expert', 'sequence', 'tensor'))
  reduction = lambda local, replicas: (f - 1) / f * local + 2 * (replicas - 1) / replicas * local / f
  if e == 1:
    expert_bytes = 0.0  # The experts are replicated like the rest: one term, as before the axis existed.
  dense, experts = (param_bytes - expert_bytes) / t, expert_bytes / (t * e)
  sent = {'gradient_reduction': reduction(dense, d * s * e) + reduction(experts, d * s),
          'fsdp_gathers': int(accum) * 2 * (f - 1) / f * (dense + experts), 'sequence_exchanges': exchanges}
  return {**sent, 'expert_exchanges': expert_exchanges} if e > 1 else sent


def _heads(n: int, tensor: int) -> int:
  """Heads of `n` on one chip: split over 'tensor' as the default rules do (whole when it does not divide)."""
  return n // tensor if n % tensor == 0 else n


def _padded(n: int, ways: int) -> int:
  return -(-n // ways) * ways


def sequence_exchange_bytes(model_cfg, seq_len: int, rows: float, mesh_shape: dict) -> float:
  """Bytes a chip sends per step (forward and backward; it receives as many) for the mixers' exchanges along the
  'sequence' axis of s ways (hybrid_jax.parallel.sequence), 0 when s = 1. Per layer, for the `rows` rows a chip
  holds per step (all micro-batches) of T/s tokens each, heads split over 'tensor', b the bytes of model.dtype:

  - full attention (and a window as long as the row): all-to-alls of q, k, v and o, each sending
    (s - 1)/s of its [rows, T/s, heads, head_dim] (heads padded to a multiple of s, key heads expanded to the query
    heads when s does not divide them, as the exchange does), and their transposes in the backward:
    2 x (2 Hq + 2 Hkv) x rows x T/s x head_dim x b x (s - 1)/s;
  - sliding window w: the halo of the w - 1 keys and values before the shard, rounded up to the shard's kernel
    granularity as the exchange sends it (up to 128 tokens), forward and its cotangent back:
    2 x 2 x rows x halo x Hkv x head_dim x b. Head-wise layers count each KV group by its own window
    (attention.kv_groups);
  - scans (gdn, lightning, mamba2): an all_gather of every shard's float32 final state [rows, H, K, V] and its
    transition ([rows, H] decays; the delta rule's [rows, H, K, K] matrices), (s - 1) x its bytes, and the
    reduce-scatter of the backward: 2 x (s - 1) x rows x H x (K V + transition) x 4.
  Left out as small: segment ids, the short convolutions' width - 1 token halos, the psum of the final conv state.
  A kind this table does not know (a mixer registered outside the package) counts nothing: its exchange is its own
  code's, so its cost is not in the estimate; a pointwise kind (an MLP layer) exchanges nothing.
  """
  s, t = int(mesh_shape.get('sequence', 1)), int(mesh_shape.get('tensor', 1))
  if s == 1:
    return 0.0
  local, b = seq_len / s, jnp.dtype(model_cfg.dtype).itemsize
  total = 0.0
  for i in range(model_cfg.num_layers):
    spec = pattern.layer_spec(model_cfg, i)
    kind = registry.get(spec.kind)
    if kind.attention:
      groups = model_cfg.num_heads // model_cfg.num_kv_heads
      for window, kv in attention.kv_groups(spec, model_cfg.num_kv_heads):
        hkv = _heads(kv.stop - kv.start, t)
        hq = _heads((kv.stop - kv.start) * groups, t)
        if window == 1:
          continue
        if window is None or window >= seq_len:
          hkv = hkv if hkv % s == 0 else hq
          moved = (2 * _padded(hq, s) + 2 * _padded(hkv, s)) * rows * local * model_cfg.head_dim * b
          total += 2 * moved * (s - 1) / s
        else:
          grain = min(int(local) & -int(local), 128)  # parallel.sequence's halo length.
          halo = -(-(window - 1) // grain) * grain
          total += 2 * 2 * rows * halo * hkv * model_cfg.head_dim * b
    elif spec.kind in _SCAN_STATES:
      heads, k, v, transition = _SCAN_STATES[spec.kind](model_cfg)
      total += 2 * (s - 1) * rows * _heads(heads, t) * (k * v + transition) * 4
  return total


def expert_exchange_bytes(model_cfg, seq_len: int, rows: float, mesh_shape: dict) -> float:
  """Bytes a chip sends per step (forward and backward; it receives as many) for the MoE layers' exchange over the
  'expert' axis of e ways (hybrid_jax.parallel.experts), 0 when e = 1. Per MoE layer, for the n = rows x T/s tokens
  a chip holds per step (all micro-batches), each ring collective over e chips sending (e - 1) n of its rows: the
  all-gather of the tokens (d_model x b, b the bytes of model.dtype) and of their routing (k x 9: expert ids, float32
  weights, kept flags), the reduce-scatter of the float32 outputs (d_model x 4), and in the backward their
  transposes (the tokens' and weights' cotangents reduce-scattered, the outputs' all-gathered):
  (e - 1) x n x (2 d_model (b + 4) + 13 k). A recomputing remat policy runs the forward's part again (not counted).
  """
  e, s = int(mesh_shape.get('expert', 1)), int(mesh_shape.get('sequence', 1))
  if e == 1:
    return 0.0
  d, k, b = int(model_cfg.d_model), int(model_cfg.moe.top_k), jnp.dtype(model_cfg.dtype).itemsize
  return moe.layer_count(model_cfg) * (e - 1) * rows * seq_len / s * (2 * d * (b + 4) + 13 * k)


# Scan kind -> (value heads, K, V, transition elements per head) of the state its shards all-gather.
_SCAN_STATES = {
    'gdn': lambda c: (c.gdn.value_heads or c.gdn.num_heads, c.gdn.key_dim, c.gdn.value_dim, c.gdn.key_dim ** 2),
    'lightning': lambda c: (c.lightning.num_heads, c.lightning.key_dim, c.lightning.value_dim, 1),
    'mamba2': lambda c: (c.mamba2.num_heads, c.mamba2.state_dim, c.mamba2.head_dim, 1),
}


def step_estimate(config, chip, *, chips: int, mesh_shape: dict, param_bytes: float,
                  xla_bytes: float | None) -> dict | None:
  """The roofline of the module docstring for `config` on `chips` chips of `chip` (parallel.chips.Chip), or None
  when the chip's peak or HBM bandwidth is unknown (CPU). `xla_bytes` None: before compiling, the memory term is 0
  and the estimate a lower bound of the compiled one (compile-check skips fixes that cannot beat the best so far)."""
  if chip is None or not chip.hbm_bytes_per_s:
    return None
  seq_len, accum = int(config.data.seq_len), int(config.train.grad_accum)
  tokens_per_chip = int(config.train.batch_size) * seq_len / chips
  model_flops = flops_lib.training_flops_per_token(config.model, seq_len) * tokens_per_chip
  recomputed = flops_lib.recomputed_flops_per_token(config.model, seq_len, int(config.train.loss_chunk))
  recomputed *= tokens_per_chip
  compute_s = (model_flops + recomputed) / (chip.peak_bf16_tflops * 1e12)
  memory_s = (xla_bytes or 0.0) * accum / chip.hbm_bytes_per_s
  batch_axes = rules_lib.parse_rules(config.parallel.rules).get('batch', ())
  rows = int(config.train.batch_size) / math.prod(int(mesh_shape.get(a, 1)) for a in batch_axes)  # Per chip.
  experts = moe.layer_count(config.model) * moe.routed_params(config.model)
  sent = collective_bytes(param_bytes, mesh_shape, accum,
                          sequence_exchange_bytes(config.model, seq_len, rows, mesh_shape),
                          expert_bytes=experts * jnp.dtype(config.model.param_dtype).itemsize,
                          expert_exchanges=expert_exchange_bytes(config.model, seq_len, rows, mesh_shape))
  collective_s = 2 * sum(sent.values()) / chip.ici_bytes_per_s if chip.ici_bytes_per_s else 0.0
  step_s = max(compute_s, memory_s) + collective_s
  ici = (f'{chip.ici_bytes_per_s / 1e9:g} GB/s ICI' if chip.ici_bytes_per_s else 'ICI unknown: collectives not priced')
  return {'step_s': step_s, 'bound': 'compute' if compute_s >= memory_s else 'memory',
          'tokens_per_s': int(config.train.batch_size) * seq_len / step_s, 'compute_s': compute_s,
          'memory_s': memory_s, 'collective_s': collective_s, 'model_flops_per_chip': model_flops,
          'recomputed_flops_per_chip': recomputed, 'collective_bytes_per_chip': sent,
          'basis': f'roofline: {chip.peak_bf16_tflops:g} TFLOP/s, {chip.hbm_bytes_per_s / 1e9:g} GB/s HBM, {ici} '
                   f'({chip.source})'}
