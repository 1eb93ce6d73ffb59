"""`collect` over run directories: one row per run with N, D, token_multiplier and every metric found."""

import csv
import json
import shutil

import pytest

from hybrid_jax.analysis import scaling_law
from hybrid_jax.models.counting import param_counts
from hybrid_jax.study import collect
from hybrid_jax.commands import collect as collect_command, parsing


def _copy_run(tiny_run, tmp_path, name, evals):
  run = tmp_path / name
  shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns('checkpoints'))
  (run / 'eval').mkdir()
  for task, result in evals.items():
    (run / 'eval' / f'{task}.json').write_text(json.dumps(result))
  return run


def test_collect_rows_and_fit_reads_them(tiny_run, tmp_path, capsys):
  a = _copy_run(tiny_run, tmp_path, 'a', {
      'ruler': {'by_context': {'4096': {'average': 40.0, 'niah_average': 55.5},
                               '16384': {'average': 20.0, 'niah_average': 30.0}}},
      'longppl': {'by_context': {'16384': {'longppl': 7.5, 'ppl': 3.0}}},
      'niah': {'by_context': {'512': 50.0}},
      'ppl': {'by_context': {'512': {'loss': 2.5, 'packed_loss': 2.75, 'loss_by_position': []}}}})
  b = _copy_run(tiny_run, tmp_path, 'b', {'longbench': {'by_context': {'16384': {'plain_mean': 12.25}}}})
  out = tmp_path / 'results.tsv'
  assert collect_command.main([str(a), str(b), '--out', str(out)]) == 0
  rows = list(csv.DictReader(out.open(), delimiter='\t'))
  report = json.loads((tiny_run / 'report.json').read_text())
  config = json.loads((tiny_run / 'config.json').read_text())
  n = param_counts(collect.runs_lib.load_config(tiny_run).model)['non_embedding']
  tokens = report['steps'] * report['batch_size'] * report['seq_len']
  assert [r['run'] for r in rows] == ['a', 'b']
  first = rows[0]
  assert first['arch'] == config['model']['arch'] and int(first['n']) == n and int(first['tokens']) == tokens
  assert float(first['token_multiplier'].rstrip('n')) == pytest.approx(tokens / n, rel=1e-8)
  assert float(first['loss']) == pytest.approx(report['eval']['packed_loss'])
  assert float(first['ruler_4096']) == 40.0 and float(first['ruler_niah_16384']) == 30.0
  assert float(first['longppl_16384']) == 7.5 and float(first['niah_512']) == 50.0
  assert first['longbench_16384'] == '' and float(rows[1]['longbench_16384']) == 12.25
  assert float(first['ppl_loss_512']) == 2.5 and float(first['ppl_packed_loss_512']) == 2.75
  header = out.read_text().splitlines()[0].split('\t')
  assert header.index('ruler_4096') < header.index('ruler_16384')  # contexts in numeric order
  points = scaling_law.load_points(str(out), metric_column='loss')  # the fitter reads collect's output
  assert len(points.y) == 2


def test_collect_errors(tiny_run, tmp_path, capsys):
  assert parsing.run(collect_command.main, [str(tmp_path), '--out', str(tmp_path / 'x.tsv')]) == 2
  assert 'no config.json' in capsys.readouterr().err
  run = tmp_path / 'unfinished'
  shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns('checkpoints', 'report.json'))
  assert parsing.run(collect_command.main, [str(run), '--out', str(tmp_path / 'x.tsv')]) == 2
  assert 'no report.json' in capsys.readouterr().err


def test_reports_from_before_packed_loss_was_named_still_give_the_loss_column(tiny_run, tmp_path):
  run = _copy_run(tiny_run, tmp_path, 'old', {})
  report = json.loads((run / 'report.json').read_text())
  report['eval'] = {'loss': 3.25, 'perplexity': 25.8, 'tokens': 512}  # The packed loss, before it was labelled.
  (run / 'report.json').write_text(json.dumps(report))
  assert collect.collect_run(run)['loss'] == 3.25
