"""Inspection and analyses on packed rows: each document of a row gives, through `inspection.forward` (restricted
or not) and the restriction analysis' NLL, what it gives alone.

"Alone" is the document at the start of a row of its own, right-padded (every layer is causal, so padding never
changes a real token's outputs). Rows hold three documents each; one row reuses an id (a returning id is a new
document), and most document starts fall inside the restriction's recurrent chunks, not on their edges.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.analysis import gradient_influence, restriction as restriction_lib
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.inspection.windowed import Restriction
from hybrid_jax.train import state as state_lib
from tests.test_documents import _rel, _tiny
from tests.test_model import _random_sinks

T = 50
LENGTHS = ((23, 9, 18), (5, 30, 15))  # Per row: documents start at 0, 23, 32 and 0, 5, 35 (chunks of 4).
IDS = ((7, 6, 5), (3, 5, 3))
RESTRICTIONS = {'none': None,
                'full': Restriction('full', 6, sinks=2),  # Full layers: the last 6 keys plus each document's first 2.
                'efficient': Restriction('efficient', 6, sinks=2, chunk=4)}  # SWA (w=8) and recurrent layers.
TOLERANCE = 1e-5


def _documents(lengths=LENGTHS, ids=IDS):
  """[(row, start, length)] of every document, and segment_ids [B, sum(lengths)]."""
  pieces, segment_ids = [], []
  for r, (row, row_ids) in enumerate(zip(lengths, ids)):
    starts = np.cumsum((0,) + row)[:-1]
    pieces += [(r, int(a), n) for a, n in zip(starts, row)]
    segment_ids.append(np.repeat(row_ids, row))
  return pieces, np.asarray(segment_ids, np.int32)


def _alone(x, pieces):
  """[documents, T, ...]: each document of x [B, T, ...] at the start of a row of its own, zero-padded."""
  out = np.zeros((len(pieces),) + x.shape[1:], x.dtype)
  for i, (r, a, n) in enumerate(pieces):
    out[i, :n] = x[r, a:a + n]
  return out


def _model(arch, **overrides):
  cfg = _tiny(arch)  # Width 32, 4 query heads on 2 KV heads, window 8, one cycle of the arch, float32.
  cfg.update(overrides)
  model_def, params = state_lib.init_model(cfg, 0)
  return cfg, model_def, _random_sinks(params) if cfg.attention_sinks else params


def _forward(model_def, restriction):
  def run(params, tokens, queries, segment_ids=None):
    residuals = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return forward_lib.forward(model_def.bind(params), tokens, segment_ids=segment_ids, attention_queries=queries,
                               residual_positions=residuals, restriction=restriction)
  return jax.jit(run)


# Attention and the two scans in the default tier; head-wise windows, Lightning and learned sinks in e2e.
ARCHES = [pytest.param('swa128', {}, IDS, id='swa'),
          pytest.param('swa128_headwise', {}, IDS, id='headwise', marks=pytest.mark.e2e),
          pytest.param('gdn', {}, IDS, id='gdn'), pytest.param('mamba2', {}, IDS, id='mamba2'),
          pytest.param('lightning', {}, IDS, id='lightning', marks=pytest.mark.e2e),
          pytest.param('swa128', dict(attention_sinks=True), IDS, id='swa_learned_sinks', marks=pytest.mark.e2e)]


@pytest.mark.parametrize('restriction', RESTRICTIONS)
@pytest.mark.parametrize('arch, overrides, ids', ARCHES)
def test_forward_gives_each_document_what_it_gives_alone(arch, overrides, ids, restriction):
  """Residuals after every block, logits and attention rows of each document equal those of the document alone;
  the attention rows are 0 over the keys of the row's other documents."""
  _, model_def, params = _model(arch, **overrides)
  pieces, segment_ids = _documents(ids=ids)
  tokens = np.random.default_rng(1).integers(0, 256, segment_ids.shape).astype(np.int32)
  offsets = np.asarray([0, 4, 5, 7])  # Queries in each document: its first token, and a few past the window.
  queries = np.asarray([[a + min(o, n - 1) for r_, a, n in pieces if r_ == r for o in offsets]
                        for r in range(len(LENGTHS))], np.int32)
  fn = _forward(model_def, RESTRICTIONS[restriction])
  packed = jax.tree.map(np.asarray, fn(params, jnp.asarray(tokens), jnp.asarray(queries), jnp.asarray(segment_ids)))
  alone_queries = np.asarray([[min(o, n - 1) for o in offsets] for _, _, n in pieces], np.int32)
  alone = jax.tree.map(np.asarray, fn(params, jnp.asarray(_alone(tokens, pieces)), jnp.asarray(alone_queries)))

  assert packed['attention'], 'every arch here has attention layers'
  for i, (r, a, n) in enumerate(pieces):  # Only the document's own tokens: the padding's outputs are not compared.
    pairs = {'logits': (packed['logits'][r, a:a + n], alone['logits'][i, :n]),
             'residuals': (packed['residuals'][:, r, a:a + n], alone['residuals'][:, i, :n])}
    mine = slice(i % 3 * len(offsets), (i % 3 + 1) * len(offsets))  # This document's queries in its row.
    for layer, probs in packed['attention'].items():
      rows = probs[r, :, mine]  # [Hq, nq, T]
      pairs[f'attention of layer {layer}'] = (rows[..., a:a + n], alone['attention'][layer][i, ..., :n])
      assert np.all(np.delete(rows, np.s_[a:a + n], axis=-1) == 0), f'layer {layer}: document {i} reads another'
    for name, (got, want) in pairs.items():
      assert _rel(got, want) <= TOLERANCE, f'{name} of document {i} under restriction {restriction}'


@pytest.mark.parametrize('restriction', ['none', 'efficient'])
def test_restriction_nll_of_a_packed_batch_is_each_documents_own(restriction):
  """The restriction analysis' per-token NLL of a packed batch equals each document's own at every target that
  counts (`target_weights`: not the last token of a document, asked for the next one's first), and its loss is
  the mean over exactly those."""
  _, model_def, params = _model('gdn')
  lengths = ((23, 9, 19), (5, 30, 16))  # T + 1 tokens per row: inputs and targets are its two shifts.
  pieces, segment_ids = _documents(lengths)
  row = np.random.default_rng(2).integers(0, 256, segment_ids.shape).astype(np.int32)
  offset = np.concatenate([np.arange(n) for r in lengths for n in r]).reshape(segment_ids.shape)
  batch = {'inputs': row[:, :-1], 'targets': row[:, 1:], 'segment_ids': segment_ids[:, :-1],
           'positions': offset[:, :-1].astype(np.int32), 'target_segment_ids': segment_ids[:, 1:]}
  nll_fn = restriction_lib.make_nll(model_def, RESTRICTIONS[restriction])
  nll, weights = restriction_lib.batch_nll(nll_fn, params, batch)

  alone_rows = _alone(np.pad(row, ((0, 0), (0, 1))), pieces)  # [documents, T + 2]: each document, then zeros.
  alone = restriction_lib.batch_nll(nll_fn, params, {'inputs': alone_rows[:, :T], 'targets': alone_rows[:, 1:T + 1]})
  own = []
  for i, (r, a, n) in enumerate(pieces):
    np.testing.assert_array_equal(weights[r, a:a + n - 1], 1)  # Every target inside the document counts ...
    if a + n - 1 < T:
      assert weights[r, a + n - 1] == 0  # ... and the next document's first token does not.
    assert _rel(nll[r, a:a + n - 1], alone[0][i, :n - 1]) <= TOLERANCE, f'document {i}'
    own.append(alone[0][i, :n - 1])
  metric = restriction_lib.loss_metric(nll_fn, params, [batch], buckets=2)
  assert metric['loss'] == pytest.approx(np.concatenate(own).mean(), rel=1e-5)


def test_gradient_influence_reads_the_last_document_only():
  """With documents kept apart the earlier documents of a row have no influence at all (0), and the last document's
  influence is what it has alone."""
  _, model_def, params = _model('gdn')
  lengths, last = (20, 28), 8
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, (1, sum(lengths))), jnp.int32)
  segment_ids = jnp.asarray(np.repeat([1, 2], lengths)[None], jnp.int32)
  fn = gradient_influence.make_gradient_norms(model_def, last=last)
  packed = np.asarray(fn(params, tokens, segment_ids=segment_ids))[0]
  alone = np.asarray(fn(params, tokens[:, lengths[0]:]))[0]
  assert np.all(packed[:lengths[0]] == 0)
  assert _rel(packed[lengths[0]:], alone) <= TOLERANCE
