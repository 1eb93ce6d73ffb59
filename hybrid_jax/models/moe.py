"""The mixture-of-experts MLP: a router picks k of E expert MLPs per token; optional shared experts see every token.

Why it looks as it does:
- Expert weights are stacked [E, ...] under the logical axis 'expert', so the `expert` mesh axis splits them
  (expert parallelism, hybrid_jax.parallel.experts), and the routing (hybrid_jax.models.moe_routing) is apart from
  the experts' computation, so the tokens can move between the two: each device routes its own tokens, and computes
  its own experts for its expert group's.
- Dropless by default: every (token, expert) assignment is computed. The N * k assignments are sorted by expert,
  the group sizes counted, and each expert matmul is one `jax.lax.ragged_dot` over the sorted rows
  (implementation 'ragged_dot'), or megablox's Pallas grouped matmul ('gmm', hybrid_jax.kernels.grouped_matmul: the
  same product, TPU only, interpreted on CPU; 'auto' picks it on TPU); 'dense' runs every expert on every token and
  weights the outputs (the reference the tests compare against, E / k times the work). On CPU, jax lowers ragged_dot
  to a masked dense product, so both do every expert's work there.
- With `dropless` off each expert takes at most ceil(capacity_factor * N * k / E) assignments, earlier tokens
  first; the rest are dropped (their weight is zero; the shared experts and the residual still carry the token)
  and counted.

`MoE.with_stats(x)` returns the output and the router's statistics (moe_routing.statistics: the balance and z
losses the train step adds, load fractions, their coefficient of variation, router entropy, dropped count).
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from hybrid_jax.kernels import grouped_matmul, platform
from hybrid_jax.models import layers, moe_routing
from hybrid_jax.models.layers import dtype_of, param
from hybrid_jax.parallel import experts as experts_lib

IMPLEMENTATIONS = ('auto', 'ragged_dot', 'gmm', 'dense')
# 'auto' per platform: megablox's Pallas grouped matmul on TPU; XLA's ragged_dot on GPU (no Mosaic there) and CPU
# (where 'gmm' would run interpreted).
_AUTO = {'cpu': 'ragged_dot', 'gpu': 'ragged_dot', 'tpu': 'gmm'}
# The grouped dispatch's matmul per implementation: (rows [m, k] sorted by expert, w [E, k, n], sizes [E]) -> [m, n].
_GROUPED = {'ragged_dot': jax.lax.ragged_dot, 'gmm': grouped_matmul.gmm}
# model.moe.activation -> weight matrices per expert (d_model x expert width each).
EXPERT_MLPS = {'swiglu': 3, 'relu2': 2, 'swiglu_oai': 3}
# Which blocks' MLPs are MoE (model.moe.blocks).
BLOCKS = ('none', 'all', 'every', 'cycle')
_TOKEN_AXES = ('batch', 'seq')  # Logical axes of the token dimensions of an MoE's input [B, T, d].
LAYER_KIND = 'moe'  # The cycle kind of an MoE as a layer of its own (hybrid_jax.models.mixers.moe_layer).


def implementation(name: str) -> str:
  """The dispatch that model.moe.implementation names, 'auto' resolved for the kernel platform."""
  return _AUTO[platform.target()] if name == 'auto' else name


def expert_width(cfg) -> int:
  """Hidden width of one routed expert: model.moe.expert_d_ff, 0 = model.d_ff."""
  return int(cfg.moe.expert_d_ff) or int(cfg.d_ff)


def shared_width(cfg) -> int:
  """Hidden width of the shared experts together (one MLP of shared_experts x shared_d_ff; 0 = the expert width)."""
  return int(cfg.moe.shared_experts) * (int(cfg.moe.shared_d_ff) or expert_width(cfg))


def is_moe_block(cfg, index: int) -> bool:
  """Whether block `index`'s MLP is an MoE (model.moe.blocks: 'all', every `every`-th block counting from 1, or the
  cycle positions `cycle_positions`)."""
  moe = cfg.moe
  if not cfg.block_mlp or moe.blocks == 'none':
    return False
  if moe.blocks == 'all':
    return True
  if moe.blocks == 'every':
    return (index + 1) % int(moe.every) == 0
  return index % len(tuple(cfg.cycle)) in tuple(moe.cycle_positions)


def layer_count(cfg) -> int:
  """How many layers have an MoE: block MLPs (model.moe.blocks) and 'moe' layers of model.cycle."""
  if 'moe' not in cfg:  # A config from before the section existed.
    return 0
  cycle = tuple(cfg.cycle)
  return sum(is_moe_block(cfg, i) or cycle[i % len(cycle)] == LAYER_KIND for i in range(cfg.num_layers))


def _activate(kind: str, gate, up, limit: float, alpha: float):
  """The expert MLP's hidden activation from its gate and up projections (gate unused by 'relu2')."""
  if kind == 'swiglu':
    return jax.nn.silu(gate) * up
  if kind == 'relu2':
    return jnp.square(jax.nn.relu(up))
  # gpt-oss: gate clamped above, up clamped both ways, (up + 1) * gate * sigmoid(alpha * gate).
  gate = jnp.minimum(gate, limit)
  up = jnp.clip(up, -limit, limit)
  return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


def capacity(cfg, tokens: int) -> int:
  """Assignments one expert takes at most without dropless: ceil(capacity_factor * tokens * k / E)."""
  moe = cfg.moe
  return math.ceil(float(moe.capacity_factor) * tokens * int(moe.top_k) / int(moe.num_experts))


def _within_capacity(flat_experts, num_experts: int, cap: int):
  """bool [A]: which assignments (flattened token-major: token n's j-th expert at n * k + j) fit their expert's
  capacity `cap`, earlier assignments first."""
  order = jnp.argsort(flat_experts, stable=True)
  sorted_experts = flat_experts[order]
  counts = jnp.zeros((num_experts,), jnp.int32).at[flat_experts].add(1)
  starts = jnp.cumsum(counts) - counts
  rank = jnp.arange(flat_experts.shape[0]) - starts[sorted_experts]
  return jnp.zeros(flat_experts.shape, bool).at[order].set(rank < cap)


class MoE(nnx.Module):
  """An MoE MLP d_model -> d_model by model.moe: router, E stacked experts, optional gated shared experts."""

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    moe = cfg.moe
    std, out_std = layers.init_stds(cfg)
    pdt, self.dtype = dtype_of(cfg.param_dtype), dtype_of(cfg.dtype)
    e, d, f = int(moe.num_experts), int(cfg.d_model), expert_width(cfg)
    self.num_experts, self.activation = e, str(moe.activation)
    self.routing = moe_routing.RouterConfig.of(moe)
    self.implementation = str(moe.implementation)
    self.capacity_factor = None if moe.dropless else float(moe.capacity_factor)
    self.limit, self.alpha = float(moe.swiglu_limit), float(moe.swiglu_alpha)
    self.router = param(rngs, (d, e), ('embed', 'expert'), std=std, dtype=pdt)
    # The selection bias of the sigmoid router: no gradient reaches it; the train step may move it (bias_rate).
    self.router_bias = (nnx.Param(jnp.zeros((e,), pdt), logical_axes=('expert',))
                        if moe.router == 'sigmoid' else None)
    # A learned bias on the router logits (gpt-oss), trained as any parameter.
    self.router_logit_bias = (nnx.Param(jnp.zeros((e,), pdt), logical_axes=('expert',))
                              if moe.get('router_logit_bias') else None)
    gated = self.activation != 'relu2'
    self.gate = param(rngs, (e, d, f), ('expert', 'embed', 'mlp'), std=std, dtype=pdt) if gated else None
    self.up = param(rngs, (e, d, f), ('expert', 'embed', 'mlp'), std=std, dtype=pdt)
    self.down = param(rngs, (e, f, d), ('expert', 'mlp', 'embed'), std=out_std, dtype=pdt)
    if self.activation == 'swiglu_oai':
      self.gate_bias = nnx.Param(jnp.zeros((e, f), pdt), logical_axes=('expert', 'mlp'))
      self.up_bias = nnx.Param(jnp.zeros((e, f), pdt), logical_axes=('expert', 'mlp'))
      self.down_bias = nnx.Param(jnp.zeros((e, d), pdt), logical_axes=('expert', 'embed'))
    else:
      self.gate_bias = self.up_bias = self.down_bias = None
    fs = shared_width(cfg)
    if fs:
      self.shared_gate_proj = param(rngs, (d, fs), ('embed', 'mlp'), std=std, dtype=pdt) if gated else None
      self.shared_up = param(rngs, (d, fs), ('embed', 'mlp'), std=std, dtype=pdt)
      self.shared_down = param(rngs, (fs, d), ('mlp', 'embed'), std=out_std, dtype=pdt)
    else:
      self.shared_gate_proj = self.shared_up = self.shared_down = None
    # Qwen's shared-expert gate: sigmoid(x . w) scales the shared output per token.
    self.shared_gate = (param(rngs, (d,), ('embed',), std=std, dtype=pdt) if fs and moe.shared_expert_gate
                        else None)

  def __call__(self, x):
    return self.with_stats(x)[0]

  def _route(self, x):
    """(router logits [N, E] float32, moe_routing.Routing of the N tokens of x [..., d_model])."""
    logits = x.astype(jnp.float32) @ self.router[...].astype(jnp.float32)
    if self.router_logit_bias is not None:
      logits = logits + self.router_logit_bias[...].astype(jnp.float32)
    bias = None if self.router_bias is None else self.router_bias[...]
    logits = logits.reshape(-1, self.num_experts)
    return logits, moe_routing.route(logits, self.routing, bias)

  def route(self, x) -> moe_routing.Routing:
    """The router's choice for the tokens of x [..., d_model], shaped like them: experts and weights [..., k],
    probs [..., E] (what the analyses read; the forward pass routes the same way)."""
    routing = self._route(x)[1]
    lead = x.shape[:-1]
    return moe_routing.Routing(*(a.reshape(*lead, a.shape[-1]) for a in (routing.experts, routing.weights,
                                                                          routing.probs)))

  def with_stats(self, x):
    """(output [..., d_model] in the compute dtype, the router statistics of this call)."""
    logits, routing = self._route(x)
    lead = x.shape[:-1]
    experts, weights = (a.reshape(*lead, a.shape[-1]) for a in (routing.experts, routing.weights))
    dt = self.dtype
    expert_weights = tuple(None if w is None else w[...].astype(dt) for w in
                           (self.gate, self.up, self.down, self.gate_bias, self.up_bias, self.down_bias))
    # Sorting tokens by expert is local to each device's tokens: a sort over the whole batch would gather every
    # token onto every device. The capacity, when there is one, is then per device, as in Switch Transformer. With
    # the experts split over the 'expert' mesh axis, each device computes its experts for its expert group's tokens.
    y, dropped = experts_lib.local(self._dispatch, (x.astype(dt), experts, weights), _TOKEN_AXES[:len(lead)],
                                   expert_weights, (1, 0))
    if self.shared_up is not None:
      y = y + self._shared(x.astype(dt))
    stats = moe_routing.statistics(logits, routing, self.num_experts, jnp.sum(dropped))
    return y.astype(dt), stats

  def _dispatch(self, x, experts, weights, *expert_weights, split):
    """(sum over each token's experts of weight x expert(x) [..., d] in float32, assignments dropped per token
    [...]) of this device's tokens; `split` (hybrid_jax.parallel.experts.Split): this device holds only some
    experts, and computes them for its expert group's tokens."""
    lead = x.shape[:-1]
    x, experts, weights = x.reshape(-1, x.shape[-1]), experts.reshape(-1, experts.shape[-1]), weights.reshape(
        -1, weights.shape[-1])
    n, k = experts.shape
    if self.capacity_factor is None:
      keep = jnp.ones((n, k), bool)
    else:  # Decided where the tokens are, so a split of the experts drops what one device would.
      keep = _within_capacity(experts.reshape(-1), self.num_experts,
                              math.ceil(self.capacity_factor * n * k / self.num_experts)).reshape(n, k)
    dropped = k - jnp.sum(keep, axis=-1)
    local = self.num_experts
    if split is not None:  # The group's assignments to this device's experts [first, first + local).
      local = expert_weights[1].shape[0]
      first = split.first(local)
      x, experts, weights, keep = (split.tokens(a) for a in (x, experts, weights, keep))
      keep = keep & (experts >= first) & (experts < first + local)
      experts = jnp.where(keep, experts - first, 0)
    weights = weights * keep
    expert = functools.partial(_expert_mlp, self.activation, self.limit, self.alpha, *expert_weights)
    impl = implementation(self.implementation)
    if impl == 'dense':
      y = _dense(expert, x, experts, weights, local)
    else:
      y = _grouped(expert, x, experts.reshape(-1), keep.reshape(-1), weights, local, _GROUPED[impl])
    if split is not None:
      y = split.outputs(y)
    return y.reshape(*lead, -1), dropped.reshape(lead).astype(jnp.float32)

  def _shared(self, x):
    """The shared experts (one MLP of their summed width) on every token, times the sigmoid gate if any."""
    dt = self.dtype
    gate = None if self.shared_gate_proj is None else x @ self.shared_gate_proj[...].astype(dt)
    up = x @ self.shared_up[...].astype(dt)
    if self.activation == 'swiglu_oai':  # No biases on the shared MLP: gpt-oss has none; plain SwiGLU there.
      hidden = jax.nn.silu(gate) * up
    else:
      hidden = _activate(self.activation, gate, up, self.limit, self.alpha)
    out = (hidden @ self.shared_down[...].astype(dt)).astype(jnp.float32)
    if self.shared_gate is not None:
      out = out * jax.nn.sigmoid(x.astype(jnp.float32) @ self.shared_gate[...].astype(jnp.float32))[..., None]
    return out


def _expert_mlp(activation, limit, alpha, gate_w, up_w, down_w, gate_b, up_b, down_b, matmul, bias):
  """The experts' MLP over rows, `matmul(rows, w [E, ...])` running each expert's matrix on its rows and
  `bias(b [E, n])` giving each row its expert's bias."""
  def run(rows):
    up = matmul(rows, up_w)
    gate = None if gate_w is None else matmul(rows, gate_w)
    if gate_b is not None:
      gate, up = gate + bias(gate_b), up + bias(up_b)
    up = checkpoint_name(up, layers.MLP_UP)
    gate = None if gate is None else checkpoint_name(gate, layers.MLP_GATE)
    out = matmul(_activate(activation, gate, up, limit, alpha), down_w)
    return out if down_b is None else out + bias(down_b)
  return run


def _grouped(expert, x, flat, keep, weights, num_experts: int, matmul=jax.lax.ragged_dot):
  """Dropless dispatch: assignments sorted by expert (dropped ones last, outside every group), one grouped `matmul`
  (ragged_dot's signature) per expert matrix, outputs put back in assignment order and summed with the routing
  weights."""
  n, k = weights.shape
  key = jnp.where(keep, flat, num_experts)
  order = jnp.argsort(key, stable=True)
  sizes = jnp.zeros((num_experts,), jnp.int32).at[flat].add(keep.astype(jnp.int32))
  rows = x[order // k]
  row_expert = jnp.minimum(key[order], num_experts - 1)
  out = expert(lambda a, w: matmul(a, w, sizes), lambda b: b[row_expert])(rows)
  out = jnp.zeros_like(out).at[order].set(out).reshape(n, k, -1)
  return jnp.einsum('nk,nkd->nd', weights, out.astype(jnp.float32))


def _dense(expert, x, experts, weights, num_experts: int):
  """Every expert on every token, outputs weighted by a [N, E] combine matrix: the reference dispatch."""
  def matmul(a, w):  # Tokens [N, d] into every expert, then each expert's hidden [E, N, f] through its own.
    return jnp.einsum('nd,edf->enf' if a.ndim == 2 else 'end,edf->enf', a, w)

  out = expert(matmul, lambda b: b[:, None])(x)
  combine = jnp.einsum('nk,nke->ne', weights, jax.nn.one_hot(experts, num_experts, dtype=jnp.float32))
  return jnp.einsum('ne,end->nd', combine, out.astype(jnp.float32))


def with_stats(module, *args):
  """(module(*args), its router statistics): an MoE's `with_stats`, {} for any other module."""
  if hasattr(type(module), 'with_stats'):
    return module.with_stats(*args)
  return module(*args), {}


def update_router_bias(module: MoE, stats: dict, rate: float) -> None:
  """Moves the sigmoid router's selection bias by moe_routing.bias_update with this step's loads (in place)."""
  if module.router_bias is not None and rate:
    module.router_bias.value = moe_routing.bias_update(module.router_bias[...], stats['load'], rate)


# ------------------------------------------------------------------------------------------- counts and FLOPs
def _per_expert(cfg) -> int:
  d, f = int(cfg.d_model), expert_width(cfg)
  return EXPERT_MLPS[str(cfg.moe.activation)] * d * f + (2 * f + d if cfg.moe.activation == 'swiglu_oai' else 0)


def routed_params(cfg) -> int:
  """Parameters of one MoE MLP's E routed experts: what the 'expert' mesh axis splits."""
  return int(cfg.moe.num_experts) * _per_expert(cfg)


def params(cfg) -> dict:
  """{'total', 'active'} parameters of one MoE MLP; active = what one token uses (router, k experts, shared)."""
  moe = cfg.moe
  e, k, d = int(moe.num_experts), int(moe.top_k), int(cfg.d_model)
  per_expert = _per_expert(cfg)
  fs = shared_width(cfg)
  shared = (2 if moe.activation == 'relu2' else 3) * d * fs + (d if fs and moe.shared_expert_gate else 0)
  router = d * e + (e if moe.router == 'sigmoid' else 0) + (e if moe.get('router_logit_bias') else 0)
  return {'total': router + e * per_expert + shared, 'active': router + k * per_expert + shared}


def forward_flops(cfg, tokens: int) -> dict:
  """Forward FLOPs of one MoE MLP over `tokens` tokens, counting what a token uses (its k experts, the router,
  the shared experts): {'total', 'input'} where 'input' leaves out the down projections (what remat recomputes)."""
  moe = cfg.moe
  e, k, d, f = int(moe.num_experts), int(moe.top_k), int(cfg.d_model), expert_width(cfg)
  mats = EXPERT_MLPS[str(moe.activation)]
  fs = shared_width(cfg)
  shared_mats = 2 if moe.activation == 'relu2' else 3
  gate = d if fs and moe.shared_expert_gate else 0
  total = 2 * tokens * (d * e + k * mats * d * f + shared_mats * d * fs + gate)
  down = 2 * tokens * (k * f * d + fs * d)
  return {'total': total, 'input': total - down}
