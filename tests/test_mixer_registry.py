"""A new mixer is one file: the toy mixer of tests/toy_mixer.py (registered by naming its module in
model.mixer_modules, no other file changed) validates, trains, counts, reports FLOPs, decodes, compiles for a fake
mesh, runs under the restriction analysis and is refused by `hf export` with one line."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hybrid_jax import config as config_lib
from hybrid_jax.errors import ConfigError
from hybrid_jax.models import counting, flops, pattern
from hybrid_jax.models.mixers import registry
from hybrid_jax.models.model import HybridLM
from tests.cli_walk import assert_one_line, run_main
from tests.conftest import ROOT, SMALL, small_config

TOY = ['--config.model.mixer_modules=tests.toy_mixer', '--config.model.cycle=meanpool,full',
       '--config.model.meanpool.width=12']
SMALL_FLAGS = [f'--config.{section}.{key}={value}' for section, values in SMALL.items() for key, value in values.items()]


@pytest.fixture(autouse=True, scope='module')
def _registry_restored():
  """The toy kind leaves the process's registry with this module, so later tests see only the project's kinds."""
  registry.names()  # The built-in kinds, loaded before the snapshot.
  kinds = dict(registry._KINDS)  # pylint: disable=protected-access
  yield
  registry._KINDS.clear()  # pylint: disable=protected-access
  registry._KINDS.update(kinds)  # pylint: disable=protected-access
  sys.modules.pop('tests.toy_mixer', None)


def toy_config(**model):
  c = small_config()
  config_lib.apply_overrides(c, TOY)
  c.model.update(model)
  return config_lib.validate(c)


def test_the_toy_kind_is_registered_with_its_config_section_and_checked():
  c = toy_config()
  assert 'meanpool' in registry.names() and c.model.meanpool.width == 12
  assert [pattern.layer_spec(c.model, i).kind for i in range(2)] == ['meanpool', 'full']
  assert registry.get('meanpool').role == 'efficient' and not registry.get('meanpool').attention
  bad = small_config()
  config_lib.apply_overrides(bad, TOY[:1] + ['--config.model.meanpool.width=0'])
  with pytest.raises(ConfigError, match=r"config.model.meanpool.width=0 is invalid: must be a positive integer"):
    config_lib.validate(bad)  # Checked even though the cycle does not use it.
  with pytest.raises(ConfigError, match=r"config.model.mixer_modules: cannot import 'tests.no_such_mixer': "
                                        r"ModuleNotFoundError"):
    config_lib.apply_overrides(small_config(), ['--config.model.mixer_modules=tests.no_such_mixer'])
  typo = small_config()
  config_lib.apply_overrides(typo, TOY)
  typo.model.cycle = ('meanpool', 'ful')
  with pytest.raises(ConfigError, match=r"unknown kind 'ful'; allowed kinds: full, .*meanpool"):
    config_lib.validate(typo)


def test_counts_and_flops_come_from_its_entry_and_match_the_built_model():
  cfg = toy_config().model
  model = nnx.eval_shape(lambda: HybridLM(cfg, rngs=nnx.Rngs(0)))
  built = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert counting.param_counts(cfg)['total'] == built
  assert counting.param_counts(cfg)['layers'][0]['mixer'] == 2 * cfg.d_model * 12
  layer = flops.layer_flops(cfg, pattern.layer_spec(cfg, 0), 64)
  assert layer['kind'] == 'meanpool' and layer['projections'] == 2 * 64 * 2 * cfg.d_model * 12
  assert flops.model_flops(cfg, 64)['by_kind']['meanpool']['layers'] == 1


def test_decoding_token_by_token_matches_the_parallel_forward():
  cfg = toy_config(dtype='float32').model
  model = HybridLM(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
  full = model(tokens)
  state = model.init_decode_state(2, 9)
  logits, state = model.prefill(tokens[:, :5], state)
  steps = [logits]
  for t in range(5, 9):
    step_logits, state = model.step(tokens[:, t], jnp.int32(t), state)
    steps.append(step_logits[:, None])
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=2e-5, atol=2e-5)


def test_it_trains_then_the_restriction_analysis_runs_and_hf_export_refuses_it(tmp_path, capsys):
  run = tmp_path / 'run'
  status, err = run_main(['train', f'--workdir={run}', '--config=hybrid:arch=swa128_nope,scale=tiny', *SMALL_FLAGS,
                          *TOY, '--config.train.steps=4', '--config.train.checkpoint_every=4'], capsys)
  assert status in (0, None), err[-2000:]
  saved = json.loads((run / 'config.json').read_text())['model']
  assert saved['cycle'] == ['meanpool', 'full'] and saved['mixer_modules'] == ['tests.toy_mixer']
  records = [json.loads(line) for line in (run / 'metrics.jsonl').read_text().splitlines()]
  assert records and all(np.isfinite(r['loss']) for r in records if 'loss' in r)

  status, err = run_main(['analyze', 'restriction', f'--workdir={run}', '--windows=8', '--metrics=loss',
                          '--seq-len=64', '--batches=1', '--no-progress', f'--out={tmp_path / "analysis"}'], capsys)
  assert status in (0, None), err[-2000:]
  rows = {row['target']: row['loss'] for row in json.loads((tmp_path / 'analysis' / 'restriction.json').read_text())
          ['rows']}
  assert set(rows) == {None, 'full', 'efficient'}
  assert rows['efficient'] != rows[None]  # The toy layer itself ran on windows of its input (windowed state).

  status, err = run_main(['hf', 'export', f'--workdir={run}', f'--out={tmp_path / "hf"}'], capsys)
  assert_one_line(status, err, 'meanpool')


def test_compile_check_compiles_it_for_a_fake_mesh(tmp_path):
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--devices=4', '--memory_budget_gib=1', '--nofind_fit',
          '--config=hybrid:arch=swa128_nope,scale=tiny', *SMALL_FLAGS, *TOY, '--config.parallel.fsdp=2',
          '--config.parallel.tensor=2', f'--json={tmp_path}/rows.json']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 0, out.stderr[-3000:]
  [row] = json.loads((tmp_path / 'rows.json').read_text())
  assert row['chips'] == 4 and row['fits'] is True and row['xla_flops_per_chip'] > 0


def test_a_module_that_registers_no_mixer_kind_is_one_line_at_the_command_line(tmp_path, capsys, monkeypatch):
  """A module that imports but registers nothing (a typo'd or wrong module) is refused naming it, instead of the
  run training as if no module were named. A mixer module named again (every config load imports it again, which
  registers nothing the second time) or imported before by other code is still a mixer module."""
  (tmp_path / 'not_a_mixer_xyz.py').write_text('X = 1\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, 'not_a_mixer_xyz', raising=False)
  run = tmp_path / 'run'
  status, err = run_main(['train', f'--workdir={run}', '--config=hybrid:arch=swa128_nope,scale=tiny', *SMALL_FLAGS,
                          '--config.model.mixer_modules=not_a_mixer_xyz', '--config.train.steps=4'], capsys)
  assert_one_line(status, err, "'not_a_mixer_xyz'", 'registered no mixer kind')
  assert not (run / 'metrics.jsonl').exists()
  with pytest.raises(ConfigError, match=r"'not_a_mixer_xyz' imports but registered no mixer kind"):
    registry.load_modules(['not_a_mixer_xyz'])  # Already imported: still refused.
  with pytest.raises(ConfigError, match=r"'json' imports but registered no mixer kind"):
    registry.load_modules(['json'])  # Imported long before, by other code, and no mixer module either.
  for _ in range(2):
    registry.load_modules(['tests.toy_mixer'])  # Named twice: the second import registers nothing, and is fine.
  registry.load_modules(['hybrid_jax.models.mixers.mamba2'])  # A built-in one, imported before by the registry.
  assert 'meanpool' in registry.names()
