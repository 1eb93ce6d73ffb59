"""MoE twins' compile-check rows beside the dense grid: compile-check names a twin (`gdn e8k2`, its `moe` entry),
scripts/tpu_fit_table.py --add merges such rows into docs/TPU_FIT.json and renders them in a section of their own
without touching the dense rows or the at-a-glance matrix, and `plan --fit` / `sweep --fit` read only dense rows."""

import json

from hybrid_jax.compile_check import fit, rows as rows_lib
from tests.test_tpu_fit_table import _script


def _row(arch='gdn', target='v5p:2x2x1', moe=None, peak=40e9, expert=1):
  mesh = {'data': 4 // expert, 'fsdp': 1, 'sequence': 1, 'tensor': 1, **({'expert': expert} if expert > 1 else {})}
  row = {'arch': arch, 'scale': 's1', 'seq_len': 16384, 'target': target, 'chips': 4, 'mesh': mesh,
         'batch_size': 64, 'per_chip_batch': 16.0, 'grad_accum': 1, 'compile_s': 80.0, 'fits': True,
         'per_device_bytes': {'peak': peak}, 'hbm_bytes': 95e9}
  if moe:
    row['moe'] = {'experts': 8, 'top_k': 2, 'expert_width': 479, 'layers': 10, 'implementation': 'gmm'}
  return row


def test_an_moe_row_names_its_experts_in_the_arch_cell():
  line = fit.table([_row(moe=True, expert=2)]).splitlines()[-1]
  assert line.startswith('| gdn e8k2 | s1 | 16384 | v5p:2x2x1 | 4 | 2/1/1/1, expert 2 |')
  assert fit.table([_row()]).splitlines()[-1].startswith('| gdn | s1 |')


def test_added_moe_rows_get_their_own_section_and_leave_the_dense_grid_alone(tmp_path):
  script = _script()
  out = tmp_path / 'TPU_FIT.md'
  dense = dict(_row(), revision=script.REVISION)
  out.with_suffix('.json').write_text(json.dumps([dense]))
  added = tmp_path / 'moe.json'
  added.write_text(json.dumps([_row(moe=True, expert=2, peak=50e9)]))
  script.main([f'--add={added}', f'--out={out}'])
  stored = json.loads(out.with_suffix('.json').read_text())
  assert [r.get('moe', {}).get('experts') for r in stored] == [None, 8]  # Same key but the twin: both kept.
  assert stored[1]['revision'] == script.REVISION
  text = out.read_text()
  assert 'This page holds 1 of the' in text and '| gdn | yes / … |' in text  # The glance: the dense row alone.
  twins = text[text.index('MoE twins'):]
  assert twins.count('| gdn e8k2 |') == 1 and '| gdn |' not in twins and '| 50.0 / 95.0 |' in twins
  script.main([f'--add={added}', f'--out={out}'])  # Added again: replaced, not repeated.
  assert len(json.loads(out.with_suffix('.json').read_text())) == 2
  chip_rows = rows_lib.load(out.with_suffix('.json'), 'v5p')  # What plan --fit reads: the dense row.
  assert list(chip_rows) == [('gdn', 's1', 16384)] and 'moe' not in chip_rows[('gdn', 's1', 16384)]
