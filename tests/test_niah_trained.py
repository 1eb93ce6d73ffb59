"""A tiny model trained on short needle documents retrieves the needle better than chance (slow: trains ~1K steps).

Documents: filler words with one `key=DDDDDD.` needle at a random place, ending with the query `key=`; the model
must copy the six digits (distinct digits: an induction head can copy them one by one). Training goes through the real data pipeline
(files source) and trainer, evaluation through the run loader and greedy generation.
"""

import json
import random

import pytest

from hybrid_jax.train import runs
from hybrid_jax.eval import ruler
from hybrid_jax.eval.scoring import ModelScorer
from hybrid_jax import standard_hooks
from tests.conftest import small_config

WORDS = 'the grass is green sky blue sun yellow here we go there and back again'.split()


def needle_document(rng):
  value = ''.join(rng.sample('0123456789', 6))
  words = [rng.choice(WORDS) for _ in range(10)]
  words.insert(rng.randrange(len(words) + 1), f'key={value}.')
  return ' '.join(words) + ' key=', value


@pytest.mark.e2e
def test_trained_tiny_model_beats_chance_on_short_needles(tmp_path):
  rng = random.Random(0)
  data = tmp_path / 'needles.jsonl'
  data.write_text(''.join(json.dumps({'text': p + v + '.'}) + '\n' for p, v in (needle_document(rng)
                                                                                 for _ in range(4000))))
  c = small_config('full', d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=128, num_layers=2)
  c.data.update(dict(source='files', paths=str(data), seq_len=128))
  c.eval.documents = 0  # Every document is shorter than the context: no loss by position inside documents.
  c.train.update(dict(steps=1000, batch_size=32, warmup_steps=20, log_every=100, checkpoint_every=1000,
                      eval_every=0, lr=3e-3))
  standard_hooks.train(c, tmp_path / 'run')
  scorer = ModelScorer.from_run(runs.load_run(tmp_path / 'run'))
  held_out = [needle_document(random.Random(10_000 + i)) for i in range(100)]
  outputs = scorer.generate([p for p, _ in held_out], 6)
  score = ruler.string_match_all(outputs, [[v] for _, v in held_out])  # RULER's NIAH scoring, 0-100
  assert score > 30, (score, outputs[:5])  # chance: a 6-digit guess is right about once in 150,000
