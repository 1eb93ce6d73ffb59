"""Where a retrieval task's tokens are routed: per MoE layer, the experts chosen at the needle tokens and at the
positions that produce the answer, against the rest of the prompt (the control).

Pure NumPy on the experts each token was routed to ([B, T, k] per layer), so the statistics are testable on
hand-built assignments. Two questions per layer:
- does the needle (or the answer-producing query) use different experts from ordinary tokens? `tv`: the total
  variation distance between its expert distribution and the control's, beside the distances that control subsets
  of the same size give (`null_mean`, `null_p95`: the sampling noise of a distribution from that few tokens);
- do the query and the needle share experts (a path through the same experts)? `overlap`: the mean fraction of the
  query's k experts that a needle token also uses, beside the same fraction for control tokens.
"""

import numpy as np


def load(experts: np.ndarray, num_experts: int) -> np.ndarray:
  """Fraction of the assignments ([..., k] expert ids) that go to each expert [E]; zeros when there are none."""
  counts = np.bincount(np.asarray(experts).reshape(-1), minlength=num_experts)[:num_experts].astype(np.float64)
  return counts / max(1.0, counts.sum())


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
  return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def null_distances(control: np.ndarray, size: int, num_experts: int, *, draws: int = 200, seed: int = 0):
  """Total variation between the control's load and the loads of `draws` random subsets of `size` control tokens
  (rows of [N, k]): what a group of that many ordinary tokens differs from the control by chance."""
  rng = np.random.default_rng(seed)
  whole = load(control, num_experts)
  size = min(size, len(control))
  return np.asarray([total_variation(load(control[rng.choice(len(control), size, replace=False)], num_experts), whole)
                     for _ in range(draws)])


def permutation_distances(group: np.ndarray, others: np.ndarray, num_experts: int, *, draws: int = 200,
                          seed: int = 0) -> np.ndarray:
  """Total variation between the loads of the two parts of `group` + `others` (rows of [N, k]) split at random into
  parts of their sizes: how far apart two such groups of tokens routed alike lie by chance."""
  rng = np.random.default_rng(seed)
  pooled, n = np.concatenate([group, others]), len(group)
  splits = (rng.permutation(len(pooled)) for _ in range(draws))
  return np.asarray([total_variation(load(pooled[order[:n]], num_experts), load(pooled[order[n:]], num_experts))
                     for order in splits])


def overlap(query: np.ndarray, others: np.ndarray) -> float:
  """Mean over (query token, other token) pairs of the same row of |experts in common| / k, given [n_q, k] and
  [n_o, k] expert ids."""
  if not len(query) or not len(others):
    return float('nan')
  k = query.shape[-1]
  common = (query[:, None, :, None] == others[None, :, None, :]).any(-1).sum(-1)  # [n_q, n_o]
  return float(common.mean() / k)


def layer_statistics(experts: np.ndarray, needle: np.ndarray, query: np.ndarray, control: np.ndarray,
                     num_experts: int, *, draws: int = 200, seed: int = 0,
                     same_tokens: np.ndarray | None = None) -> dict:
  """One MoE layer's statistics. `experts` [B, T, k]; `needle`, `query`, `control` bool [B, T] masks of the token
  groups (disjoint). The overlaps pair tokens within a row only (a query with its own row's needle).

  `same_tokens` (a part of the control: the needle's own token ids elsewhere in its row) tells routing by position
  in the task from routing by token identity: the needle's distance from those tokens' load ('tv_same_tokens'),
  beside the distances random splits of the two groups pooled reach."""
  groups = {'needle': needle, 'query': query, 'control': control}
  picked = {name: experts[mask] for name, mask in groups.items()}
  out = {name: {'tokens': int(mask.sum()), 'load': load(picked[name], num_experts).tolist()}
         for name, mask in groups.items()}
  for name in ('needle', 'query'):
    null = null_distances(picked['control'], len(picked[name]), num_experts, draws=draws, seed=seed)
    out[name].update(tv=total_variation(out[name]['load'], out['control']['load']),
                     null_mean=float(null.mean()), null_p95=float(np.quantile(null, 0.95)))
  if same_tokens is not None and same_tokens.any():
    twins = experts[same_tokens]
    twin_load = load(twins, num_experts)
    null = permutation_distances(picked['needle'], twins, num_experts, draws=draws, seed=seed)
    out['needle'].update(same_tokens=int(same_tokens.sum()),
                         tv_same_tokens=total_variation(out['needle']['load'], twin_load),
                         same_tokens_null_mean=float(null.mean()), same_tokens_null_p95=float(np.quantile(null, 0.95)))
  rows = [(experts[b][query[b]], experts[b][needle[b]], experts[b][control[b]]) for b in range(len(experts))]
  pairs = [(overlap(q, n), overlap(q, c)) for q, n, c in rows if len(q) and len(n) and len(c)]
  out['overlap'] = {'query_needle': float(np.mean([p[0] for p in pairs])) if pairs else float('nan'),
                    'query_control': float(np.mean([p[1] for p in pairs])) if pairs else float('nan')}
  return out
