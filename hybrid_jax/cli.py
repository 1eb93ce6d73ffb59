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
_TOPOLOGY = flags.DEFINE_string('topology', None, "compile-check: a TPU topology such as 'v5p:4x4x4' (needs libtpu)")
_BUDGET = flags.DEFINE_float('memory_budget_gib', None, 'compile-check: fail when the peak per-device memory '
                             'exceeds this many GiB.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory (checkpoints, metrics, report). '
                               'Default: runs/<config.name>.')


def _workdir(config) -> pathlib.Path:
  return pathlib.Path(_WORKDIR.value or pathlib.Path('runs') / config.name)


def cmd_train(config):
  """Train (or resume) a run in the workdir and write its report."""
  from hybrid_jax.parallel import distributed
  from hybrid_jax.train import loop
  try:
    result = loop.train(config, _workdir(config))
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


def _compile_report(config, devices, topology) -> dict:
  """Per-device bytes (parameters, optimizer, arguments, temporaries, peak) and FLOPs of one compiled step."""
  import math
  import jax
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import optim, state as state_lib, step as step_lib
  if topology:
    target = mesh_lib.topology_devices(topology)
  else:
    if devices:
      try:
        jax.config.update('jax_num_cpu_devices', int(devices))  # Fake CPU devices; only before jax starts.
      except Exception:  # Backends already running: the check below explains.
        pass
    if devices and jax.default_backend() == 'cpu' and jax.device_count() < devices:
      raise ConfigError(f'--devices={devices}: only {jax.device_count()} CPU devices; compile-check fakes them '
                        'when started fresh (python -m hybrid_jax compile-check sets jax_num_cpu_devices)')
    target = jax.devices()[:devices] if devices else jax.devices()
  mesh = mesh_lib.make_mesh(config.parallel, target)
  model_def = state_lib.make_model_def(config.model)
  tx = optim.make_optimizer(config.train)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh, rules_lib.parse_rules(config.parallel.rules))
  abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(config.model, config.seed, tx),
                                            shardings.state)
  compiled = step_lib.compile_train_step(model_def, tx, config.train, shardings, abstract, config.data.seq_len)

  def per_device(tree):
    return int(sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(tree)))

  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  args, out, temp = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes
  return {
      'mesh': dict(mesh.shape), 'platform': target[0].platform, 'devices': len(target),
      'per_device_bytes': {'parameters': per_device(abstract['params']),
                           'optimizer': per_device(abstract['opt_state']), 'arguments': int(args),
                           'outputs': int(out), 'activations_and_temporaries': int(temp),
                           'peak': int(args + out - mem.alias_size_in_bytes + temp)},
      'flops_per_step_per_device': float((cost or {}).get('flops', float('nan'))),
  }


def cmd_compile_check(config):
  """Compile the train step for a target mesh without running it; report per-device memory and FLOPs."""
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  try:
    report = _compile_report(config, _DEVICES.value, _TOPOLOGY.value)
  except (mesh_lib.MeshError, rules_lib.ShardingRuleError, ConfigError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(json.dumps(report, indent=2))
  budget = _BUDGET.value
  if budget is not None and report['per_device_bytes']['peak'] > budget * 2**30:
    print(f"error: the train step needs {report['per_device_bytes']['peak'] / 2**30:.2f} GiB per device, over the "
          f'budget of {budget} GiB; raise parallel.fsdp / parallel.tensor, lower train.batch_size or set '
          'model.remat', file=sys.stderr)
    return 3
  return 0


COMMANDS = {'train': cmd_train, 'params': cmd_params, 'shardings': cmd_shardings,
            'compile-check': cmd_compile_check}
# Commands with their own argument parsing (no --config): name -> 'module:function(argv)'.
RAW_COMMANDS = {'bench': 'hybrid_jax.bench:main', 'build-tfds': 'hybrid_jax.data.tfds_local:main',
                'fit': 'hybrid_jax.analysis.scaling_law:main', 'eval': 'hybrid_jax.eval.cli:main',
                'analyze': 'hybrid_jax.analysis.cli:main',
                'plan': 'hybrid_jax.study.plan:main', 'collect': 'hybrid_jax.study.collect:main',
                'study': 'hybrid_jax.study.mini:main'}
RAW_COMMANDS['hf'] = 'hybrid_jax.hf.cli:main'  # hf export | hf import (transformers checkpoints)


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
