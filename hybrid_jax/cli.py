"""Command-line entry: `python -m hybrid_jax <command> [--config=FILE[:ARG]] [--config.key=value ...]`.

Commands are a registry (name -> function of the parsed flags); each validates its config before anything
compiles. `python -m hybrid_jax help` lists them.
"""

import json
import os
import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from hybrid_jax.config import ConfigError, validate

DEFAULT_CONFIG = str(pathlib.Path(__file__).resolve().parents[1] / 'configs' / 'hybrid.py') + \
    ':arch=swa128_nope,scale=tiny'

_CONFIG = config_flags.DEFINE_config_file('config', DEFAULT_CONFIG, 'Config file[:arg] (ml_collections).',
                                          lock_config=True)
_DEVICES = flags.DEFINE_integer('devices', None, 'shardings / compile-check: device count of the target mesh '
                                '(default: the devices present; compile-check fakes that many CPU devices).')
_TOPOLOGY = flags.DEFINE_list('topology', None, "compile-check: TPU topologies such as 'v5p:4x4x4,v6e:4x4' "
                              '(libtpu compiles for them on any host; no TPU needed)')
_NUM_SLICES = flags.DEFINE_integer('num_slices', 1, 'compile-check: slices of each topology, joined over the '
                                   'data-center network (multislice; the dcn_* mesh axes)')
_SWEEP = flags.DEFINE_string('sweep', None, 'compile-check: check every distinct step of a sweep FILE:NAME '
                             '(e.g. configs/sweep.py:main) instead of --config')
_BUDGET = flags.DEFINE_float('memory_budget_gib', None, 'compile-check: the per-device memory limit in GiB '
                             "(default: the chip's HBM; needed for CPU meshes)")
_JSON = flags.DEFINE_string('json', None, 'compile-check: also write every row (and the fixes tried) to this file')
_FIND_FIT = flags.DEFINE_bool('find_fit', True, 'compile-check: when a step does not fit, compile the changes '
                              'that trade speed for memory and report the first that fits')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (checkpoints, metrics, report). '
                               'Default: runs/<config.name>.')


def _workdir(config) -> pathlib.Path:
  return pathlib.Path(_WORKDIR.value or pathlib.Path('runs') / config.name)


def cmd_train(config):
  """Train (or resume) a run in the workdir and write its report."""
  from hybrid_jax.parallel import distributed
  from hybrid_jax.train import loop, session
  try:
    result = loop.train(config, _workdir(config))
  except session.REFUSALS as e:  # Another trainer holds the workdir, or the config would change the run.
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except distributed.DistributedError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # A normal exit would wait at jax's shutdown barrier for the dead process and abort.
  print(loop.summary_line(result))
  print(f'report: {_workdir(config) / "report.json"}')
  return 0 if result['status'] == 'completed' else 143


def cmd_params(config):
  """Print parameter counts (non_embedding, embedding, total, per layer) as one JSON object."""
  from hybrid_jax.models.counting import param_counts
  print(json.dumps(param_counts(config.model), indent=2))
  return 0


def cmd_shardings(config):
  """Print each parameter's sharding on the configured mesh and flag tensors left replicated."""
  import jax
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import state as state_lib
  ici, dcn = mesh_lib.mesh_shape(config.parallel, _DEVICES.value or jax.device_count())
  shape = {a: ici[a] * dcn[a] for a in mesh_lib.AXES}
  _, text = mesh_lib.sharding_report(state_lib.make_model_def(config.model), rules_lib.parse_rules(
      config.parallel.rules), shape)
  print(text)
  return 0


def _compile_targets():
  from hybrid_jax.parallel import compile_check
  if _TOPOLOGY.value:
    return [compile_check.tpu_target(t, _NUM_SLICES.value) for t in _TOPOLOGY.value]
  return [compile_check.fake_cpu_target(_DEVICES.value)]


def _compile_configs(config):
  """--config, or the distinct compiled steps of --sweep (runs that differ only in length compile the same)."""
  if not _SWEEP.value:
    return [config]
  from hybrid_jax.study import plan
  seen, out = set(), []
  for run in plan.sweep_runs(_SWEEP.value):
    c = plan.load_run(run)[2]
    key = json.dumps([c.model.to_dict(), c.data.seq_len, c.train.batch_size, c.train.grad_accum,
                      c.train.loss_chunk, c.parallel.to_dict()], sort_keys=True, default=str)
    if key not in seen:
      seen.add(key)
      out.append(c)
  return out


def cmd_compile_check(config):
  """Compile the train step for target meshes without running it: fit, memory, FLOPs, estimated step time."""
  from hybrid_jax.parallel import compile_check, mesh as mesh_lib, rules as rules_lib
  limit = _BUDGET.value * 2**30 if _BUDGET.value else None
  rows = []
  try:
    targets = _compile_targets()
    print(compile_check.table([]), flush=True)  # Rows follow as they compile (minutes each at study scale).
    for c in _compile_configs(config):
      for target in targets:
        rows.append(compile_check.check(c, target, memory_limit=limit, find_fit=_FIND_FIT.value))
        print(compile_check.table(rows[-1:]).splitlines()[-1], flush=True)
  except (mesh_lib.MeshError, rules_lib.ShardingRuleError, ConfigError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if _JSON.value:
    pathlib.Path(_JSON.value).write_text(json.dumps(rows, indent=2) + '\n')
  tight = [r for r in rows if r.get('fits') is False]
  for r in tight:
    peak = r.get('per_device_bytes', {}).get('peak')
    need = f'needs {peak / 2**30:.2f} GiB per device' if peak else r.get('error', 'does not fit')
    fix = r.get('fix', {}).get('change')
    over = f", over the limit of {r['hbm_bytes'] / 2**30:.2f} GiB" if r.get('hbm_bytes') else ''
    print(f"error: {r['arch']} {r['scale']} on {r['target']}: the train step {need}{over}; "
          + (f'fits with {fix}' if fix else 'raise parallel.fsdp / parallel.tensor, lower train.batch_size, '
             'raise train.grad_accum or set model.remat'), file=sys.stderr)
  return 3 if tight else 0


COMMANDS = {'train': cmd_train, 'params': cmd_params, 'shardings': cmd_shardings,
            'compile-check': cmd_compile_check}
# Commands with their own argument parsing (no --config): name -> 'module:function(argv)'.
RAW_COMMANDS = {'bench': 'hybrid_jax.bench:main', 'build-tfds': 'hybrid_jax.data.tfds_local:main',
                'fit': 'hybrid_jax.analysis.scaling_law:main', 'eval': 'hybrid_jax.eval.cli:main',
                'analyze': 'hybrid_jax.analysis.cli:main',
                'plan': 'hybrid_jax.study.plan:main', 'collect': 'hybrid_jax.study.collect:main',
                'study': 'hybrid_jax.study.mini:main'}
RAW_COMMANDS['hf'] = 'hybrid_jax.hf.cli:main'  # hf export | hf import (transformers checkpoints)
RAW_COMMANDS['pretokenize'] = 'hybrid_jax.data.pretokenized:main'  # tokenize a corpus once into ArrayRecord shards


def _usage() -> str:
  lines = ['usage: python -m hybrid_jax <command> [flags]', 'commands:']
  lines += [f'  {name:13s} {fn.__doc__.strip().splitlines()[0]}' for name, fn in COMMANDS.items()]
  lines += [f'  {name:13s} see python -m hybrid_jax {name} --help' for name in RAW_COMMANDS]
  return '\n'.join(lines)


def main(argv=None):
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ('help', '-h', '--help'):
    print(_usage())
    sys.exit(0 if len(argv) >= 2 else 2)
  command, rest = argv[1], argv[2:]
  if command in RAW_COMMANDS:
    module_name, fn_name = RAW_COMMANDS[command].split(':')
    module = __import__(module_name, fromlist=[fn_name])
    sys.exit(getattr(module, fn_name)(rest))
  if command not in COMMANDS:
    print(f'unknown command {command!r}\n{_usage()}', file=sys.stderr)
    sys.exit(2)

  def run(_):
    try:
      config = validate(_CONFIG.value)
    except ConfigError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
    return COMMANDS[command](config)

  logging.set_verbosity(logging.WARNING)
  app.run(run, argv=[f'{argv[0]} {command}'] + rest)
