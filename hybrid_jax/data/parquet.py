"""Local parquet shards (the on-disk format of Hugging Face datasets) as a random-access document source.

One document per row of a string column. The index is built from parquet metadata alone (row counts per row
group), so opening a corpus reads no text. Reads decode whole row groups (the unit parquet compresses) and keep the
last few per process, so reading in index order (pretokenize, held-out evaluation) decodes each row group once;
a global shuffle over a large corpus decodes a row group per document, which is what `pretokenize` avoids.

grain's own parquet reader (`grain.experimental.ParquetIterDataset`) only iterates rows in order, so it cannot give
the pipeline's global shuffle, index-based host sharding and exact resume; this source is a plain `len` /
`[i]` data source and gets all three from the pipeline, as every other source does. The train/eval split is the
same stable hash split as the 'files' source, of each row's identity '<file identity>:<row number>'.
"""

import collections

import numpy as np

from hybrid_jax.errors import ConfigError
from hybrid_jax.data import sources

PARQUET_SUFFIXES = ('.parquet',)
_CACHED_ROW_GROUPS = 4


def _row_groups(path: str, text_field: str) -> list[int]:
  """Rows per row group of `path`; ConfigError naming the file when `text_field` is not a string column."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  try:
    meta = pq.ParquetFile(path)
  except (pa.ArrowException, OSError) as e:
    raise sources.DataError(f'{path}: not a readable parquet file ({e})') from e
  schema = meta.schema_arrow
  if text_field not in schema.names:
    raise ConfigError(f'config.data.text_field={text_field!r} is invalid for {path}: no such column (columns: '
                      f'{schema.names})')
  kind = schema.field(text_field).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
    raise ConfigError(f'config.data.text_field={text_field!r} is invalid for {path}: the column holds {kind}, '
                      'not strings')
  return [meta.metadata.row_group(g).num_rows for g in range(meta.num_row_groups)]


class ParquetSource:
  """Rows of `text_field` in local parquet files named by `paths` (comma-separated files, directories, globs)."""

  def __init__(self, paths: str, split: str, eval_fraction: float, text_field: str = 'text'):
    self.paths_spec, self.split, self.text_field = str(paths), split, text_field
    self.eval_fraction = float(eval_fraction)
    self.files = sources.resolve_paths(paths, PARQUET_SUFFIXES)
    rows, identities = [], []  # rows: [file index, row group, row in group] per block of rows.
    for file_index, (path, identity) in enumerate(self.files):
      base = 0  # Row number within the file: the identity does not depend on how rows are grouped.
      for group, count in enumerate(_row_groups(path, text_field)):
        in_group = np.arange(count, dtype=np.int64)
        rows.append(np.stack([np.full(count, file_index), np.full(count, group), in_group], axis=1))
        identities.extend(f'{identity}:{base + i}' for i in range(count))
        base += count
    if not identities:
      raise sources.DataError(f'config.data.paths={paths!r}: the parquet files hold no rows')
    keep = sources.split_by_hash(identities, self.eval_fraction, split)
    self._index = np.concatenate(rows)[keep]
    self._cache = collections.OrderedDict()

  def __len__(self):
    return len(self._index)

  def _texts(self, file_index: int, group: int) -> list:
    key = (file_index, group)
    texts = self._cache.get(key)
    if texts is None:
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
      path = self.files[file_index][0]
      try:
        table = pq.ParquetFile(path).read_row_group(group, columns=[self.text_field])
      except Exception as e:  # pyarrow raises ArrowInvalid / OSError / ... for a damaged file.
        raise sources.DataError(f'{path}: row group {group} cannot be read ({type(e).__name__}: {e})') from e
      texts = table.column(0).to_pylist()
      self._cache[key] = texts
      while len(self._cache) > _CACHED_ROW_GROUPS:
        self._cache.popitem(last=False)
    else:
      self._cache.move_to_end(key)
    return texts

  def __getitem__(self, index: int) -> str:
    file_index, group, row = (int(x) for x in self._index[index])
    return self._texts(file_index, group)[row] or ''  # A null cell is an empty document (dropped by the pipeline).

  def __getstate__(self):
    state = dict(self.__dict__)
    state['_cache'] = collections.OrderedDict()
    return state

  def __repr__(self):
    return (f'ParquetSource(paths={self.paths_spec!r}, split={self.split!r}, eval_fraction={self.eval_fraction!r}, '
            f'text_field={self.text_field!r}, files={len(self.files)}, documents={len(self)})')
