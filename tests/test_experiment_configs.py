"""The repository's experiment files (configs/): each loads and validates, and builds what its docstring says."""

import pytest

from hybrid_jax.config import CONFIG_DIR, ConfigError, load_config_file, load_run, load_sweep, resolve_spec, validate
from hybrid_jax.sweep import members as sweep_members
from hybrid_jax.user_files import load_python_file
from tests.conftest import ROOT

EXPERIMENTS = ROOT / 'configs'
NOPE_FIX = EXPERIMENTS / 'nope_fix.py'
LAZINESS = EXPERIMENTS / 'laziness.py'
TRACING_KEYS = ('checkpoint_every', 'keep_checkpoints', 'retrieval_probe_every')  # What nope_fix adds to the grid.


def _without_tracing(config) -> dict:
  d = config.to_dict()
  for key in TRACING_KEYS:
    del d['train'][key]
  return d


def test_every_experiment_file_loads_and_validates():
  """Config files build a valid config with their default argument, sweep files list valid runs; none takes the
  name of a packaged config, so `configs/NAME.py` in older run strings still names the packaged one."""
  files = sorted(EXPERIMENTS.glob('*.py'))
  assert {f.name for f in files} >= {'nope_fix.py', 'laziness.py', 'my_experiment.py'}
  assert not {f.stem for f in files} & {p.stem for p in CONFIG_DIR.glob('*.py')}
  for file in files:
    module = load_python_file(file, 'config')
    assert module.__doc__ and hasattr(module, 'get_config') != hasattr(module, 'runs'), file
    if hasattr(module, 'get_config'):
      validate(load_config_file(str(file)))
    else:
      assert all(load_run(run) for run in load_sweep(str(file)))


def test_nope_fix_is_the_grids_swa128_nope_with_every_checkpoint_probed():
  c = validate(load_config_file(str(NOPE_FIX)))
  grid = validate(load_config_file(resolve_spec('hybrid:arch=swa128_nope,scale=tiny')))
  assert _without_tracing(c) == _without_tracing(grid) and c.name == 'swa128_nope_tiny'
  t = c.train
  assert t.checkpoint_every == t.retrieval_probe_every == 30 and t.steps // t.checkpoint_every + 1 <= t.keep_checkpoints
  _, _, short = load_run(f'{NOPE_FIX} --config.train.steps=55')  # Checkpoints and probes follow the steps.
  assert short.train.checkpoint_every == short.train.retrieval_probe_every == 6

  control = validate(load_config_file(f'{NOPE_FIX}:window=512,full_pe=rope,scale=s1,budget=200'))
  grid = validate(load_config_file(resolve_spec('hybrid:arch=swa512,scale=s1,budget=200')))
  assert _without_tracing(control) == _without_tracing(grid) and control.name == 'swa512_s1_200n'
  wide = validate(load_config_file(f'{NOPE_FIX}:window=2048'))
  assert (wide.name, wide.model.arch, wide.model.window, wide.model.rope_full, wide.model.rope_swa) == (
      'swa2048_nope_tiny', 'swa2048_nope', 2048, False, True)


@pytest.mark.parametrize('arg, message', [
    ('window=0', "configs/nope_fix.py: window='0' is invalid: must be a positive integer"),
    ('window=wide', "configs/nope_fix.py: window='wide' is invalid"),
    ('full_pe=alibi', "configs/nope_fix.py: full_pe='alibi' is unknown; allowed: nope, rope"),
    ('arch=gdn', "configs/nope_fix.py: bad argument 'arch=gdn'; expected scale=NAME[,window=W]"),
    ('scale=s9', "model.scale='s9' is unknown"),
])
def test_bad_nope_fix_arguments_are_one_line(arg, message):
  with pytest.raises(ConfigError) as error:
    load_config_file(f'{NOPE_FIX}:{arg}')
  assert message in str(error.value) and '\n' not in str(error.value)


def test_the_laziness_sweep_crosses_windows_with_rope_and_nope(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # Its runs name nope_fix.py by its own folder, not the working directory.
  members = sweep_members.load(f'{LAZINESS}:scale=s1,budget=200', tmp_path)
  cells = {(m.config.model.window, m.config.model.rope_full) for m in members}
  assert len(members) == 6 and cells == {(w, rope) for w in (128, 512, 2048) for rope in (True, False)}
  assert all(m.name.endswith('_s1_200n') and m.config.train.retrieval_probe_every for m in members)
  assert sorted(m.name for m in members) == sorted({m.name for m in members})  # A run directory each.
  assert [m.name for m in sweep_members.load(str(LAZINESS), tmp_path)][:2] == ['swa128_tiny', 'swa128_nope_tiny']
  with pytest.raises(ConfigError, match=r"configs/laziness.py: bad argument 'window=64'; expected scale=NAME"):
    load_sweep(f'{LAZINESS}:window=64')


def test_my_experiment_changes_the_grid_run_where_it_says():
  c = validate(load_config_file(str(EXPERIMENTS / 'my_experiment.py')))
  grid = validate(load_config_file(resolve_spec('hybrid:arch=swa128,scale=tiny')))
  assert (c.name, c.model.window, c.data.seq_len, c.train.steps) == ('my_swa128_tiny', 64, 2 * grid.data.seq_len,
                                                                    2 * grid.train.steps)
  assert c.train.warmup_steps == 2 * grid.train.warmup_steps  # Derived from the steps, so it follows them.
