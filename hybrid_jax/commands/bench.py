"""`python -m hybrid_jax bench NAME [flags]`: the flags of each benchmark program of hybrid_jax.bench, which runs
with them (its `run(args)` reads one attribute per flag)."""

import argparse
import os

import jax

from hybrid_jax import bench, checks
from hybrid_jax.bench import attention, data, decode, kernel_errors, moe, scan, step
from hybrid_jax.commands import parsing
from hybrid_jax.errors import InputError
from hybrid_jax.kernels.attention import IMPLEMENTATIONS
from hybrid_jax.kernels.scan_checks import IMPLEMENTATION_NAMES

_JSON_HELP = 'write all rows and the run metadata to this JSON file (rewritten after every row)'


def _parser(name: str, description: str, **kwargs) -> parsing.ArgumentParser:
  return parsing.ArgumentParser(prog=f'python -m hybrid_jax bench {name}', description=description, **kwargs)


def _backend_defaults(args, defaults: dict) -> None:
  """Sets each flag left unset (None) to this backend's default (the GPU's on a backend without its own)."""
  for key, value in defaults.get(jax.default_backend(), defaults['gpu']).items():
    if getattr(args, key) is None:
      setattr(args, key, value)


def _attention(argv) -> int:
  p = _parser('attention', attention.__doc__.split('\n')[0])
  ints = checks.flag_numbers(integer=True, positive=True)
  windows = checks.flag_numbers(integer=True, positive=True, words=('full', 'none', 'None'))
  p.add_argument('--seq-lens', type=ints, help='comma-separated T values (default: 2048,4096,8192 CPU; 4096,32768 GPU)')
  p.add_argument('--windows', type=windows, help="comma-separated windows; 'full' = full causal (default 128,full CPU; "
                 '128,512,2048,full GPU)')
  p.add_argument('--heads', type=checks.POSITIVE_INT, help='query heads (default: 4 on CPU, 16 on GPU/TPU)')
  p.add_argument('--kv-heads', type=checks.POSITIVE_INT, help='kv heads (default: --heads)')
  p.add_argument('--head-dim', type=checks.POSITIVE_INT, help='head dim (default: 64 on CPU, 128 on GPU/TPU)')
  p.add_argument('--batch', type=checks.POSITIVE_INT, help='batch size (default 1 on CPU)')
  p.add_argument('--tokens', type=checks.POSITIVE_INT,
                 help='tokens per call: batch = tokens // T (default 32768 on GPU/TPU)')
  p.add_argument('--gemm', type=checks.POSITIVE_INT,
                 help='size n of the n x n x n GEMM ceiling (default 1024 CPU, 8192 else)')
  p.add_argument('--min-seconds', type=checks.NONNEGATIVE, default=1.0, help='time each measurement at least this long')
  p.add_argument('--dtype', choices=['float32', 'bfloat16', 'float16'], help='default: float32 on CPU, else bf16')
  impls = checks.flag_choices(('auto', *IMPLEMENTATIONS), 'attention implementations')
  p.add_argument('--impls', type=impls,
                 help='comma-separated implementations (default xla CPU, pallas_gpu,cudnn,xla GPU)')
  p.add_argument('--repeats', type=checks.POSITIVE_INT,
                 help='fewest timed runs per measurement (more until 1 s); median reported (default 5 CPU, 20 else)')
  p.add_argument('--documents', type=ints, metavar='N[,N...]',
                 help='also time every call on rows of packed documents of N tokens (segment ids; N = T: one '
                 'document per row) after the unmasked one, for each N listed; those rows carry documents=N and '
                 'their speed vs the unmasked call (default: unmasked only)')
  p.add_argument('--timeout', type=checks.NONNEGATIVE, default=120.0,
                 help='seconds per measurement (one implementation, T and window; compile included): past it the '
                 'row records the timeout and the sweep goes on (0: no limit)')
  p.add_argument('--json', metavar='OUT', type=checks.OUT_FILE, help=_JSON_HELP)
  args = p.parse_args(argv)
  explicit = args.batch is not None, args.tokens is not None
  _backend_defaults(args, attention.DEFAULTS)
  if explicit == (True, False):
    args.tokens = None  # An explicit batch wins over the backend's tokens-per-call default.
  args.batch = args.batch or 1
  args.kv_heads = args.kv_heads or args.heads
  if isinstance(args.seq_lens, str):  # The backend's default.
    args.seq_lens = ints(args.seq_lens)
  if isinstance(args.windows, str):
    args.windows = windows(args.windows)
  if isinstance(args.impls, str):
    args.impls = impls(args.impls)
  if args.heads % args.kv_heads:
    p.error(f'--heads={args.heads} must be a multiple of --kv-heads={args.kv_heads} (grouped-query attention)')
  return attention.run(args)


def _scan(argv) -> int:
  # fla (torch) shares the GPU: JAX must not grab most of its memory up front (before the backend starts below).
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  p = _parser('scan', scan.__doc__.split('\n')[0])
  ints = checks.flag_numbers(integer=True, positive=True)
  p.add_argument('--seq-lens', type=ints, help='comma-separated T values (default 1024,4096,16384 CPU; '
                 '2048,8192,32768 GPU/TPU)')
  p.add_argument('--kernels', type=checks.flag_choices(scan.KERNELS, 'kernels'), default=list(scan.KERNELS),
                 help=f'comma-separated, of {list(scan.KERNELS)}')
  impls = checks.flag_choices(IMPLEMENTATION_NAMES, 'scan implementations')
  p.add_argument('--impls', type=impls, help='comma-separated implementations (default xla,reference CPU; '
                 'pallas_gpu,xla GPU)')
  p.add_argument('--baseline', help='implementation the speed-ups are relative to, one of --impls (default '
                 'reference CPU, xla else)')
  p.add_argument('--batch', type=checks.POSITIVE_INT, help='batch size (default: by device)')
  p.add_argument('--heads', type=checks.POSITIVE_INT, help='heads (default: by device)')
  p.add_argument('--head-dim', type=checks.POSITIVE_INT, help='K = V')
  p.add_argument('--chunk-size', type=checks.POSITIVE_INT, default=64, help='chunk length of the chunked kernels')
  p.add_argument('--dtype', choices=['float32', 'bfloat16'], help='input dtype (default: by device)')
  p.add_argument('--no-bwd', action='store_true', help='time the forward pass only')
  p.add_argument('--repeats', type=checks.POSITIVE_INT, help='fewest timed runs (more until --min-seconds)')
  p.add_argument('--min-seconds', type=checks.NONNEGATIVE, default=0.5, help='fewest seconds of timed runs per row')
  p.add_argument('--gemm', type=checks.POSITIVE_INT, help='n of the n^3 GEMM ceiling (default 1024 CPU, 8192 else)')
  p.add_argument('--fla', action='store_true', help='also time fla (needs fla-core, torch and a CUDA GPU)')
  p.add_argument('--documents', type=ints, metavar='N[,N...]',
                 help='also time every implementation on rows of packed documents of N tokens (segment ids) after '
                 'its unmasked call, for each N listed; those rows carry documents=N and their speed vs the '
                 'unmasked call (default: unmasked only)')
  p.add_argument('--parity', action='store_true', help='check values and gradients on this device first')
  p.add_argument('--parity-only', action='store_true', help='run the parity checks and no timings')
  p.add_argument('--timeout', type=checks.NONNEGATIVE, default=120.0,
                 help='seconds per measurement (each implementation and fla kernel at each T; compile included) '
                 'and per parity case; past it the row records the timeout and the run goes on (0: no limit)')
  p.add_argument('--parity-budget', type=checks.NONNEGATIVE, default=55.0,
                 help='seconds for all parity cases: cases not started by then are recorded as skipped')
  p.add_argument('--json', metavar='OUT', type=checks.OUT_FILE, help=_JSON_HELP)
  args = p.parse_args(argv)
  chosen_baseline = args.baseline
  _backend_defaults(args, scan.DEFAULTS)
  for key, parse in (('seq_lens', ints), ('impls', impls)):
    if isinstance(getattr(args, key), str):  # The backend's default.
      setattr(args, key, parse(getattr(args, key)))
  if chosen_baseline is not None and chosen_baseline not in args.impls:
    p.error(f'argument --baseline: {chosen_baseline!r} is not one of the implementations timed (--impls '
            f'{",".join(args.impls)})')
  if args.baseline not in args.impls:  # The backend's default baseline, when --impls leaves it out: the first.
    args.baseline = args.impls[0]
  return scan.run(args)


def _decode(argv) -> int:
  p = _parser('decode', decode.__doc__)
  p.add_argument('--arches', default='full,swa128,gdn', help='comma-separated arches of the config hybrid')
  p.add_argument('--scale', default='tiny', help='model scale (of the config hybrid)')
  p.add_argument('--contexts', default='1024,4096,16384', type=checks.flag_numbers(integer=True, positive=True),
                 help='comma-separated context lengths L')
  p.add_argument('--steps', type=checks.POSITIVE_INT, default=30, help='timed decode steps per row')
  p.add_argument('--json', default=None, type=checks.OUT_FILE, help='also write the rows to this JSON file')
  return decode.run(p.parse_args(argv))


def _step(argv) -> int:
  p = _parser('step', step.__doc__.split('\n')[0])
  p.add_argument('--config', required=True, help='config file[:arg] as for train, e.g. hybrid:arch=gdn,scale=s1')
  p.add_argument('--seq_len', type=checks.POSITIVE_INT, help='override data.seq_len')
  p.add_argument('--batch_size', type=checks.POSITIVE_INT, help='override train.batch_size (global sequences per step)')
  p.add_argument('--grad_accum', type=checks.POSITIVE_INT, help='override train.grad_accum')
  p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                 help='any config override, repeatable, e.g. --set model.remat=full --set model.scan_layers=False')
  p.add_argument('--documents', type=checks.POSITIVE_INT, metavar='N',
                 help="with data.packing='documents' (the default), rows of documents of N tokens (default: "
                 'data.seq_len // 4)')
  p.add_argument('--steps', type=checks.POSITIVE_INT, default=5, help='timed steady steps (after one warm-up step)')
  p.add_argument('--profile-steps', type=checks.NONNEGATIVE_INT, default=2,
                 help='steps traced by the profiler for the breakdown by part (0 = no breakdown)')
  p.add_argument('--trace-dir', type=checks.OUT_DIR,
                 help='keep the profiler trace here (viewable in TensorBoard / Perfetto); '
                 'default: a temporary directory, deleted afterwards')
  p.add_argument('--json', metavar='OUT', type=checks.OUT_FILE, help='write the full result to this JSON file')
  p.add_argument('--dry-run', action='store_true', help='validate the config and print its model FLOPs; no compile')
  p.add_argument('--compile-only', action='store_true',
                 help='compile the step from shapes only and report compile time and compiled memory (nothing is '
                      'allocated or run: checks that a configuration fits before spending device time)')
  return step.run(p.parse_args(argv), list(argv))


def _data(argv) -> int:
  p = _parser('data', data.__doc__.split('\n')[0], epilog='--config.KEY=VALUE overrides follow --config, as for train.')
  p.add_argument('--config', required=True, help='config file[:arg]: source, seq_len, batch size')
  p.add_argument('--tokenizers', default='', help="comma-separated tokenizer specs (default: the config's)")
  p.add_argument('--make-tokenizers', metavar='DIR', type=checks.OUT_DIR,
                 help='train a tokenizer.json and a SentencePiece model on the '
                 'corpus into DIR and add them to --tokenizers')
  p.add_argument('--workers', default=[0], type=checks.flag_numbers(integer=True, nonnegative=True),
                 help='comma-separated grain worker counts (data.worker_count)')
  p.add_argument('--batches', type=checks.POSITIVE_INT, default=20, help='timed batches per row, at least')
  p.add_argument('--min-seconds', type=checks.NONNEGATIVE, default=3.0, help='timed seconds per row, at least')
  p.add_argument('--hosts', type=checks.POSITIVE_INT, default=1,
                 help='hosts sharing the global batch (each measures its share)')
  p.add_argument('--compile-check', metavar='JSON', type=checks.IN_FILE,
                 help='compile-check --json output: the step consumption')
  p.add_argument('--tokens-per-s', type=checks.flag_number(positive=True),
                 help='else: the tokens/s one host must deliver')
  p.add_argument('--json', metavar='OUT', type=checks.OUT_FILE, help='write the rows to this JSON file')
  args, overrides = p.parse_known_args(argv)
  if overrides and not overrides[0].startswith('--config.'):
    p.error(f'unrecognized arguments: {" ".join(overrides)}')
  return data.run(args, overrides)


def _kernel_errors(argv) -> int:
  p = _parser('kernel-errors', kernel_errors.__doc__.split('\n')[0])
  p.add_argument('--kernels', type=checks.flag_choices(kernel_errors.KERNELS, 'kernels'),
                 default=list(kernel_errors.KERNELS), help=f'comma-separated, of {list(kernel_errors.KERNELS)}')
  p.add_argument('--chunk', type=checks.flag_number(integer=True, low=16, high=128), choices=[16, 32, 64, 128],
                 default=64, help='chunk length of the scans')
  p.add_argument('--dtype', choices=['float32', 'bfloat16'], default='float32', help='input dtype')
  return kernel_errors.run(p.parse_args(argv))


def _moe_shapes(text):
  try:
    return moe.parse_shapes(text)
  except InputError as e:
    raise argparse.ArgumentTypeError(str(e).replace('<flag>=', '', 1)) from None


def _moe(argv) -> int:
  p = _parser('moe', moe.__doc__.split('\n')[0])
  p.add_argument('--shapes', type=_moe_shapes,
                 help='comma-separated TOKENSxD_MODELxEXPERT_WIDTHxEXPERTSxTOP_K (default '
                 f"{moe.DEFAULTS['cpu']['shapes']} CPU; {moe.DEFAULTS['gpu']['shapes']} GPU/TPU)")
  p.add_argument('--impls', type=checks.flag_choices(moe.IMPLEMENTATIONS, 'MoE dispatches'),
                 help="comma-separated dispatches (default ragged_dot,dense CPU and GPU; gmm,ragged_dot,dense TPU; "
                 "'gmm' runs interpreted on CPU: slow)")
  p.add_argument('--dtype', choices=['float32', 'bfloat16'], help='default: float32 on CPU, else bfloat16')
  p.add_argument('--no-bwd', action='store_true', help='time the forward pass only')
  p.add_argument('--repeats', type=checks.POSITIVE_INT, help='fewest timed runs (default 3 CPU, 10 else)')
  p.add_argument('--min-seconds', type=checks.NONNEGATIVE, default=0.5, help='fewest seconds of timed runs per row')
  p.add_argument('--timeout', type=checks.NONNEGATIVE, default=300.0,
                 help='seconds per measurement (one shape and dispatch, compile included): past it the row records '
                 'the timeout and the run goes on (0: no limit)')
  p.add_argument('--json', metavar='OUT', type=checks.OUT_FILE, help=_JSON_HELP)
  args = p.parse_args(argv)
  _backend_defaults(args, moe.DEFAULTS)
  if isinstance(args.shapes, str):  # The backend's default.
    args.shapes = moe.parse_shapes(args.shapes)
  if isinstance(args.impls, str):
    args.impls = args.impls.split(',')
  return moe.run(args)


_BENCHMARKS = {'attention': _attention, 'scan': _scan, 'decode': _decode, 'step': _step, 'data': _data,
               'kernel-errors': _kernel_errors, 'moe': _moe}


def main(argv) -> int:
  """Time kernels, MoE dispatch, decoding and the train step (attention, scan, moe, decode, step); kernel errors."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax bench', description=bench.__doc__.splitlines()[0])
  parser.add_argument('name', metavar='NAME', choices=list(_BENCHMARKS),
                      help=f'the benchmark: {", ".join(_BENCHMARKS)} (NAME --help lists its flags)')
  parser.add_argument('args', nargs='...', help="the benchmark's flags")
  args = parser.parse_args(argv)
  return _BENCHMARKS[args.name](args.args)
