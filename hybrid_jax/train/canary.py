"""A numerics canary: the configured kernels checked against the 'xla' ones on the run's own hardware and batches.

Kernel tests run on chosen shapes and random inputs; a defect that shows only on one chip, one compiler version or
the activations of a trained model would go unseen, and training would go on with wrong gradients. So every
train.numerics_canary_every steps (and at step 1) the canary takes the first train.numerics_canary_rows rows and
train.numerics_canary_tokens tokens of the step's batch, runs the model up to the first layer of each mixer kind
and reruns that layer's mixer twice on the same input: as training runs it (model.attention_implementation,
model.recurrent_implementation, model.dtype) and with the 'xla' kernels in float32 at the highest matmul precision.
The relative gap |a - b| / |b| of each layer goes to metrics.jsonl and TensorBoard as canary/layer<i>_<kind>_gap;
a gap above the tolerance of model.dtype (or not finite) logs one warning per layer, the first time.

The check is one small jitted function, compiled once: its forward pass stops at the deepest layer checked.
"""

import logging

import jax
import jax.numpy as jnp

from hybrid_jax.inspection import forward
from hybrid_jax.kernels import platform
from hybrid_jax.models import documents
from hybrid_jax.models.mixers import registry
from hybrid_jax.train import hooks, state as state_lib

# train.numerics_canary_every='auto' by platform: on CPU the automatic kernels are the 'xla' ones the canary
# compares with; on GPU and TPU Pallas and cuDNN kernels run, and one check costs little (base.py says why 500).
AUTO_EVERY = {'cpu': 0, 'gpu': 500, 'tpu': 500}


def every(train_cfg, where) -> int:
  """Steps between checks (0: off) of train.numerics_canary_every (validated), 'auto' resolved for `where`: a
  platform name or a mesh (hybrid_jax.kernels.platform.platform_of)."""
  value = train_cfg.numerics_canary_every
  return AUTO_EVERY[platform.platform_of(where)] if value == 'auto' else int(value)


def tolerance_key(config, where='cpu') -> str:
  """The train.* key of the largest gap that is not a defect on `where` (a platform name or a mesh): float32's
  where float32 dots are float32, else the half precisions' (bfloat16, float16; and float32 on GPU and TPU, whose
  dots at the default precision round their operands to TF32 or bfloat16 unless jax_default_matmul_precision asks
  for float32)."""
  full = (platform.platform_of(where) == 'cpu' or
          jax.config.jax_default_matmul_precision in ('highest', 'float32'))
  exact = config.model.dtype == 'float32' and full
  return 'numerics_canary_tolerance_' + ('float32' if exact else 'bfloat16')


def tolerance(config, where='cpu') -> float:
  return float(config.train[tolerance_key(config, where)])


def checked_layers(model_cfg) -> list[forward.Layer]:
  """The first layer of each mixer kind that mixes positions (kernels run there; a pointwise MLP layer has none)."""
  first = {}
  for layer in forward.layers(model_cfg):
    if layer.role != 'pointwise':
      first.setdefault(layer.kind, layer)
  return sorted(first.values(), key=lambda layer: layer.index)


def metric_name(layer: forward.Layer) -> str:
  return f'layer{layer.index}_{layer.kind}_gap'


def implementation_key(model_cfg, kind: str) -> str:
  """The config key and value that pick the kernels of a layer of `kind`, for messages."""
  key = 'attention_implementation' if registry.get(kind).attention else 'recurrent_implementation'
  return f'model.{key}={model_cfg[key]!r}'


def reference_config(model_cfg):
  """The model config of the reference: the same parameters, computed in float32 by the 'xla' kernels."""
  cfg = model_cfg.copy_and_resolve_references()
  cfg.attention_implementation = cfg.recurrent_implementation = 'xla'
  cfg.dtype = 'float32'
  return cfg


def relative_gap(a, b):
  """|a - b| / |b| over all elements, in float32 (0 / 0 counts as 0)."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return jnp.sqrt(jnp.sum(jnp.square(a - b))) / jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(b))),
                                                            jnp.finfo(jnp.float32).tiny)


def make_check(model_cfg, model_def, shardings, rows: int, tokens: int):
  """Jitted (params, inputs [B, T], segment_ids [B, T] or None) -> {metric name: gap} over the first `rows` rows
  and `tokens` tokens, each gap replicated on every device."""
  layers = checked_layers(model_cfg)
  deepest = max(layer.index for layer in layers)
  checked = {layer.index: metric_name(layer) for layer in layers}
  reference_def = state_lib.make_model_def(reference_config(model_cfg))

  def check(params, inputs, segment_ids):
    tokens_ = inputs[:rows, :tokens]
    segment_ids = None if segment_ids is None else segment_ids[:rows, :tokens]
    # Kernels chosen for the mesh's platform; rows whole on each device (a few rows need not split evenly).
    with platform.targeting(shardings.mesh):
      model, reference = model_def.bind(params), reference_def.bind(params)
      positions, segment_ids = documents.resolve(tokens_, None, segment_ids)
      x = forward.embed(model, tokens_).astype(model.dtype)
      gaps = {}
      for index, block, reference_block in zip(range(deepest + 1), forward.blocks(model), forward.blocks(reference)):
        h = block.mixer_input(x)
        y = block.mixer(h, positions, segment_ids)
        if index in checked:
          with jax.default_matmul_precision('highest'):
            expected = reference_block.mixer(h.astype(jnp.float32), positions, segment_ids)
          gaps[checked[index]] = relative_gap(y, expected)
        x = block.mlp_branch(block.add(x, block.mixer_output(y)))
    return gaps

  return jax.jit(check, out_shardings=shardings.replicated)


class NumericsCanary(hooks.Hook):
  """Logs each checked layer's gap as canary/<name> at the steps it is due; warns once per layer above tolerance."""

  def __init__(self, context: hooks.LoopContext):
    self.context, config = context, context.config
    self.layers = checked_layers(config.model)
    t = config.train
    self.rows = min(int(t.numerics_canary_rows), int(t.batch_size))
    self.tokens = min(int(t.numerics_canary_tokens) or config.data.seq_len, config.data.seq_len)
    self.tolerance_key = tolerance_key(config, context.mesh)
    self.tolerance = float(t[self.tolerance_key])
    self.check = make_check(config.model, context.model_def, context.shardings, self.rows, self.tokens)
    self.warned = set()  # Layer indices already warned about.

  def after_step(self, step, state, batch):
    gaps = {name: float(gap) for name, gap in
            self.check(state['params'], batch['inputs'], batch.get('segment_ids')).items()}
    self.context.write(step, gaps, 'canary')
    for layer in self.layers:
      gap = gaps[metric_name(layer)]
      if gap <= self.tolerance or layer.index in self.warned:
        continue
      self.warned.add(layer.index)
      if self.context.lead:
        model = self.context.config.model
        logging.warning(
            'numerics canary: layer %d (%s) with %s in %s differs from the float32 xla kernels by %.3g at step %d '
            '(tolerance %g, train.%s): a kernel may be computing something wrong on this hardware', layer.index,
            layer.kind, implementation_key(model, layer.kind), model.dtype, gap, step, self.tolerance,
            self.tolerance_key)
