"""scripts/device/measure.sh end to end in its dry-run mode (CPU, interpret mode, tiny shapes), and the summary
it ends with. Nothing here asserts a time: only that every phase ran and reported what it measured."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(pathlib.Path(ROOT) / 'scripts' / 'device'))
import summary  # pylint: disable=wrong-import-position

FILES = {'env.txt', 'attention.txt', 'attention.json', 'scan.txt', 'scan.json', 'step.txt', 'step.json',
         'summary.md'}


def _dry_run(tmp_path, step_runs):
  out = tmp_path / 'out'
  env = dict(os.environ, DRY_RUN='1', OUT=str(out), PYTHON=sys.executable, STEP_RUNS=step_runs,
             PYTHONPATH=str(ROOT))
  done = subprocess.run(['bash', 'scripts/device/measure.sh'], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=1500, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert {p.name for p in out.iterdir()} == FILES  # At most 8 files, each phase's.
  return out, done.stdout


def _check_kernels(out):
  attention = json.loads((out / 'attention.json').read_text())
  assert attention['parity']['rows'] and all(r['ok'] for r in attention['parity']['rows'])
  bench = attention['bench']['rows']
  assert {r['impl'] for r in bench} == {'pallas_gpu', 'xla'}
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 and r['fwd_bwd_compile_s'] > 0 for r in bench)
  # pallas_gpu on rows of documents of 12 tokens and of one document (T = 32), each after the same call unmasked,
  # and their speed against it.
  documents = attention['documents']['rows']
  assert [(r['impl'], r['window'], r['documents']) for r in documents] == [
      ('pallas_gpu', window, n) for window in (8, None) for n in (None, 12, 32)]
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 for r in documents)
  assert all(r['fwd_bwd_vs_unmasked'] > 0 for r in documents if r['documents'])
  pairs = {(r['window'], r['documents']): r['pairs'] for r in documents}
  assert all(pairs[w, 12] < pairs[w, None] == pairs[w, 32] for w in (8, None))  # Only a document's own pairs.
  # The cuDNN-with-documents phase (XLA standing in for cuDNN on CPU): unmasked and on documents, at two T.
  cudnn_documents = attention['cudnn_documents']['rows']
  assert [(r['impl'], r['window'], r['T'], r['documents']) for r in cudnn_documents] == [
      ('xla', window, t, n) for window in (8, None) for t in (16, 32) for n in (None, 12)]
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 for r in cudnn_documents)
  assert attention['documents_parity']['rows'] and all(r['ok'] for r in attention['documents_parity']['rows'])
  scan = json.loads((out / 'scan.json').read_text())
  assert scan['parity'] and all(r['ok'] for r in scan['parity'])
  # Parity rows carry the shared-memory model of what they ran, for the device run to check it against.
  budget = 232448
  assert all(r['kernel_chunk'] == 16 and 0 < max(r['smem_model'].values()) <= budget for r in scan['parity'])
  assert all(0 < max(r['smem_model'].values()) <= budget for r in attention['parity']['rows']
             if r['impl'] == 'pallas_gpu')
  assert {r['impl'] for r in scan['rows']} == {'pallas_gpu', 'xla'}
  assert all('error' not in r and r['fwd_bwd_ms'] > 0 for r in scan['rows'])
  assert [(r['impl'], r['documents']) for r in scan['rows']] == [('pallas_gpu', None), ('pallas_gpu', 12),
                                                                 ('xla', None), ('xla', 12)]
  assert all(r['fwd_bwd_vs_unmasked'] > 0 for r in scan['rows'] if r['documents'])


@pytest.mark.e2e
def test_dry_run_measures_every_phase(tmp_path):
  out, stdout = _dry_run(tmp_path, 'full')
  _check_kernels(out)
  [run] = json.loads((out / 'step.json').read_text())
  assert run['run'] == 'full' and run['step']['step_s_median'] > 0 and run['step']['breakdown']['parts']
  assert run['config']['packing'] == 'concat'  # The MFU runs time concatenated rows, as their targets were set.
  text = (out / 'summary.md').read_text()
  assert '| attention parity cases passed | 2/2 | all | met |' in text
  assert '| scan parity cases passed | 2/2 | all | met |' in text
  assert 'done; files:' in stdout


@pytest.mark.e2e
def test_dry_run_every_step_run(tmp_path):
  out, _ = _dry_run(tmp_path, 'full swa128_nope gdn gdn_pallas_scan gdn_documents')
  _check_kernels(out)
  runs = json.loads((out / 'step.json').read_text())
  assert [r['run'] for r in runs] == ['full', 'swa128_nope', 'gdn', 'gdn_pallas_scan', 'gdn_documents']
  assert all(r['step']['step_s_median'] > 0 for r in runs)
  assert [(r['config']['packing'], r['config']['documents']) for r in runs] == [('concat', None)] * 4 + [
      ('documents', 8)]  # Documents of seq_len // 4 tokens.


def test_summary_compares_each_measure_with_its_target(tmp_path):
  attention_rows = [dict(impl='pallas_gpu', window=128, fwd_bwd_vs_cudnn=1.6),
                    dict(impl='pallas_gpu', window=512, fwd_bwd_vs_cudnn=1.1),
                    dict(impl='pallas_gpu', window=2048, error='RuntimeError: no\nmore'),
                    dict(impl='cudnn', window=None, fwd_bwd_vs_cudnn=1.0)]
  documents_rows = [dict(impl='cudnn', T=16384, window=128, documents=512, fwd_bwd_ms=1.0),
                    dict(impl='cudnn', T=32768, window=128, documents=512, fwd_bwd_ms=2.0),
                    dict(impl='pallas_gpu', T=32768, window=128, documents=512, fwd_bwd_ms=5.0),
                    dict(impl='cudnn', T=32768, window=None, documents=512, fwd_bwd_ms=9.0, ran='pallas_gpu'),
                    dict(impl='pallas_gpu', T=32768, window=None, documents=512, fwd_bwd_ms=9.0)]
  (tmp_path / 'attention.json').write_text(json.dumps(
      {'parity': {'rows': [{'ok': True}, {'ok': False}]}, 'bench': {'rows': attention_rows},
       'cudnn_documents': {'rows': documents_rows}, 'documents_parity': {'rows': [{'ok': True}]}}))
  (tmp_path / 'scan.json').write_text(json.dumps({'parity': [{'ok': True}], 'rows': [
      dict(kernel='linear_scan', impl='pallas_gpu', fwd_bwd_vs_fla=1.25)]}))
  (tmp_path / 'step.json').write_text(json.dumps([
      {'run': 'full', 'step': {'mfu': 0.31}}, {'run': 'gdn', 'step': {'mfu': 0.30, 'step_s_median': 1.0}},
      {'run': 'gdn_pallas_scan', 'step': {'step_s_median': 0.8}}, {'run': 'swa128_nope', 'error': 'timed out'}]))
  lines = set(summary.summary(tmp_path).splitlines())
  assert '| attention w128 fwd+bwd vs cuDNN | 1.60 | >= 1.5 | met |' in lines
  assert '| attention w512 fwd+bwd vs cuDNN | 1.10 | >= 1.2 | missed |' in lines
  assert '| attention w2048 fwd+bwd vs cuDNN | error: RuntimeError: no | >= 1.0 |  |' in lines
  assert '| attention wfull fwd+bwd vs cuDNN | not measured | >= 0.8 |  |' in lines  # Only cuDNN's own row.
  assert '| attention parity cases passed | 1/2 | all | missed |' in lines
  assert '| attention documents w128 fwd+bwd cuDNN vs pallas_gpu | 2.50 | >= 1.0 | met |' in lines  # At 32K.
  assert '| attention documents wfull fwd+bwd cuDNN vs pallas_gpu | ran pallas_gpu | >= 1.0 |  |' in lines
  assert '| attention documents parity cases passed | 1/1 | all | met |' in lines
  assert '| linear_scan pallas_gpu fwd+bwd vs fla | 1.25 | >= 1.0 | met |' in lines
  assert '| gated_delta_rule pallas_gpu fwd+bwd vs fla | not measured | >= 1.0 |  |' in lines
  assert '| step full MFU | 31.0% | >= 45% | missed |' in lines
  assert '| step gdn MFU | 30.0% | >= 30% | met |' in lines
  assert '| step swa128_nope MFU | timed out | >= 40% |  |' in lines
  assert '| step gdn with Pallas scans, speed vs the XLA scans | 1.25 | > 1 to switch |  |' in lines


def test_summary_of_nothing_is_all_not_measured(tmp_path):
  text = summary.summary(tmp_path)
  assert '| met |' not in text and '| missed |' not in text and text.count('not measured') == 17
