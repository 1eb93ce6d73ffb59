"""HybridLM: embeddings -> blocks -> final RMSNorm -> untied LM head.

Optional scalings for checkpoints trained with them (Granite, MiniCPM): embeddings times
`model.embedding_multiplier`, each residual branch times `model.residual_multiplier`, logits divided by
`model.logits_scaling`. At their default 1 they are skipped, so the plain block's program is unchanged.

The stack is `model.cycle` repeated. With `scan_layers=True` the repeats are one Cycle module whose parameters
carry a leading `layers` axis, applied with `jax.lax.scan`, so compile time does not grow with depth; leftover
layers (depth not a multiple of the cycle) run unscanned after it. Both layouts compute the same function.
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.models import documents, layers, moe, pattern
from hybrid_jax.models.layers import RMSNorm, dtype_of, param
from hybrid_jax.models.mixers import make_mixer, registry
from hybrid_jax.parallel import activations

# 'minimal' keeps the tensors named in models/layers.py, as MaxText's policy of that name does: q and k after RoPE
# (so the backward does not redo RoPE in float32), v, every mixer's input and output projections, the MLP's gate
# and up. Unlike 'save_dots' it drops q/k before RoPE and the MLP's down projection, which the backward never needs
# (the next block's input is kept by the layer scan).
MINIMAL_SAVED = (layers.QUERY, layers.KEY, layers.VALUE, layers.MIXER_IN, layers.MIXER_OUT, layers.MLP_GATE,
                 layers.MLP_UP)
# 'recompute_mlp' keeps what 'minimal' keeps but the MLP's gate and up, which are over half of a block's kept bytes
# (2 x d_ff against 4 x d_model at the study's scales): the backward runs those two matmuls again, the mixer's never.
# Between 'minimal' and 'full' in memory and in time; it fits S5's 32K steps on v6e that otherwise need 'full'.
MIXER_SAVED = tuple(name for name in MINIMAL_SAVED if name not in (layers.MLP_GATE, layers.MLP_UP))
_REMAT_POLICIES = {
    'full': jax.checkpoint_policies.nothing_saveable,
    'save_dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    'minimal': jax.checkpoint_policies.save_only_these_names(*MINIMAL_SAVED),
    'recompute_mlp': jax.checkpoint_policies.save_only_these_names(*MIXER_SAVED),
}


class Block(nnx.Module):
  """Pre-norm block: x + r * mixer(norm(x)), then x + r * mlp(norm(x)), r = model.residual_multiplier.

  With model.block_mlp False a block is its mixer alone (Nemotron-H's blocks); MLPs are then layers of their own
  (the 'mlp' kind of the cycle). With model.attention.post_norm an attention layer's block is post-norm:
  x + r * norm(mixer(x)), then x + r * norm(mlp(x)) (OLMo Hybrid's attention layers). A branch whose layer kind's
  section sets `normed_residual` (alpha, beta) (the mixer's kind; for the MLP, model.moe when it is an MoE) carries
  its normed input instead of x: alpha * norm(x) + beta * r * branch(norm(x)) (MiniMax's blocks).
  """

  def __init__(self, cfg, spec: pattern.LayerSpec, *, rngs: nnx.Rngs):
    pdt, dt = dtype_of(cfg.param_dtype), dtype_of(cfg.dtype)
    # Post-norm (OLMo Hybrid's attention blocks): the norms take the branch outputs, the mixer and MLP the stream.
    self.post_norm = bool(registry.get(spec.kind).attention and cfg.attention.post_norm)
    self.mixer_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pdt, dtype=dt)
    self.mixer = make_mixer(cfg, spec, rngs=rngs)
    if cfg.block_mlp:
      self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pdt, dtype=dt)
      self.mlp = moe.MoE(cfg, rngs=rngs) if spec.moe else layers.make_mlp(cfg, rngs=rngs)
    else:
      self.mlp_norm = self.mlp = None
    self.scope = spec.scope
    self.residual_multiplier = float(cfg.residual_multiplier)
    section = registry.get(spec.kind).section
    self.mixer_residual = tuple(cfg[section].get('normed_residual', ())) if section else ()
    self.mlp_residual = tuple(cfg.moe.get('normed_residual', ())) if cfg.block_mlp and spec.moe else ()

  def add(self, x, y):
    """The residual stream x after the mixer's branch of output y: x plus y (times the residual multiplier), or
    with the mixer kind's normed_residual (alpha, beta), alpha * mixer_norm(x) + beta * that."""
    return self._join(x, y, self.mixer_residual, self.mixer_norm)

  def _join(self, x, y, normed_residual, norm):
    y = y.astype(x.dtype)
    y = y if self.residual_multiplier == 1.0 else y * self.residual_multiplier
    if not normed_residual:
      return x + y
    alpha, beta = normed_residual
    return norm(x).astype(x.dtype) * alpha + y * beta

  def mixer_input(self, x):
    """What the mixer reads of the stream x: norm(x), or x itself in a post-norm block."""
    return x if self.post_norm else self.mixer_norm(x)

  def mixer_output(self, y):
    """What joins the stream of the mixer's output y: y, or norm(y) in a post-norm block."""
    return self.mixer_norm(y) if self.post_norm else y

  def mlp_branch(self, x):
    """x plus the block's MLP branch (x itself when the block has no MLP)."""
    return self.mlp_branch_with_stats(x)[0]

  def mlp_branch_with_stats(self, x):
    """(mlp_branch(x), the MLP's router statistics: {} unless it is an MoE)."""
    if self.mlp is None:
      return x, {}
    y, stats = moe.with_stats(self.mlp, self.mlp_input(x))
    if self.post_norm:
      return self._join(x, self.mlp_norm(y), (), None), stats
    return self._join(x, y, self.mlp_residual, self.mlp_norm), stats

  def mlp_input(self, x):
    """What the MLP reads of the stream x: norm(x), or x itself in a post-norm block."""
    return x if self.post_norm else self.mlp_norm(x)

  def forward(self, x, positions, segment_ids=None):
    """(the block's output, the router statistics of its MoE: {} for a block without one)."""
    # Named scopes survive into the compiled program's op metadata: `bench step` attributes profiled time by them.
    with jax.named_scope(self.scope):
      with jax.named_scope('mixer'):
        y, mixer_stats = moe.with_stats(self.mixer, self.mixer_input(x), positions, segment_ids)
        x = self.add(x, self.mixer_output(y))
      with jax.named_scope('mlp'):
        x, mlp_stats = self.mlp_branch_with_stats(x)
    return activations.constrain(x, activations.RESIDUAL), mixer_stats or mlp_stats

  def __call__(self, x, positions, segment_ids=None):
    return self.forward(x, positions, segment_ids)[0]

  def moe_module(self):
    """The block's MoE (its MLP or its 'moe' layer), or None."""
    if isinstance(self.mlp, moe.MoE):
      return self.mlp
    return getattr(self.mixer, 'moe', None) if isinstance(getattr(self.mixer, 'moe', None), moe.MoE) else None

  def decode(self, x, where, state, *, prefill: bool):
    """Prefill (x [B,T,d] at positions `where`) or one step (x [B,1,d] at position `where`), with mixer state."""
    mix = self.mixer.prefill if prefill else self.mixer.step
    y, state = mix(self.mixer_input(x), where, state)
    return self.mlp_branch(self.add(x, self.mixer_output(y))), state


class Cycle(nnx.Module):
  """One repeat of the layer pattern (e.g. [SWA block, full block])."""

  def __init__(self, cfg, specs, *, rngs: nnx.Rngs):
    self.blocks = nnx.List([Block(cfg, spec, rngs=rngs) for spec in specs])
    self.remat = cfg.remat

  def forward(self, x, positions, segment_ids=None):
    """(the cycle's output, [each block's router statistics])."""
    # Each block is its own remat unit, not the cycle, so the backward need not recompute a whole cycle at once:
    # swa128_1to3 (3 SWA + 1 full) at S1 on v5p peaks at 38.3 GB this way, 48.9 GB with the cycle as the unit.
    stats = []
    for block in self.blocks:
      x, block_stats = run_block(block, x, positions, self.remat, segment_ids)
      stats.append(block_stats)
    return x, stats

  def __call__(self, x, positions, segment_ids=None):
    return self.forward(x, positions, segment_ids)[0]

  def decode(self, x, where, states, *, prefill: bool):
    new_states = []
    for block, state in zip(self.blocks, states):
      x, state = block.decode(x, where, state, prefill=prefill)
      new_states.append(state)
    return x, new_states


def _stack_modules(modules):
  """Merges identical-structure modules into one whose parameters have a leading `layers` axis."""
  graphdef, first = nnx.split(modules[0])
  states = [first] + [nnx.split(m)[1] for m in modules[1:]]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  module = nnx.merge(graphdef, stacked)
  for _, variable in nnx.iter_graph(module):
    if isinstance(variable, nnx.Param):
      variable.set_metadata('logical_axes', ('layers',) + tuple(variable.get_metadata().get('logical_axes', ())))
  return module


def _apply_pure(graphdef, state, x, positions, segment_ids=None):
  return nnx.merge(graphdef, state).forward(x, positions, segment_ids)


def run_block(block, x, positions, remat: str, segment_ids=None):
  """block.forward(x, positions, segment_ids) -> (output, router statistics) under the remat policy (the unit of
  rematerialisation is one block)."""
  if remat == 'none':
    return block.forward(x, positions, segment_ids)
  graphdef, state = nnx.split(block)
  fn = jax.checkpoint(_apply_pure, policy=_REMAT_POLICIES[remat], static_argnums=(0,))
  return fn(graphdef, state, x, positions, segment_ids)


class HybridLM(nnx.Module):

  def __init__(self, cfg, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pdt, self.dtype = dtype_of(cfg.param_dtype), dtype_of(cfg.dtype)
    self.embed = param(rngs, (cfg.vocab_size, cfg.d_model), ('vocab', 'embed'), std=cfg.init_std, dtype=pdt)
    specs = [pattern.layer_spec(cfg, i) for i in range(cfg.num_layers)]
    period = len(tuple(cfg.cycle))
    n_cycles, n_left = pattern.stack_layout(cfg)
    self.scan_layers = bool(cfg.scan_layers) and n_cycles > 1
    if self.scan_layers:
      self.cycles = _stack_modules([Cycle(cfg, specs[:period], rngs=rngs) for _ in range(n_cycles)])
      self.tail = nnx.List([Block(cfg, s, rngs=rngs) for s in specs[n_cycles * period:]])
    else:
      self.tail = nnx.List([Block(cfg, s, rngs=rngs) for s in specs])
    self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=pdt, dtype=self.dtype)
    self.lm_head = param(rngs, (cfg.d_model, cfg.vocab_size), ('embed', 'vocab'), std=cfg.init_std, dtype=pdt)
    self.remat = cfg.remat
    self.embedding_multiplier = float(cfg.embedding_multiplier)
    self.logits_scaling = float(cfg.logits_scaling)

  def embed_tokens(self, tokens, dtype=None):
    """Input embeddings [B, T, d_model] of int tokens [B, T] (times the embedding multiplier), in `dtype`
    (default: the compute dtype)."""
    x = jnp.take(self.embed[...], tokens, axis=0)
    if self.embedding_multiplier != 1.0:
      x = x * self.embedding_multiplier
    return x.astype(self.dtype if dtype is None else dtype)

  def hidden_states(self, tokens, positions=None, segment_ids=None):
    """Final-norm hidden states [B, T, d_model] for int tokens [B, T]; positions and documents as `__call__`."""
    return self.hidden_states_with_stats(tokens, positions, segment_ids)[0]

  def hidden_states_with_stats(self, tokens, positions=None, segment_ids=None):
    """(hidden_states, the MoE router statistics {'cycles': [per block of the cycle, stacked over repeats],
    'tail': [per block]}, {} for a block without an MoE; `stats_by_layer` numbers them by layer)."""
    positions, segment_ids = documents.resolve(tokens, positions, segment_ids)
    with jax.named_scope('embed'):
      x = self.embed_tokens(tokens)
    x = activations.constrain(x, activations.RESIDUAL)
    stats = {'cycles': [], 'tail': []}
    if self.scan_layers:
      graphdef, stacked = nnx.split(self.cycles)
      body = functools.partial(_apply_pure, graphdef)
      x, stats['cycles'] = jax.lax.scan(lambda h, s: body(s, h, positions, segment_ids), x, stacked)
    for block in self.tail:
      x, block_stats = run_block(block, x, positions, self.remat, segment_ids)
      stats['tail'].append(block_stats)
    with jax.named_scope('final_norm'):
      return self.final_norm(x), stats

  def moe_blocks(self, stats):
    """(layer index or (indices of the scanned repeats), block, its statistics) of every block with an MoE."""
    period = len(tuple(self.cfg.cycle))
    n_cycles = jax.tree.leaves(nnx.state(self.cycles))[0].shape[0] if self.scan_layers else 0
    for j, (block, block_stats) in enumerate(zip(self.cycles.blocks if self.scan_layers else (), stats['cycles'])):
      if block.moe_module() is not None:
        yield tuple(c * period + j for c in range(n_cycles)), block, block_stats
    for i, (block, block_stats) in enumerate(zip(self.tail, stats['tail'])):
      if block.moe_module() is not None:
        yield n_cycles * period + i, block, block_stats

  def stats_by_layer(self, stats) -> dict:
    """{layer index: that layer's router statistics} from `hidden_states_with_stats`'s statistics."""
    out = {}
    for where, _, block_stats in self.moe_blocks(stats):
      if isinstance(where, tuple):
        out.update((index, jax.tree.map(lambda v, c=c: v[c], block_stats)) for c, index in enumerate(where))
      else:
        out[where] = block_stats
    return dict(sorted(out.items()))

  def update_router_biases(self, stats, rate: float) -> None:
    """Auxiliary-loss-free balancing: every sigmoid router's selection bias moved by its layer's load (in place)."""
    for _, block, block_stats in self.moe_blocks(stats):
      moe.update_router_bias(block.moe_module(), block_stats, rate)

  def logits(self, h):
    """Logits [..., vocab] (compute dtype) of final hidden states `h` [..., d_model]."""
    with jax.named_scope('lm_head'):
      logits = h @ self.lm_head[...].astype(self.dtype)
      if self.logits_scaling != 1.0:
        logits = logits / self.logits_scaling
      return activations.constrain(logits, activations.LOGITS)

  def __call__(self, tokens, positions=None, segment_ids=None):
    """Logits [B, T, vocab] (compute dtype) for int tokens [B, T].

    segment_ids [B, T] (packed documents, hybrid_jax.models.documents): each token sees only its own document in
    every layer; positions [B, T] or [T] default to 0..T-1 (with documents, any numbering that counts up by one
    inside each document computes the same).
    """
    return self.logits(self.hidden_states(tokens, positions, segment_ids))

  # ------------------------------------------------------------------------------------------- decoding
  def init_decode_state(self, batch: int, max_len: int) -> dict:
    """Per-layer decode states (KV caches, SWA rings, recurrent states) for up to max_len tokens."""
    state = {'tail': [block.mixer.init_state(batch, max_len) for block in self.tail]}
    if self.scan_layers:
      one = [block.mixer.init_state(batch, max_len) for block in self.cycles.blocks]
      n = jax.tree.leaves(nnx.state(self.cycles))[0].shape[0]
      state['cycles'] = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), one)
    return state

  def _decode(self, tokens, where, state, *, prefill: bool):
    x = self.embed_tokens(tokens)
    new_state = {}
    if self.scan_layers:
      graphdef, stacked = nnx.split(self.cycles)

      def body(h, params_and_state):
        params, layer_state = params_and_state
        return nnx.merge(graphdef, params).decode(h, where, layer_state, prefill=prefill)

      x, new_state['cycles'] = jax.lax.scan(body, x, (stacked, state['cycles']))
    new_state['tail'] = []
    for block, layer_state in zip(self.tail, state['tail']):
      x, layer_state = block.decode(x, where, layer_state, prefill=prefill)
      new_state['tail'].append(layer_state)
    return self.logits(self.final_norm(x)), new_state

  def prefill(self, tokens, state):
    """Logits [B, T, vocab] of a prompt (positions 0..T-1) through the parallel path, and the filled state."""
    return self._decode(tokens, jnp.arange(tokens.shape[1], dtype=jnp.int32), state, prefill=True)

  def step(self, token, position, state):
    """Logits [B, vocab] of one token [B] at `position` (a scalar), and the updated state."""
    logits, state = self._decode(token[:, None], position, state, prefill=False)
    return logits[:, 0], state
