"""Hugging Face checkpoints in and out: config.json + safetensors <-> a hybrid_jax run directory.

`config_map` translates model configs (which transformers class expresses which layer pattern), `weights` moves
tensors between the two layouts, `io` reads and writes checkpoint and run directories; hybrid_jax/commands/hf.py
is `python -m hybrid_jax hf export|import`. docs/HF.md has the mapping table and what is refused.
"""

from hybrid_jax.errors import UserError


class HFError(UserError, ValueError):
  """A config or checkpoint that cannot be translated exactly; the message names the field and what is allowed."""
