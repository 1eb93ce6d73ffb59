"""Loading a trained run read-only: config, newest or chosen checkpoint, overrides, clear errors."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from hybrid_jax.train import runs
from hybrid_jax.config import BASE_CONFIG, load_config_file
from hybrid_jax.models.mixers import lightning
from hybrid_jax.models.model import HybridLM
from hybrid_jax.train import checkpoint, config_history, optim, session as session_lib, state as state_lib
from tests.conftest import small_config


def test_load_run_restores_the_saved_parameters(tiny_run):
  run = runs.load_run(tiny_run)
  assert run.step == 12 and runs.checkpoint_steps(tiny_run) == [4, 8, 12]
  # Independent read through the training checkpointer gives the same arrays.
  ckpt = checkpoint.Checkpointer(tiny_run / 'checkpoints', keep=10, async_save=False)
  abstract = state_lib.abstract_initial_state(run.config.model, run.config.seed, optim.make_optimizer(run.config.train))
  restored = ckpt.manager.restore(12, args=checkpoint.ocp.args.Composite(
      state=checkpoint.ocp.args.StandardRestore(abstract)))
  ckpt.close()
  for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(restored.state['params'])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  earlier = runs.load_run(tiny_run, step=4)
  assert earlier.step == 4
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(earlier.params)))
  logits = run.model(run.tokenizer.encode('import os\n')[None])
  assert logits.shape == (1, 10, run.config.model.vocab_size) and np.isfinite(np.asarray(logits)).all()


def test_load_run_overrides_and_errors(tiny_run, tmp_path):
  run = runs.load_run(tiny_run, model_overrides={'window': 4})
  assert run.config.model.window == 4
  with pytest.raises(runs.RunError, match='no checkpoint at step 5'):
    runs.load_run(tiny_run, step=5)
  with pytest.raises(runs.RunError, match='no config.json'):
    runs.load_run(tmp_path)
  (tmp_path / 'config.json').write_text(json.dumps(json.loads((tiny_run / 'config.json').read_text())))
  with pytest.raises(runs.RunError, match='no checkpoints'):
    runs.load_run(tmp_path)
  with pytest.raises(runs.RunError, match='cannot be restored for this model'):
    runs.load_run(tiny_run, model_overrides={'d_model': 48})


def test_a_run_saved_before_a_config_key_existed_still_loads(tiny_run, tmp_path, caplog):
  import shutil
  old = tmp_path / 'old_run'
  shutil.copytree(tiny_run, old)
  saved = json.loads((old / 'config.json').read_text())
  del saved['eval']['position_buckets'], saved['model']['gdn']
  (old / 'config.json').write_text(json.dumps(saved))
  config = runs.load_config(old)
  assert config.eval.position_buckets == 8 and config.model.gdn.conv_width == 4  # The packaged base config's defaults.
  assert 'eval.position_buckets' in caplog.text and 'model.gdn' in caplog.text
  # A caller that has read the config hands it to load_run: the run loads without reading (and warning) again.
  caplog.clear()
  run = runs.load_run(old, config=config)
  assert run.config.eval.position_buckets == 8 and caplog.text.count('predates') == 0
  assert runs.load_run(old).step == 12 and caplog.text.count('predates') == 1


def _before_the_decay_key(config):
  """config.json as a run saved before model.lightning.decay_rates existed wrote it."""
  saved = json.loads(config.to_json_best_effort())
  del saved['model']['lightning']['decay_rates']
  return saved


@pytest.mark.parametrize('arch, heads, kept', [('lightning', 3, 'alibi_interleaved'), ('lightning', 4, 'closed_form'),
                                               ('swa128_nope', 3, 'closed_form')])
def test_a_run_saved_before_the_lightning_decay_key_keeps_the_rates_it_was_trained_with(arch, heads, kept, caplog):
  """Only a run with Lightning layers whose head count is not a power of two computed something else before."""
  config = small_config(arch, lightning=dict(num_heads=heads, key_dim=4, value_dim=4))
  loaded = runs._with_new_defaults(_before_the_decay_key(config), load_config_file(str(BASE_CONFIG)), 'config.json')
  assert loaded.model.lightning.decay_rates == kept
  named = 'predates config key model.lightning.decay_rates' in caplog.text
  assert named == (kept == 'alibi_interleaved') and ('ALiBi' in caplog.text) == named


def test_an_old_lightning_run_loads_as_trained_and_refuses_to_resume_as_the_new_model(tmp_path, caplog):
  """A Lightning run (3 heads) from before the closed-form rates: reading it (eval, analyses) builds the model it
  trained, a plain resume is refused naming the key, and a resume that keeps the old rates is allowed."""
  config = small_config('lightning', lightning=dict(num_heads=3, key_dim=4, value_dim=4))
  (tmp_path / 'config.json').write_text(json.dumps(_before_the_decay_key(config)))
  (tmp_path / 'checkpoints' / '12').mkdir(parents=True)  # A resume: the session compares configs before restoring.

  loaded = runs.load_config(tmp_path)
  assert loaded.model.lightning.decay_rates == 'alibi_interleaved' and 'ALiBi' in caplog.text
  # The model built from the run's config (as load_run builds it) decays at the interleaved rates.
  model = nnx.eval_shape(lambda: HybridLM(loaded.model, rngs=nnx.Rngs(0)))
  decays = {tuple(np.asarray(m.log_decay).ravel()) for _, m in nnx.iter_graph(model) if hasattr(m, 'log_decay')}
  assert decays == {tuple(-s for s in lightning.alibi_interleaved_slopes(3))}

  refused = r'model.lightning.decay_rates: run has "alibi_interleaved", this command says "closed_form"'
  with pytest.raises(config_history.ConfigChangeRefused, match=refused):
    with session_lib.open_session(config, tmp_path):
      pass
  config.model.lightning.decay_rates = 'alibi_interleaved'
  with session_lib.open_session(config, tmp_path) as session:
    assert session.allowed == {}


def test_init_from_an_old_lightning_run_names_the_decay_rates_it_was_trained_with(tmp_path, caplog):
  """Parameters copied (train.init_from) from a run with the interleaved rates into a closed-form model are named;
  the same rates, or a run without Lightning layers, are not."""
  from hybrid_jax.train import loop  # pylint: disable=g-import-not-at-top
  config = small_config('lightning', lightning=dict(num_heads=3, key_dim=4, value_dim=4))
  (tmp_path / 'config.json').write_text(json.dumps(_before_the_decay_key(config)))
  message = loop.init_from_mismatch(tmp_path, config.model)
  assert "'alibi_interleaved', this run uses 'closed_form'" in message and 'decay_rates=alibi_interleaved' in message
  config.model.lightning.decay_rates = 'alibi_interleaved'
  assert loop.init_from_mismatch(tmp_path, config.model) is None
  assert loop.init_from_mismatch(tmp_path / 'missing', config.model) is None
