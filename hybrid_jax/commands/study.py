"""`python -m hybrid_jax study`: the mini-study's runs, scores and verdicts on the study's mechanistic claims."""

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.study import mini
from hybrid_jax.study.presets import ARCHES, DESCRIPTIONS, PRESETS, select_arches


def _epilog() -> str:
  """One line per preset (docs/MINI_STUDY.md has the whole story)."""
  width = max(map(len, PRESETS))
  return 'presets (docs/MINI_STUDY.md):\n' + '\n'.join(
      f'  {name:<{width}}  {DESCRIPTIONS.get(name, PRESETS[name].note)}' for name in PRESETS)


def main(argv) -> int:
  """The mini-study: every arch on the recall task, verdicts on the study's mechanistic claims."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax study', description=mini.__doc__, epilog=_epilog())
  parser.add_argument('--preset', choices=sorted(PRESETS), default='mini',
                      help='the study size and task: one line each below; mini trains until retrieval forms, capped '
                      'at 20,000 steps; a cell of the load study is one preset and one arch, e.g. --preset load-1.5 '
                      '--arches gdn')
  parser.add_argument('--out', default=None, type=checks.OUT_DIR,
                      help='output directory (default: runs/study_<preset>)')
  parser.add_argument('--seeds', type=checks.POSITIVE_INT, default=None,
                      help="number of seeds (0, 1, ...) per arch (default: the preset's)")
  parser.add_argument('--arches', default=None,
                      help=f'comma-separated subset of {", ".join(ARCHES)} (or their arch names; default: the '
                      "preset's: every one-cycle arch for mini, all of them for mini-deep)")
  parser.add_argument('--parallel', type=checks.POSITIVE_INT, default=None,
                      help="runs trained at a time (default: the preset's): above 1, the runs not yet trained train "
                      'in that many processes through the sweep runner (sweep run --sweep sweep:mini), '
                      'then are scored here')
  args = parser.parse_args(argv)
  out = args.out or f'runs/study_{args.preset}'
  parallel = PRESETS[args.preset].parallel if args.parallel is None else args.parallel
  report = mini.run_study(args.preset, out, seeds=args.seeds, arches=select_arches(args.arches, PRESETS[args.preset]),
                     parallel=parallel)
  print('\n'.join(report['table'] + [''] + report['findings']))
  print(f'report: {out}/report.json, {out}/report.png')
  return 0
