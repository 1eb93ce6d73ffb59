"""Turn local .txt/.jsonl(.gz) files into a TFDS dataset in ArrayRecord format, readable by `tfds.data_source`.

Why: the 'files' source scans and indexes its files at every start and keeps gzipped files decompressed in memory;
an ArrayRecord dataset is built once, is random-access on disk and reads without TensorFlow, like any TFDS corpus.

Documents follow the 'files' source rules exactly (same reader: `sources.iter_documents`), and the
'train'/'validation' split is the same stable hash split (`sources.split_by_hash`, fraction `eval_fraction`).
Writing needs no TensorFlow: with `file_format='array_record'` TFDS serializes examples with its own protobuf code
and writes through the `array_record` module. Each distinct input (file list, sizes, modification times, text field,
eval fraction) gets its own builder config, so a changed corpus is rebuilt instead of silently reused.

    name = build_local_tfds('corpus/*.jsonl', '/data/tfds')
    # then: --config.data.source=tfds --config.data.tfds_name=<name> --config.data.tfds_data_dir=/data/tfds
"""

import hashlib
import json
import os

import tensorflow_datasets as tfds

from hybrid_jax import checks
from hybrid_jax.data import sources
from hybrid_jax.errors import InputError

NAME = 'hybrid_jax_local_files'


class LocalFilesConfig(tfds.core.BuilderConfig):
  """Which files to read; `name` is a digest of them (see `_config_name`)."""

  def __init__(self, *, paths: str, eval_fraction: float, text_field: str, **kwargs):
    super().__init__(**kwargs)
    self.paths, self.eval_fraction, self.text_field = paths, eval_fraction, text_field


# skip_registration: reads always go through the files on disk (the config is not known to a fresh process).
class LocalFilesBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Local text documents with a 'text' feature (and 'id', the document's stable identity)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Local .txt / .jsonl(.gz) files, hash-based train/validation split.'}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=f'Local files {self.builder_config.paths!r} (text field {self.builder_config.text_field!r}).',
        features=tfds.features.FeaturesDict({'text': tfds.features.Text(), 'id': tfds.features.Text()}),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    cfg = self.builder_config
    files = sources.resolve_paths(cfg.paths)
    undecodable = sources.UndecodableDocuments(f'build-tfds {cfg.paths!r}')
    identities = []
    for doc in sources.iter_documents(files, cfg.text_field):
      identities.append(doc.identity)
      if not doc.utf8:
        undecodable.identities.add(doc.identity)
    if not identities:
      raise sources.DataError(f'{cfg.paths!r}: every document is empty or whitespace-only')
    undecodable.report_scan(len(identities))  # The dataset stores their U+FFFD text; say so once, here.
    eval_keys = {identities[i] for i in sources.split_by_hash(identities, cfg.eval_fraction, 'eval')}
    return {
        'train': self._generate_examples(files, eval_keys, held_out=False),
        'validation': self._generate_examples(files, eval_keys, held_out=True),
    }

  def _generate_examples(self, files, eval_keys, held_out: bool):
    for doc in sources.iter_documents(files, self.builder_config.text_field):
      if (doc.identity in eval_keys) == held_out:
        yield f'{doc.file_index}:{doc.start}', {'text': doc.text, 'id': doc.identity}


def _config_name(files, eval_fraction: float, text_field: str) -> str:
  stats = [(path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path, _ in files]
  blob = json.dumps([stats, float(eval_fraction), text_field]).encode()
  return 'c' + hashlib.blake2b(blob, digest_size=8).hexdigest()


def build_local_tfds(paths: str, data_dir: str, eval_fraction: float = 0.02, text_field: str = 'text') -> str:
  """Builds (or reuses) the ArrayRecord dataset under `data_dir`; returns the name for config.data.tfds_name."""
  if not 0 < checks.number(eval_fraction, '--eval-fraction', positive=True) < 1:
    raise InputError(f'--eval-fraction={eval_fraction!r} is invalid: must be strictly between 0 and 1')
  files = sources.resolve_paths(paths)
  config = LocalFilesConfig(name=_config_name(files, eval_fraction, text_field), paths=paths,
                            eval_fraction=eval_fraction, text_field=text_field,
                            version=LocalFilesBuilder.VERSION, description='local files')
  builder = LocalFilesBuilder(config=config, data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return f'{NAME}/{config.name}'
