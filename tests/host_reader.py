"""What one host of a multi-host run reads, run in its own process by tests (kept light: no TFDS import)."""

import numpy as np

from hybrid_jax.config import BASE_CONFIG, load_config_file
from hybrid_jax.data import pipeline

EOS = 256


def documents_read_by_host(args) -> set[str]:
  """The whole byte-tokenized documents host `index` of `count` reads from pretokenized `directory` in its first
  `batches` batches of 2 rows of 64 tokens."""
  directory, index, count, batches = args
  c = load_config_file(str(BASE_CONFIG))
  c.data.update(source='pretokenized', paths=directory, long_short_ratio=0.0, seq_len=64)
  c.train.batch_size = 2 * count
  it = iter(pipeline.make_train_dataset(c, process_index=index, process_count=count))
  rows = [np.concatenate([b['inputs'][r], b['targets'][r][-1:]]) for b in (next(it) for _ in range(batches))
          for r in range(2)]
  stream = np.concatenate(rows)
  cuts = np.flatnonzero(stream == EOS)
  return {stream[a + 1:b].astype(np.uint8).tobytes().decode() for a, b in zip(cuts[:-1], cuts[1:])}
