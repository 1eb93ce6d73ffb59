"""`python -m hybrid_jax sweep run|status`: run every run of a sweep under one root, or print where each stands.

  python -m hybrid_jax sweep run --sweep sweep:main --root runs/main [--parallel 2] \\
      [--config.train.steps=100 ...]
  python -m hybrid_jax sweep run --sweep sweep:s5 --root /mnt/BUCKET/s5 --backend tpu --zone us-east5-a \\
      --repo https://github.com/YOU/hybrid_jax --bucket BUCKET --spot --fit docs/TPU_FIT.json --parallel 4
  python -m hybrid_jax sweep status --root runs/main

Rerunning the same `sweep run` skips completed runs and resumes stopped ones; a run that failed on a user error is
reported with its cause and not retried unless its command changed (or --retry-failed). `--config.KEY=VALUE`
overrides apply to every run; on a rerun, one that would change a key that defines an existing run is refused for
that run, as `train` refuses it.
"""


from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.sweep import members as members_lib, runner as runner_lib, status as status_lib


def _run_parser():
  p = parsing.ArgumentParser(prog='python -m hybrid_jax sweep run', description=__doc__.splitlines()[0],
                             epilog='Any config key of every run is overridden with --config.KEY=VALUE.')
  p.add_argument('--sweep', required=True, metavar='FILE:NAME',
                 help='sweep file (or the packaged sweep) and name, e.g. sweep:main or configs/laziness.py:scale=s1')
  p.add_argument('--root', required=True, help='folder of the run directories (a mounted bucket for --backend tpu)')
  p.add_argument('--backend', choices=('local', 'tpu'), default='local',
                 help='local: child processes on this machine; tpu: one Cloud TPU slice per run (launch/tpu_pod.py)')
  p.add_argument('--parallel', type=checks.POSITIVE_INT, default=1,
                 help='runs at a time (local: processes, each with its share of the GPUs; tpu: slices)')
  p.add_argument('--retry-failed', action='store_true',
                 help='start runs that failed on a user error again even with the same command')
  p.add_argument('--dry-run', action='store_true', help='print what each run would execute; start nothing')
  p.add_argument('--wandb', default='', metavar='PROJECT',
                 help="also log every run's metrics.jsonl records to this Weights & Biases project (pip install "
                 "'hybrid_jax[wandb]'; WANDB_MODE=offline logs to files only)")
  _add_tpu_flags(p)
  return p


def _add_tpu_flags(p) -> None:
  """The flags of --backend tpu (hybrid_jax.sweep.tpu reads them as attributes of the parsed flags)."""
  g = p.add_argument_group('--backend tpu')
  g.add_argument('--zone', default='', help='the zone of the slices, e.g. us-east5-a')
  g.add_argument('--project', default='', help="'' = gcloud's configured project")
  g.add_argument('--accelerator', default='v5p-8', help='the accelerator type of runs without a --fit row')
  g.add_argument('--version', default='v2-alpha-tpuv5', help='TPU software (runtime) version')
  g.add_argument('--spot', action='store_true', help='spot (preemptible) capacity; preempted slices are re-queued')
  g.add_argument('--repo', default='', help='git URL of this project, cloned on every new slice')
  g.add_argument('--bucket', default='', help='the Cloud Storage bucket mounted at /mnt/BUCKET (holds --root)')
  g.add_argument('--fit', metavar='FILE', type=checks.IN_FILE, default=None,
                 help="compile-check rows (--json), e.g. docs/TPU_FIT.json: each run's topology, as plan reads it")
  g.add_argument('--chip', default='v5p', help='with --fit: the TPU generation whose rows to use')
  g.add_argument('--name-prefix', default='hj-sweep', help='slices are named PREFIX-<slot>')
  g.add_argument('--poll-s', type=checks.flag_number(positive=True), default=30.0,
                 help='seconds between looks at a queued slice (and before retrying a failed create)')
  g.add_argument('--max-requeues', type=checks.POSITIVE_INT, default=20,
                 help='preemptions and failed creates a run may meet before the runner gives up on it')


def _status_parser():
  p = parsing.ArgumentParser(prog='python -m hybrid_jax sweep status', description=status_lib.__doc__)
  p.add_argument('--root', required=True, type=checks.IN_DIR, help='folder of the run directories')
  return p


def run(argv) -> int:
  parser = _run_parser()
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith('--config.')]
  if bad:
    parser.error(f'unrecognized arguments: {" ".join(bad)}')
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  members = members_lib.load(args.sweep, args.root, rest)
  sweep = args.sweep.partition(':')[2] or 'study'
  if args.backend == 'tpu':
    from hybrid_jax.sweep import tpu  # pylint: disable=g-import-not-at-top
    backend = tpu.TpuBackend.from_args(args, members)
  else:
    from hybrid_jax.sweep import local  # pylint: disable=g-import-not-at-top
    checks.path(args.root, '--root', kind='dir', exists=False, writable=True)
    backend = local.LocalBackend(args.parallel)
  if args.dry_run:
    for member in members:
      print(f'# {member.name}: {runner_lib.decide(member, args.retry_failed)[1]}')
      for line in backend.commands(member):
        print(line)
    return 0
  sink = None
  if args.wandb:
    from hybrid_jax.sweep import wandb_sink  # pylint: disable=g-import-not-at-top
    sink = wandb_sink.WandbSink(args.wandb)
  return runner_lib.Runner(members, backend, sweep=sweep, retry_failed=args.retry_failed, sink=sink,
                           say=lambda line: print(line, flush=True)).run()


def main(argv) -> int:
  """Run every run of a sweep (local or Cloud TPU, resumable), or print where each stands."""
  p = parsing.ArgumentParser(prog='python -m hybrid_jax sweep', description=__doc__)
  p.add_argument('command', choices=('run', 'status'), help='run: start or resume the runs; status: where each stands')
  p.add_argument('args', nargs='...', help="the command's flags")
  args = p.parse_args(argv)
  if args.command == 'status':
    return status_lib.main(_status_parser().parse_args(args.args).root)
  return run(args.args)
