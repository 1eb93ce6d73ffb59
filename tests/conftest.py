"""Shared fixtures: configs loaded from the project's own config files; one compilation cache per test session."""

import os
import pathlib
import shutil
import sys
import tempfile
import time

import jax
import pytest

from hybrid_jax import host_memory
from hybrid_jax.config import load_config_file, resolve_spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
host_memory.keep_freed_memory()  # As `python -m hybrid_jax` does: steps on the CPU reuse their buffers.

# The default tier's programs are small, so compiling them costs far more than running them: LLVM at O0 takes a
# quarter off its time on 2 cores. XLA's own passes (fusion, layout, buffer assignment) run as in training, so the
# programs are the ones users get, in less optimised machine code, whose rounding can differ; the whole suite (CI)
# compiles as training does. Read when the backend starts, after pytest_configure.
XLA_TEST_FLAGS = ''


def pytest_configure(config):
  global XLA_TEST_FLAGS
  if hasattr(config.option, 'loadscopereorder'):  # pytest-xdist: keep the order SLOW_FILES sets.
    config.option.loadscopereorder = False
  if config.option.markexpr.replace(' ', '') == 'note2e':
    XLA_TEST_FLAGS = '--xla_backend_optimization_level=0'
    if XLA_TEST_FLAGS not in os.environ.get('XLA_FLAGS', ''):  # xdist workers inherit the controller's.
      os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_TEST_FLAGS}".strip()


# The files that take longest (both tiers, measured with --durations=0 on 2 cores), sent to the xdist workers first
# and in this order: `--dist loadfile` hands out whole files, so a long file handed out last runs alone while the
# other worker idles. Files not listed follow in collection order. (xdist's own order, by test count, is turned
# off: it sends the long files with few tests last.)
SLOW_FILES = ('test_parallel.py', 'test_tpu_compile.py', 'test_attention_pallas.py', 'test_context_parallel.py',
              'test_loop.py', 'test_kernel_regimes.py', 'test_expert_parallel.py', 'test_model.py',
              'test_niah_trained.py', 'test_documents.py', 'test_generate.py', 'test_measure_script.py',
              'test_hf_hybrids.py', 'test_mini_study.py', 'test_scan_pallas.py', 'test_multihost.py',
              'test_compile_check.py', 'test_sweep.py', 'test_documents_analysis.py', 'test_train.py')


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(SLOW_FILES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: the rest keep their order.


def fake_devices_env(n: int) -> dict:
  """The environment of a subprocess that sees `n` fake CPU devices (fixed when jax starts), with the suite's flags."""
  return dict(os.environ, JAX_PLATFORMS='cpu',
              XLA_FLAGS=f'--xla_force_host_platform_device_count={n} {XLA_TEST_FLAGS}'.strip())


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


def with_libtpu(describe):
  """describe() (a TPU topology's devices or a compile target: libtpu describes them), or a skip where libtpu is
  missing; with HYBRID_JAX_REQUIRE_LIBTPU set (CI) a missing libtpu fails instead."""
  from hybrid_jax.parallel import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  try:
    return describe()
  except mesh_lib.MeshError as e:
    if os.environ.get('HYBRID_JAX_REQUIRE_LIBTPU'):
      raise
    pytest.skip(f"libtpu is missing, so no TPU topology can be described ({e}); pip install -e '.[tpu]'")


def default_tier(values, keep):
  """Parametrize `values` so those in `keep` run in the default tier and the rest in the end-to-end tier (-m e2e):
  the edit-test loop checks one representative of each code path, the e2e tier every case."""
  return [v if v in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.e2e)
          for v in values]


def study_config(arch='swa128_nope', scale='tiny'):
  return load_config_file(resolve_spec(f'hybrid:arch={arch},scale={scale}'))


# The seconds-fast run's settings, shared by `small_config` (in process) and `train_command` (the command line),
# so a test comparing the two compares like with like.
SMALL = {'model': dict(d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=64, window=16),
         'data': dict(seq_len=64),
         'train': dict(batch_size=2, warmup_steps=2, log_every=1, eval_every=0, eval_batches=1, progress=False,
                       lr=3e-3),
         'eval': dict(batches=1, position_buckets=4)}


def small_config(arch='swa128_nope', **model_overrides):
  """A seconds-fast run: 2 layers of width 32 over 64-token sequences of the built-in corpus."""
  c = study_config(arch)
  for section, values in SMALL.items():
    c[section].update(values)
  c.model.update(model_overrides)
  c.train.update(dict(steps=12, checkpoint_every=4))
  return c


def train_command(workdir, *overrides):
  """`python -m hybrid_jax train` of `small_config()`'s run (steps and checkpoints from the overrides)."""
  settings = [f'--config.{section}.{key}={value}' for section, values in SMALL.items() for key, value in values.items()]
  return [sys.executable, '-m', 'hybrid_jax', 'train', f'--workdir={workdir}',
          '--config=hybrid:arch=swa128_nope,scale=tiny', *settings, *overrides]


def wait_for(condition, proc, what, timeout=300):
  """Polls `condition` while the subprocess `proc` runs; fails naming `what` if it exits or `timeout` s pass."""
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f'the process exited before {what}:\n{proc.stderr.read()}'
    assert time.time() < deadline, f'no {what} in {timeout} s'
    time.sleep(0.02)


@pytest.fixture
def small():
  return small_config()


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """A run directory trained for a few steps once per test session (checkpoints at steps 4, 8, 12).

  Tools that read runs (eval, analysis) test against it; treat it as read-only.
  """
  from hybrid_jax import standard_hooks
  workdir = tmp_path_factory.mktemp('tiny_run')
  standard_hooks.train(small_config(), workdir)
  return workdir
