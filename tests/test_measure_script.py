"""scripts/device/measure.sh end to end in its dry-run mode (CPU, interpret mode, tiny shapes), and the summary and
choice tables it ends with. Nothing here asserts a time: only that every phase ran, reported what it measured, and
that the summary names every row the call was to measure beside its target."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(pathlib.Path(ROOT) / 'scripts' / 'device'))
import kernels  # pylint: disable=wrong-import-position
import summary  # pylint: disable=wrong-import-position

FILES = {'env.txt', 'measure.log', 'scans.json', 'attention.json', 'moe.json', 'step.json', 'choices.json',
         'summary.md'}


def _dry_run(tmp_path, step_runs=None, **env_vars):
  out = tmp_path / 'out'
  env = dict(os.environ, DRY_RUN='1', OUT=str(out), PYTHON=sys.executable, PYTHONPATH=str(ROOT), **env_vars)
  if step_runs is not None:
    env['STEP_RUNS'] = step_runs
  done = subprocess.run(['bash', 'scripts/device/measure.sh'], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=3600, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert {p.name for p in out.iterdir()} == FILES  # At most 8 files come back from the device.
  return out, done.stdout


def _check_kernels(out):
  scans = json.loads((out / 'scans.json').read_text())
  rows = scans['rows']
  want = [(form, shape.name, documents, impl) for form, shape, documents, impls in kernels.scan_cases(True)
          for impl in impls]
  assert [(r['form'], r['shape'], r['documents'], r['impl'].split(':')[0]) for r in rows] == want
  ours = [r for r in rows if not r['impl'].startswith('fla')]
  assert {r['impl'] for r in ours} == {'pallas_gpu', 'xla'}  # One Pallas row (interpret mode), XLA for the rest.
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 and r['compile_s'] > 0 for r in ours)
  assert all('error' in r for r in rows if r['impl'].startswith('fla'))  # No torch/fla, no GPU here.
  assert len(scans['parity']) == 2 and all(r['ok'] for r in scans['parity'])
  attention = json.loads((out / 'attention.json').read_text())
  rows = attention['rows']
  assert [(r['shape'], r['window'], r['documents'], r['impl']) for r in rows] == [
      (s.name, w, d, i) for s, w, d, i in kernels.attention_cases(True)]
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 for r in rows)
  unmasked = {(r['shape'], r['window']): r['pairs'] for r in rows if r['documents'] is None}
  assert all(r['pairs'] < unmasked[r['shape'], r['window']] for r in rows if r['documents'])  # A document's own.
  assert attention['documents_parity'] and all(r['ok'] for r in attention['documents_parity'])


def _check_summary(out, step_runs):
  text = (out / 'summary.md').read_text()
  scans = summary._load(out / 'scans.json')  # pylint: disable=protected-access
  attention = summary._load(out / 'attention.json')  # pylint: disable=protected-access
  names = [row[0] for row in summary.scan_rows(scans, True) + summary.attention_rows(attention, True)
           + summary.step_rows(None, step_runs.split(), True)]
  lines = [line for line in text.splitlines() if line.startswith('| ') and not line.startswith(('| row', '| ---'))]
  assert [line.split(' | ')[0][2:] for line in lines] == names  # Every row, in order, each with its target.
  steps_ = [line for line in lines if 'MFU (' in line]
  assert all(line.split(' | ')[2] for line in steps_ if ' full ' in line or ' gdn ' in line)  # Their targets.
  assert all('s/step' in line and 'no MFU: no bf16 peak for cpu' in line for line in steps_)  # Ran; CPU has no peak.
  assert '| scan parity cases passed | 2/2 | all | met |' in text
  assert '| attention documents parity cases passed | 1/1 | all | met |' in text
  # Measured attention rows are ratios beside 0.9; the fla rows say why nothing was compared.
  assert all(' | >= 0.9 | ' in line and 'not measured' not in line for line in lines if 'attention documents vs' in line)
  assert all('fla' in line.split(' | ')[3] for line in lines if 'vs fla' in line)
  choices = json.loads((out / 'choices.json').read_text())
  assert [bound for bound, _ in choices['attention']['_GPU_BY_WINDOW']] == [128, 512, 2048, None]
  assert set(choices['scans']['GPU_MEASURED_CHOICE']) == {'linear_scan', 'gated_delta_rule'}


@pytest.mark.e2e
def test_dry_run_measures_every_phase_and_every_step_run(tmp_path):
  """Every phase, and the default twelve step runs; their steps get a longer box than the device's (a CPU compiles
  a GDN step slowly)."""
  out, stdout = _dry_run(tmp_path, STEPS_S='500', BUDGET_S='3000')
  _check_kernels(out)
  moe = json.loads((out / 'moe.json').read_text())
  assert moe and all('error' not in r for r in moe['rows']), moe
  runs = json.loads((out / 'step.json').read_text())
  default = summary.DEFAULT_STEP_RUNS.split()
  assert [r['run'] for r in runs] == default and len(default) == 12
  assert all(r['step']['step_s_median'] > 0 for r in runs)
  assert [(r['config']['arch'], r['config']['packing']) for r in runs] == [
      (name.removesuffix('_concat'), 'concat' if name.endswith('_concat') else 'documents') for name in default]
  assert all(r['config']['documents'] == 8 for r in runs if r['config']['packing'] == 'documents')  # seq_len // 4.
  _check_summary(out, summary.DEFAULT_STEP_RUNS)
  assert 'done; files:' in stdout and '| step gdn concat MFU (TINY 32 x 2) |' in stdout  # The summary, printed.


def _scan_row(form, shape, impl, ms, documents=None):
  return dict(form=form, shape=shape, T=32768 if shape.startswith('anchor') else 16384, documents=documents,
              impl=impl, fwd_bwd_ms=ms)


def test_summary_compares_each_measure_with_its_target(tmp_path):
  scans = [_scan_row('gdn', 'anchor 16 heads', 'pallas_gpu', 2.0),
           _scan_row('gdn', 'anchor 16 heads', 'fla:chunk_gated_delta_rule', 3.0),
           _scan_row('gdn', 's4', 'pallas_gpu', 2.0), _scan_row('gdn', 's4', 'xla', 1.6),
           _scan_row('gdn', 's4', 'fla:chunk_gated_delta_rule', 1.2),
           _scan_row('mamba2', 's4', 'pallas_gpu', 1.0), _scan_row('mamba2', 's4', 'xla', 2.0),
           dict(_scan_row('mamba2', 's4', 'fla:chunk_simple_gla', None), error='RuntimeError: no\nmore'),
           _scan_row('lightning', 's4', 'pallas_gpu', 1.0), _scan_row('lightning', 's4', 'xla', 1.5)]
  parity = [dict(kernel='linear_scan', impl='pallas_gpu', ok=True), dict(kernel='gated_delta_rule', impl='None',
                                                                          ok=False)]
  (tmp_path / 'scans.json').write_text(json.dumps({'rows': scans, 'parity': parity}))
  attention = [dict(shape='s4', T=16384, window=128, documents=None, impl='cudnn', fwd_bwd_ms=1.0),
               dict(shape='s4', T=16384, window=128, documents=4096, impl='cudnn', fwd_bwd_ms=1.25, ran='pallas_gpu'),
               dict(shape='s4', T=16384, window=128, documents=4096, impl='pallas_gpu', fwd_bwd_ms=1.2),
               dict(shape='s4', T=16384, window=None, documents=None, impl='cudnn', fwd_bwd_ms=4.0),
               dict(shape='s4', T=16384, window=None, documents=4096, impl='cudnn', fwd_bwd_ms=2.0),
               dict(shape='s4', T=16384, window=None, documents=4096, impl='pallas_gpu', error='Boom')]
  (tmp_path / 'attention.json').write_text(json.dumps({'rows': attention, 'documents_parity': [{'ok': True}]}))
  (tmp_path / 'step.json').write_text(json.dumps([
      {'run': 'full', 'step': {'mfu': 0.31, 'step_s_median': 1.0, 'tokens_per_s': 131072}},
      {'run': 'gdn_concat', 'step': {'mfu': 0.36, 'step_s_median': 1.0, 'tokens_per_s': 131072}},
      {'run': 'swa128_nope', 'error': 'skipped: the deadline of 150 s had passed'},
      {'run': 'mamba2', 'step': {'mfu': 0.2, 'step_s_median': 1.0, 'tokens_per_s': 131072}}]))
  lines = set(summary.summary(tmp_path).splitlines())
  gdn_s4 = 'GDN fwd+bwd vs fla chunk_gated_delta_rule, s4, 2 x 16K, 7/7 heads, K 32 V 64'
  assert (f'| GDN fwd+bwd vs fla chunk_gated_delta_rule, anchor 16 heads, 1 x 32K, 16/16 heads, K 128 V 128 | 1.50 | '
          '>= 1.0 | met (pallas_gpu 2.000 ms, fla 3.000 ms) |') in lines
  assert f'| {gdn_s4} | 0.75 | >= 1.0 | missed (xla 1.600 ms, fla 1.200 ms) |' in lines  # Our faster one.
  assert ('| Mamba-2 fwd+bwd vs fla chunk_simple_gla, s4, 2 x 16K, 8/1 heads, K 128 V 64 | not measured | >= 1.0 | '
          'fla error: RuntimeError: no |') in lines
  assert f'| {gdn_s4}, documents of 4096 | not measured | >= 1.0 |  |' in lines
  assert '| scan parity cases passed | 1/2 | all | missed |' in lines
  assert ('| attention documents vs cuDNN unmasked, w128, s4, 2 x 16K, 12/2 heads, K 64 V 64 | 0.83 | >= 0.9 | '
          'missed (pallas_gpu 1.200 ms, unmasked cudnn 1.000 ms) |') in lines
  assert ('| attention documents vs cuDNN unmasked, wfull, s4, 2 x 16K, 12/2 heads, K 64 V 64 | 2.00 | >= 0.9 | '
          'met (cudnn 2.000 ms, unmasked cudnn 4.000 ms) |') in lines
  assert '| attention documents vs cuDNN unmasked, w128, s4, 1 x 32K, 12/2 heads, K 64 V 64 | not measured | >= 0.9 |  |' in lines
  assert '| attention documents parity cases passed | 1/1 | all | met |' in lines
  assert ('| step full documents MFU (S4 16K x 8) | 31.0% | >= 45% | missed (1.000 s/step, 131,072 tokens/s) |'
          in lines)
  assert '| step gdn concat MFU (S4 16K x 8) | 36.0% | >= 35% | met (1.000 s/step, 131,072 tokens/s) |' in lines
  assert ('| step swa128_nope documents MFU (S4 16K x 8) | not measured | >= 45% | error: skipped: the deadline of '
          '150 s had passed |') in lines
  assert '| step mamba2 documents MFU (S4 16K x 8) | 20.0% |  | 1.000 s/step, 131,072 tokens/s |' in lines  # No target.
  choices = json.loads((tmp_path / 'choices.json').read_text())
  # Window 128: pallas_gpu (1.2 ms) beat cuDNN (1.25) on documents; full: pallas_gpu failed, the window's kernels are
  # compared only where both ran, so it keeps cudnn; 512 and 2048 were not measured.
  assert choices['attention']['_GPU_BY_WINDOW'] == [[128, 'pallas_gpu'], [512, 'cudnn'], [2048, 'cudnn'],
                                                     [None, 'cudnn']]
  # linear_scan: pallas_gpu faster (2.0 against 3.5 ms) and its parity passed; the delta rule: xla faster.
  assert choices['scans']['GPU_MEASURED_CHOICE'] == {'gated_delta_rule': 'xla', 'linear_scan': 'pallas_gpu'}


def test_summary_of_nothing_is_all_not_measured(tmp_path):
  text = summary.summary(tmp_path)
  expected = (sum(1 for _ in kernels.scan_cases(False)) + 1 + len({(s, w) for s, w, _, _ in
                                                                    kernels.attention_cases(False)}) + 1 + 12)
  assert '| met' not in text and '| missed' not in text and text.count('not measured') == expected
  assert json.loads((tmp_path / 'choices.json').read_text())['scans']['GPU_MEASURED_CHOICE'] == {
      'gated_delta_rule': 'xla', 'linear_scan': 'xla'}
