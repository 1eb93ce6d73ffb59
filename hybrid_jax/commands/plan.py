"""`python -m hybrid_jax plan`: the plan of a sweep or of run strings (hybrid_jax.study.plan)."""

import json
import pathlib
import sys

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.compile_check import rows as compile_check_rows
from hybrid_jax.config import load_sweep
from hybrid_jax.study import plan as plan_lib


def main(argv=None) -> int:
  """Tokens, FLOPs and accelerator-hours of a sweep, and its launch lines."""
  p = parsing.ArgumentParser(prog='python -m hybrid_jax plan', description=plan_lib.__doc__.split('\n')[0])
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument('--sweep', help='sweep file[:name]; its runs(name) returns config strings')
  source.add_argument('--runs', nargs='+', help='config strings, e.g. hybrid:arch=gdn,scale=s1')
  p.add_argument('--tflops', type=checks.flag_number(positive=True), default=989.0,
                 help='peak TFLOP/s of one device (default: H100/H200 bf16)')
  p.add_argument('--mfu', type=checks.flag_number(positive=True, high=1), default=0.4,
                 help='expected model FLOPs utilisation, a fraction')
  p.add_argument('--launch-list', metavar='FILE', type=checks.OUT_FILE,
                 help='write one launcher command line per run')
  p.add_argument('--json', metavar='FILE', type=checks.OUT_FILE,
                 help='write the plan as JSON')
  p.add_argument('--fit', metavar='FILE', type=checks.IN_FILE,
                 help="compile-check rows (--json), e.g. docs/TPU_FIT.json: add TPU-hours")
  p.add_argument('--chip', default='v5p', help='with --fit: the TPU generation whose rows to use (default: v5p)')
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  runs = load_sweep(args.sweep) if args.sweep else args.runs
  plan = plan_lib.make_plan(runs, args.tflops, args.mfu, compile_check_rows.load(args.fit, args.chip) if args.fit else None)
  print(plan_lib.table(plan))
  if args.launch_list:
    pathlib.Path(args.launch_list).write_text('\n'.join(plan_lib.launch_lines(plan)) + '\n')
    print(f'launch list: {args.launch_list} ({len(plan["runs"])} commands)')
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(plan, indent=1) + '\n')
  return 0
