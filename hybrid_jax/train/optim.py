"""AdamW with warmup-stable-decay or cosine schedules, global-norm clipping, and decay only on matrices."""

import jax
import optax


def make_schedule(t) -> optax.Schedule:
  """Learning rate per step. 'wsd' = linear warmup, constant, then a linear decay over the last decay_fraction."""
  peak, final = t.lr, t.lr * t.min_lr_ratio
  warmup = int(t.warmup_steps)
  if t.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, t.steps, end_value=final)
  ramp = optax.linear_schedule(0.0, peak, warmup) if warmup else optax.constant_schedule(peak)
  if t.schedule == 'constant':
    return optax.join_schedules([ramp, optax.constant_schedule(peak)], [warmup])
  if t.schedule == 'wsd':
    decay_steps = int(round(t.steps * t.decay_fraction))
    stable_end = max(warmup, t.steps - decay_steps)
    return optax.join_schedules(
        [ramp, optax.constant_schedule(peak), optax.linear_schedule(peak, final, max(decay_steps, 1))],
        [warmup, stable_end])
  raise ValueError(f'unknown schedule {t.schedule!r}')


# Never decayed, by name: recurrent decay rates, time steps and skips, and the mixers' output-norm scales (which
# may be stored per head as matrices).
NO_DECAY = ('A_log', 'dt_bias', 'D', 'norm')


def decay_mask(params):
  """Weight decay on matrices and embeddings (ndim >= 2), never on norm scales or other vectors.

  Scanned stacks (under 'cycles') carry a leading layers axis, which does not make a vector a matrix.
  """
  def decays(path, p):
    keys = [getattr(k, 'key', getattr(k, 'idx', k)) for k in path]
    matrix_dims = p.ndim - (1 if 'cycles' in keys else 0)
    return matrix_dims >= 2 and keys[-1] not in NO_DECAY
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(t) -> optax.GradientTransformation:
  adamw = optax.adamw(make_schedule(t), b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay, mask=decay_mask)
  if t.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(t.grad_clip), adamw)
  return adamw
