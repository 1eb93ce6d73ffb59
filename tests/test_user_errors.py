"""Every bad input is one `error: …` line with exit status 2, through the command line's entry
(hybrid_jax.commands.main, in this process: a Python per case would cost seconds each).

The flag walk reads each command's parser and generates bad values from what each flag's check requires (zero,
negative, inf, nan, letters, a fraction for an integer, a file for a directory and back, a missing path, an
unwritable path); the config walk does the same for every numeric key. A value a command accepts would run it, so
each parse stops at once when the parser accepts (`Accepted`): the test then fails naming the flag and value.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from hybrid_jax import checks
from hybrid_jax.commands import config_flags
from tests.cli_walk import assert_one_line, leaf_parsers, run_main, parsers_seen
from tests.conftest import ROOT, train_command

# Parsers that are not built from the shared checks yet (another change owns their modules).
NOT_WALKED = set()
UNWRITABLE_ROOT = pathlib.Path('/sys')  # sysfs refuses new files even to root (modes do not stop root).


def _bad_numbers(bounds: dict) -> list[str]:
  values = ['abc', 'nan', 'inf', '-inf']
  if bounds.get('integer'):
    values.append('2.5')
  if bounds.get('positive'):
    values += ['0', '-3']
  if bounds.get('nonnegative'):
    values.append('-3')
  if bounds.get('low') is not None:
    values.append(str(bounds['low'] - 1))
  if bounds.get('high') is not None:
    values.append(str(bounds['high'] + 1))
  return values


@pytest.fixture
def paths(tmp_path):
  """A file, a folder, a missing path, a path under a file, and (where the machine has one) an unwritable path."""
  (tmp_path / 'a_file').write_text('x')
  (tmp_path / 'a_dir').mkdir()
  out = {'file': tmp_path / 'a_file', 'dir': tmp_path / 'a_dir', 'missing': tmp_path / 'missing' / 'x',
         'under_a_file': tmp_path / 'a_file' / 'sub', 'too_long': tmp_path / ('n' * 300)}
  if UNWRITABLE_ROOT.is_dir() and not checks.can_write_in(UNWRITABLE_ROOT):
    out['unwritable'] = UNWRITABLE_ROOT / 'hybrid_jax_test' / 'out'
  return out


def _bad_paths(rules: dict, paths: dict) -> list[str]:
  values = ['', paths['too_long']]
  if rules.get('exists', True):
    values.append(paths['missing'])
  if rules.get('kind') == 'dir':
    values.append(paths['file'])
  if rules.get('kind') == 'file':
    values.append(paths['dir'])
  if rules.get('writable'):
    values += [paths['under_a_file']] + ([paths['unwritable']] if 'unwritable' in paths else [])
  return [str(v) for v in values]


def _cases(parser, paths):
  """(flag name, argv words, bad value) for every checked flag of `parser`; fails on a numeric flag left unchecked."""
  positionals = [a for a in parser._actions if not a.option_strings]  # pylint: disable=protected-access
  for action in parser._actions:  # pylint: disable=protected-access
    assert action.type not in (int, float), f'{parser.prog} {action.option_strings}: use hybrid_jax.checks'
    requires = getattr(action.type, 'requires', None)
    if not requires:
      continue
    if 'number' in requires:
      values = _bad_numbers(requires['number'])
    elif 'numbers' in requires:
      values = _bad_numbers(requires['numbers'])
      values += [f'1,{v}' for v in values if v not in ('2.5',)][:2] + ['']
    elif 'choices' in requires:
      values = ['nosuch', f'{requires["choices"][0]},nosuch', '', ',']
    else:
      values = _bad_paths(requires['path'], paths)
    for value in values:
      if action.option_strings:
        yield action.option_strings[0], [action.option_strings[0], value]
      else:  # A positional: those before it get a harmless word.
        index = positionals.index(action)
        yield action.dest, ['word'] * index + [value]


def test_every_checked_flag_refuses_generated_bad_values(capsys, paths):
  parsers = leaf_parsers(capsys)
  assert len(parsers) >= 20, sorted(parsers)
  walked, checked = 0, 0
  for words, parser in sorted(parsers.items()):
    if parser.prog in NOT_WALKED:
      continue
    walked += 1
    for flag, argv in _cases(parser, paths):
      with parsers_seen(stop_at=parser.prog):
        status, err = run_main([*words, *argv], capsys)
      assert_one_line(status, err, f'argument {flag}')
      checked += 1
  print(f'{checked} bad flag values across {walked} commands')
  assert checked >= 300 and walked >= 20


def _numeric_keys():
  keys = []

  def walk(node, prefix):
    for key, value in node.items():
      if hasattr(value, 'items'):
        walk(value, f'{prefix}{key}.')
      elif isinstance(value, (int, float)) and not isinstance(value, bool):
        keys.append((f'{prefix}{key}', value))

  walk(config_flags.load_config(config_flags.DEFAULT_CONFIG, []), '')
  return keys


def test_every_numeric_config_key_refuses_generated_bad_values(capsys):
  """Letters, inf and nan for every numeric key, a fraction for an integer, and a negative number for every key
  but the mesh axes' -1 and process_id's -1 (which mean 'the rest' and 'from the environment')."""
  cases = []
  for key, value in _numeric_keys():
    extra = ['--config.data.source=recall'] if key.startswith('data.recall.') else []  # Read only then.
    bad = ['abc', 'inf', 'nan', '-inf'] + (['2.5', '-7'] if isinstance(value, int) else ['-7'])
    cases += [(key, extra + [f'--config.{key}={v}']) for v in bad]
  refused = 0
  for key, overrides in cases:
    status, err = run_main(['params', *overrides], capsys)
    assert_one_line(status, err, key)
    refused += 1
  print(f'{refused} bad config values')
  assert refused >= 400


@pytest.fixture
def damaged_run(tiny_run, tmp_path):
  """A copy of conftest's tiny run (checkpoints 4, 8, 12) whose newest checkpoint lost its array data files.

  Every data file is cut: which file holds the parameters (rather than optimizer moments only) varies between runs,
  and a command that restores parameters alone must meet the damage.
  """
  run = tmp_path / 'run'
  shutil.copytree(tiny_run, run)
  for data in (run / 'checkpoints' / '12' / 'state').glob('ocdbt.process_0/d/*'):
    data.write_bytes(data.read_bytes()[:100])
  return run


def test_eval_and_analyze_name_the_damaged_step_and_the_readable_ones(damaged_run, capsys):
  for argv in (['eval', '--workdir', str(damaged_run), '--tasks', 'ppl'],
               ['analyze', 'probing', '--workdir', str(damaged_run)]):
    status, err = run_main(argv, capsys)
    assert_one_line(status, err, 'the checkpoint at step 12', 'missing or damaged',
                     'readable steps: [8, 4] (choose one with --step 8)')
  assert (damaged_run / 'checkpoints' / '12').is_dir()  # Read-only commands move nothing.


def test_train_resumes_past_a_damaged_checkpoint_with_one_record_per_step(damaged_run, capsys, caplog):
  """The resume sets step 12 aside with a warning naming the file, ignores a half-written checkpoint folder, trains
  9-12 again, and metrics.jsonl keeps one record per step (the steps trained twice: the later run's)."""
  half_written = damaged_run / 'checkpoints' / '16.orbax-checkpoint-tmp-1700000000'
  half_written.mkdir()
  (half_written / 'partial').write_bytes(b'x')
  argv = train_command(damaged_run, '--config.train.steps=12', '--config.train.checkpoint_every=4')[3:]
  with caplog.at_level('WARNING'):
    status, err = run_main(argv, capsys)
  assert status == 0, err
  [warning] = [r.getMessage() for r in caplog.records if 'cannot be restored' in r.getMessage()]
  assert 'the checkpoint at step 12' in warning and 'ocdbt.process_0/d/' in warning and 'falling back' in warning
  assert list((damaged_run / 'checkpoints.unrestorable').glob('*/12'))
  records = [json.loads(line) for line in (damaged_run / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in records if r['kind'] == 'train'] == list(range(1, 13))
  report = json.loads((damaged_run / 'report.json').read_text())
  assert report['resumed_from'] == 8 and report['status'] == 'completed'
  assert json.loads((damaged_run / 'lock.json').read_text())['state'] == 'released'


def test_listed_inputs_are_one_line(tmp_path, capsys, paths, tiny_run):
  """The bad inputs found by hand, each through the entry point."""
  a_file = paths['file']
  safetensors = tmp_path / 'hf'
  shutil.copytree(ROOT / 'tests' / 'data' / 'hf' / 'hf_llama_tied', safetensors)
  weights = safetensors / 'model.safetensors'
  weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
  binary = tmp_path / 'fit.json'
  binary.write_bytes(bytes(range(256)) * 4)
  run = tmp_path / 'run'
  shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns('eval'))
  (run / 'eval').write_text('a file where eval writes its folder')
  cases = [
      (['train', f'--workdir={a_file}'], ['argument --workdir', f'{a_file}: is a file, not a directory']),
      (['train', f'--workdir={paths["under_a_file"]}'], ['is a file, so no folder can be made under it']),
      (['train', '--config.train.lr=inf'], ['config.train.lr=inf is invalid']),
      (['params', '--config=/bin/sh'], ["config file '/bin/sh' is not valid Python"]),  # A binary file.
      (['bench', 'step', '--config=hybrid:arch=gdn,scale=tiny', '--set', 'train.lr=inf', '--dry-run'],
       ['config.train.lr=inf is invalid']),
      (['plan', '--sweep', 'sweep:nosuch'], ["in runs('nosuch'): ValueError: unknown sweep 'nosuch'"]),
      (['compile-check', '--sweep', 'sweep:nosuch'], ["in runs('nosuch'): ValueError: unknown sweep 'nosuch'"]),
      (['plan', '--runs', 'hybrid:arch=gdn,scale=s1', '--fit', str(binary)], ['not JSON']),
      (['compile-check', '--devices=-3'], ["argument --devices: '-3' is invalid: must be a positive integer"]),
      (['compile-check', '--devices=0'], ["argument --devices: '0' is invalid"]),
      (['compile-check', '--memory_budget_gib=-1'], ["argument --memory_budget_gib: '-1' is invalid"]),
      (['bench', 'attention', '--seq-lens', '0,-1'], ["argument --seq-lens: '0,-1': '0' is invalid"]),
      (['bench', 'attention', '--windows', 'abc'], ["argument --windows: 'abc' is invalid"]),
      (['hf', 'import', str(safetensors), '--workdir', str(tmp_path / 'imported')],
       [f'{weights} cannot be read as safetensors']),
      (['pretokenize', '--config=base', '--config.data.source=recall', '--out', str(tmp_path / 'tok')],
       ["source='recall' is invalid for pretokenize", 'builtin, files, tfds, parquet']),
      (['eval', '--workdir', str(run), '--tasks', 'ppl'], ['--out (default: WORKDIR/eval)', 'is a file']),
      (['hf', 'export', '--workdir', str(run), '--out', str(run / 'checkpoints' / 'x')], ['is inside']),
      (['eval', '--workdir', str(run), '--tasks', 'lm_eval:nosuch', '--out', str(tmp_path / 'ev')],
       ["lm_eval task(s) 'nosuch' unknown"]),
      (['analyze', 'retrieval-heads', '--workdir', str(run), '--length', '5', '--out', str(tmp_path / 'an')],
       ['max_seq_length=5 leaves no room']),
  ]
  if 'unwritable' in paths:
    cases.append((['train', f'--workdir={paths["unwritable"]}'], ['cannot be written']))
  for argv, fragments in cases:
    with parsers_seen():  # (Not stopping: these are refused after parsing.)
      status, err = run_main(argv, capsys)
    assert_one_line(status, err, *fragments)
  assert not (tmp_path / 'imported').exists() and not (tmp_path / 'tok').exists()


def test_an_unknown_tfds_name_is_one_line_with_the_nearest_names(tmp_path, capsys):
  status, err = run_main(['pretokenize', '--config=base', '--config.data.source=tfds',
                       '--config.data.tfds_name=ag_news_subst', '--out', str(tmp_path / 'tok')], capsys)
  assert_one_line(status, err, "tfds_name='ag_news_subst'", 'Did you mean ag_news_subset')


def test_a_nan_stop_before_any_checkpoint_says_none_was_saved(tmp_path, capsys):
  argv = train_command(tmp_path / 'run', '--config.train.lr=1e30', '--config.train.steps=20',
                       '--config.train.warmup_steps=0', '--config.train.checkpoint_every=20')[3:]
  status, err = run_main(argv, capsys)
  error = [line for line in err.splitlines() if line.startswith('error: ')]
  assert status == 2 and len(error) == 1 and 'Traceback' not in err, err
  assert 'training loss is' in error[0] and 'No checkpoint was saved before it' in error[0]
  assert 'step 0' not in error[0] and not list((tmp_path / 'run' / 'checkpoints').iterdir())
  assert json.loads((tmp_path / 'run' / 'lock.json').read_text())['state'] == 'released'


def test_through_the_real_entry_point(tmp_path):
  """`python -m hybrid_jax` itself, for two of the cases above: the same line, status 2, no traceback."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT))
  (tmp_path / 'a_file').write_text('x')
  for argv, fragment in [(['train', f'--workdir={tmp_path / "a_file"}'], 'is a file, not a directory'),
                         (['compile-check', '--devices=0'], "argument --devices: '0' is invalid")]:
    out = subprocess.run([sys.executable, '-m', 'hybrid_jax', *argv], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert_one_line(out.returncode, out.stderr, fragment)


def test_hf_export_writes_files_with_the_umask_mode(tiny_run, tmp_path, capsys, caplog):
  with caplog.at_level('WARNING'):
    status, err = run_main(['hf', 'export', '--workdir', str(tiny_run), '--out', str(tmp_path / 'out')], capsys)
  assert status == 0, err
  notes = [r.getMessage() for r in caplog.records if 'read only' in r.getMessage() or 'read_only' in r.getMessage()]
  assert not notes  # Orbax's notes that a read-only read is read-only are dropped.
  umask = os.umask(0)
  os.umask(umask)
  for file in (tmp_path / 'out').iterdir():
    assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file
