"""`analyze routing`: the routing statistics on hand-built assignments, the token groups of needle prompts, and the
routes of the inspection forward pass against the model's own router statistics."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.analysis import routing, routing_stats
from hybrid_jax.errors import InputError
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.models.model import HybridLM

from tests.conftest import small_config

E, K = 8, 2


def random_routes(rng, shape):
  """[..., K] distinct experts per token, uniform."""
  flat = np.stack([rng.choice(E, K, replace=False) for _ in range(int(np.prod(shape)))])
  return flat.reshape(*shape, K)


def masks(b, t):
  needle = np.zeros((b, t), bool)
  needle[:, 10:14] = True
  query = np.zeros((b, t), bool)
  query[:, t - 3:] = True
  return needle, query, ~(needle | query)


def test_load_and_distance_closed_forms():
  np.testing.assert_allclose(routing_stats.load(np.array([[0, 1], [1, 3]]), 4), [0.25, 0.5, 0, 0.25])
  assert routing_stats.total_variation([0.5, 0.5, 0], [0, 0.5, 0.5]) == pytest.approx(0.5)
  # Overlap: per (query, other) pair, the share of the query's experts the other also uses.
  assert routing_stats.overlap(np.array([[0, 1]]), np.array([[1, 2], [0, 1], [5, 6]])) == pytest.approx(
      (0.5 + 1.0 + 0.0) / 3)


def test_a_needle_routed_apart_is_beyond_chance_and_a_random_one_is_not():
  rng = np.random.default_rng(0)
  b, t = 6, 64
  experts = random_routes(rng, (b, t))
  needle, query, control = masks(b, t)
  apart = experts.copy()
  apart[needle] = [3, 5]
  apart[query] = [3, 6]
  got = routing_stats.layer_statistics(apart, needle, query, control, E)
  control_load = routing_stats.load(apart[control], E)
  want_needle = np.zeros(E)
  want_needle[[3, 5]] = 0.5
  np.testing.assert_allclose(got['needle']['load'], want_needle)
  assert got['needle']['tv'] == pytest.approx(routing_stats.total_variation(want_needle, control_load))
  assert got['needle']['tv'] > 2 * got['needle']['null_p95']
  assert got['overlap']['query_needle'] == pytest.approx(0.5)  # Expert 3 of the query's two, at every needle token.
  assert got['overlap']['query_control'] < 0.4  # Uniform control: 2 of 8 experts, about 0.25.
  assert got['needle']['tokens'] == b * 4 and got['query']['tokens'] == b * 3
  plain = routing_stats.layer_statistics(experts, needle, query, control, E)
  assert plain['needle']['tv'] <= plain['needle']['null_p95'] and plain['query']['tv'] <= plain['query']['null_p95']


def test_routing_by_token_identity_is_told_from_routing_by_role():
  """Experts chosen by token id alone: the needle is far from the control (other ids) but within chance of its own
  ids elsewhere in the row; a needle routed by its role is far from both."""
  rng = np.random.default_rng(1)
  b, t = 6, 64
  tokens = rng.integers(0, 6, (b, t))
  needle, query, control = masks(b, t)
  tokens[needle] = 7  # The needle's id, which also occurs in the control.
  tokens[:, 30:36] = 7
  table = np.stack([rng.choice(E, K, replace=False) for _ in range(8)])
  by_id = table[tokens]
  twins = routing.same_tokens(tokens, needle, control)
  assert twins.sum() == b * 6 and not (twins & needle).any()
  got = routing_stats.layer_statistics(by_id, needle, query, control, E, same_tokens=twins)['needle']
  assert got['tv'] > 2 * got['null_p95'] and got['same_tokens'] == b * 6
  assert got['tv_same_tokens'] <= got['same_tokens_null_p95']
  by_role = by_id.copy()
  by_role[needle] = [k for k in range(E) if k not in table[7]][:K]
  got = routing_stats.layer_statistics(by_role, needle, query, control, E, same_tokens=twins)['needle']
  assert got['tv_same_tokens'] > 2 * got['same_tokens_null_p95'] > 0


def test_overlaps_pair_tokens_within_their_own_row():
  """Row 0's query shares its experts with row 0's needle only: pairing across rows would dilute the overlap."""
  b, t = 2, 32
  needle, query, control = masks(b, t)
  experts = np.zeros((b, t, K), int)
  experts[..., 1] = 7
  experts[0][needle[0]] = [1, 2]
  experts[0][query[0]] = [1, 2]
  experts[1][needle[1]] = [3, 4]
  experts[1][query[1]] = [3, 4]
  got = routing_stats.layer_statistics(experts, needle, query, control, E, draws=10)
  assert got['overlap']['query_needle'] == pytest.approx(1.0)
  assert got['overlap']['query_control'] == pytest.approx(0.0)


def test_groups_of_a_needle_batch():
  batch = {'tokens': np.zeros((2, 16), np.int32), 'prompt_len': np.array([10, 12]), 'answer_len': np.array([2, 3]),
           'needle': np.array([[3, 4, 0], [5, 6, 7]]), 'needle_valid': np.array([[True, True, False], [True] * 3])}
  needle, query, control = routing.groups(batch)
  assert np.flatnonzero(needle[0]).tolist() == [3, 4] and np.flatnonzero(needle[1]).tolist() == [5, 6, 7]
  assert np.flatnonzero(query[0]).tolist() == [9, 10] and np.flatnonzero(query[1]).tolist() == [11, 12, 13]
  assert np.flatnonzero(control[0]).tolist() == [0, 1, 2, 5, 6, 7, 8]  # The prompt before the query, not padding.
  assert not (needle & query).any() and not (needle & control).any() and not (query & control).any()


def moe_config(layout, **moe):
  cfg = small_config('swa128').model
  if layout == 'blocks':
    cfg.moe.update(dict(blocks='all'))
  else:  # MoE layers of their own between the attention layers (Nemotron 3's 'E').
    cfg.update(dict(block_mlp=False, cycle=('swa', 'moe')))
  cfg.moe.update(dict(num_experts=E, top_k=K, **moe))
  return cfg


@pytest.mark.parametrize('layout, moe', [('blocks', dict()), ('layers', dict(router='sigmoid', n_group=2))])
def test_the_forward_passes_routes_are_the_models_own(layout, moe):
  """Aggregated over every token, the inspection forward's routes give each layer's load exactly as the model's
  training forward counts it (moe_routing.statistics), and the logits are unchanged by asking for routes."""
  cfg = moe_config(layout, **moe)
  graphdef, params = nnx.split(HybridLM(cfg, rngs=nnx.Rngs(0)))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 64)), jnp.int32)

  @jax.jit
  def run(p):
    model = nnx.merge(graphdef, p)
    out = forward_lib.forward(model, tokens, routes=True)
    stats = model.stats_by_layer(model.hidden_states_with_stats(tokens)[1])
    return out, stats, forward_lib.forward(model, tokens)['logits']

  out, by_layer, plain = run(params)
  moe_layers = [i for i in range(cfg.num_layers) if layout == 'blocks' or i % 2]
  assert sorted(out['routes']) == sorted(by_layer) == moe_layers
  for layer, experts in out['routes'].items():
    assert experts.shape == (2, 64, K)
    np.testing.assert_allclose(routing_stats.load(np.asarray(experts), E), np.asarray(by_layer[layer]['load']),
                               atol=1e-7)
  np.testing.assert_allclose(out['logits'], plain, rtol=1e-6)


def test_a_dense_model_is_refused_in_one_line():
  with pytest.raises(InputError, match='mixture-of-experts') as e:
    routing.score(None, small_config('swa128').model, None, [], None)
  assert '\n' not in str(e.value)


@pytest.mark.e2e
def test_every_analysis_runs_on_a_trained_moe_run(tmp_path):
  """`analyze routing` writes every MoE layer's groups and its plot; the other analyses run on the same MoE run."""
  from hybrid_jax import standard_hooks
  from hybrid_jax.commands import analyze
  c = small_config('gdn')
  c.model.moe.update(dict(blocks='all', num_experts=E, top_k=K))
  c.train.update(dict(steps=4, checkpoint_every=2))
  run = tmp_path / 'run'
  standard_hooks.train(c, run)
  needle = ['--source', 'study', '--samples', '4', '--length', '256', '--no-progress']
  assert analyze.main(['routing', '--workdir', str(run), *needle, '--draws', '20']) == 0
  result = json.loads((run / 'analysis' / 'routing.json').read_text())
  assert [row['index'] for row in result['layers']] == list(range(c.model.num_layers))
  for row in result['layers']:
    for name in ('needle', 'query', 'control'):
      assert row[name]['tokens'] > 0 and sum(row[name]['load']) == pytest.approx(1.0)
    assert 0 <= row['needle']['tv'] <= 1 and row['needle']['null_mean'] <= row['needle']['null_p95']
  assert (run / 'analysis' / 'routing.png').stat().st_size > 0
  for args in (['retrieval-heads', *needle], ['tracing', *needle],
               ['restriction', '--windows', '16', '--metrics', 'loss', '--batches', '1', '--seq-len', '64',
                '--no-progress'],
               ['probing', '--samples', '40', '--length', '256', '--no-progress'],
               ['gradient-influence', '--context', '32', '--samples', '2', '--last', '4', '--no-progress']):
    assert analyze.main([args[0], '--workdir', str(run), *args[1:]]) == 0, args[0]
