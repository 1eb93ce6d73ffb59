"""Loading a trained run read-only: config, newest or chosen checkpoint, overrides, clear errors."""

import json

import jax
import numpy as np
import pytest

from hybrid_jax import runs
from hybrid_jax.train import checkpoint, optim, state as state_lib


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
  assert config.eval.position_buckets == 8 and config.model.gdn.conv_width == 4  # configs/base.py defaults
  assert 'eval.position_buckets' in caplog.text and 'model.gdn' in caplog.text
  # A caller that has read the config hands it to load_run: the run loads without reading (and warning) again.
  caplog.clear()
  run = runs.load_run(old, config=config)
  assert run.config.eval.position_buckets == 8 and caplog.text.count('predates') == 0
  assert runs.load_run(old).step == 12 and caplog.text.count('predates') == 1
