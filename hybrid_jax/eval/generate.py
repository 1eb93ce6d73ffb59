"""Batched greedy decoding: prefill through the parallel path, then jitted one-token steps with decode states.

Prompts of equal length share a batch (no padding, so positions and caches stay exact); stop at EOS, at a stop
string, or at max_new_tokens.

Compilations are bounded by length buckets: a prompt of T tokens is prefilled in parallel up to the largest
multiple of `bucket` below T, and its last T mod bucket tokens go through the one-token step; decode states are
sized to a multiple of `bucket`. Prompts of many lengths (RULER, LongBench) then share a few compiled programs.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np


class Generator:
  """Greedy generation for one model; the jitted prefill/step functions are reused across calls."""

  def __init__(self, model_def, params, *, eos_id=None, bucket: int = 64):
    if bucket <= 0:
      raise ValueError(f'bucket={bucket} must be positive')
    self.model_def, self.params, self.eos_id, self.bucket = model_def, params, eos_id, bucket
    self._prefill = jax.jit(lambda p, tokens, state: model_def.bind(p).prefill(tokens, state))
    self._step = jax.jit(lambda p, token, position, state: model_def.bind(p).step(token, position, state),
                         donate_argnums=3)

  def _init_state(self, batch, max_len):
    return self.model_def.bind(self.params).init_decode_state(batch, max_len)

  def generate(self, prompts, *, max_new_tokens: int, batch_size: int = 8, stop=None) -> list[list[int]]:
    """Greedy continuations (token ids, EOS excluded) of `prompts` (lists of ids).

    `stop(ids) -> bool`, if given, ends a sequence early (e.g. when its decoded text contains a stop string).
    """
    if max_new_tokens < 0:
      raise ValueError(f'max_new_tokens={max_new_tokens} must be >= 0')
    if any(len(p) == 0 for p in prompts):
      raise ValueError('every prompt needs at least one token')
    by_length = collections.defaultdict(list)
    for i, prompt in enumerate(prompts):
      by_length[len(prompt)].append(i)
    outputs = [None] * len(prompts)
    for length, indices in by_length.items():
      for start in range(0, len(indices), batch_size):
        group = indices[start:start + batch_size]
        tokens = np.asarray([prompts[i] for i in group], np.int32)
        for i, out in zip(group, self._generate_batch(tokens, max_new_tokens, stop)):
          outputs[i] = out
    return outputs

  def _generate_batch(self, tokens, max_new_tokens, stop):
    b, t = tokens.shape
    outs = [[] for _ in range(b)]
    if max_new_tokens == 0:
      return outs
    state = self._init_state(b, -(-(t + max_new_tokens) // self.bucket) * self.bucket)
    parallel = (t // self.bucket) * self.bucket or t  # Short prompts (< bucket) are prefilled whole.
    logits, state = self._prefill(self.params, jnp.asarray(tokens[:, :parallel]), state)
    logits = logits[:, -1]
    for position in range(parallel, t):
      logits, state = self._step(self.params, jnp.asarray(tokens[:, position]), jnp.int32(position), state)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    done = np.zeros(b, bool)
    for step in range(max_new_tokens):
      ids = np.asarray(token)
      for row in np.flatnonzero(~done):
        if self.eos_id is not None and ids[row] == self.eos_id:
          done[row] = True
          continue
        outs[row].append(int(ids[row]))
        if stop is not None and stop(outs[row]):
          done[row] = True
      if done.all() or step == max_new_tokens - 1:
        break
      logits, state = self._step(self.params, token, jnp.int32(t + step), state)
      token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return outs


def stop_on_strings(decode, strings):
  """A `stop` callable for Generator.generate: true once the decoded text contains any of `strings`."""
  strings = tuple(strings)
  return lambda ids: bool(strings) and any(s in decode(ids) for s in strings)
