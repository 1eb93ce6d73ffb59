"""Pure train and eval steps: `train_step(state, batch) -> (state, metrics)`.

Losses, log-partition terms and per-position statistics are float32 regardless of the compute dtype.
"""

import contextlib

import jax
import jax.numpy as jnp
import optax

from hybrid_jax.parallel import activations


def token_nll(logits, targets):
  """(-log p(target), log Z) per token, in float32."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  return log_z - target_logit, log_z


def _activation_layouts(shardings):
  """Activation sharding constraints while tracing a sharded step; nothing for an unsharded one."""
  if shardings is None or not shardings.rules:
    return contextlib.nullcontext()
  return activations.sharded(shardings.mesh, shardings.rules)


def make_train_step(model_def, tx, train_cfg, shardings=None):
  """The jitted train step (state donated). Gradient accumulation scans over micro-batches.

  With `shardings` (hybrid_jax.parallel.mesh.TrainShardings) state, batch and metrics get explicit layouts, and
  GSPMD inserts the collectives (data parallel, FSDP gathers, tensor-parallel reductions).
  """
  accum, z_weight = int(train_cfg.grad_accum), float(train_cfg.z_loss)

  def loss_fn(params, batch):
    with _activation_layouts(shardings):
      logits = model_def.bind(params)(batch['inputs'])
    nll, log_z = token_nll(logits, batch['targets'])
    loss = jnp.mean(nll)
    total = loss + z_weight * jnp.mean(jnp.square(log_z)) if z_weight else loss
    return total, loss

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state, batch):
    params = state['params']
    if accum == 1:
      (_, loss), grads = grad_fn(params, batch)
    else:
      micro = jax.tree.map(lambda x: x.reshape(accum, x.shape[0] // accum, *x.shape[1:]), batch)

      def body(carry, mb):
        (_, loss), grads = grad_fn(params, mb)
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

      zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
      (loss, grads), _ = jax.lax.scan(body, zeros, micro)
      loss, grads = jax.tree.map(lambda x: x / accum, (loss, grads))
    updates, opt_state = tx.update(grads, state['opt_state'], params)
    new_state = {'step': state['step'] + 1, 'params': optax.apply_updates(params, updates), 'opt_state': opt_state}
    metrics = {'loss': loss, 'grad_norm': optax.global_norm(grads), 'param_norm': optax.global_norm(params)}
    return new_state, metrics

  if shardings is None:
    return jax.jit(train_step, donate_argnums=0)
  return jax.jit(train_step, donate_argnums=0, in_shardings=(shardings.state, shardings.batch),
                 out_shardings=(shardings.state, shardings.replicated))


def make_eval_step(model_def, shardings=None):
  """Jitted (params, batch) -> per-position summed NLL [T] and token count per position [T]."""

  def eval_step(params, batch):
    with _activation_layouts(shardings):
      logits = model_def.bind(params)(batch['inputs'])
    nll, _ = token_nll(logits, batch['targets'])
    return jnp.sum(nll, axis=0), jnp.full((nll.shape[1],), nll.shape[0], jnp.float32)

  if shardings is None:
    return jax.jit(eval_step)
  return jax.jit(eval_step, in_shardings=(shardings.state['params'], shardings.batch),
                 out_shardings=shardings.replicated)


def compile_train_step(model_def, tx, train_cfg, shardings, abstract_state, seq_len: int):
  """Lowers and compiles the sharded train step for `shardings.mesh` from shapes only (nothing runs).

  The mesh may be made of devices that are not attached (jax.experimental.topologies), so a pod's fit can be
  checked from a laptop.
  """
  batch = jax.ShapeDtypeStruct((int(train_cfg.batch_size), int(seq_len)), jnp.int32, sharding=shardings.batch)
  step = make_train_step(model_def, tx, train_cfg, shardings)
  return step.lower(abstract_state, {'inputs': batch, 'targets': batch}).compile()

