"""compile-check's JSON rows read back: `plan --fit` and `sweep --fit` estimate TPU hours from them."""

import pathlib

from hybrid_jax import checks, readers
from hybrid_jax.errors import ConfigError

FIT_ROW_KEYS = ('target', 'arch', 'scale', 'seq_len', 'batch_size', 'chips')  # What a plan reads of every row.


def load(path, chip: str) -> dict:
  """(arch, scale, seq_len) -> compile-check row on `chip` (e.g. 'v5p') from a compile-check JSON file. Rows of MoE
  models (their `moe` entry; docs/TPU_FIT.json holds some beside the dense grid) are not their arch's dense step
  and are left out."""
  if not pathlib.Path(path).exists():
    raise ConfigError(f'--fit {path}: no such file (write one with compile-check --json)')
  checks.path(path, '--fit', kind='file')
  rows = readers.read_json(path, '--fit', expect=list, required=FIT_ROW_KEYS,
                           hint='expected a list of compile-check rows (compile-check --json)')
  chips = sorted({r['target'].partition(':')[0] for r in rows})
  if chip not in chips:
    raise ConfigError(f'--fit {path}: no rows for --chip {chip}; it has {", ".join(chips) or "none"}')
  return {(r['arch'], r['scale'], r['seq_len']): r for r in rows
          if r['target'].partition(':')[0] == chip and not r.get('moe')}
