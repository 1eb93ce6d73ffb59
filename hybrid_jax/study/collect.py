"""Results collection: one table row per run directory (`python -m hybrid_jax collect RUN_DIRS... --out FILE.tsv`).

A row carries the run's arch, scale, N (non-embedding parameters), D (tokens trained) and the study's
`token_multiplier` (D/N as '200.110938n', the released data's format, so `python -m hybrid_jax fit` reads it),
then every final metric found: held-out loss over packed rows (report.json's packed_loss, column `loss`), and
from `eval/<task>.json` the ppl task's loss over whole held-out documents (`ppl_loss_<L>`) and over packed rows
(`ppl_packed_loss_<L>`), LongPPL, RULER (average and NIAH sub-average), NIAH grid average and LongBench, one column
per context length. A metric a run lacks is an empty cell. `config_changed` flags a run whose training settings a
resume changed ('train.lr@13': from step 13 on; empty when the run trained as configured throughout).
"""

import csv
import pathlib

from hybrid_jax import readers
from hybrid_jax.train import runs as runs_lib
from hybrid_jax.models.counting import param_counts
from hybrid_jax.train import config_history

FIXED_COLUMNS = ('run', 'arch', 'scale', 'model_size', 'n', 'tokens', 'token_multiplier', 'steps', 'status',
                 'config_changed', 'loss')

# task -> (per-context result key -> column prefix)
_EVAL_COLUMNS = {
    'ppl': {'loss': 'ppl_loss', 'packed_loss': 'ppl_packed_loss'},
    'longppl': {'longppl': 'longppl', 'ppl': 'longppl_ppl'},
    'ruler': {'average': 'ruler', 'niah_average': 'ruler_niah'},
    'longbench': {'plain_mean': 'longbench'},
}


def _read_json(path: pathlib.Path, required=()) -> dict:
  return readers.read_json(path, 'run record', required=required)


def _packed_loss(final_eval: dict):
  """The held-out loss over packed rows; reports written before loss by position moved to whole documents call it
  'loss'."""
  return final_eval.get('packed_loss', final_eval.get('loss', ''))


def collect_run(workdir) -> dict:
  """The row of one run directory (needs config.json and report.json)."""
  workdir = pathlib.Path(workdir)
  config = runs_lib.load_config(workdir)
  report_path = workdir / 'report.json'
  if not report_path.is_file():
    raise runs_lib.RunError(f'{workdir} has no report.json (is the run finished? `python -m hybrid_jax train` '
                            'writes it at the end)')
  report = _read_json(report_path, ('steps', 'batch_size', 'seq_len'))
  n = param_counts(config.model)['non_embedding']
  tokens = int(report['steps']) * int(report['batch_size']) * int(report['seq_len'])
  row = {'run': workdir.name, 'arch': config.model.arch, 'scale': config.model.scale, 'n': n,
         'model_size': config.model.scale.upper(), 'tokens': tokens, 'token_multiplier': f'{tokens / n:.9g}n',
         'steps': report['steps'], 'status': report.get('status', ''),
         'loss': _packed_loss(report.get('eval') or {}),
         'config_changed': config_history.training_changes(config_history.read_sessions(workdir))}
  eval_dir = workdir / 'eval'
  for task, keys in _EVAL_COLUMNS.items():
    path = eval_dir / f'{task}.json'
    if path.is_file():
      for length, result in _read_json(path, ('by_context',))['by_context'].items():
        for key, prefix in keys.items():
          if key in result:
            row[f'{prefix}_{length}'] = result[key]
  niah_path = eval_dir / 'niah.json'
  if niah_path.is_file():
    for length, value in _read_json(niah_path, ('by_context',))['by_context'].items():
      row[f'niah_{length}'] = value
  return row


def _context_sort_key(column: str):
  prefix, _, length = column.rpartition('_')
  return (prefix, int(length)) if length.isdigit() else (column, 0)


def collect(workdirs) -> list[dict]:
  if not workdirs:
    raise runs_lib.RunError('no run directories given')
  return [collect_run(w) for w in workdirs]


def write_table(rows: list[dict], path) -> list[str]:
  """Writes rows as TSV (fixed columns first, then metric columns sorted by name and context); returns columns."""
  extra = sorted({k for r in rows for k in r} - set(FIXED_COLUMNS), key=_context_sort_key)
  columns = list(FIXED_COLUMNS) + extra
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, columns, delimiter='\t', restval='', lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
  return columns
