"""Scaling-law fits y = b·N^(−α) + c·D^(−β) (+ a), by the study's released fitting procedure.

Fit in log space: with b = e^B, c = e^C (a = e^A), predict log y = logsumexp(B − α ln N, C − β ln D [, A]) and
minimise the summed Huber loss (δ = 1e-3) of log-space residuals. The default is the released procedure as it runs
(its analysis code's `fit_scaling.py`): L-BFGS-B from each start of a 1,728-point grid with maxiter 3000 /
ftol 1e-6 and SciPy's other defaults (finite-difference gradients, gtol 1e-5), then the best start's result refitted
with maxiter 20000 / ftol 1e-8; bounds α ∈ [0.2, 0.3], β ≥ 0. Its coefficients are the ones the paper reports.
That procedure stops short of the objective's minimum (ftol is relative to max(|f|, 1) and the loss is ~2e-4), so
`polish_fit=True` (`--polish`) also reports the minimum itself beside it (the same objective, polished to convergence).
Fitting in log space with logsumexp keeps every term positive and the problem well conditioned across orders of
magnitude of N and D. Goodness of fit (R², RMSE, MAE) is reported on y itself (ln of the metric with --log-metric).
"""

import dataclasses
import itertools
import math
import pathlib
import re

import numpy as np
from scipy import optimize, special
from threadpoolctl import threadpool_limits

from hybrid_jax import readers
from hybrid_jax.errors import UserError

FORMULAS = ('no_constant', 'chinchilla')
HUBER_DELTA = 1e-3
# The released procedure's L-BFGS-B options; it sets maxiter and ftol only, so gtol, eps and the finite-difference
# gradient are SciPy's defaults.
GRID_OPTIONS = {'maxiter': 3000, 'ftol': 1e-6}
REFIT_OPTIONS = {'maxiter': 20000, 'ftol': 1e-8}
GRID = {  # The study's grid of starts.
    'alpha': (0.1, 0.2, 0.5, 1.0, 1.5, 2.0),
    'beta': (0.1, 0.2, 0.5, 0.8, 1.0, 1.2),
    'B': (0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0),
    'C': (0.0, 1.0, 2.0, 8.0, 10.0, 12.0),
    'A': (-2.0, 0.0, 1.0),  # Chinchilla only; the study does not state this grid (our choice).
}


POLISHED_STARTS = 3  # --polish: the best grid starts (and the released fit) polished; the lowest is reported.
POLISH_TOL = 1e-13  # A polishing round that improves the loss by less than this ends the polish.
POLISH_ROUNDS = 50
LOG_COEF_BOUND = 100.0


class FitDataError(UserError, ValueError):
  """The input table cannot be fitted (missing columns, bad numbers, too few points)."""


@dataclasses.dataclass(frozen=True)
class Points:
  size: list  # Model-size labels (e.g. 'S1'), for plots and hold-out.
  n: np.ndarray  # Non-embedding parameters.
  d: np.ndarray  # Training tokens.
  y: np.ndarray  # The fitted quantity (ln of the metric with --log-metric).

  def subset(self, mask):
    return Points([s for s, m in zip(self.size, mask) if m], self.n[mask], self.d[mask], self.y[mask])


def _number(text, what, row):
  try:
    value = float(text)
  except (TypeError, ValueError):
    raise FitDataError(f'row {row}: {what}={text!r} is not a number') from None
  if not math.isfinite(value) or value <= 0:
    raise FitDataError(f'row {row}: {what}={text!r} must be a positive finite number')
  return value


def _tokens(row, n, index):
  """D from a 'tokens' / 'D' column, or the study's `token_multiplier` like '200.110938n' (times n)."""
  for key in ('tokens', 'D', 'd'):
    if row.get(key) not in (None, ''):
      return _number(row[key], key, index)
  multiplier = row.get('token_multiplier')
  if multiplier is None:
    raise FitDataError(f'row {index}: no tokens / D / token_multiplier column')
  match = re.fullmatch(r'\s*([0-9.eE+-]+)\s*n\s*', multiplier)
  if not match:
    raise FitDataError(f"row {index}: token_multiplier={multiplier!r} must look like '200.11n'")
  return _number(match.group(1), 'token_multiplier', index) * n


def load_points(path, *, metric_column='loss', log_metric=False) -> Points:
  """Reads a TSV/CSV (delimiter sniffed from the extension) or a JSON list of records."""
  path = pathlib.Path(path)
  if not path.exists():
    raise FitDataError(f'data file {str(path)!r} does not exist')
  if path.suffix == '.json':
    rows = readers.read_json(path, '--data', expect=list, items=dict)
  else:
    rows = readers.read_table(path, '--data')
  if not rows:
    raise FitDataError(f'{path}: no rows')
  sizes, ns, ds, ys = [], [], [], []
  for i, row in enumerate(rows, start=1):
    n_key = next((k for k in ('n', 'N', 'non_embedding') if k in row), None)
    if n_key is None or metric_column not in row:
      raise FitDataError(f'{path}: row {i} needs columns n (or N) and {metric_column!r}; has {sorted(row)}')
    n = _number(row[n_key], n_key, i)
    y = _number(row[metric_column], metric_column, i)
    if log_metric:
      y = math.log(y)
      if y <= 0:
        raise FitDataError(f'row {i}: ln({metric_column}) = {y:.4g} must be positive to fit a power law')
    sizes.append(str(row.get('model_size', row.get('size', f'N={n:.3g}'))))
    ns.append(n)
    ds.append(_tokens(row, n, i))
    ys.append(y)
  return Points(sizes, np.array(ns), np.array(ds), np.array(ys))


def _terms(theta, formula, n, d):
  terms = [theta['B'] - theta['alpha'] * np.log(n), theta['C'] - theta['beta'] * np.log(d)]
  if formula == 'chinchilla':
    terms.append(np.full_like(terms[0], theta['A']))
  return np.stack(terms)


def _names(formula):
  return ('alpha', 'beta', 'B', 'C') + (('A',) if formula == 'chinchilla' else ())


def _loss(x, formula, log_n, log_d, log_y):
  """The summed Huber loss alone, as the released procedure minimises it (SciPy differentiates it numerically).
  np.logaddexp is logsumexp over the two or three terms, about 100x cheaper than special.logsumexp per call."""
  log_pred = np.logaddexp(x[2] - x[0] * log_n, x[3] - x[1] * log_d)
  if formula == 'chinchilla':
    log_pred = np.logaddexp(log_pred, x[4])
  return float(np.sum(special.huber(HUBER_DELTA, log_pred - log_y)))


def _objective(x, names, formula, points):
  """Summed Huber loss of log-space residuals and its exact gradient (L-BFGS-B then needs no finite differences)."""
  theta = dict(zip(names, x))
  terms = _terms(theta, formula, points.n, points.d)
  log_pred = special.logsumexp(terms, axis=0)
  r = log_pred - np.log(points.y)
  dr = np.clip(r, -HUBER_DELTA, HUBER_DELTA)  # d huber / d r
  w = np.exp(terms - log_pred) * dr  # d loss / d term_k, per point
  grad = {'alpha': -np.sum(w[0] * np.log(points.n)), 'beta': -np.sum(w[1] * np.log(points.d)),
          'B': np.sum(w[0]), 'C': np.sum(w[1])}
  if formula == 'chinchilla':
    grad['A'] = np.sum(w[2])
  return float(np.sum(special.huber(HUBER_DELTA, r))), np.array([grad[k] for k in names])


def polish(x, names, formula, points, bounds):
  """(x, loss) at the bottom of x's basin: tight L-BFGS-B, then Powell (derivative-free) from its end point,
  repeated until a round improves the loss by less than POLISH_TOL (L-BFGS-B alone stalls on the flat valley).
  Only improvements are kept, so the loss returned is never above x's."""
  loss = _objective(x, names, formula, points)[0]
  for _ in range(POLISH_ROUNDS):
    lbfgs = optimize.minimize(_objective, x, args=(names, formula, points), method='L-BFGS-B', jac=True,
                              bounds=bounds, options={'maxiter': 100_000, 'ftol': 1e-15, 'gtol': 1e-14, 'maxcor': 50})
    powell = optimize.minimize(lambda z: _objective(z, names, formula, points)[0], lbfgs.x, method='Powell',
                               bounds=bounds, options={'xtol': 1e-12, 'ftol': 1e-15, 'maxiter': 100_000})
    step = min((lbfgs, powell), key=lambda r: r.fun)
    if not step.fun < loss - POLISH_TOL:
      if step.fun < loss:
        x, loss = step.x, float(step.fun)
      break
    x, loss = step.x, float(step.fun)
  return np.asarray(x), float(loss)


def _coefficients(x, names, loss):
  theta = dict(zip(names, x))
  out = {'b': math.exp(theta['B']), 'alpha': float(theta['alpha']), 'c': math.exp(theta['C']),
         'beta': float(theta['beta'])}
  if 'A' in theta:
    out['a'] = math.exp(theta['A'])
  out['loss'] = float(loss)
  return out


def fit(points: Points, *, formula='no_constant', alpha_bounds=(0.2, 0.3), grid=None, polish_fit=False) -> dict:
  """The released procedure's fit: {'b','alpha','c','beta'[, 'a'], 'loss', 'starts'}; with `polish_fit`, also
  'polish': the objective's minimum (same keys but 'starts'), never above the released fit's loss.

  `grid` overrides some of the start values (name -> tuple); the default is the study's grid.
  """
  # L-BFGS-B's tiny BLAS calls ran 5x slower with OpenBLAS threads on a shared 2-core CPU; one thread is enough.
  with threadpool_limits(1, user_api='blas'):
    return _fit(points, formula, alpha_bounds, grid, polish_fit)


def _fit(points, formula, alpha_bounds, grid, polish_fit):
  grid = {**GRID, **(grid or {})}
  if formula not in FORMULAS:
    raise ValueError(f'formula={formula!r} is unknown; allowed: {", ".join(FORMULAS)}')
  names = _names(formula)
  if len(points.y) < len(names):
    raise FitDataError(f'{len(points.y)} points cannot determine {len(names)} parameters')
  bounds = [alpha_bounds, (0.0, None), (None, None), (None, None), (None, None)][:len(names)]
  args = (formula, np.log(points.n), np.log(points.d), np.log(points.y))
  starts = []
  for start in itertools.product(*(grid[name] for name in names)):
    res = optimize.minimize(_loss, np.array(start, float), args=args, method='L-BFGS-B', bounds=bounds,
                            options=GRID_OPTIONS)
    if np.isfinite(res.fun):
      starts.append(res)
  if not starts:
    raise FitDataError('no start of the grid reached a finite loss')
  best = min(starts, key=lambda r: r.fun)  # The first of equals, as a strict `<` scan over the grid keeps it.
  refit = optimize.minimize(_loss, best.x, args=args, method='L-BFGS-B', bounds=bounds, options=REFIT_OPTIONS)
  out = dict(_coefficients(refit.x, names, refit.fun), starts=int(np.prod([len(grid[k]) for k in names])))
  if polish_fit:
    # Log-coefficients are bounded far outside any real law (e^±100), so a polish on data with no law in it (a
    # flat valley running off to infinity) stops at finite coefficients. The released fit is one of the points
    # polished, so the minimum reported is never above it.
    log_bound = (-LOG_COEF_BOUND, LOG_COEF_BOUND)
    polish_bounds = [alpha_bounds, (0.0, None), log_bound, log_bound, log_bound][:len(names)]
    seeds = [np.concatenate([refit.x[:2], np.clip(refit.x[2:], -LOG_COEF_BOUND, LOG_COEF_BOUND)])]
    seeds += [r.x for r in sorted(starts, key=lambda r: r.fun)[:POLISHED_STARTS]]
    polished = [polish(x, names, formula, points, polish_bounds) for x in seeds]
    x, loss = min(polished, key=lambda p: p[1])
    if not loss <= refit.fun:  # Only if the released fit lies beyond e^±100, where the polish may not go.
      x, loss = refit.x, refit.fun
    out['polish'] = _coefficients(x, names, loss)
  return out


def predict(coefs: dict, n, d):
  y = coefs['b'] * np.asarray(n, float) ** -coefs['alpha'] + coefs['c'] * np.asarray(d, float) ** -coefs['beta']
  return y + coefs.get('a', 0.0)


def goodness(y, y_hat) -> dict:
  y, y_hat = np.asarray(y, float), np.asarray(y_hat, float)
  if not len(y):
    return {'r2': None, 'rmse': None, 'mae': None}
  ss_tot = float(np.sum((y - y.mean()) ** 2))
  r2 = 1.0 - float(np.sum((y - y_hat) ** 2)) / ss_tot if ss_tot > 0 else None
  return {'r2': r2, 'rmse': float(np.sqrt(np.mean((y - y_hat) ** 2))), 'mae': float(np.mean(np.abs(y - y_hat)))}


def _scores(coefs, train, test) -> dict:
  out = {}
  for name, part in (('train', train), ('holdout', test)):
    for key, value in goodness(part.y, predict(coefs, part.n, part.d)).items():
      out[f'{key}_{name}'] = value
  return out


def polish_note(result: dict) -> str:
  """The sentence that says which of a --polish result's two fits is which."""
  released, deeper = result['loss'], result['polish']['loss']
  return (f"The top-level coefficients are the study's released fitting procedure (the paper's numbers; Huber "
          f"objective {released:.5g}); 'polish' is the same objective minimised to convergence ({deeper:.5g}, "
          f"{100 * (released - deeper) / released:.2f}% lower on the fitted points), not what the paper reports.")


def fit_and_score(points: Points, *, formula='no_constant', holdout='largest', alpha_bounds=(0.2, 0.3),
                  grid=None, polish_fit=False) -> dict:
  """Fits on all sizes but the largest (holdout='largest') or on everything (holdout='none'); scores both sets
  (and, with `polish_fit`, the polished fit under 'polish', with a 'note' saying which fit is which)."""
  if holdout not in ('largest', 'none'):
    raise ValueError(f"holdout={holdout!r} is unknown; allowed: largest, none")
  held = points.n == points.n.max() if holdout == 'largest' else np.zeros(len(points.n), bool)
  if held.all():
    raise FitDataError('holding out the largest size leaves nothing to fit: the data has a single model size')
  train, test = points.subset(~held), points.subset(held)
  coefs = fit(train, formula=formula, alpha_bounds=alpha_bounds, grid=grid, polish_fit=polish_fit)
  polished = coefs.pop('polish', None)
  result = dict(coefs, method='released', formula=formula, n_train=len(train.y), n_holdout=len(test.y),
                holdout_sizes=sorted(set(test.size)), **_scores(coefs, train, test))
  if polished is not None:
    result['polish'] = dict(polished, method='polish', **_scores(polished, train, test))
    result['note'] = polish_note(result)
  return result


def plot_fit(points: Points, coefs: dict, path, *, ylabel='metric') -> None:
  """Fitted curves (y against D, one per model size) over the measured points; a 'polish' fit in `coefs` is drawn
  dashed beside them."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, n in enumerate(sorted(set(points.n))):
    mask = points.n == n
    color = f'C{i}'
    label = points.size[int(np.argmax(mask))]
    ax.scatter(points.d[mask], points.y[mask], color=color, label=f'{label} (N={n / 1e6:.1f}M)')
    grid = np.geomspace(points.d[mask].min() / 1.5, points.d[mask].max() * 1.5, 100)
    ax.plot(grid, predict(coefs, np.full_like(grid, n), grid), color=color, lw=1)
    if 'polish' in coefs:
      ax.plot(grid, predict(coefs['polish'], np.full_like(grid, n), grid), color=color, lw=1, ls='--')
  ax.set_xscale('log')
  ax.set_xlabel('training tokens D')
  ax.set_ylabel(ylabel)
  title = f"released procedure (solid): α={coefs['alpha']:.4f}, β={coefs['beta']:.4f}"
  if 'polish' in coefs:
    title += f"\npolish (dashed): α={coefs['polish']['alpha']:.4f}, β={coefs['polish']['beta']:.4f}"
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3, which='both')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
