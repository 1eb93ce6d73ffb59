"""Pure train and eval steps: `train_step(state, batch) -> (state, metrics)`.

Losses, log-partition terms and per-position statistics are float32 regardless of the compute dtype.

A batch is {'inputs', 'targets'} int32 [B, T], and with packed documents (data.packing='documents') also
'segment_ids', 'positions' and 'target_segment_ids' [B, T]: the model then keeps the documents apart, and the loss
counts a target only inside its input token's document (`target_weights`), so the EOS closing a document is not
asked to predict the next document's first token, and padding (segment 0) counts nowhere.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hybrid_jax.kernels import platform
from hybrid_jax.parallel import activations
from hybrid_jax.train import cpu_dots


def token_nll(logits, targets):
  """(-log p(target), log Z) per token, in float32."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return log_z - target_logit, log_z


def target_weights(batch):
  """float32 [B, T]: which targets count toward the loss of a batch with documents; None for a batch without
  (every target counts). Works on NumPy and JAX arrays alike."""
  if 'segment_ids' not in batch:
    return None
  seg = batch['segment_ids']
  target_seg = batch.get('target_segment_ids', seg)
  return ((seg == target_seg) & (seg != 0)).astype(jnp.float32)


def _head_and_loss(model, h, targets):
  logits = model.logits(h)
  with jax.named_scope('loss'):
    return token_nll(logits, targets)


def _over_chunks(fn, h, per_token, chunk: int):
  """fn(h [B, C', d], *per_token [B, C']) for every chunk under remat, its outputs stacked on a leading chunk axis,
  and the inverse of the split for per-token outputs [n, B, C'] -> [B, T].

  A chunk is C positions of each sequence shard (C' = C x the shards; one shard without context parallelism), so
  no token leaves its device. Each shard's last chunk is padded with zeros (callers slice the padding off, or
  weight it 0)."""
  batch, length = per_token[0].shape
  ways = activations.sequence_ways(length)
  local = length // ways
  n = -(-local // chunk)

  def split(x):
    x = x.reshape(batch, ways, local, *x.shape[2:])
    x = jnp.pad(x, [(0, 0), (0, 0), (0, n * chunk - local)] + [(0, 0)] * (x.ndim - 3))
    x = jnp.moveaxis(x.reshape(batch, ways, n, chunk, *x.shape[3:]), 2, 0)
    return x.reshape(n, batch, ways * chunk, *x.shape[4:])

  def unsplit(y):
    y = jnp.moveaxis(y.reshape(n, batch, ways, chunk), 0, 2).reshape(batch, ways, n * chunk)
    return y[:, :, :local].reshape(batch, length)

  return jax.lax.map(jax.checkpoint(lambda args: fn(*args)), (split(h), *map(split, per_token))), unsplit


def sequence_nll(model, tokens, targets, chunk: int = 0, *, positions=None, segment_ids=None):
  """(-log p(target), log Z) per token [B, T], in float32, for int tokens and targets [B, T] (documents as
  `model(tokens, positions, segment_ids)`).

  With 0 < chunk < T the LM head and the loss run over `chunk` positions at a time under remat, so the
  [B, T, vocab] logits never exist at once (at 8 x 16K tokens x 73K vocab they are 19 GB in bf16, 38 GB in
  float32); the backward pass recomputes each chunk's logits, one extra LM-head matmul. T need not be a multiple
  of `chunk` (the last chunk is padded, and the padding sliced off).
  """
  return _nll_of_hidden(model, model.hidden_states(tokens, positions, segment_ids), targets, chunk)


def _nll_of_hidden(model, h, targets, chunk: int):
  """`sequence_nll` from the final hidden states h [B, T, d]."""
  batch, length = targets.shape
  if not chunk or chunk >= length:
    return _head_and_loss(model, h, targets)
  (nll, log_z), unsplit = _over_chunks(functools.partial(_head_and_loss, model), h, (targets,), chunk)
  return unsplit(nll), unsplit(log_z)


def weighted_loss_sums(model, tokens, targets, weights, chunk: int = 0, *, positions=None, segment_ids=None):
  """(sum of w * -log p(target), sum of w * (log Z)^2) in float32 over a batch, weights [B, T] as `target_weights`.

  Chunked like `sequence_nll`, but each chunk is weighted and summed inside its remat, so only two numbers leave
  it: a weighted sum taken outside keeps one chunk's float32 logits live beside the layers' saved activations
  (measured on S1 at 16K on v5p: about a quarter more peak memory).
  """
  return _weighted_sums_of_hidden(model, model.hidden_states(tokens, positions, segment_ids), targets, weights,
                                  chunk)


def _weighted_sums_of_hidden(model, h, targets, weights, chunk: int):
  """`weighted_loss_sums` from the final hidden states h [B, T, d]."""
  def sums(h, targets, weights):
    nll, log_z = _head_and_loss(model, h, targets)
    return jnp.sum(nll * weights), jnp.sum(jnp.square(log_z) * weights)

  if not chunk or chunk >= targets.shape[1]:
    return sums(h, targets, weights)
  (nll, z), _ = _over_chunks(sums, h, (targets, weights), chunk)
  return jnp.sum(nll), jnp.sum(z)


@contextlib.contextmanager
def _tracing_for(shardings):
  """While a sharded step is traced: activation layouts by the rules, kernels chosen for the mesh's platform (it
  may be a TPU topology compiled from a CPU host) and run per shard. Nothing for an unsharded step."""
  if shardings is None:
    yield
    return
  layouts = activations.sharded(shardings.mesh, shardings.rules) if shardings.rules else contextlib.nullcontext()
  with platform.targeting(shardings.mesh), layouts:
    yield


def router_penalty(model, stats):
  """The MoE layers' auxiliary terms added to the training loss: model.moe.aux_loss_coef times the summed
  load-balancing losses plus model.moe.z_loss_coef times the summed router z-losses (0 without MoE layers)."""
  by_layer = model.stats_by_layer(stats)
  if not by_layer:
    return 0.0
  moe_cfg = model.cfg.moe
  aux = sum(layer['aux_loss'] for layer in by_layer.values())
  z = sum(layer['z_loss'] for layer in by_layer.values())
  return float(moe_cfg.aux_loss_coef) * aux + float(moe_cfg.z_loss_coef) * z


def router_metrics(model, stats) -> dict:
  """The MoE layers' statistics as metrics: 'moe_aux_loss' and 'moe_z_loss' (summed over layers, before their
  coefficients) and 'moe/layer{i}/{name}' per layer ('load' a vector: per-expert fractions)."""
  by_layer = model.stats_by_layer(stats)
  if not by_layer:
    return {}
  out = {'moe_aux_loss': sum(s['aux_loss'] for s in by_layer.values()),
         'moe_z_loss': sum(s['z_loss'] for s in by_layer.values())}
  for index, layer in by_layer.items():
    out.update({f'moe/layer{index}/{name}': value for name, value in layer.items()})
  return out


def make_train_step(model_def, tx, train_cfg, shardings=None):
  """The jitted train step (state donated). Gradient accumulation scans over micro-batches.

  With MoE layers the loss also carries their router penalty (`router_penalty`), the metrics their statistics
  (averaged over micro-batches), and with model.moe.bias_rate the sigmoid routers' selection biases move after the
  optimizer update (auxiliary-loss-free balancing).

  With `shardings` (hybrid_jax.parallel.mesh.TrainShardings) state, batch and metrics get explicit layouts, and
  GSPMD inserts the collectives (data parallel, FSDP gathers, tensor-parallel reductions).
  """
  accum, z_weight = int(train_cfg.grad_accum), float(train_cfg.z_loss)
  loss_chunk = int(train_cfg.loss_chunk)

  def loss_fn(params, batch, counted):
    """(loss + z-loss + router penalty, (loss, router statistics)) of a (micro-)batch: the mean over its
    targets, or with documents the sum over the counted targets divided by `counted`, the whole batch's count (so
    micro-batches add up to the batch's mean; the router penalty, a mean per micro-batch, is then divided by the
    micro-batches)."""
    model = model_def.bind(params)
    weights = target_weights(batch)
    with _tracing_for(shardings):
      if weights is None:
        h, stats = model.hidden_states_with_stats(batch['inputs'])
        nll, log_z = _nll_of_hidden(model, h, batch['targets'], loss_chunk)
      else:
        h, stats = model.hidden_states_with_stats(batch['inputs'], batch.get('positions'), batch['segment_ids'])
        nll_sum, z_sum = _weighted_sums_of_hidden(model, h, batch['targets'], weights, loss_chunk)
    penalty = router_penalty(model, stats)
    if weights is None:
      loss = jnp.mean(nll)
      total = loss + z_weight * jnp.mean(jnp.square(log_z)) if z_weight else loss
      return total + penalty, (loss, stats)
    loss = nll_sum / counted
    total = loss + z_weight * z_sum / counted if z_weight else loss
    return total + penalty / accum, (loss, stats)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state, batch):
    params = state['params']
    weights = target_weights(batch)
    counted = None if weights is None else jnp.maximum(jnp.sum(weights), 1.0)
    if accum == 1:
      (_, (loss, stats)), grads = grad_fn(params, batch, counted)
    else:
      micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

      def body(carry, mb):
        (_, (loss, stats)), grads = grad_fn(params, mb, counted)
        return jax.tree.map(jnp.add, carry, (loss, grads)), stats

      zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
      (loss, grads), stats = jax.lax.scan(body, zeros, micro)
      stats = jax.tree.map(lambda x: jnp.mean(x, axis=0), stats)
      if weights is None:  # Means of equal micro-batches; with documents the parts already sum to the mean.
        loss, grads = jax.tree.map(lambda x: x / accum, (loss, grads))
    with jax.named_scope('optimizer'):
      updates, opt_state = tx.update(grads, state['opt_state'], params)
      new_params = optax.apply_updates(params, updates)
    model = model_def.bind(params)
    bias_rate = float(model.cfg.moe.bias_rate) if 'moe' in model.cfg else 0.0
    if bias_rate and router_metrics(model, stats):
      moved = model_def.bind(new_params)
      moved.update_router_biases(stats, bias_rate)
      new_params = nnx.to_pure_dict(nnx.state(moved))
    new_state = {'step': state['step'] + 1, 'params': new_params, 'opt_state': opt_state}
    with jax.named_scope('metrics'):
      metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads), 'param_norm': optax.global_norm(params),
                 **router_metrics(model, stats)}
    return new_state, metrics

  if shardings is None:
    return jax.jit(train_step, donate_argnums=0, compiler_options=cpu_dots.compiler_options(jax.devices()[:1]))
  return jax.jit(train_step, donate_argnums=0, in_shardings=(shardings.state, shardings.batch),
                 out_shardings=(shardings.state, shardings.replicated),
                 compiler_options=cpu_dots.compiler_options(shardings.mesh.devices.flat))


def make_eval_step(model_def, shardings=None, loss_chunk: int = 0):
  """Jitted (params, batch) -> per-token NLL [B, T] in float32 (per sequence, for standard errors across documents).

  `loss_chunk` as in `sequence_nll` (long contexts: the logits of a whole batch need not fit). A batch with
  documents runs them apart; which of its targets count is `target_weights(batch)`.
  """

  def eval_step(params, batch):
    with _tracing_for(shardings):
      nll, _ = sequence_nll(model_def.bind(params), batch['inputs'], batch['targets'], loss_chunk,
                            positions=batch.get('positions'), segment_ids=batch.get('segment_ids'))
    return nll

  if shardings is None:
    return jax.jit(eval_step)
  return jax.jit(eval_step, in_shardings=(shardings.state['params'], shardings.batch),
                 out_shardings=shardings.replicated)


BATCH_KEYS = {'concat': ('inputs', 'targets'),
              'documents': ('inputs', 'targets', 'segment_ids', 'positions', 'target_segment_ids')}


def compile_train_step(model_def, tx, train_cfg, shardings, abstract_state, seq_len: int, packing: str = 'concat'):
  """Lowers and compiles the sharded train step for `shardings.mesh` from shapes only (nothing runs), for the
  batches of `packing` (data.packing).

  The mesh may be made of devices that are not attached (jax.experimental.topologies), so a pod's fit can be
  checked from a laptop.
  """
  row = jax.ShapeDtypeStruct((int(train_cfg.batch_size), int(seq_len)), jnp.int32, sharding=shardings.batch)
  step = make_train_step(model_def, tx, train_cfg, shardings)
  return step.lower(abstract_state, {key: row for key in BATCH_KEYS[packing]}).compile()

