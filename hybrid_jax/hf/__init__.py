"""Hugging Face checkpoints in and out: config.json + safetensors <-> a hybrid_jax run directory.

Two importers, one per kind of transformers class: `attention` (Llama, Mistral, SmolLM3, GraniteSWA, MiniCPM: a
layer plan and a tensor-name table) and `families` (the released recurrent hybrids: a config plan and tensor rules
per family). Both read config.json through `fields` and move tensors with `tensors`; `io` reads and writes
checkpoint and run directories, choosing the importer by model_type. hybrid_jax/commands/hf.py is
`python -m hybrid_jax hf export|import`. docs/HF.md has the mapping tables and what is refused.
"""

from hybrid_jax.errors import UserError


class HFError(UserError, ValueError):
  """A config or checkpoint that cannot be translated exactly; the message names the field and what is allowed."""
