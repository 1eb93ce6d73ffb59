"""The data section of a run config (config.data), checked by the layer that reads the data."""

from hybrid_jax import config_keys as keys
from hybrid_jax.data import recall

SOURCES = ('builtin', 'files', 'tfds', 'parquet', 'pretokenized', 'recall')
PACKINGS = ('documents', 'concat')


def validate(c) -> None:
  """Checks config.data of the run config `c`; ConfigError naming the first bad key."""
  d = c.data
  keys.positive_int(c, 'data.seq_len')
  keys.choice(c, 'data.source', SOURCES)
  keys.choice(c, 'data.packing', PACKINGS)
  if d.source in ('files', 'parquet') and not d.paths:
    keys.fail('data.paths', d.paths, f"must name files, directories or globs when data.source={d.source!r}")
  if d.source == 'pretokenized' and not d.paths:
    keys.fail('data.paths', d.paths, "must name a directory written by `pretokenize` when data.source='pretokenized'")
  if d.source == 'tfds' and not d.tfds_name:
    keys.fail('data.tfds_name', d.tfds_name, "must name a TFDS dataset when data.source='tfds'")
  if d.source == 'recall':
    recall.settings(d)
  else:  # Checked all the same: a bad value is a typo waiting for data.source=recall.
    recall.check_fields(d.recall)
  keys.number(c, 'data.worker_count', integer=True, nonnegative=True)  # 0 = in the main process.
  keys.nonnegative(c, 'data.long_short_ratio')
  keys.nonnegative(c, 'data.long_doc_min_tokens')
  if not 0 < keys.number(c, 'data.eval_fraction') < 1:
    keys.fail('data.eval_fraction', d.eval_fraction, 'must be strictly between 0 and 1')
