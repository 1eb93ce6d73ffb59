"""The step time a configuration could reach on a chip: a roofline that prices what each memory fix costs.

step_s = max(compute_s, memory_s) + collective_s, per chip:
- compute_s: the model's training FLOPs (models/flops.py, 3 x forward) plus the forward FLOPs that the backward
  computes again under the remat policy and the chunked loss (`flops.recomputed_flops_per_token`), at the chip's
  bf16 peak; so a fix that recomputes the whole forward (model.remat=full) costs what it recomputes.
- memory_s: XLA's bytes accessed per chip times train.grad_accum (XLA counts the accumulation loop's body once), at
  the HBM bandwidth; XLA also counts the layer scan's body once, so this term stays a lower bound.
- collective_s: the bytes each chip sends and receives over the chip-to-chip links (ICI), by ring algorithms: the
  gradient reduction over the batch axes once per step (XLA moves it out of the accumulation loop: seen in a
  compiled v5p step), and with FSDP the parameter all-gathers of every micro-batch's forward and backward, at the
  chip's bidirectional ICI bandwidth, counted as not overlapped with compute (XLA overlaps some of it).
  Optimizer-state sharding costs nothing here: its reduce-scatter plus all-gather move what the all-reduce moves.
  Tensor-parallel activation collectives are not counted.
Kernel efficiency and the smaller matmuls of a micro-batch are not modelled, so fixes that tie here still differ;
compile-check breaks ties by its order of candidates, the ones that change least first.
"""

from hybrid_jax.models import flops as flops_lib


def collective_bytes(param_bytes: float, mesh_shape: dict, accum: int) -> dict:
  """Bytes each chip sends per step (and receives as many) for the parameters' collectives, by kind.

  `param_bytes`: all parameters' bytes (the gradients have the same dtype); `mesh_shape`: {'data', 'fsdp',
  'tensor'} sizes. The gradient is reduce-scattered over 'fsdp' and all-reduced over 'data' ((n - 1) / n and
  2 (n - 1) / n of the bytes per chip); FSDP gathers every weight for each micro-batch's forward and again for its
  backward. Tensor parallelism splits every weight 'tensor' ways.
  """
  d, f, t = (int(mesh_shape[a]) for a in ('data', 'fsdp', 'tensor'))
  local = param_bytes / t
  return {'gradient_reduction': (f - 1) / f * local + 2 * (d - 1) / d * local / f,
          'fsdp_gathers': int(accum) * 2 * (f - 1) / f * local}


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
  sent = collective_bytes(param_bytes, mesh_shape, accum)
  collective_s = 2 * sum(sent.values()) / chip.ici_bytes_per_s if chip.ici_bytes_per_s else 0.0
  step_s = max(compute_s, memory_s) + collective_s
  ici = (f'{chip.ici_bytes_per_s / 1e9:g} GB/s ICI' if chip.ici_bytes_per_s else 'ICI unknown: collectives not priced')
  return {'step_s': step_s, 'bound': 'compute' if compute_s >= memory_s else 'memory',
          'tokens_per_s': int(config.train.batch_size) * seq_len / step_s, 'compute_s': compute_s,
          'memory_s': memory_s, 'collective_s': collective_s, 'model_flops_per_chip': model_flops,
          'recomputed_flops_per_chip': recomputed, 'collective_bytes_per_chip': sent,
          'basis': f'roofline: {chip.peak_bf16_tflops:g} TFLOP/s, {chip.hbm_bytes_per_s / 1e9:g} GB/s HBM, {ici} '
                   f'({chip.source})'}
