"""One loaded run as the evaluators see it: per-token NLL of a sequence, and greedy generation from text prompts.

Sequences are padded on the right to a multiple of `pad_multiple` tokens before the forward pass: every mixer is
causal, so padding never changes the NLL of real tokens, and a handful of padded lengths means a handful of
compilations instead of one per document length.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from hybrid_jax.eval.generate import Generator, stop_on_strings
from hybrid_jax.train.step import token_nll


class ModelScorer:
  """NLLs and generations of one model (`model_def`, `params`) with its tokenizer."""

  def __init__(self, model_def, params, tokenizer, *, pad_multiple: int = 256):
    if pad_multiple <= 0:
      raise ValueError(f'pad_multiple={pad_multiple} must be positive')
    self.tokenizer, self.pad_multiple = tokenizer, pad_multiple
    self.params = params

    def nll_and_greedy(p, tokens):
      logits = model_def.bind(p)(tokens[None, :-1])[0]
      return token_nll(logits, tokens[1:])[0], jnp.argmax(logits, axis=-1) == tokens[1:]

    self._nll_and_greedy = jax.jit(nll_and_greedy)
    self.generator = Generator(model_def, params, eos_id=tokenizer.eos_id)

  @classmethod
  def from_run(cls, run, **kwargs):
    return cls(run.model_def, run.params, run.tokenizer, **kwargs)

  def nll(self, ids) -> np.ndarray:
    """-log p(ids[i] | ids[:i]) for every i (float64); entry 0 is NaN (nothing predicts the first token)."""
    return self.nll_and_greedy(ids)[0]

  def nll_and_greedy(self, ids) -> tuple[np.ndarray, np.ndarray]:
    """`nll(ids)` and whether each ids[i] is the greedy (argmax) choice after ids[:i] (entry 0: False)."""
    ids = np.asarray(ids, np.int32).reshape(-1)
    n = len(ids)
    nll, greedy = np.full(n, np.nan), np.zeros(n, bool)
    if n < 2:
      return nll, greedy
    padded = np.zeros(math.ceil(n / self.pad_multiple) * self.pad_multiple + 1, np.int32)
    padded[:n] = ids
    padded_nll, padded_greedy = self._nll_and_greedy(self.params, jnp.asarray(padded))
    nll[1:] = np.asarray(padded_nll, np.float64)[:n - 1]
    greedy[1:] = np.asarray(padded_greedy)[:n - 1]
    return nll, greedy

  def count_tokens(self, text: str) -> int:
    return len(self.tokenizer.encode(text))

  def generate(self, prompts, max_new_tokens, *, stop_strings=(), batch_size: int = 8) -> list[str]:
    """Greedy continuations (decoded text) of text `prompts`; `max_new_tokens` is one int or one per prompt."""
    if isinstance(max_new_tokens, int):
      max_new_tokens = [max_new_tokens] * len(prompts)
    if len(max_new_tokens) != len(prompts):
      raise ValueError(f'{len(max_new_tokens)} max_new_tokens for {len(prompts)} prompts')
    stop = stop_on_strings(self.tokenizer.decode, stop_strings) if stop_strings else None
    encoded = [self.tokenizer.encode(p).tolist() for p in prompts]
    outputs = [None] * len(prompts)
    for limit in sorted(set(max_new_tokens)):  # One generate call per limit keeps equal-length batching.
      indices = [i for i, m in enumerate(max_new_tokens) if m == limit]
      ids = self.generator.generate([encoded[i] for i in indices], max_new_tokens=limit, batch_size=batch_size,
                                    stop=stop)
      for i, out in zip(indices, ids):
        text = self.tokenizer.decode(out)
        for s in stop_strings:  # Cut at the first stop string, as the harnesses that define these tasks do.
          text = text.split(s)[0] if s in text else text
        outputs[i] = text
    return outputs
