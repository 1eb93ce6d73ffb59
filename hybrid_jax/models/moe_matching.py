"""Sizing a mixture-of-experts hybrid to a dense one: the routed experts' width whose active parameters equal the
dense model's non-embedding count as nearly as whole widths allow.

Why: the study compares hybrids at matched parameters, and an MoE hybrid is compared with its dense twin at matched
*active* parameters (what a token computes with, so FLOPs match too). Only the MoE blocks change: a token's k experts
of width w plus the router (and any shared experts) replace the dense MLP of width d_ff. Counts come from
hybrid_jax.models.counting, the same formulas `params` prints, so the match holds for any router, activation or
shared-expert setting.
"""

import copy

from hybrid_jax.models import counting


def _active(cfg, width: int) -> int:
  c = copy.deepcopy(cfg)
  c.moe.expert_d_ff = width
  return counting.param_counts(c)['active_non_embedding']


def dense_twin(cfg):
  """The same model with every MLP dense (model.moe.blocks = 'none')."""
  c = copy.deepcopy(cfg)
  c.moe.blocks = 'none'
  return c


def matched_expert_width(cfg) -> int:
  """model.moe.expert_d_ff (>= 1) whose active non-embedding parameters are nearest the dense twin's
  non-embedding parameters (the smaller width on a tie). The count is linear in the width, so two counts solve it.
  ValueError when even width 1 has more active parameters than the dense model (a router wider than the MLP)."""
  target = counting.param_counts(dense_twin(cfg))['non_embedding']
  at_1, slope = _active(cfg, 1), _active(cfg, 2) - _active(cfg, 1)
  if at_1 > target or slope <= 0:
    raise ValueError(f'an MoE of {cfg.moe.num_experts} experts (top {cfg.moe.top_k}) cannot match the dense '
                     f'model\'s {target:,} non-embedding parameters: width 1 already has {at_1:,} active')
  low = 1 + (target - at_1) // slope
  return min((low, low + 1), key=lambda w: (abs(_active(cfg, w) - target), w))


def matched(cfg):
  """A copy of `cfg` (a model config with model.moe set) with expert_d_ff from matched_expert_width."""
  c = copy.deepcopy(cfg)
  c.moe.expert_d_ff = matched_expert_width(cfg)
  return c


def matching_row(cfg) -> dict:
  """The counts a table of matched MoE hybrids prints: dense non-embedding, MoE active and total non-embedding,
  the expert width and the active count's relative difference from the dense one."""
  dense = counting.param_counts(dense_twin(cfg))['non_embedding']
  counts = counting.param_counts(cfg)
  return {'dense': dense, 'active': counts['active_non_embedding'], 'total': counts['non_embedding'],
          'expert_d_ff': int(cfg.moe.expert_d_ff),
          'difference': (counts['active_non_embedding'] - dense) / dense}
