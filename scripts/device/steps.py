"""The training-step phase of scripts/device/measure.sh: `bench step` for several runs in one process (one jax start,
one GPU memory pool), each run's result written to --json the moment it ends.

  python3 scripts/device/steps.py --json OUT.json [--deadline S] [--dry-run] RUN [RUN ...]

A run is ARCH (the config's own packing, documents: data.packing's default, documents of T / 4 tokens as bench
step makes them) or ARCH_concat (data.packing=concat), ARCH one of the study's arches. Every run is the S4 step at
16K x 8 with the study's settings (remat save_dots, the chunked loss) under the flags training uses: the process's
XLA_FLAGS are the same for every run, so command buffers are on or off alike (no run is profiled). Each run has
its own time limit (--timeout; a compile that overruns ends at its next return to Python) and none starts after
--deadline seconds (recorded as skipped). --dry-run: a 2-layer model of width 32 at 32 tokens on CPU.
"""

import argparse
import json
import sys
import time
import types

from hybrid_jax.configs import hybrid

SHAPE = dict(seq_len=16384, batch_size=8, steps=3, scale='s4', overrides=('model.remat=save_dots',))
DRY_SHAPE = dict(seq_len=32, batch_size=2, steps=1, scale='tiny',
                 overrides=('model.d_model=32', 'model.num_layers=2', 'model.num_heads=4', 'model.head_dim=8',
                            'model.d_ff=64', 'model.window=16'))


def parse_run(name):
  """(arch, packing override or None) of a run name; ValueError for an unknown arch."""
  arch, concat = (name[:-len('_concat')], True) if name.endswith('_concat') else (name, False)
  if arch not in hybrid.ARCHES:
    raise ValueError(f"unknown step run {name!r}: ARCH or ARCH_concat, ARCH one of {', '.join(hybrid.ARCHES)}")
  return arch, 'data.packing=concat' if concat else None


def _without_tensorboardx():
  """bench step reads only the chip table and FLOP helpers of hybrid_jax.train.metrics, whose run logs need
  tensorboardX; where the device has no tensorboardX wheel, empty stand-ins let the step be timed (nothing here
  writes a log)."""
  try:
    import tensorboardX  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    names = ('tensorboardX', 'tensorboardX.summary', 'tensorboardX.event_file_writer', 'tensorboardX.proto',
             'tensorboardX.proto.event_pb2')
    modules = {name: types.ModuleType(name) for name in names}
    modules['tensorboardX'].summary = modules['tensorboardX.summary']
    modules['tensorboardX.event_file_writer'].EventsWriter = None
    modules['tensorboardX.proto.event_pb2'].Event = modules['tensorboardX.proto.event_pb2'].SessionLog = None
    sys.modules.update(modules)
    print('steps: no tensorboardX here; stand-ins for hybrid_jax.train.metrics (no log is written)', flush=True)


def measure(name, shape):
  """bench step's result for run `name` at `shape`, as `python -m hybrid_jax bench step` computes it."""
  from hybrid_jax.bench import step as bench_step  # pylint: disable=import-outside-toplevel
  arch, packing = parse_run(name)
  overrides = list(shape['overrides']) + ([packing] if packing else [])
  args = types.SimpleNamespace(config=f"hybrid:arch={arch},scale={shape['scale']}", seq_len=shape['seq_len'],
                               batch_size=shape['batch_size'], grad_accum=None, set=overrides, documents=None,
                               steps=shape['steps'], profile_steps=0, trace_dir=None, compile_only=False, json=None)
  argv = ['bench', 'step', '--config', args.config, '--seq_len', str(args.seq_len), '--batch_size',
          str(args.batch_size), '--steps', str(args.steps)] + [f'--set={o}' for o in overrides]
  return bench_step.measure(args, argv)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('runs', nargs='+', metavar='RUN')
  p.add_argument('--json', required=True, help='a list with one result (or error) per run, rewritten after each')
  p.add_argument('--deadline', type=float, default=600.0, help='no run starts after this many seconds')
  p.add_argument('--timeout', type=float, default=90.0, help='seconds per run, compile included')
  p.add_argument('--dry-run', action='store_true', help='a tiny model on CPU')
  args = p.parse_args(argv)
  for name in args.runs:
    parse_run(name)  # Every name checked before the first compile.
  shape = DRY_SHAPE if args.dry_run else SHAPE
  start = time.perf_counter()
  _without_tensorboardx()
  import jax  # pylint: disable=import-outside-toplevel
  from hybrid_jax.bench import step as bench_step, timing  # pylint: disable=import-outside-toplevel
  print(f'steps: {jax.devices()[0].device_kind}, jax {jax.__version__}, {len(args.runs)} runs', flush=True)
  rows = []
  for name in args.runs:
    row = {'run': name}
    if time.perf_counter() - start > args.deadline:
      row['error'] = f'skipped: the deadline of {args.deadline:g} s had passed'
    else:
      timing.measured(row, args.timeout, lambda row, name=name: row.update(measure(name, shape)))
    line = (f"== {name}: {timing.headline(row['error'])}" if 'error' in row else
            f"== {name} ({row['wall_s']:.0f} s)\n{bench_step.report(row)}")
    print(line, flush=True)
    rows.append(row)
    with open(args.json, 'w') as fh:
      json.dump(rows, fh, indent=1, default=str)
  return 0


if __name__ == '__main__':
  sys.exit(main())
