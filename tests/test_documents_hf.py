"""Imported released models on packed rows: each document of a row computes the logits of that document alone.

The five recurrent hybrid families of test_hf_hybrids.py and one attention class (GraniteSWA with learned sinks,
sliding windows and NoPE full layers), imported from their fixtures under tests/data/hf/ once each. Each fixture's
two 16-token prompts are packed as three documents of different lengths: 12, 3 (shorter than the conv width of 4)
and 1 token, in opposite orders in the two rows. The first document of each row is a prefix of the prompt, so its
packed logits are also checked against transformers' own (reference.safetensors).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from hybrid_jax.hf import io
from hybrid_jax.train import state as state_lib
from tests.test_documents import _close, _pieces, _segment_ids
from tests.test_hf import DATA, REL_TOL, _rel_err
from tests.test_hf_hybrids import HYBRIDS

ATTENTION_CLASS = 'hf_granite_swa_sinks'
ROWS = ((12, 3, 1), (1, 3, 12))  # Per row: document lengths in order (16 tokens, as the fixtures' prompts).


@functools.cache
def _imported(name):
  """(jitted model(tokens, segment_ids=None) -> float32 logits, model config) of fixture `name`, imported once."""
  config, params, _ = io.read_hf(DATA / name)
  model_def = state_lib.make_model_def(config.model)
  fn = jax.jit(lambda p, tokens, segment_ids: model_def.bind(p)(tokens, segment_ids=segment_ids))
  return functools.partial(fn, params), config.model


@pytest.mark.parametrize('name', [*HYBRIDS.values(), ATTENTION_CLASS])
def test_each_packed_document_computes_what_it_computes_alone(name):
  model, cfg = _imported(name)
  assert cfg.dtype == 'float32'
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  tokens = jnp.asarray(ref['tokens'])
  assert tokens.shape == (len(ROWS), sum(ROWS[0]))
  segment_ids = jnp.asarray(np.concatenate([_segment_ids(lengths) for lengths in ROWS]))
  packed = np.asarray(model(tokens, segment_ids), np.float64)
  # Alone: every document of both rows as a row of its own, padded at its end to the longest (causal: the padding
  # changes nothing before it), so one program runs them all.
  longest = max(max(lengths) for lengths in ROWS)
  docs = [(row, sl) for row, lengths in enumerate(ROWS) for sl in _pieces(lengths)]
  alone = np.asarray(model(jnp.stack([jnp.pad(tokens[row, sl], (0, longest - (sl.stop - sl.start)))
                                      for row, sl in docs]), None), np.float64)
  scale = float(np.max(np.abs(packed)))
  for i, (row, sl) in enumerate(docs):
    _close(packed[row, sl], alone[i, :sl.stop - sl.start], scale, f'{name} row {row} document {sl}')
  for row, lengths in enumerate(ROWS):  # The first document is the prompt's prefix: transformers' logits.
    assert _rel_err(packed[row, :lengths[0]], ref['logits'][row, :lengths[0]]) <= REL_TOL, (name, row)
