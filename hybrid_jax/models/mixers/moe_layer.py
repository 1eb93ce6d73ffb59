"""The mixture-of-experts section `model.moe`, and an MoE as a layer of its own (kind 'moe').

The section says which blocks' MLPs are MoE (`blocks`: none by default, so a dense model computes what it always
did) and what the MoE is (hybrid_jax.models.moe). The kind 'moe' is Nemotron 3's 'E' layers: with
`model.block_mlp` False a cycle such as ('mamba2', 'moe', 'full', 'moe') makes every MLP layer an MoE. It mixes
nothing across positions (role 'pointwise'). docs/MOE.md describes every key.
"""

from flax import nnx

from hybrid_jax import config_keys
from hybrid_jax.errors import invalid_config
from hybrid_jax.models import moe, moe_routing, pattern
from hybrid_jax.models.mixers import attention, mlp
from hybrid_jax.models.mixers import registry


class MoELayer(mlp.Pointwise):
  """model.moe's MoE as a layer; `with_stats` gives the router statistics too."""

  def __init__(self, cfg, spec, *, rngs: nnx.Rngs):
    del spec
    self.moe = moe.MoE(cfg, rngs=rngs)

  def with_stats(self, x, positions, segment_ids=None):
    del positions, segment_ids
    return self.moe.with_stats(x)

  def __call__(self, x, positions, segment_ids=None):
    return self.with_stats(x, positions, segment_ids)[0]


def _number(**bounds):
  return lambda config, key: config_keys.number(config, key, **bounds)


def _positions(config, key):
  found = config_keys.value(config, key)
  if not isinstance(found, (tuple, list)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in found):
    config_keys.fail(key, found, 'must be a list of 0-based positions in model.cycle')
  return found


FIELDS = {
    'blocks': registry.choice('none', moe.BLOCKS, "Which blocks' MLPs are MoE: 'none' (a dense model), 'all', "
                              "'every' (every `every`-th block, counting from 1), 'cycle' (the blocks at "
                              '`cycle_positions` of every repeat of model.cycle).'),
    'every': registry.positive_int(2, "'every': block i is MoE when (i + 1) % every == 0."),
    'cycle_positions': registry.Field((), "'cycle': 0-based positions in model.cycle whose blocks are MoE.",
                                      _positions),
    'num_experts': registry.positive_int(8, 'Routed experts per MoE layer.'),
    'top_k': registry.positive_int(2, 'Routed experts per token.'),
    'router': registry.choice('softmax_topk', moe_routing.ROUTERS,
                              "'softmax_topk' | 'topk_softmax' (gpt-oss) | 'sigmoid' (DeepSeek-V3, Nemotron 3)."),
    'router_logit_bias': registry.boolean(False, 'A learned bias added to the router logits before routing '
                                          "(gpt-oss); the 'sigmoid' router's selection bias is apart."),
    'norm_topk_prob': registry.boolean(True, "'softmax_topk' and 'sigmoid': renormalise the k weights to sum to 1."),
    'n_group': registry.positive_int(1, "'sigmoid': expert groups of the grouped top-k (1 = no groups)."),
    'topk_group': registry.positive_int(1, "'sigmoid': groups a token may pick its experts from."),
    'routed_scaling_factor': registry.Field(1.0, 'Factor on the routing weights (DeepSeek-V3: 2.5).',
                                            _number(positive=True)),
    'bias_rate': registry.nonnegative(0.0, "'sigmoid': auxiliary-loss-free balancing, the selection bias moves by "
                                      'this after every step toward even load (DeepSeek-V3: 0.001); 0 = off.'),
    'activation': registry.choice('swiglu', moe.EXPERT_MLPS, "Expert MLP: 'swiglu' | 'relu2' | 'swiglu_oai' "
                                  "(gpt-oss: clamped SwiGLU with biases, (up + 1) * glu)."),
    'swiglu_limit': registry.Field(7.0, "'swiglu_oai': clamp limit.", _number(positive=True)),
    'swiglu_alpha': registry.Field(1.702, "'swiglu_oai': glu = gate * sigmoid(alpha * gate).",
                                   _number(positive=True)),
    'expert_d_ff': registry.nonnegative_int(0, 'Hidden width of one routed expert; 0 = model.d_ff.'),
    'shared_experts': registry.nonnegative_int(0, 'Shared experts every token goes through (one MLP of their '
                                               'summed width); 0 = none.'),
    'shared_d_ff': registry.nonnegative_int(0, 'Hidden width of one shared expert; 0 = the routed expert width.'),
    'shared_expert_gate': registry.boolean(False, "A sigmoid gate sigmoid(x . w) on the shared output (Qwen)."),
    'dropless': registry.boolean(True, 'Every assignment is computed; False = at most capacity_factor * tokens * k '
                                 '/ E per expert, the rest dropped and counted.'),
    'capacity_factor': registry.Field(1.25, 'Capacity per expert when dropless is False.', _number(positive=True)),
    'implementation': registry.choice('auto', moe.IMPLEMENTATIONS, "'auto' | 'ragged_dot' (grouped matmul over "
                                      "tokens sorted by expert) | 'dense' (every expert on every token)."),
    'normed_residual': attention.normed_residual_field(
        "() or (alpha, beta): the MoE's block carries alpha * norm(x) + beta * MoE(norm(x)) instead of "
        'x + MoE(norm(x)) (MiniMax).'),
    'aux_loss_coef': registry.nonnegative(0.01, 'Weight of the load-balancing loss (summed over MoE layers).'),
    'z_loss_coef': registry.nonnegative(0.001, 'Weight of the router z-loss (summed over MoE layers).'),
}


def _check(cfg, used: bool):
  m = cfg.moe
  if m.top_k > m.num_experts:
    raise invalid_config('model.moe.top_k', m.top_k, f'must be at most model.moe.num_experts={m.num_experts}')
  if m.n_group > 1 or m.topk_group > 1:
    if m.router != 'sigmoid':
      raise invalid_config('model.moe.n_group', m.n_group, "grouped top-k needs model.moe.router='sigmoid'")
    if m.num_experts % m.n_group:
      raise invalid_config('model.moe.n_group', m.n_group, f'must divide model.moe.num_experts={m.num_experts}')
    if m.topk_group > m.n_group:
      raise invalid_config('model.moe.topk_group', m.topk_group, f'must be at most model.moe.n_group={m.n_group}')
    if m.top_k > m.topk_group * (m.num_experts // m.n_group):
      raise invalid_config('model.moe.top_k', m.top_k, 'must be at most the experts of model.moe.topk_group groups')
  if m.bias_rate and m.router != 'sigmoid':
    raise invalid_config('model.moe.bias_rate', m.bias_rate, "needs model.moe.router='sigmoid' (the selection bias)")
  if used and cfg.block_mlp:
    raise invalid_config('model.block_mlp', cfg.block_mlp, "must be False when model.cycle has 'moe' layers (a "
                         'block with an MLP of its own and an MoE layer is two MLPs)')
  if m.blocks != 'none' and not cfg.block_mlp:
    raise invalid_config('model.moe.blocks', m.blocks, "needs model.block_mlp True (without block MLPs, put 'moe' "
                         'layers in model.cycle)')
  period = len(tuple(cfg.cycle))
  if m.blocks == 'cycle':
    if not m.cycle_positions or any(not 0 <= i < period for i in m.cycle_positions):
      raise invalid_config('model.moe.cycle_positions', tuple(m.cycle_positions),
                           f'must name positions 0..{period - 1} of model.cycle')
  if m.blocks == 'every' and cfg.scan_layers and pattern.stack_layout(cfg)[0] > 1 and period % m.every:
    raise invalid_config('model.moe.every', m.every, f'must divide len(model.cycle)={period} with '
                         'model.scan_layers (every scanned repeat of the cycle is the same)')


def moe_layer_flops(cfg, spec, t: int) -> dict:
  del spec
  return {'projections': moe.forward_flops(cfg, t)['total'], 'core': 0, 'conv': 0}


registry.register(registry.MixerKind(
    moe.LAYER_KIND, build=MoELayer, params=lambda cfg, spec=None: moe.params(cfg)['total'], flops=moe_layer_flops,
    role='pointwise', section='moe', fields=FIELDS, validate=_check))
