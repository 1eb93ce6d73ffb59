"""Every kind of document source by its `data.source` name: the one place that opens a source from a data config
(text sources in sources.py, parquet.py; token shards in pretokenized.py; the synthetic recall task in recall.py)."""

from hybrid_jax.data import parquet, pretokenized, recall, sources
from hybrid_jax.errors import ConfigError


def make_source(data_cfg, split: str):
  """The document source for `split` ('train' or 'eval') that `data_cfg.source` names."""
  if split not in ('train', 'eval'):
    raise ValueError(f"split={split!r} is invalid: use 'train' or 'eval'")
  kind = data_cfg.source
  if kind == 'builtin':
    return sources.BuiltinSource(split, data_cfg.eval_fraction)
  if kind == 'files':
    return sources.FilesSource(data_cfg.paths, split, data_cfg.eval_fraction, data_cfg.text_field)
  if kind == 'tfds':
    if not data_cfg.tfds_name:
      raise ConfigError("config.data.tfds_name='' is invalid: must name a TFDS dataset when data.source='tfds'")
    tfds_split = data_cfg.tfds_train_split if split == 'train' else data_cfg.tfds_eval_split
    return sources.TfdsSource(data_cfg.tfds_name, tfds_split, data_cfg.tfds_data_dir, data_cfg.text_field)
  if kind == 'parquet':
    return parquet.ParquetSource(data_cfg.paths, split, data_cfg.eval_fraction, data_cfg.text_field)
  if kind == 'pretokenized':
    return pretokenized.PretokenizedSource(data_cfg.paths, split, data_cfg.tokenizer)
  if kind == 'recall':
    return recall.RecallSource(data_cfg, split)
  raise ConfigError(f"config.data.source={kind!r} is invalid: allowed: builtin, files, tfds, parquet, pretokenized, "
                    'recall')
