"""The during-training retrieval probe: config keys, and probe/* metrics logged by the training loop."""

import pytest

from hybrid_jax.analysis import callbacks
from hybrid_jax.config import ConfigError, validate
from hybrid_jax import standard_hooks
from hybrid_jax.train import metrics, state as state_lib
from tests.conftest import small_config


def test_probe_keys_are_validated():
  c = small_config()
  assert c.train.retrieval_probe_every == 0  # Off by default.
  for key, bad in (('retrieval_probe_every', -1), ('retrieval_probe_length', -2), ('retrieval_probe_samples', 0)):
    c = small_config()
    c.train[key] = bad
    with pytest.raises(ConfigError, match=key):
      validate(c)


@pytest.mark.e2e  # The mini-study smoke test (default suite) also checks probe metrics logged during training.
def test_training_logs_probe_metrics(tmp_path):
  c = small_config()
  c.train.update(steps=8, checkpoint_every=8, retrieval_probe_every=4, retrieval_probe_samples=2,
                 retrieval_probe_length=256)
  standard_hooks.train(c, tmp_path)
  probes = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['kind'] == 'probe']
  assert [r['step'] for r in probes] == [4, 8]
  for r in probes:
    assert 0 <= r['niah_accuracy'] <= 1 and 0 <= r['retrieval_top_score'] <= 1 and r['seconds'] > 0
    assert r['retrieval_top_layer'] == 1  # The only full-attention layer.
    assert {f'niah_accuracy_depth_{d}' for d in ('0.1', '0.5', '0.9')} <= set(r)


def test_probe_too_short_for_a_prompt_is_a_config_error():
  c = small_config()
  c.train.update(retrieval_probe_every=4)  # Length 0 = data.seq_len = 64 tokens: too short for a needle prompt.
  assert callbacks.make_retrieval_probe(small_config(), None) is None
  with pytest.raises(ConfigError, match='retrieval_probe_length'):
    callbacks.make_retrieval_probe(c, state_lib.make_model_def(c.model))
