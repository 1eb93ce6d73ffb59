"""Recall documents generated once and read by every run that trains on them.

Why: the mini-study's arches of one seed train on the same recall documents in the same order, and generating a
document (numpy draws, a few hundred microseconds) was a tenth of the mini preset's CPU training step
(docs/notebook/mini_study.md, "CPU: the mini-study's input generated once"). A store holds the text of chosen
documents of one split: `hybrid_jax.data.recall.build_store` writes it, and a RecallSource reads from it whenever
the environment variable HYBRID_JAX_RECALL_STORE names the directory that holds it; documents not in the store are
generated as before. A store is named by a digest of the recall settings and the
split, so a source only ever reads a store of its own documents; the text is the generator's own output, so a run
trains on exactly the documents it would have generated.

File: `recall-<digest>.npz` with `indices` (int64, sorted, the documents' indices in the split), `texts` (uint8
[len(indices), length]: every recall or text document is exactly `length` ASCII characters) and `key` (the
settings and split it was built from).
"""

import hashlib
import logging
import pathlib

import numpy as np

ENV = 'HYBRID_JAX_RECALL_STORE'
PER_WORKER = 20_000  # Documents (about 6 s of generating) worth starting another process for.

log = logging.getLogger(__name__)


def key_of(settings, split: str) -> str:
  return f'{settings!r} split={split}'


def path_for(directory, settings, split: str) -> pathlib.Path:
  digest = hashlib.sha256(key_of(settings, split).encode()).hexdigest()[:20]
  return pathlib.Path(directory) / f'recall-{digest}.npz'


class Store:
  """The stored documents of one store file: `get(index)` is the text, or None when the store does not hold it."""

  def __init__(self, indices: np.ndarray, texts: np.ndarray):
    self.indices, self.texts = indices, texts

  def get(self, index: int) -> str | None:
    j = int(np.searchsorted(self.indices, index))
    if j == len(self.indices) or self.indices[j] != index:
      return None
    return self.texts[j].tobytes().decode('ascii')


def load(directory, settings, split: str) -> Store | None:
  """The store of these settings and split in `directory`; None when there is none. A store that cannot be read,
  or whose recorded settings differ, is logged and left unused (the documents are generated instead)."""
  path = path_for(directory, settings, split)
  if not path.exists():
    return None
  try:
    with np.load(path, allow_pickle=False) as f:
      key, indices, texts = str(f['key']), f['indices'], f['texts']
  except (OSError, ValueError, KeyError) as e:
    log.warning('recall store %s is unreadable (%s); generating documents instead', path, e)
    return None
  if key != key_of(settings, split) or texts.shape != (len(indices), settings.length):
    log.warning('recall store %s was built for other settings (%s); generating documents instead', path, key)
    return None
  return Store(indices, texts)
