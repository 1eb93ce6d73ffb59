"""scripts/tpu_fit_table.py: the committed docs/TPU_FIT.md is what its rows render to, and the at-a-glance matrix
says per chip whether each (arch, scale, context) fits, which change made it fit, or that it was not compiled."""

import importlib.util
import json
import re

import pytest

from tests.conftest import ROOT


def _script():
  spec = importlib.util.spec_from_file_location('tpu_fit_table', ROOT / 'scripts' / 'tpu_fit_table.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _without_date(text):
  return re.sub(r'Generated \d{4}-\d\d-\d\d', 'Generated DATE', text)


def test_the_committed_table_is_what_its_rows_render_to(tmp_path):
  out = tmp_path / 'TPU_FIT.md'
  (tmp_path / 'TPU_FIT.json').write_text((ROOT / 'docs' / 'TPU_FIT.json').read_text())
  _script().main(['--render-only', f'--out={out}'])
  assert _without_date(out.read_text()) == _without_date((ROOT / 'docs' / 'TPU_FIT.md').read_text())


def _row(arch, scale, target, fits, overrides=None, seq_len=16384):
  row = {'arch': arch, 'scale': scale, 'seq_len': seq_len, 'target': target, 'fits': fits}
  if fits is False:
    row['fix'] = {'overrides': overrides, 'change': 'the long text'} if overrides else {'tried': []}
  return row


def test_the_glance_matrix_gives_each_chip_its_verdict_in_the_study_order():
  script = _script()
  rows = [_row('gdn', 's2', 'v6e:2x4', False, {'train.grad_accum': 2}),
          _row('gdn', 's2', 'v5p:2x2x1', True),
          _row('full', 's5', 'v6e:4x8', False, {'train.grad_accum': 32, 'model.remat': 'full'}),
          _row('full', 's5', 'v5p:2x4x4', False),
          _row('full', 's5', 'v5p:2x4x4', True, seq_len=32768)]
  for row in rows:
    row['revision'] = script.REVISION
  rows[1]['revision'] = 1
  lines = script.glance(rows).splitlines()
  assert lines[2] == '| arch | S1 16K | S2 16K | S3 16K | S4 16K | S5 16K | S5 32K |'
  table = {line.split(' | ')[0].strip('| '): [c.strip() for c in line.strip('|').split('|')[1:]]
           for line in lines[4:]}
  assert list(table) == list(_hybrid_arches())
  assert table['gdn'][1] == 'yes* / grad_accum=2'  # The v5p row is of an older revision.
  assert table['full'][4] == 'no fit found / grad_accum=32, remat=full'
  assert table['full'][5] == 'yes / …'
  assert table['gdn'][0] == table['full'][0] == '… / …'


def test_the_detail_rows_are_ordered_by_context_scale_arch_and_chip():
  script = _script()
  rows = [_row('gdn', 's1', 'v6e:2x4', True), _row('full', 's5', 'v5p:2x4x4', True, seq_len=32768),
          _row('full', 's2', 'v5p:2x2x1', True), _row('gdn', 's1', 'v5p:2x2x1', True),
          _row('full', 's1', 'v6e:2x4', True)]
  ordered = [(r['seq_len'], r['scale'], r['arch'], r['target']) for r in sorted(rows, key=script._grid_order)]
  assert ordered == [(16384, 's1', 'full', 'v6e:2x4'), (16384, 's1', 'gdn', 'v5p:2x2x1'),
                     (16384, 's1', 'gdn', 'v6e:2x4'), (16384, 's2', 'full', 'v5p:2x2x1'),
                     (32768, 's5', 'full', 'v5p:2x4x4')]


def _hybrid_arches():
  from hybrid_jax.configs import hybrid
  return hybrid.ARCHES


def test_each_context_names_the_sequence_length_its_config_sets():
  from hybrid_jax.config import load_config_file, resolve_spec
  for context, (seq_len, context_args) in _script().CONTEXTS.items():
    config = load_config_file(resolve_spec(f'hybrid:arch=swa128,scale=s5{context_args}'))
    assert config.data.seq_len == seq_len, context


@pytest.mark.parametrize('flag, value', [('--contexts', '16384'), ('--archs', 'full,mamba3'), ('--scales', 's6'),
                                         ('--chips', 'v4')])
def test_an_unknown_list_item_is_named_with_the_allowed_ones(tmp_path, capsys, flag, value):
  with pytest.raises(SystemExit) as stopped:
    _script().main(['--out', str(tmp_path / 'FIT.md'), flag, value])
  assert stopped.value.code == 2
  bad = value.split(',')[-1]
  assert f"{flag}: '{bad}' not among" in capsys.readouterr().err
  assert not (tmp_path / 'FIT.json').exists()


def _compiled(arch, scale, target, revision=None):
  """A row as compile-check writes it, with every field the detail table shows (and a revision if given)."""
  row = dict(_row(arch, scale, target, True), chips=4, mesh={'data': 4, 'fsdp': 1, 'tensor': 1}, per_chip_batch=16,
             grad_accum=1, compile_s=1.0, per_device_bytes={'peak': 10**10}, hbm_bytes=95 * 10**9)
  return dict(row, revision=revision) if revision else row


def test_a_run_compiles_missing_and_older_rows_and_keeps_current_ones(tmp_path, monkeypatch):
  from hybrid_jax.compile_check import fit as compile_check
  script = _script()
  store = tmp_path / 'TPU_FIT.json'
  # A row from before revisions were recorded (revision 1) and one of the current revision.
  store.write_text(json.dumps([_compiled('full', 's1', 'v5p:2x2x1'),
                               _compiled('swa128', 's1', 'v5p:2x2x1', script.REVISION)]))
  args = ['--archs=full,swa128,gdn', '--scales=s1', '--chips=v5p', '--contexts=16k', f'--out={tmp_path}/TPU_FIT.md']
  script.main(['--render-only'] + args[-1:])
  page = (tmp_path / 'TPU_FIT.md').read_text()
  assert '| full | yes* / … |' in page and '| swa128 | yes / … |' in page and 'revision 1: ' in page
  compiled = []
  monkeypatch.setattr(compile_check, 'tpu_target', lambda topology: topology)
  monkeypatch.setattr(compile_check, 'check', lambda config, target: compiled.append(config.model.arch) or
                      _compiled(config.model.arch, config.model.scale, target))
  script.main(args)
  assert compiled == ['full', 'gdn']
  rows = json.loads(store.read_text())
  assert sorted((r['arch'], r['revision']) for r in rows) == [(a, script.REVISION) for a in ('full', 'gdn', 'swa128')]
  page = (tmp_path / 'TPU_FIT.md').read_text()
  assert '| full | yes / … |' in page and '*' not in page.split('Compiled at revision')[0].split('| arch |')[1]
  assert 'older revision' not in page
