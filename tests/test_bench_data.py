"""`bench data`: every path and worker count gets a row, headroom against the step's consumption (never timed)."""

import json

import pytest

from hybrid_jax.bench import data as bench_data
from hybrid_jax.commands import bench as bench_command
from hybrid_jax.config import ConfigError
from tests.test_data import BASE_CONFIG


def test_bench_data_rows_and_headroom(tmp_path, capsys):
  (tmp_path / 'docs').mkdir()
  for i in range(20):
    (tmp_path / 'docs' / f'{i}.txt').write_text(f'document {i} ' * (5 + 7 * i))
  out = tmp_path / 'rows.json'
  argv = [f'--config={BASE_CONFIG}', '--config.data.source=files', f'--config.data.paths={tmp_path / "docs"}',
          '--config.data.seq_len=32', '--config.train.batch_size=4', '--batches', '3', '--min-seconds', '0',
          '--hosts', '2', '--tokens-per-s', '500', '--json', str(out)]
  assert bench_command.main(['data', *argv]) == 0
  result = json.loads(out.read_text())
  assert result['required_tokens_per_s'] == 500
  assert [(r['path'], r['tokenizer'], r['workers']) for r in result['rows']] == [('on the fly', 'byte', 0),
                                                                                   ('pretokenized', 'byte', 0)]
  for r in result['rows']:
    assert r['tokens'] == 3 * 2 * 32  # 3 batches of this host's 2 of 4 sequences.
    assert r['tokens_per_s'] == pytest.approx(r['tokens'] / r['seconds'])
    assert r['headroom'] == pytest.approx(r['tokens_per_s'] / 500)
  assert 'pretokenized | byte | 0 |' in capsys.readouterr().out


def test_required_rate_from_compile_check(tmp_path):
  rows = [{'target': 'v5p:2x2x1', 'estimate': {'tokens_per_s': 4e6}}, {'target': 'cpu', 'fits': True},
          {'target': 'v5p:2x2x2', 'estimate': {'tokens_per_s': 1e7}}]
  (tmp_path / 'cc.json').write_text(json.dumps(rows))
  assert bench_data.required_tokens_per_s(str(tmp_path / 'cc.json'), None, hosts=2) == 5e6
  assert bench_data.required_tokens_per_s(None, 123.0, hosts=2) == 123.0
  (tmp_path / 'cc.json').write_text(json.dumps(rows[1:2]))
  with pytest.raises(ConfigError, match='no row with a step-time estimate'):
    bench_data.required_tokens_per_s(str(tmp_path / 'cc.json'), None, hosts=1)
