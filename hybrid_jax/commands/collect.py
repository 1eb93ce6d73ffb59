"""`python -m hybrid_jax collect`: the final metrics of run directories as one TSV table (hybrid_jax.study.collect)."""

from hybrid_jax import checks
from hybrid_jax.commands import parsing
from hybrid_jax.study import collect


def main(argv) -> int:
  """Gather finished runs into a scaling-law points table."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax collect', description=collect.__doc__)
  parser.add_argument('workdirs', nargs='+', type=checks.IN_DIR,
                      help='run directories (config.json, report.json, eval/)')
  parser.add_argument('--out', required=True, type=checks.OUT_FILE,
                      help='output TSV path')
  args = parser.parse_args(argv)
  rows = collect.collect(args.workdirs)
  columns = collect.write_table(rows, args.out)
  print(f'{len(rows)} runs, {len(columns)} columns -> {args.out}')
  return 0
