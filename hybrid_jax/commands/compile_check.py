"""`python -m hybrid_jax compile-check`: compile the train step for target meshes without running it."""

import argparse
import json
import pathlib
import sys

from hybrid_jax import checks
from hybrid_jax.commands import config_flags
from hybrid_jax.config import load_run, load_sweep


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


def run(args, config):
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
  from hybrid_jax.compile_check import attention_work
  for line in dict.fromkeys(filter(None, map(attention_work.line, rows))):  # Once per step, after the table.
    print(line)
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
              'raise parallel.fsdp / parallel.tensor / parallel.sequence, lower train.batch_size, raise '
              'train.grad_accum or set model.remat')
    print(f"error: {r['arch']} {r['scale']} on {r['target']}: the train step {need}{over}; {advice}", file=sys.stderr)
  return 3 if tight else 0


def _topologies(text):
  parts = [part.strip() for part in text.split(',') if part.strip()]
  if not parts:
    raise argparse.ArgumentTypeError(f'{text!r} names no topology: give one or more, e.g. v5p:2x2x1,v6e:4x4')
  return parts


def _add_flags(parser):
  config_flags.add_devices_flag(parser, '; without --topology that many CPU devices are faked')
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


def main(argv) -> int:
  """Compile the train step for target meshes without running it: fit, memory, FLOPs, estimated step time."""
  return config_flags.run('compile-check', main.__doc__, argv, run, _add_flags)
