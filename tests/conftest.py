"""Shared fixtures: configs loaded from the project's own config files; one compilation cache per test session."""

import os
import pathlib
import shutil
import tempfile

import jax
import pytest

from hybrid_jax.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Many tests compile the same small programs (each builds its own jitted step, so jit's in-memory cache misses).
# A persistent compilation cache that starts empty each session serves the repeats from disk (about a third of
# the suite's time on 2 cores); subprocess tests inherit it through the environment.
_CACHE_OWNED = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _CACHE_OWNED:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='hybrid_jax_test_xla_cache_')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs',
                  float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))
jax.config.update('jax_persistent_cache_min_entry_size_bytes',
                  int(os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES']))


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _CACHE_OWNED:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


def study_config(arch='swa128_nope', scale='tiny'):
  return load_config_file(f'{ROOT}/configs/hybrid.py:arch={arch},scale={scale}')


def small_config(arch='swa128_nope', **model_overrides):
  """A seconds-fast run: 2 layers of width 32 over 64-token sequences of the built-in corpus."""
  c = study_config(arch)
  c.model.update(dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=64, window=16))
  c.model.update(model_overrides)
  c.data.seq_len = 64
  c.train.update(dict(steps=12, batch_size=2, warmup_steps=2, log_every=1, eval_every=0, eval_batches=1,
                      checkpoint_every=4, progress=False, lr=3e-3))
  c.eval.batches = 1
  c.eval.position_buckets = 4
  return c


@pytest.fixture
def small():
  return small_config()


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """A run directory trained for a few steps once per test session (checkpoints at steps 4, 8, 12).

  Tools that read runs (eval, analysis) test against it; treat it as read-only.
  """
  from hybrid_jax import training
  workdir = tmp_path_factory.mktemp('tiny_run')
  training.train(small_config(), workdir)
  return workdir
