"""Parameter counts per layer kind, from the config alone (no arrays allocated).

`embedding` counts the input embedding and the untied LM head (the study's convention); `non_embedding` is
everything else. A test checks these formulas against the real model's parameters. A mixture-of-experts MLP
(hybrid_jax.models.moe) also has `active` parameters, what one token uses (router, its k experts, shared experts):
`active` and `active_non_embedding` equal `total` and `non_embedding` in a dense model.
"""

from hybrid_jax.models import layers, moe, pattern
from hybrid_jax.models.mixers import registry


def mixer_params(cfg, spec: pattern.LayerSpec) -> int:
  """The mixer's parameters, by its registry entry (hybrid_jax.models.mixers.registry)."""
  return registry.get(spec.kind).params(cfg, spec)


def block_params(cfg, spec: pattern.LayerSpec) -> dict:
  """The block's mixer, MLP (none when model.block_mlp is off) and norm parameters, and of those the `active`
  ones (the experts a token does not use left out)."""
  mlp = layers.mlp_params(cfg) if cfg.block_mlp else 0
  inactive = 0
  if spec.moe or spec.kind == moe.LAYER_KIND:
    counts = moe.params(cfg)
    inactive = counts['total'] - counts['active']
    mlp = counts['total'] if spec.moe else mlp
  norms = (2 if cfg.block_mlp else 1) * cfg.d_model
  mixer = mixer_params(cfg, spec)
  total = mixer + mlp + norms
  return {'kind': spec.kind, 'mixer': mixer, 'mlp': mlp, 'norms': norms, 'total': total, 'active': total - inactive}


def param_counts(cfg) -> dict:
  """{'non_embedding', 'embedding', 'total', 'layers': [...]} for a model config."""
  layers = [block_params(cfg, pattern.layer_spec(cfg, i)) for i in range(cfg.num_layers)]
  non_embedding = sum(layer['total'] for layer in layers) + cfg.d_model  # + final norm
  active = sum(layer['active'] for layer in layers) + cfg.d_model
  embedding = 2 * cfg.vocab_size * cfg.d_model  # input table + untied LM head
  return {'non_embedding': non_embedding, 'embedding': embedding, 'total': non_embedding + embedding,
          'active_non_embedding': active, 'active': active + embedding, 'layers': layers}
