"""The one command line, through the real entry point (`python -m hybrid_jax`, in subprocesses): every --help lists
its flags and exits 0, and every user error is one `error: …` line with exit status 2 and no traceback."""

import os
import pathlib
import subprocess
import sys

import pytest

from hybrid_jax import commands
from hybrid_jax.analysis import scaling_law
from hybrid_jax.config import BASE_CONFIG, CONFIG_DIR
from hybrid_jax.commands import config_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
HYBRID = CONFIG_DIR / 'hybrid.py'  # The packaged grid, by its path.
TINY = ['--config.model.d_model=32', '--config.model.num_layers=2', '--config.model.head_dim=8',
        '--config.model.d_ff=64', '--config.model.window=16', '--config.data.seq_len=64', '--config.train.batch_size=2',
        '--config.train.progress=False', '--config.eval.batches=1', '--config.train.eval_batches=1',
        '--config.eval.position_buckets=4', '--config.eval.documents=0']


def _run(*args, cwd=None):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(ROOT))
  return subprocess.run([sys.executable, '-m', 'hybrid_jax', *args], capture_output=True, text=True, cwd=cwd,
                        env=env, timeout=300)


def _assert_user_error(out, *fragments):
  assert out.returncode == 2, out.stderr
  assert 'Traceback' not in out.stderr, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), out.stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def test_top_level_help_lists_every_command():
  out = _run('--help')
  assert out.returncode == 0, out.stderr
  for name in [*commands.COMMANDS]:
    assert f'\n  {name} ' in out.stdout, name


@pytest.mark.parametrize('command, flags', [
    ('train', ('--config', '--workdir', '--config.KEY=VALUE')),
    ('compile-check', ('--topology', '--num_slices', '--sweep', '--json', '--nofind_fit', '--memory_budget_gib')),
    ('fit', ('--data', '--out', '--formula')),
])
def test_command_help_lists_flags_with_defaults(command, flags):
  out = _run(command, '--help')
  assert out.returncode == 0, out.stderr
  assert '(default: ' in out.stdout or command == 'train'  # train's flags default to None: the config decides.
  assert '(default: None)' not in out.stdout  # A flag without a default says nothing of one.
  for flag in flags:
    assert flag in out.stdout, flag


def test_packaged_configs_by_name_from_another_directory(tmp_path, capsys):
  """`--config=hybrid:ARG` from a directory without configs/ is the packaged grid, as is the older spelling
  `configs/NAME.py:ARG` there; the help says where the keys and their defaults are."""
  by_file = _run('params', f'--config={HYBRID}:arch=gdn,scale=s1')
  assert by_file.returncode == 0 and '"non_embedding"' in by_file.stdout, by_file.stderr
  for spec in ('hybrid:arch=gdn,scale=s1', 'configs/hybrid.py:arch=gdn,scale=s1'):
    elsewhere = _run('params', f'--config={spec}', cwd=tmp_path)
    assert (elsewhere.returncode, elsewhere.stdout) == (0, by_file.stdout), elsewhere.stderr
  _assert_user_error(_run('params', '--config=nosuch:arch=gdn', cwd=tmp_path), "config file 'nosuch' does not exist")
  with pytest.raises(SystemExit):
    commands.main(['hybrid_jax', 'params', '--help'])
  assert f'the packaged base config, {BASE_CONFIG}.' in ' '.join(capsys.readouterr().out.split())


def test_every_command_help_exits_0_in_process(capsys):
  """The same parsers, in one process (a subprocess each would cost seconds): every flag has a help line."""
  for command in [*commands.COMMANDS, 'bench attention', 'bench scan', 'bench decode', 'bench step',
                  'bench data', 'hf export', 'hf import', 'analyze probing']:
    with pytest.raises(SystemExit) as exit_info:
      commands.main(['hybrid_jax', *command.split(), '--help'])
    assert exit_info.value.code == 0, command
    text = capsys.readouterr().out
    assert 'usage: python -m hybrid_jax' in text, command


def test_unknown_arch_is_one_line():
  _assert_user_error(_run('train', f'--config={HYBRID}:arch=swa64,scale=tiny'), "model.arch='swa64' is unknown",
                     'swa128')


def test_unknown_scale_is_one_line():
  _assert_user_error(_run('params', f'--config={HYBRID}:arch=gdn,scale=s9'), "model.scale='s9' is unknown", 's5')


def test_config_key_typo_names_the_nearest_key():
  _assert_user_error(_run('train', '--config.model.windw=64'), 'config.model.windw does not exist',
                     'did you mean config.model.window?')


def test_bad_override_value_and_unknown_flag():
  _assert_user_error(_run('params', '--config.model.window=wide'), "--config.model.window='wide'")
  _assert_user_error(_run('params', '--bogus'), 'unrecognized arguments: --bogus')
  _assert_user_error(_run('fly'), "invalid choice: 'fly'")


def test_missing_data_files_are_one_line(tmp_path):
  _assert_user_error(_run('train', f'--workdir={tmp_path}', '--config.data.source=files',
                          '--config.data.paths=/nonexistent/*.jsonl'), "glob '/nonexistent/*.jsonl' matches no")


def test_broken_jsonl_line_is_one_line(tmp_path):
  corpus = tmp_path / 'bad.jsonl'
  corpus.write_text('{"text": "a good first document"}\n{broken\n')
  _assert_user_error(_run('train', f'--workdir={tmp_path / "run"}', '--config.data.source=files',
                          f'--config.data.paths={corpus}', *TINY), f'{corpus}:2: not JSON')


def test_missing_run_directory_is_one_line(tmp_path):
  _assert_user_error(_run('eval', '--workdir', str(tmp_path / 'nothing')), str(tmp_path / 'nothing'))


@pytest.mark.parametrize('command', [['train', *TINY], ['eval'], ['analyze', 'retrieval-heads'],
                                     ['hf', 'import', str(ROOT / 'tests/data/hf/hf_llama_tied')]])
def test_a_url_workdir_is_refused_without_making_a_local_folder(tmp_path, command):
  """pathlib folds gs://B/R into a local gs:/B/R; a run must never land there unnoticed."""
  out = _run(*command, '--workdir=gs://bucket/run1', cwd=tmp_path)
  _assert_user_error(out, 'gs://bucket/run1 is a URL', 'gcsfuse', '/mnt/BUCKET/run1')
  assert list(tmp_path.iterdir()) == []


def test_derived_defaults_follow_an_override_of_steps():
  default = config_flags.load_config(config_flags.DEFAULT_CONFIG, [])
  assert (default.train.steps, default.train.warmup_steps, default.train.eval_every,
          default.train.checkpoint_every) == (300, 30, 100, 100)  # BENCHMARKS.md, "The main job on CPU".
  short = config_flags.load_config(config_flags.DEFAULT_CONFIG, ['--config.train.steps=2'])
  assert (short.train.warmup_steps, short.train.eval_every, short.train.checkpoint_every) == (0, 1, 1)
  long = config_flags.load_config(config_flags.DEFAULT_CONFIG, ['--config.train.steps', '1000'])
  assert (long.train.warmup_steps, long.train.eval_every, long.train.checkpoint_every) == (100, 334, 334)
  explicit = config_flags.load_config(config_flags.DEFAULT_CONFIG, ['--config.train.warmup_steps=7', '--config.train.steps=50'])
  assert (explicit.train.warmup_steps, explicit.train.eval_every) == (7, 17)


def test_an_explicit_warmup_is_kept_and_checked():
  _assert_user_error(_run('params', '--config.train.steps=2', '--config.train.warmup_steps=30'),
                     'config.train.warmup_steps=30 is invalid: must be smaller than train.steps=2')


@pytest.mark.e2e
def test_train_with_two_steps_trains(tmp_path):
  """`train --config.train.steps=2` trains: warmup, eval and checkpoint intervals follow steps."""
  out = _run('train', f'--workdir={tmp_path}', '--config.train.steps=2', *TINY)
  assert out.returncode == 0, out.stderr
  assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir() if p.name.isdigit()) == ['1', '2']


def test_fit_writes_under_out_default_the_working_directory(tmp_path, monkeypatch, capsys):
  """Through the entry point in this process, with a small grid of starts (the study's grid takes minutes)."""
  monkeypatch.setattr(scaling_law, 'GRID', {'alpha': (0.2,), 'beta': (0.5,), 'B': (4.0,), 'C': (8.0,)})
  data_dir = tmp_path / 'readonly'
  data_dir.mkdir()
  data = data_dir / 'points.tsv'
  data.write_text((ROOT / 'tests' / 'data' / 'swa128_longppl.tsv').read_text())
  data_dir.chmod(0o555)
  work = tmp_path / 'work'
  work.mkdir()
  monkeypatch.chdir(work)
  try:
    with pytest.raises(SystemExit) as exit_info:
      commands.main(['hybrid_jax', 'fit', '--data', str(data), '--log-metric'])
  finally:
    data_dir.chmod(0o755)
  assert exit_info.value.code == 0, capsys.readouterr().err
  assert (work / 'points_fit.png').is_file() and sorted(p.name for p in data_dir.iterdir()) == ['points.tsv']
  with pytest.raises(SystemExit) as exit_info:
    commands.main(['hybrid_jax', 'fit', '--data', str(data), '--log-metric', '--out', str(tmp_path / 'plots')])
  assert exit_info.value.code == 0 and (tmp_path / 'plots' / 'points_fit.png').is_file()
