"""MoE twins of the study grid: expert widths matched to the dense runs' parameters, the config and sweep that build
them, the mini-study preset with MoE blocks, and docs/MOE_SHAPES.md in sync."""

import pathlib

import pytest

from hybrid_jax.config import CONFIG_DIR, ConfigError, load_config_file
from hybrid_jax.configs import sweep
from hybrid_jax.models import counting, moe_matching
from hybrid_jax.study import mixer_shapes, presets

ROOT = pathlib.Path(__file__).resolve().parents[1]


def hybrid(arg):
  return load_config_file(f'{CONFIG_DIR / "hybrid.py"}:{arg}')


def active_at(cfg, width):
  c = cfg.copy_and_resolve_references()
  c.moe.expert_d_ff = width
  return counting.param_counts(c)['active_non_embedding']


@pytest.mark.parametrize('moe', [dict(), dict(num_experts=16, top_k=4),
                                 dict(router='sigmoid', activation='relu2', shared_experts=1, shared_d_ff=64),
                                 dict(num_experts=4, top_k=1, shared_experts=1, shared_expert_gate=True)])
def test_the_matched_width_is_the_nearest_of_every_width(moe):
  """Brute force over the widths around the chosen one (the count is linear in the width): none is nearer."""
  cfg = hybrid('arch=gdn,scale=tiny').model
  cfg.moe.update(dict(blocks='all', **moe))
  dense = counting.param_counts(moe_matching.dense_twin(cfg))['non_embedding']
  chosen = moe_matching.matched_expert_width(cfg)
  gaps = {w: abs(active_at(cfg, w) - dense) for w in range(max(1, chosen - 40), chosen + 40)}
  best = min(gaps.values())
  assert gaps[chosen] == best and chosen == min(w for w, g in gaps.items() if g == best)
  assert best < cfg.num_layers * cfg.d_model * 3 * cfg.moe.top_k  # Within one width step per layer.


def test_a_router_wider_than_the_mlp_cannot_match():
  cfg = hybrid('arch=full,scale=tiny').model
  cfg.moe.update(dict(blocks='all', num_experts=4096, top_k=1))
  with pytest.raises(ValueError, match='cannot match'):
    moe_matching.matched_expert_width(cfg)


@pytest.mark.parametrize('arch', ['full', 'swa128', 'lightning', 'mamba2', 'gdn'])
def test_the_grid_builds_moe_twins_with_the_dense_budget(arch):
  dense = hybrid(f'arch={arch},scale=s1,budget=100')
  twin = hybrid(f'arch={arch},scale=s1,budget=100,experts=8,top_k=2')
  assert twin.name == f'{arch}_s1_e8k2_100n' and twin.model.moe.blocks == 'all'
  assert (twin.model.moe.num_experts, twin.model.moe.top_k) == (8, 2)
  counts, dense_n = counting.param_counts(twin.model), counting.param_counts(dense.model)['non_embedding']
  assert abs(counts['active_non_embedding'] / dense_n - 1) < 1e-3 < counts['non_embedding'] / dense_n - 1
  # The budget counts active parameters: the twin trains on its dense run's tokens, to within the width step.
  assert abs(twin.train.steps / dense.train.steps - 1) < 2e-3


@pytest.mark.parametrize('arg, match', [
    ('arch=gdn,scale=tiny,top_k=2', 'add experts=E'),
    ('arch=gdn,scale=tiny,experts=4,top_k=5', 'top_k=5 is invalid'),
    ('arch=gdn,scale=tiny,experts=0', 'experts'),
    ('arch=gdn,scale=tiny,experts=2.5', 'experts'),
])
def test_bad_moe_arguments_are_one_config_error(arg, match):
  with pytest.raises(ConfigError, match=match) as e:
    hybrid(arg)
  assert '\n' not in str(e.value)


def test_the_moe_sweep_lists_the_main_grid_as_twins():
  runs = sweep.runs('moe,experts=16,top_k=4')
  assert len(runs) == len(sweep.runs('main')) and all(r.endswith(',experts=16,top_k=4') for r in runs)
  assert sweep.runs('moe')[0].endswith(',experts=8,top_k=2')
  assert not any('experts' in r for r in sweep.runs('study'))


def test_the_mini_moe_preset_trains_matched_moe_blocks():
  preset = presets.PRESETS['mini-moe']
  for label in preset.arches:
    moe_cfg, dense_cfg = (presets.run_config(label, p).model for p in (preset, presets.PRESETS['mini']))
    assert moe_cfg.moe.blocks == 'all' and dense_cfg.moe.blocks == 'none'
    active = counting.param_counts(moe_cfg)['active_non_embedding']
    assert abs(active / counting.param_counts(dense_cfg)['non_embedding'] - 1) < 5e-3, label


def test_moe_shapes_page_is_in_sync():
  assert (ROOT / 'docs' / 'MOE_SHAPES.md').read_text() == mixer_shapes.moe_matching_markdown()
