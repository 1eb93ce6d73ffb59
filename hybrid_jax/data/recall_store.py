"""Recall documents generated once and read by every run that trains on them.

Why: the mini-study's arches of one seed train on the same recall documents in the same order, and generating a
document (numpy draws, a few hundred microseconds) was a tenth of the mini preset's CPU training step
(BENCHMARKS.md). A store holds the text of chosen documents of one split: `build` writes it, and a RecallSource
reads from it whenever the environment variable HYBRID_JAX_RECALL_STORE names the directory that holds it;
documents not in the store are generated as before. A store is named by a digest of the recall settings and the
split, so a source only ever reads a store of its own documents; the text is the generator's own output, so a run
trains on exactly the documents it would have generated.

File: `recall-<digest>.npz` with `indices` (int64, sorted, the documents' indices in the split), `texts` (uint8
[len(indices), length]: every recall or text document is exactly `length` ASCII characters) and `key` (the
settings and split it was built from).
"""

import concurrent.futures
import hashlib
import logging
import multiprocessing
import os
import pathlib
import uuid

import numpy as np

ENV = 'HYBRID_JAX_RECALL_STORE'
_PER_WORKER = 20_000  # Documents (about 6 s of generating) worth starting another process for.

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


def _texts(data_cfg, split: str, indices: np.ndarray) -> np.ndarray:
  """uint8 [len(indices), length]: the documents' text."""
  from hybrid_jax.data import recall  # pylint: disable=g-import-not-at-top  (recall imports this module)
  source = recall.RecallSource(data_cfg, split, use_store=False)
  length = source.settings.length
  out = np.empty((len(indices), length), np.uint8)
  for row, index in enumerate(indices):
    text = source[int(index)].encode('ascii')
    if len(text) != length:
      raise AssertionError(f'recall document {index} has {len(text)} characters, not {length}')
    out[row] = np.frombuffer(text, np.uint8)
  return out


def build(data_cfg, split: str, indices, directory, workers: int = 1) -> pathlib.Path:
  """Generates documents `indices` of `split` (a data config with source 'recall') into the store of its settings
  in `directory`, in `workers` processes, and returns the store's path. Documents an existing store already holds
  are kept, not generated again."""
  from hybrid_jax.data import recall  # pylint: disable=g-import-not-at-top
  settings = recall.settings(data_cfg)
  path = path_for(directory, settings, split)
  present = load(directory, settings, split) or Store(np.zeros(0, np.int64), np.zeros((0, settings.length), np.uint8))
  missing = np.setdiff1d(np.asarray(indices, np.int64), present.indices)
  if not len(missing):
    return path
  workers = min(workers, max(1, len(missing) // _PER_WORKER))
  if workers > 1:
    parts = np.array_split(missing, workers)
    context = multiprocessing.get_context('spawn')  # No fork of a process whose JAX runtime holds threads.
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
      new = np.concatenate(list(pool.map(_texts, [data_cfg] * workers, [split] * workers, parts)))
  else:
    new = _texts(data_cfg, split, missing)
  indices = np.concatenate([present.indices, missing])
  order = np.argsort(indices)
  indices, texts = indices[order], np.concatenate([present.texts, new])[order]
  path.parent.mkdir(parents=True, exist_ok=True)
  partial = path.with_name(f'.{path.stem}-{uuid.uuid4().hex}.npz')  # Readers never see half a file.
  np.savez(partial, key=np.asarray(key_of(settings, split)), indices=indices, texts=texts)
  os.replace(partial, path)
  return path
