"""Pieces shared by the recurrent mixers (Lightning, Mamba-2, Gated DeltaNet).

Gates, norms and decay rates are computed in float32 whatever the compute dtype, because the scans exponentiate
and accumulate them over the whole sequence.
"""

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax import kernels
from hybrid_jax.models import layers
from hybrid_jax.models.layers import checkpoint_name, dtype_of
from hybrid_jax.parallel import activations, sequence


def implementation(cfg):
  """The kernels' `implementation` argument from model.recurrent_implementation ('auto' -> None)."""
  impl = cfg.recurrent_implementation
  return None if impl == 'auto' else impl


def project_in(x, ws, dtype):
  """The input projections x [..., d] @ w for each w of `ws` ([d, heads, dim] or [d, n]): a tuple, computed together
  (layers.heads_projections: on CPU one transposed x for every weight gradient), each kept by remat policy
  'minimal' in its flat form."""
  return layers.heads_projections(x, tuple(w[...] for w in ws), dtype, (layers.MIXER_IN,) * len(ws))


def named_out(y):
  """The output projection's output, named so that remat policy 'minimal' keeps it."""
  return checkpoint_name(y, layers.MIXER_OUT)


def l2_normalize(x, eps=1e-6):
  """Unit-norm vectors over the last axis (the delta rule needs |k| = 1 to stay bounded)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.sum(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def conv_param(rngs: nnx.Rngs, width: int, shape, axes, *, dtype) -> nnx.Param:
  """A depthwise causal-conv kernel [width, *shape]; std 1/sqrt(width) keeps the activation scale."""
  init = jax.random.normal(rngs.params(), (width, *shape), dtype) / math.sqrt(width)
  return nnx.Param(init, logical_axes=(None, *axes))  # The tap axis is never sharded.


def causal_conv_silu(x, weight, dtype, state=None, bias=None, segment_ids=None):
  """(SiLU(causal depthwise conv of x [B, T, *C] + bias), conv state [B, W-1, prod(C)]) with weight [W, *C] and
  bias [prod(C)] (None = none).

  `state` carries the last W-1 inputs between calls (None = zeros); one token with a state is a decode step.
  `segment_ids` [B, T]: no tap reads across a document boundary.
  """
  b, t = x.shape[:2]
  flat = x.reshape(b, t, -1).astype(dtype)
  w = weight.reshape(weight.shape[0], -1).astype(dtype)
  if state is not None and t == 1:
    y, state = kernels.causal_conv1d_step(state, flat[:, 0], w)
    y = y[:, None]
  elif state is not None:  # A prompt continuing a decode state: whole rows.
    y, state = kernels.causal_conv1d(flat, w, initial_state=state, segment_ids=segment_ids)
  else:  # Training and scoring: over a split sequence, with the halo the taps need.
    # The taps run in float32 whatever w's dtype (so float32 w computes the same), and the gradient of a weight
    # shared by the shards is summed across them in float32 (XLA's CPU all-reduce fails on bfloat16 there).
    w32 = w.astype(jnp.float32)

    def conv(x, ids, *, shards):
      run = lambda x, before, ids: kernels.causal_conv1d(x, w32, initial_state=before, segment_ids=ids)
      return run(x, None, ids) if shards is None else sequence.causal_conv(run, x, ids, width=w.shape[0],
                                                                          shards=shards)

    y, state = activations.sequence_local(conv, (flat, segment_ids), (3, -3))
  if bias is not None:
    y = y + bias.astype(y.dtype)
  return jax.nn.silu(y).reshape(x.shape), state


def scan(q, k, v, log_decay, beta=None, *, scale=None, state=None, segment_ids=None, chunk_size, implementation):
  """(o, final state) of the scalar-decay scan, or of the gated delta rule when `beta` is given.

  Over T tokens it runs the chunked kernel from `state` (None = zeros), restarting from zero at each document
  start of `segment_ids` [B, T]; one token with a state is an exact decode step through the kernels' `*_step`
  functions.
  """
  if state is not None and q.shape[1] == 1:
    g = log_decay if log_decay.ndim == 1 else log_decay[:, 0]
    if beta is None:
      o, state = kernels.linear_scan_step(state, q[:, 0], k[:, 0], v[:, 0], g, scale=scale)
    else:
      o, state = kernels.gated_delta_rule_step(state, q[:, 0], k[:, 0], v[:, 0], g, beta[:, 0], scale=scale)
    return o[:, None], state
  per_token = lambda x: ('batch', 'seq', 'heads') if x.ndim == 3 else ('heads',)
  args = (q, k, v, log_decay, beta, state, segment_ids)
  axes = (_SEQ_AXES, _SEQ_AXES, _SEQ_AXES, per_token(log_decay), beta is not None and per_token(beta), _STATE_AXES,
          _SEGMENT_AXES)

  def kernel(q, k, v, log_decay, beta, state, segment_ids):
    if beta is None:
      return kernels.linear_scan(q, k, v, log_decay, scale=scale, initial_state=state, chunk_size=chunk_size,
                                 segment_ids=segment_ids, implementation=implementation)
    return kernels.gated_delta_rule(q, k, v, log_decay, beta, scale=scale, initial_state=state,
                                    chunk_size=chunk_size, segment_ids=segment_ids, implementation=implementation)

  def local(q, k, v, log_decay, beta, state, segment_ids, *, shards):
    if shards is None:
      return kernel(q, k, v, log_decay, beta, state, segment_ids)
    return sequence.scan(kernel, q, k, v, log_decay, beta, scale=scale, initial_state=state,
                         segment_ids=segment_ids, shards=shards)

  # Per shard of batch and heads when a sharded step is traced (key and value heads split alike or not at all), and
  # of the sequence with the state carried across its shards (the final state is the whole row's on every shard).
  return activations.shard_local(local, args, axes, (_SEQ_AXES, _STATE_AXES), tied=('heads',))


_SEQ_AXES = ('batch', 'seq', 'heads', None)  # q, k [B, T, Hk, K] and v, o [B, T, Hv, V].
_STATE_AXES = ('batch', 'heads', None, None)
_SEGMENT_AXES = ('batch', 'seq')


class DecodeMixin:
  """Decode protocol shared with attention (init_state / prefill / step): a recurrent layer's prefill and step are
  both its forward pass carrying state, `_forward(x, state, segment_ids=None) -> (y, state)`."""

  def _configure(self, cfg):
    """Settings every recurrent layer reads: norm epsilon, scan chunk size and kernel, compute dtype."""
    self.eps = cfg.norm_eps
    self.chunk_size = cfg.recurrent_chunk_size
    self.implementation = implementation(cfg)
    self.dtype = dtype_of(cfg.dtype)

  def prefill(self, x, positions, state):
    del positions
    return self._forward(x, state)

  def step(self, x, position, state):
    del position
    return self._forward(x, state)

  def __call__(self, x, positions, segment_ids=None):
    del positions  # Position enters only through the recurrence (and the short convs).
    return self._forward(x, None, segment_ids)[0]


def zeros_state(batch, heads, key_dim, value_dim):
  return jnp.zeros((batch, heads, key_dim, value_dim), jnp.float32)


def a_log_init(rngs: nnx.Rngs, heads: int, *, low: float, high: float, dtype) -> nnx.Param:
  """log(A) with A ~ U(low, high): per-head decay rates spread over an order of magnitude (Mamba-2 init)."""
  a = jax.random.uniform(rngs.params(), (heads,), jnp.float32, low, high)
  return nnx.Param(jnp.log(a).astype(dtype), logical_axes=('heads',))


def dt_bias_init(rngs: nnx.Rngs, heads: int, *, dt_min=1e-3, dt_max=1e-1, dtype) -> nnx.Param:
  """Inverse softplus of dt ~ log-uniform[dt_min, dt_max], so softplus(dt_bias) starts in that range."""
  u = jax.random.uniform(rngs.params(), (heads,), jnp.float32)
  dt = jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
  return nnx.Param((dt + jnp.log(-jnp.expm1(-dt))).astype(dtype), logical_axes=('heads',))
