"""`python -m hybrid_jax fit --data FILE [--polish] [--out DIR]`: prints the fit as one JSON object and plots it in
  DIR. The fit is the study's released procedure; --polish adds the objective's minimum beside it."""

import json
import pathlib

from hybrid_jax import checks
from hybrid_jax.analysis import scaling_law
from hybrid_jax.commands import parsing
from hybrid_jax.errors import InputError


def main(argv) -> int:
  """Fit a scaling law to study points and plot it."""
  parser = parsing.ArgumentParser(prog='python -m hybrid_jax fit', description=__doc__)
  parser.add_argument('--data', required=True, type=checks.IN_FILE,
                      help='TSV/CSV/JSON with n (or N), tokens/D or token_multiplier, and the metric column')
  parser.add_argument('--formula', choices=scaling_law.FORMULAS, default='no_constant', help='the law fitted')
  parser.add_argument('--metric-column', default='loss', help='column of the metric fitted')
  parser.add_argument('--log-metric', action='store_true', help='fit ln(metric), e.g. ln(LongPPL)')
  parser.add_argument('--holdout', choices=('largest', 'none'), default='largest', 
                      help='points left out of the fit and scored: the largest model, or none')
  parser.add_argument('--alpha-bounds', default=[0.2, 0.3], type=checks.flag_numbers(nonnegative=True),
                      help='lower,upper bound of alpha')
  parser.add_argument('--polish', action='store_true',
                      help="also minimise the objective to convergence and report that fit under 'polish', beside "
                      "the released procedure's (which stops short of the minimum)")
  parser.add_argument('--out', default='.', type=checks.OUT_DIR,
                      help='folder for the outputs (the plot <data stem>_fit.png)')
  args = parser.parse_args(argv)
  if len(args.alpha_bounds) != 2 or not args.alpha_bounds[0] < args.alpha_bounds[1]:
    raise InputError(f'--alpha-bounds={",".join(map(str, args.alpha_bounds))} is invalid: give two numbers, '
                     'lower < upper, e.g. 0.2,0.3')
  low, high = args.alpha_bounds
  points = scaling_law.load_points(args.data, metric_column=args.metric_column, log_metric=args.log_metric)
  result = scaling_law.fit_and_score(points, formula=args.formula, holdout=args.holdout, alpha_bounds=(low, high),
                         polish_fit=args.polish)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  plot = out / f'{pathlib.Path(args.data).stem}_fit.png'
  ylabel = f'ln({args.metric_column})' if args.log_metric else args.metric_column
  scaling_law.plot_fit(points, result, plot, ylabel=ylabel)
  result['plot'] = str(plot)
  print(json.dumps(result, indent=2))
  return 0
