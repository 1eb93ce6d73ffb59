"""Run sizing in the packaged hybrid config (token budgets, stages) and starting a run from another run's parameters."""

import math

import jax
import numpy as np
import pytest

from hybrid_jax.train import runs
from hybrid_jax.config import ConfigError, resolve_spec, validate
from hybrid_jax.train import loop, optim, state as state_lib
from tests.conftest import small_config, study_config


def _config(arg):
  from hybrid_jax.config import load_config_file
  return validate(load_config_file(resolve_spec(f'hybrid:{arg}')))


def test_budget_sets_steps_from_non_embedding_params():
  c = _config('arch=swa128,scale=s1,budget=100')
  tokens_per_step = 64 * 16_384
  assert c.train.steps == math.ceil(100 * 14_999_424 / tokens_per_step) == 1431
  assert c.train.warmup_steps == 29 and c.train.checkpoint_every == c.train.eval_every == 143
  assert c.name == 'swa128_s1_100n'
  s5 = _config('arch=gdn,scale=s5,tokens=100e9')
  assert s5.train.steps == math.ceil(100e9 / tokens_per_step) and s5.train.warmup_steps == 1000


def test_extension_stage(tmp_path):
  c = _config(f'arch=swa128_nope,scale=s5,stage=extend32k,init_from={tmp_path},rope_base=500000')
  assert c.data.seq_len == 32_768 and c.train.init_from == str(tmp_path) and c.model.rope_base == 500000
  assert c.train.steps == math.ceil(5e9 / (64 * 32_768))
  assert c.model.rope_full is False  # NoPE full layers stay NoPE; the base applies to the RoPE (SWA) layers.


@pytest.mark.parametrize('arg, message', [
    ('arch=full,scale=s1,budget=100,tokens=5', 'not both'),
    ('arch=full,scale=s1,budget=abc', "budget='abc' is invalid: must be a positive finite number"),
    ('arch=full,scale=s1,budget=-1', "budget='-1' is invalid"),
    ('arch=full,scale=s1,budget=0', "budget='0' is invalid"),
    ('arch=full,scale=s1,budget=inf', "budget='inf' is invalid"),  # An endless run.
    ('arch=full,scale=s1,tokens=1e400', "tokens='1e400' is invalid"),  # Overflows to inf.
    ('arch=full,scale=s1,tokens=nan', "tokens='nan' is invalid"),
    ('arch=full,scale=s1,stage=extend32k', 'init_from=RUN_DIR'),
    ('arch=full,scale=s1,init_from=x', 'belong to a stage'),
    ('arch=full,scale=s1,stage=warp', "stage='warp' is unknown"),
    ('arch=full,scale=s1,steps=5', 'bad argument'),
])
def test_bad_arguments(arg, message):
  with pytest.raises(ConfigError, match=message):
    _config(arg)


def test_init_from_reads_the_source_runs_newest_parameters(tiny_run):
  config = small_config()
  fresh = state_lib.init_sharded_train_state(
      config.model, 1, optim.make_optimizer(config.train),
      jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                   state_lib.abstract_initial_state(config.model, 1, optim.make_optimizer(config.train))))
  got = loop._params_of_run(str(tiny_run), fresh['params'], config.model)  # pylint: disable=protected-access
  want = runs.load_run(tiny_run).params
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_init_from_errors(tiny_run, tmp_path):
  config = small_config()
  params = jax.jit(lambda: state_lib.init_params(config.model, 0))()
  with pytest.raises(ConfigError, match='no checkpoints'):
    loop._params_of_run(str(tmp_path), params, config.model)  # pylint: disable=protected-access
  wider = jax.jit(lambda: state_lib.init_params(small_config(d_model=48).model, 0))()
  with pytest.raises(ConfigError, match='cannot be restored'):
    loop._params_of_run(str(tiny_run), wider, small_config(d_model=48).model)  # pylint: disable=protected-access
  assert study_config().train.init_from == ''
