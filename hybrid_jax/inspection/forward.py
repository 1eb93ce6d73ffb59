"""A HybridLM forward pass run block by block, so analyses can look inside it without touching the model code.

`forward` computes the same function as `HybridLM.__call__` (a test holds them equal) and can, on the side:
- return attention probabilities of chosen query positions in every attention layer ([B, Hq, nq, T] each);
- return the residual stream at chosen positions before the first block and after every block;
- start from given input embeddings instead of tokens (for gradients with respect to them);
- restrict the receptive field of the full-attention or of the efficient layers (see `windowed.py`);
- keep the documents of a packed row apart (`segment_ids`, as `HybridLM.__call__` takes them), restricted or not;
- return the experts every token is routed to in every mixture-of-experts layer.

Training never runs this path, so its numerics and speed are untouched. A scanned stack is unrolled here (its stacked
parameters sliced per cycle): compile time grows with depth, which is fine for inference-only analyses.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from hybrid_jax.inspection import windowed
from hybrid_jax.models import documents, moe, pattern
from hybrid_jax.models.mixers import attention, moe_layer, registry


@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer of a model: its index, spec and its role in the study ('full', 'efficient' or 'headwise')."""
  index: int
  spec: pattern.LayerSpec

  @property
  def kind(self) -> str:
    return self.spec.kind

  @property
  def is_attention(self) -> bool:
    return registry.get(self.spec.kind).attention

  @property
  def role(self) -> str:
    """'full' for full causal attention, 'headwise' for mixed layers, 'efficient' for SWA and recurrent mixers
    (each kind's registry entry says)."""
    return registry.get(self.spec.kind).role


def layers(model_cfg) -> list[Layer]:
  return [Layer(i, pattern.layer_spec(model_cfg, i)) for i in range(model_cfg.num_layers)]


def blocks(model) -> list:
  """The model's blocks in layer order; a scanned stack is sliced into per-cycle modules (works inside jit)."""
  out = []
  if model.scan_layers:
    graphdef, stacked = nnx.split(model.cycles)
    n_cycles = jax.tree.leaves(stacked)[0].shape[0]
    for c in range(n_cycles):
      cycle = nnx.merge(graphdef, jax.tree.map(lambda a, c=c: a[c], stacked))
      out.extend(cycle.blocks)
  out.extend(model.tail)
  return out


def head_windows(layer: Layer, model_cfg) -> list[int]:
  """Native window of each query head of an attention layer (0 = full causal)."""
  per_kv = model_cfg.num_heads // model_cfg.num_kv_heads
  return [window or 0 for window, kv in attention.kv_groups(layer.spec, model_cfg.num_kv_heads)
          for _ in range((kv.stop - kv.start) * per_kv)]


def embed(model, tokens):
  """Input embeddings [B, T, d] as they enter the first block (embedding multiplier applied), in float32 (the
  model casts them to its compute dtype itself)."""
  return model.embed_tokens(tokens, jnp.float32)


def forward(model, tokens=None, *, embeddings=None, positions=None, segment_ids=None, attention_queries=None,
            residual_positions=None, logit_positions=None, restriction: 'windowed.Restriction | None' = None,
            head_scale=None, routes: bool = False) -> dict:
  """{'logits' [B, T, V], 'attention' {layer: [B, Hq, nq, T]}, 'residuals' [L + 1, B, nr, d],
  'routes' {layer: [B, T, k] int32}}.

  Give `tokens` [B, T] or `embeddings` [B, T, d]. `positions` and `segment_ids` [B, T] as `HybridLM.__call__`
  takes them (hybrid_jax.models.documents): with segment ids every layer sees only each token's own document, so
  each document of a packed row gives what it gives alone, and attention rows are 0 over other documents' keys.
  `logit_positions` [B, n] computes logits only there ([B, n, V]: a long context times a large vocabulary would not
  fit otherwise). `attention_queries` [B, nq] (int) selects the query positions whose attention rows are returned
  for every attention layer; `residual_positions` [B, nr] selects where the residual stream is read (entry 0: the
  embeddings, entry l + 1: after block l). Absent selections are not computed.
  `head_scale` {layer index: [Hq]} multiplies each query head's output of those attention layers before their output
  projection (0 ablates a head; the values may be traced). `routes`: the k experts of every token in each layer with
  a mixture of experts (its block MLP, or the layer itself for the 'moe' kind), as its router chose them.
  """
  if (tokens is None) == (embeddings is None):
    raise ValueError('forward needs exactly one of tokens or embeddings')
  x = embed(model, tokens) if embeddings is None else embeddings
  x = x.astype(model.dtype)
  rows = jax.ShapeDtypeStruct(x.shape[:2], jnp.int32)  # `resolve` reads only the shape of the tokens.
  positions, segment_ids = documents.resolve(rows, positions, segment_ids)
  residuals = [] if residual_positions is None else [windowed.take_rows(x, residual_positions)]
  attention, routed = {}, {}
  for layer, block in zip(layers(model.cfg), blocks(model)):
    h = block.mixer_input(x)
    if routes and isinstance(block.mixer, moe_layer.MoELayer):
      routed[layer.index] = block.mixer.moe.route(h).experts
    y, probs = windowed.mix(block.mixer, layer.spec, h, positions, restriction, attention_queries,
                            (head_scale or {}).get(layer.index), segment_ids)
    if probs is not None:
      attention[layer.index] = probs
    x = block.add(x, block.mixer_output(y))
    if routes and isinstance(block.mlp, moe.MoE):
      routed[layer.index] = block.mlp.route(block.mlp_input(x)).experts
    x = block.mlp_branch(x)
    if residual_positions is not None:
      residuals.append(windowed.take_rows(x, residual_positions))
  if logit_positions is not None:
    x = windowed.take_rows(x, logit_positions)
  logits = model.logits(model.final_norm(x))
  out = {'logits': logits, 'attention': attention}
  if residual_positions is not None:
    out['residuals'] = jnp.stack(residuals).astype(jnp.float32)
  if routes:
    out['routes'] = routed
  return out
