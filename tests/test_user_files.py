"""Config and sweep files are the user's code: every way one can fail is one `error:` line naming the file and line.

Generated, not listed: every command whose parser takes a config file (`--config`) or a sweep file (`--sweep`), found
by walking the command line, meets every failure mode below; sweep flags also meet every config failure mode through
a sweep whose run names the bad config file. A mode a command accepted would run it, so each mode is one that no
correct boundary lets through.
"""

import json
import textwrap

import pytest

from hybrid_jax.commands import config_flags
from hybrid_jax.config import BASE_CONFIG, ConfigError, load_config_file, validate
from tests.cli_walk import assert_one_line, leaf_parsers, parsers_seen, run_main

BASE = str(BASE_CONFIG)
_FROM_BASE = f'''
from hybrid_jax.config import load_config_file
def get_config(arg=None):
  c = load_config_file({BASE!r})
'''

# Failure mode -> (config file text, its ARG or None, fragments of the one line; {file} is the file's path). The
# line numbers are where the failure is in the file's text.
CONFIG_MODES = {
    'raises': ('def get_config(arg=None):\n  raise RuntimeError("boom")\n', None,
               ["{file}':2 in get_config()", 'RuntimeError: boom']),
    'raises a KeyError deep in its own helper': (
        'def _pick(x):\n  return {}[x]\ndef get_config(arg=None):\n  return _pick(arg)\n', 'a=1',
        ["{file}':2 in get_config('a=1')", "KeyError: 'a=1'"]),
    'returns None': ('def get_config(arg=None):\n  return None\n', None,
                     ['get_config() returned NoneType None', 'expected an ml_collections.ConfigDict']),
    'returns a plain dict': ('def get_config(arg=None):\n  return {"model": {"d_model": 64}}\n', None,
                             ['get_config() returned dict', 'expected an ml_collections.ConfigDict']),
    'takes no argument but is given one': ('def get_config():\n  return None\n', 'arch=gdn',
                                           ["get_config() takes no argument, but 'arch=gdn' was given"]),
    'imports a missing module': ('import hybrid_jax_no_such_module\n', None,
                                 ["{file}':1 failed while loading", 'ModuleNotFoundError']),
    'raises while loading': ('x = 1\nraise ValueError("bad module")\n', None,
                             ["{file}':2 failed while loading: ValueError: bad module"]),
    'exits while loading': ('import sys\nsys.exit(3)\n', None, ["{file}':2 failed while loading: SystemExit: 3"]),
    'is not Python': ('def get_config(:\n', None, ["{file}':1 is not valid Python"]),
    'defines no get_config': ('CONFIG = 1\n', None, ['defines no get_config(arg) function']),
    'sets text where a number belongs': (_FROM_BASE + '  c.model.d_model = "wide"\n  return c\n', None,
                                         ["{file}':5 in get_config()", "field 'd_model'", 'wide']),
    'adds a key no code reads': (_FROM_BASE + '  c.model.widht = 3\n  return c\n', None,
                                 ['config.model.widht does not exist']),
    'sets an unused choice key to a value not allowed': (
        _FROM_BASE + '  c.model.lightning.decay_rates = "nosuch"\n  return c\n', None,
        ["config.model.lightning.decay_rates='nosuch' is invalid"]),
}
SWEEP_MODES = {
    'raises': ('def runs(name=None):\n  raise RuntimeError("boom")\n', ["{file}':2 in runs()", 'RuntimeError: boom']),
    'returns None': ('def runs(name=None):\n  return None\n', ['runs() returned NoneType None',
                                                               'a non-empty list of config strings']),
    'returns an empty list': ('def runs(name=None):\n  return []\n', ['returned an empty list']),
    'returns a number among its runs': ('def runs(name=None):\n  return [3]\n', ['returned int 3 among its runs']),
    'imports a missing module': ('import hybrid_jax_no_such_module\n',
                                 ["{file}':1 failed while loading", 'ModuleNotFoundError']),
    'defines no runs': ('RUNS = []\n', ['defines no runs(arg) function']),
}


def _file_flags(parsers):
  """(command words, flag, parser) for every --config / --sweep flag of every command."""
  for words, parser in sorted(parsers.items()):
    for action in parser._actions:  # pylint: disable=protected-access
      for flag in set(action.option_strings) & {'--config', '--sweep'}:
        yield words, flag, parser


def _required(parser, flag, tmp_path) -> list[str]:
  """Harmless values for the command's other required flags (output folders that do not exist yet)."""
  argv = []
  for action in parser._actions:  # pylint: disable=protected-access
    if action.required and action.option_strings and flag not in action.option_strings:
      argv += [action.option_strings[0], str(tmp_path / f'fill{len(argv)}')]
  return argv


def _cases(parsers, tmp_path):
  """(label, argv, fragments) of every file flag x every failure mode."""
  folder = tmp_path / 'files'
  folder.mkdir()
  for n, (mode, (text, arg, fragments)) in enumerate(CONFIG_MODES.items()):
    file = folder / f'config_{n}.py'
    file.write_text(text)
    spec = f'{file}:{arg}' if arg else str(file)
    sweep = folder / f'sweep_of_config_{n}.py'
    sweep.write_text(f'def runs(name=None):\n  return [{spec!r}]\n')
    for words, flag, parser in _file_flags(parsers):
      value = spec if flag == '--config' else str(sweep)
      yield (f'{" ".join(words)} {flag}: config {mode}', [*words, f'{flag}={value}', *_required(parser, flag, tmp_path)],
             [f.format(file=file) for f in fragments])
  for n, (mode, (text, fragments)) in enumerate(SWEEP_MODES.items()):
    file = folder / f'sweep_{n}.py'
    file.write_text(text)
    for words, flag, parser in _file_flags(parsers):
      if flag == '--sweep':
        yield (f'{" ".join(words)} {flag}: sweep {mode}', [*words, f'{flag}={file}', *_required(parser, flag, tmp_path)],
               [f.format(file=file) for f in fragments])


def test_every_file_flag_meets_every_failure_mode_as_one_line(capsys, tmp_path):
  parsers = leaf_parsers(capsys)
  commands = {words for words, _, _ in _file_flags(parsers)}
  assert {('train',), ('params',), ('plan',), ('sweep', 'run'), ('bench', 'step')} <= commands, commands
  checked = 0
  for label, argv, fragments in _cases(parsers, tmp_path):
    with parsers_seen():
      status, err = run_main(argv, capsys)
    assert 'Traceback' not in err, (label, err)
    try:
      assert_one_line(status, err, *fragments)
    except AssertionError as e:
      raise AssertionError(f'{label}: {e}') from None
    checked += 1
  print(f'{checked} user-file failures across {len(commands)} commands')
  assert checked >= 100
  assert not list(tmp_path.glob('fill*')), 'a command wrote its output before refusing its config'


def test_the_line_named_is_the_users_frame_not_ours(tmp_path):
  """A user's file that calls into this package, which raises: the line named is the user's call."""
  file = tmp_path / 'calls_in.py'
  file.write_text('from hybrid_jax.config import load_config_file\n\ndef get_config(arg=None):\n'
                  '  return load_config_file(3)\n')
  with pytest.raises(ConfigError, match=f"{file}':4 in get_config\\(\\)") as error:
    load_config_file(str(file))
  assert 'hybrid_jax/' not in str(error.value)


@pytest.mark.parametrize('signature, arg, expected', [('arg=None', None, [None]), ('arg=None', 'x=1', ['x=1']),
                                                      ('', None, []), ('arg', None, [None]), ('*args', 'k=v', ['k=v'])])
def test_get_config_is_called_as_absl_calls_it_and_as_this_project_does(tmp_path, signature, arg, expected):
  """absl's config files define get_config() and get no argument without ':ARG'; this project's take arg=None."""
  file = tmp_path / 'seen.py'
  file.write_text(textwrap.dedent(f'''
      import ml_collections
      from hybrid_jax.config import load_config_file
      def get_config({signature}):
        c = load_config_file({BASE!r})
        c.name = {json.dumps(json.dumps(expected))}
        return c
  '''))
  config = load_config_file(f'{file}:{arg}' if arg else str(file))
  assert json.loads(config.name) == expected and validate(config) is config


def test_every_choice_key_refuses_an_unknown_value_whatever_the_arch():
  """Every text key with a fixed set of values refuses 'nosuch' on the default arch (which reads no recurrent key
  and no recall key); the keys that take any text are listed here, so a new choice key is covered unlisted."""
  free_text = {'name', 'model.arch', 'model.scale', 'data.paths', 'data.tokenizer', 'data.text_field',
               'data.tfds_name', 'data.tfds_data_dir', 'data.tfds_train_split', 'data.tfds_eval_split',
               'data.recall.filler', 'data.recall.filler_random', 'train.init_from', 'parallel.distributed.coordinator_address'}
  config = config_flags.load_config(config_flags.DEFAULT_CONFIG, [])
  keys = []

  def walk(node, prefix):
    for key, value in node.items():
      if hasattr(value, 'items'):
        walk(value, f'{prefix}{key}.')
      elif isinstance(value, (str, tuple, list)) and f'{prefix}{key}' not in free_text:
        keys.append(f'{prefix}{key}')

  walk(config, '')
  assert 'model.lightning.decay_rates' in keys and 'data.recall.distance_ranges' in keys
  for key in keys:
    with pytest.raises(ConfigError, match=key.replace('.', r'\.')):
      config_flags.load_config(config_flags.DEFAULT_CONFIG, [f'--config.{key}=nosuch'])
