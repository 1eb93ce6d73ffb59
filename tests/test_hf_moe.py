"""The released mixture-of-experts hybrids read by `hf import`, against transformers' own outputs.

Each fixture under tests/data/hf_moe/ is a tiny random checkpoint saved by transformers 5.25 with, in
reference.safetensors, its logits, 8 greedy tokens and `routing`: the experts each of the 32 prompt tokens chose in
each MoE layer (ascending), taken from the routers' own outputs (scripts/hf_reference_logits.py; the "MoE fixtures"
section of docs/HF.md). The routing is compared first: logits within tolerance with a wrong choice of experts would
be luck.
No torch is imported here.
"""

import functools
import json
import pathlib
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hybrid_jax.commands import hf as hf_cli, parsing
from hybrid_jax.eval.generate import Generator
from hybrid_jax.hf import HFError, io
from hybrid_jax.models import moe
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier

DATA = pathlib.Path(__file__).parent / 'data' / 'hf_moe'
REL_TOL = 1e-5  # As the dense fixtures: max |difference| / max |logit|, float32.
# Where transformers' float32 reference itself is noisier than that. hf_qwen3_5_moe: ours 1.1e-5 from its logits,
# with the routing equal; hybrid_jax in float64 is 9.0e-6 from transformers' logits and 6.3e-6 from its own cached
# decode, and those two transformers outputs differ from each other by 8.0e-6. The cached decode here is within
# REL_TOL of transformers' (test_cached_decode_matches_transformers).
PREFILL_TOL = {'hf_qwen3_5_moe': 1.5e-5}
READ = ('hf_qwen3_5_moe', 'hf_qwen3_next', 'hf_granite_moe_hybrid', 'hf_nemotron_h_moe')


def _rel_err(ours, ref):
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _logits_and_routing(model_cfg, params, tokens):
  """(logits, per MoE layer the experts each token chose, ascending [layers, tokens, k]) of one jitted forward.
  The router's choices are taken where the model makes them (moe_routing.route, as the MoE calls it)."""
  model_def = state_lib.make_model_def(model_cfg)
  route, chosen = moe.moe_routing.route, []

  def recording(*args, **kwargs):
    routing = route(*args, **kwargs)
    chosen.append(routing.experts)
    return routing

  def forward(p, t):
    chosen.clear()
    return model_def.bind(p)(t), list(chosen)

  moe.moe_routing.route = recording
  try:
    logits, experts = jax.jit(forward)(params, tokens)
  finally:
    moe.moe_routing.route = route
  return np.asarray(logits), np.sort(np.stack([np.asarray(e) for e in experts]), axis=-1)


def _read(path):
  """The imported model unscanned (the router of every layer traced once, in layer order)."""
  return io.read_hf(path, {'scan_layers': False})


@functools.cache
def _fixture(name):
  """(model config, params, reference outputs) of a fixture, imported once per test session."""
  config, params, _ = _read(DATA / name)
  return config, params, load_file(str(DATA / name / 'reference.safetensors'))


@pytest.mark.parametrize('name', READ)
def test_routing_logits_and_greedy_tokens_match_transformers(name):
  config, params, ref = _fixture(name)
  logits, routing = _logits_and_routing(config.model, params, jnp.asarray(ref['tokens']))
  assert routing.shape == ref['routing'].shape
  np.testing.assert_array_equal(routing, ref['routing'])
  assert _rel_err(logits, ref['logits']) <= PREFILL_TOL.get(name, REL_TOL)
  generator = Generator(state_lib.make_model_def(config.model), params, bucket=8)
  greedy = generator.generate(ref['tokens'].tolist(), max_new_tokens=ref['greedy'].shape[1])
  np.testing.assert_array_equal(np.asarray(greedy), ref['greedy'])


@pytest.mark.parametrize('name', default_tier(READ, keep=('hf_qwen3_5_moe',)))
def test_cached_decode_matches_transformers(name):
  """The first token prefilled, then one step per token through the decode states, against transformers' own
  cached decode (`decode_logits`)."""
  config, params, ref = _fixture(name)
  model = state_lib.make_model_def(config.model).bind(params)
  tokens = jnp.asarray(ref['tokens'])
  state = model.init_decode_state(tokens.shape[0], tokens.shape[1])
  logits, state = model.prefill(tokens[:, :1], state)
  steps = [np.asarray(logits)]
  step = jax.jit(lambda t, pos, s: model.step(t, pos, s))
  for t in range(1, tokens.shape[1]):
    logits, state = step(tokens[:, t], jnp.int32(t), state)
    steps.append(np.asarray(logits)[:, None])
  assert _rel_err(np.concatenate(steps, axis=1), ref['decode_logits']) <= REL_TOL


def test_imported_moe_options():
  """Each family's routing rule, expert shapes and MoE layers become model.moe's keys of the same meaning."""
  qwen, _, _ = _read(DATA / 'hf_qwen3_5_moe')
  m = qwen.model.moe
  assert (m.blocks, m.num_experts, m.top_k, m.router, m.norm_topk_prob, m.activation, m.expert_d_ff,
          m.shared_experts, m.shared_d_ff, m.shared_expert_gate) == (
              'all', 8, 3, 'softmax_topk', True, 'swiglu', 8, 1, 20, True)
  nxt, _, _ = _read(DATA / 'hf_qwen3_next')
  m = nxt.model.moe
  # Layers gdn, full, gdn, gdn with layer 2 dense: the unit (gdn, full, gdn) with MoE at positions 0 and 1.
  assert tuple(nxt.model.cycle) == ('gdn', 'full', 'gdn') and (m.blocks, tuple(m.cycle_positions)) == ('cycle', (0, 1))
  assert (m.num_experts, m.top_k, m.norm_topk_prob, m.shared_d_ff, nxt.model.d_ff) == (6, 2, False, 16, 24)
  granite, _, _ = _read(DATA / 'hf_granite_moe_hybrid')
  m = granite.model.moe
  assert (m.blocks, m.num_experts, m.top_k, m.router, m.expert_d_ff, m.shared_d_ff, m.shared_expert_gate) == (
      'all', 8, 2, 'topk_softmax', 12, 24, False)
  nemo, _, _ = _read(DATA / 'hf_nemotron_h_moe')
  m = nemo.model.moe
  assert tuple(nemo.model.cycle) == ('mamba2', 'moe', 'mamba2', 'full', 'moe') and not nemo.model.block_mlp
  assert (m.blocks, m.num_experts, m.top_k, m.router, m.norm_topk_prob, m.n_group, m.topk_group,
          m.routed_scaling_factor, m.activation, m.expert_d_ff, m.shared_experts, m.shared_d_ff) == (
              'none', 8, 3, 'sigmoid', True, 2, 1, 2.5, 'relu2', 12, 1, 20)


def _per_expert(tensors, fused, parts):
  """A checkpoint's fused experts (`fused` suffix, [E, rows, H]) rewritten one tensor per expert and part."""
  out = {}
  for name, value in tensors.items():
    if not name.endswith('.experts.' + fused):
      out[name] = value
      continue
    group = name[:-len(fused) - 1]
    for e, expert in enumerate(value):
      for part, piece in zip(parts, np.split(expert, len(parts), axis=0)):
        out[f'{group}.{e}.{part}.weight'] = np.ascontiguousarray(piece)
  return out


def _fused(tensors):
  """A checkpoint's per-expert experts stacked into the fused layout (gate rows, then up; Nemotron-H's ungated
  up_proj alone)."""
  out, groups = {}, {}
  for name, value in tensors.items():
    match = re.match(r'^(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$', name)
    if match:
      groups.setdefault(match[1], {}).setdefault(match[3], {})[int(match[2])] = value
    else:
      out[name] = value
  for group, parts in groups.items():
    stack = lambda part: np.stack([parts[part][e] for e in sorted(parts[part])])
    if 'gate_proj' in parts:
      out[f'{group}.gate_up_proj'] = np.concatenate([stack('gate_proj'), stack('up_proj')], axis=1)
    else:
      out[f'{group}.up_proj'] = stack('up_proj')
    out[f'{group}.down_proj'] = stack('down_proj')
  return out


def _copy(tmp_path, name, tensors):
  target = tmp_path / name
  shutil.copytree(DATA / name, target)
  save_file(tensors, str(target / io.WEIGHTS_FILE))
  return target


@pytest.mark.parametrize('name, rewrite', [
    ('hf_qwen3_5_moe', lambda t: _per_expert(_per_expert(t, 'gate_up_proj', ('gate_proj', 'up_proj')),
                                             'down_proj', ('down_proj',))),
    ('hf_qwen3_next', _fused),
    ('hf_nemotron_h_moe', _fused),
])
def test_both_expert_layouts_read_to_the_same_parameters(tmp_path, name, rewrite):
  """Experts stored fused ([E, 2I, H]: gate rows, then up) or one tensor per expert import alike."""
  tensors = load_file(str(DATA / name / io.WEIGHTS_FILE))
  rewritten = rewrite(tensors)
  assert set(rewritten) != set(tensors)
  _, params, _ = _read(DATA / name)
  _, again, _ = _read(_copy(tmp_path, name, rewritten))
  flat, flat_again = jax.tree.leaves_with_path(params), jax.tree.leaves_with_path(again)
  assert [p for p, _ in flat] == [p for p, _ in flat_again]
  for (path, a), (_, b) in zip(flat, flat_again):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_a_vision_language_qwen3_5_moe_checkpoint_imports_its_text_model(tmp_path):
  """Hub Qwen3.5-MoE checkpoints are its vision-language model (`qwen3_5_moe`): text_config, tensors under
  model.language_model., a vision tower and MTP heads beside them (left out)."""
  text = json.loads((DATA / 'hf_qwen3_5_moe' / 'config.json').read_text())
  tensors = load_file(str(DATA / 'hf_qwen3_5_moe' / io.WEIGHTS_FILE))
  tensors = {n.replace('model.', 'model.language_model.', 1): v for n, v in tensors.items()}
  tensors['model.visual.patch_embed.proj.weight'] = np.ones((8, 3), np.float32)
  tensors['mtp.layers.0.mlp.experts.gate_up_proj'] = np.ones((8, 16, 16), np.float32)
  source = _copy(tmp_path, 'hf_qwen3_5_moe', tensors)
  (source / 'config.json').write_text(json.dumps(dict(
      model_type='qwen3_5_moe', architectures=['Qwen3_5MoeForConditionalGeneration'], tie_word_embeddings=False,
      text_config=text, vision_config=dict(depth=1))))
  config, params, plan = _read(source)
  _, direct, _ = _read(DATA / 'hf_qwen3_5_moe')
  assert plan.model_type == 'qwen3_5_moe_text' and len(plan.ignored) == 2
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(direct)))


def _edited(tmp_path, name, edit):
  tensors = load_file(str(DATA / name / io.WEIGHTS_FILE))
  edit(tensors)
  return _copy(tmp_path, name, tensors)


@pytest.mark.parametrize('name, edit, match', [
    # Seven experts fused where config.json says eight.
    ('hf_qwen3_5_moe', lambda t: t.__setitem__('model.layers.1.mlp.experts.gate_up_proj',
                                               t['model.layers.1.mlp.experts.gate_up_proj'][:7]),
     r"tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape \(7, 16, 16\), but config.json implies "
     r'\(8, 16, 16\)'),
    # An expert of the wrong width.
    ('hf_qwen3_5_moe', lambda t: t.__setitem__('model.layers.0.mlp.experts.down_proj',
                                               t['model.layers.0.mlp.experts.down_proj'][..., :6]),
     r"tensor 'model.layers.0.mlp.experts.down_proj' has shape \(8, 16, 6\), but config.json implies \(8, 16, 8\)"),
    # The last expert of a layer dropped (five per-expert tensors where config.json says six).
    ('hf_qwen3_next', lambda t: [t.pop(f'model.layers.3.mlp.experts.5.{p}_proj.weight') for p in ('gate', 'up',
                                                                                                  'down')],
     r"tensor 'model.layers.3.mlp.experts.\{0..4\}.down_proj.weight' has shape \(5, 16, 8\), but config.json "
     r'implies \(6, 16, 8\)'),
    # A gap in the experts.
    ('hf_qwen3_next', lambda t: t.pop('model.layers.0.mlp.experts.2.up_proj.weight'),
     r"no tensor model.layers.0.mlp.experts.2.'up_proj.weight'"),
    # One expert shaped unlike the others.
    ('hf_qwen3_next', lambda t: t.__setitem__('model.layers.0.mlp.experts.4.down_proj.weight',
                                              np.zeros((16, 7), np.float32)),
     r"tensor 'model.layers.0.mlp.experts.4.down_proj.weight' has shape \(16, 7\), but "
     r"'model.layers.0.mlp.experts.0.down_proj.weight' has \(16, 8\)"),
])
def test_expert_tensors_that_do_not_match_the_config_are_refused(tmp_path, name, edit, match):
  with pytest.raises(HFError, match=match):
    _read(_edited(tmp_path, name, edit))


def test_a_mismatched_expert_tensor_is_one_line_at_the_command_line(tmp_path, capsys):
  source = _edited(tmp_path, 'hf_qwen3_5_moe', lambda t: t.__setitem__(
      'model.layers.2.mlp.experts.gate_up_proj', t['model.layers.2.mlp.experts.gate_up_proj'][:, :, :8]))
  assert parsing.run(hf_cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count('\n') == 0 and err.startswith('error: ') and 'model.layers.2.mlp.experts.gate_up_proj' in err
  assert not (tmp_path / 'run').exists()
