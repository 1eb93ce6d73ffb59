"""Parameter counts per layer kind, from the config alone (no arrays allocated).

`embedding` counts the input embedding and the untied LM head (the study's convention); `non_embedding` is
everything else. A test checks these formulas against the real model's parameters.
"""

from hybrid_jax.models import layers, pattern
from hybrid_jax.models.mixers import registry


def mixer_params(cfg, spec: pattern.LayerSpec) -> int:
  """The mixer's parameters, by its registry entry (hybrid_jax.models.mixers.registry)."""
  return registry.get(spec.kind).params(cfg, spec)


def block_params(cfg, spec: pattern.LayerSpec) -> dict:
  """The block's mixer, MLP (none when model.block_mlp is off) and norm parameters."""
  mlp = layers.mlp_params(cfg) if cfg.block_mlp else 0
  norms = (2 if cfg.block_mlp else 1) * cfg.d_model
  mixer = mixer_params(cfg, spec)
  return {'kind': spec.kind, 'mixer': mixer, 'mlp': mlp, 'norms': norms, 'total': mixer + mlp + norms}


def param_counts(cfg) -> dict:
  """{'non_embedding', 'embedding', 'total', 'layers': [...]} for a model config."""
  layers = [block_params(cfg, pattern.layer_spec(cfg, i)) for i in range(cfg.num_layers)]
  non_embedding = sum(layer['total'] for layer in layers) + cfg.d_model  # + final norm
  embedding = 2 * cfg.vocab_size * cfg.d_model  # input table + untied LM head
  return {'non_embedding': non_embedding, 'embedding': embedding, 'total': non_embedding + embedding,
          'layers': layers}
