"""Command-line entry: `python -m hybrid_jax <command> [flags]`; `python -m hybrid_jax --help` lists the commands.

Every command parses its own flags with argparse (hybrid_jax.command_line): `--help` lists them with their defaults,
and bad input is one `error: …` line with exit status 2. The commands that read a config take `--config=FILE[:ARG]`
and any number of `--config.KEY=VALUE` overrides, and validate it before anything compiles.
"""

import argparse
import json
import os
import pathlib
import sys

from hybrid_jax import checks, command_line, host_memory
from hybrid_jax.config import (BASE_CONFIG, apply_overrides, load_config_file, load_run, load_sweep, resolve_spec,
                               validate)

DEFAULT_CONFIG = 'hybrid:arch=swa128_nope,scale=tiny'  # The packaged study grid (hybrid_jax/configs/hybrid.py).
OVERRIDES_HELP = ('Any config key is overridden with --config.KEY=VALUE (e.g. --config.train.steps=100 '
                  '--config.model.window=64); the keys and their defaults are in the packaged base config, '
                  f'{BASE_CONFIG}.')


def _workdir(args, config) -> pathlib.Path:
  """The run directory: a folder that exists or can be made, checked before anything is built."""
  from hybrid_jax.train import runs
  workdir = runs.local_workdir(args.workdir or pathlib.Path('runs') / config.name)
  return checks.path(workdir, '--workdir', kind='dir', exists=False, writable=True)


def cmd_train(args, config):
  """Train (or resume) a run in the workdir and write its report."""
  from hybrid_jax import training
  from hybrid_jax.parallel import distributed
  from hybrid_jax.train import loop
  workdir = _workdir(args, config)
  try:  # A refusal (another trainer holds the workdir, or the config would change the run) is a user error.
    result = training.train(config, workdir)
  except distributed.DistributedError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # A normal exit would wait at jax's shutdown barrier for the dead process and abort.
  print(loop.summary_line(result))
  print(f'report: {workdir / "report.json"}')
  return 0 if result['status'] == 'completed' else 143


def cmd_params(args, config):  # pylint: disable=unused-argument
  """Print parameter counts (non_embedding, embedding, total, per layer) as one JSON object."""
  from hybrid_jax.models.counting import param_counts
  print(json.dumps(param_counts(config.model), indent=2))
  return 0


def cmd_shardings(args, config):
  """Print each parameter's sharding on the configured mesh and flag tensors left replicated."""
  import jax
  from hybrid_jax.parallel import mesh as mesh_lib, rules as rules_lib
  from hybrid_jax.train import state as state_lib
  ici, dcn = mesh_lib.mesh_shape(config.parallel, args.devices or jax.device_count())
  shape = {a: ici[a] * dcn[a] for a in mesh_lib.AXES}
  _, text = mesh_lib.sharding_report(state_lib.make_model_def(config.model), rules_lib.parse_rules(
      config.parallel.rules), shape)
  print(text)
  return 0


def _compile_targets(args):
  from hybrid_jax.compile_check import fit as compile_check
  if args.topology:
    return [compile_check.tpu_target(t, args.num_slices) for t in args.topology]
  return [compile_check.fake_cpu_target(args.devices)]


def _compile_configs(args, config):
  """--config, or the distinct compiled steps of --sweep (runs that differ only in length compile the same)."""
  if not args.sweep:
    return [config]
  seen, out = set(), []
  for run in load_sweep(args.sweep):
    c = load_run(run)[2]
    key = json.dumps([c.model.to_dict(), c.data.seq_len, c.train.batch_size, c.train.grad_accum,
                      c.train.loss_chunk, c.parallel.to_dict()], sort_keys=True, default=str)
    if key not in seen:
      seen.add(key)
      out.append(c)
  return out


def cmd_compile_check(args, config):
  """Compile the train step for target meshes without running it: fit, memory, FLOPs, estimated step time."""
  from hybrid_jax.compile_check import fit as compile_check
  limit = args.memory_budget_gib * 2**30 if args.memory_budget_gib else None
  rows = []
  targets = _compile_targets(args)
  configs = _compile_configs(args, config)  # A bad sweep is refused before the table starts.
  print(compile_check.table([]), flush=True)  # Rows follow as they compile (minutes each at study scale).
  for c in configs:
    for target in targets:
      rows.append(compile_check.check(c, target, memory_limit=limit, find_fit=args.find_fit))
      print(compile_check.table(rows[-1:]).splitlines()[-1], flush=True)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=2) + '\n')
  tight = [r for r in rows if r.get('fits') is False]
  for r in tight:
    peak = r.get('per_device_bytes', {}).get('peak')
    need = f'needs {peak / 2**30:.2f} GiB per device' if peak else r.get('error', 'does not fit')
    fix = r.get('fix', {})
    flags = ' '.join(f'--config.{k}={v}' for k, v in fix.get('overrides', {}).items())
    over = f", over the limit of {r['hbm_bytes'] / 2**30:.2f} GiB" if r.get('hbm_bytes') else ''
    advice = (f"fits with {fix['change']}: add {flags}" if 'change' in fix else
              'raise parallel.fsdp / parallel.tensor, lower train.batch_size, raise train.grad_accum or set model.remat')
    print(f"error: {r['arch']} {r['scale']} on {r['target']}: the train step {need}{over}; {advice}", file=sys.stderr)
  return 3 if tight else 0


def _add_config_flags(parser):
  parser.add_argument('--config', default=DEFAULT_CONFIG, metavar='FILE[:ARG]',
                      help='a packaged config (hybrid, base, mini) or a config file, and its argument '
                      '(get_config(ARG)), e.g. hybrid:arch=gdn,scale=s1 or configs/hybrid.py:arch=gdn,scale=s1')


def _add_devices_flag(parser, what):
  parser.add_argument('--devices', type=checks.POSITIVE_INT, default=None,
                      help=f'device count of the target mesh (None: the devices present{what})')


def _add_train_flags(parser):
  parser.add_argument('--workdir', default=None, type=checks.OUT_DIR,
                      help='run directory (checkpoints, metrics, report); None means runs/<config.name>')


def _add_shardings_flags(parser):
  _add_devices_flag(parser, '')


def _topologies(text):
  parts = [part.strip() for part in text.split(',') if part.strip()]
  if not parts:
    raise argparse.ArgumentTypeError(f'{text!r} names no topology: give one or more, e.g. v5p:2x2x1,v6e:4x4')
  return parts


def _add_compile_check_flags(parser):
  _add_devices_flag(parser, '; without --topology that many CPU devices are faked')
  parser.add_argument('--topology', type=_topologies, default=None,
                      help="TPU topologies such as 'v5p:4x4x4,v6e:4x4' (libtpu compiles for them on any host; "
                      'no TPU needed)')
  parser.add_argument('--num_slices', type=checks.POSITIVE_INT, default=1,
                      help='slices of each topology, joined over the data-center network (multislice; the dcn_* '
                      'mesh axes)')
  parser.add_argument('--sweep', default=None, metavar='FILE:NAME',
                      help='check every distinct step of a sweep (e.g. sweep:main) instead of --config')
  parser.add_argument('--memory_budget_gib', type=checks.flag_number(positive=True), default=None,
                      help="the per-device memory limit in GiB (default: the chip's HBM; needed for CPU meshes)")
  parser.add_argument('--json', default=None, metavar='FILE',
                      type=checks.OUT_FILE,
                      help='also write every row (and the fixes tried) to this file')
  parser.add_argument('--find_fit', dest='find_fit', action='store_true', default=True,
                      help='when a step does not fit, compile the changes that save memory and recommend the one '
                      'that fits with the lowest estimated step time (the others are listed)')
  parser.add_argument('--nofind_fit', dest='find_fit', action='store_false', help='do not search for a fit')


# Commands that read a config: name -> (function of (args, config), function adding its own flags).
COMMANDS = {'train': (cmd_train, _add_train_flags), 'params': (cmd_params, lambda parser: None),
            'shardings': (cmd_shardings, _add_shardings_flags),
            'compile-check': (cmd_compile_check, _add_compile_check_flags)}
# Commands with their own parser and no --config: name -> 'module:function(argv)'.
RAW_COMMANDS = {'bench': 'hybrid_jax.bench:main', 'build-tfds': 'hybrid_jax.commands.build_tfds:main',
                'fit': 'hybrid_jax.analysis.scaling_law:main', 'eval': 'hybrid_jax.eval.cli:main',
                'analyze': 'hybrid_jax.analysis.cli:main',
                'plan': 'hybrid_jax.study.plan:main', 'collect': 'hybrid_jax.study.collect:main',
                'study': 'hybrid_jax.commands.study:main', 'hf': 'hybrid_jax.hf.cli:main',
                'pretokenize': 'hybrid_jax.commands.pretokenize:main', 'sweep': 'hybrid_jax.sweep.cli:main'}
RAW_SUMMARIES = {'bench': 'time kernels, decoding and the sharded train step (attention, scan, decode, step)',
                 'build-tfds': 'write text files as a local TFDS dataset (data.source=tfds)',
                 'fit': 'fit a scaling law to study points and plot it',
                 'eval': 'evaluate a run: perplexity, long-context perplexity, NIAH, RULER, LongBench',
                 'analyze': 'dissect a trained run: probing, restriction, tracing, retrieval heads, influence',
                 'plan': 'tokens, FLOPs and accelerator-hours of a sweep, and its launch lines',
                 'collect': 'gather finished runs into a scaling-law points table',
                 'study': 'the mini-study: four arches on the recall task, verdicts on the study\'s mechanistic claims',
                 'hf': 'export a run as a transformers checkpoint, or import one as a run',
                 'pretokenize': 'tokenize a corpus once into ArrayRecord shards (data.source=pretokenized)',
                 'sweep': 'run every run of a sweep (local or Cloud TPU, resumable), or print where each stands'}


def _command_list() -> str:
  lines = ['commands (python -m hybrid_jax COMMAND --help lists its flags):']
  lines += [f'  {name:14s} {fn.__doc__.strip().splitlines()[0]}' for name, (fn, _) in COMMANDS.items()]
  lines += [f'  {name:14s} {RAW_SUMMARIES[name]}' for name in RAW_COMMANDS]
  return '\n'.join(lines)


def _top_parser():
  parser = command_line.ArgumentParser(prog='python -m hybrid_jax', description=__doc__.splitlines()[0],
                                       epilog=_command_list())
  parser.add_argument('command', metavar='COMMAND', choices=[*COMMANDS, *RAW_COMMANDS],
                      help='one of the commands below')
  parser.add_argument('args', nargs='...', help="the command's flags")
  return parser


def command_parser(command: str):
  """The parser of a config-reading command (its own flags and --config)."""
  fn, add_flags = COMMANDS[command]
  parser = command_line.ArgumentParser(prog=f'python -m hybrid_jax {command}', description=fn.__doc__.strip(),
                                       epilog=OVERRIDES_HELP)
  _add_config_flags(parser)
  add_flags(parser)
  return parser


def load_config(spec: str, overrides):
  """The validated config of `--config=FILE[:ARG]` and its `--config.KEY=VALUE` overrides, in order."""
  config = load_config_file(resolve_spec(spec))
  apply_overrides(config, overrides)
  config.lock()
  return validate(config)


def _run_config_command(command: str, argv) -> int:
  parser = command_parser(command)
  args, rest = parser.parse_known_args(argv)
  if rest and not rest[0].startswith('--config.'):
    parser.error(f'unrecognized arguments: {" ".join(rest)}')
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  return COMMANDS[command][0](args, load_config(args.config, rest))


def main(argv=None):
  host_memory.keep_freed_memory()  # Before any array exists: on a CPU each step then reuses its buffers.
  argv = list(sys.argv if argv is None else argv)
  args = _top_parser().parse_args(argv[1:])
  if args.command in RAW_COMMANDS:
    module_name, fn_name = RAW_COMMANDS[args.command].split(':')
    module = __import__(module_name, fromlist=[fn_name])
    sys.exit(command_line.run(getattr(module, fn_name), args.args))
  sys.exit(command_line.run(_run_config_command, args.command, args.args))
