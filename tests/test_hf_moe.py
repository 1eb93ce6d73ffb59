"""The released mixture-of-experts hybrids read by `hf import`, against transformers' own outputs.

Each fixture under tests/data/hf_moe/ is a tiny random checkpoint saved by transformers 5.25 with, in
reference.safetensors, its logits, 8 greedy tokens and `routing`: the experts each of the 32 prompt tokens chose in
each MoE layer (ascending), taken from the routers' own outputs (scripts/hf_reference_logits.py; the "MoE fixtures"
section of docs/HF.md). The routing is compared first: logits within tolerance with a wrong choice of experts would
be luck. Export writes each family back as its class; the exported tensors are checked against the fixture's own
(names, shapes, values) and imported again (transformers loading those exports: docs/HF.md).
No torch is imported here.
"""

import functools
import json
import math
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
from hybrid_jax.hf.families import config as family_config, export as family_export, weights as family_weights
from hybrid_jax.models import counting, layers, moe
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier

DATA = pathlib.Path(__file__).parent / 'data' / 'hf_moe'
REL_TOL = 1e-5  # As the dense fixtures: max |difference| / max |logit|, float32 against transformers' float64.
# Against transformers' own float32 logits the two roundings add: its float32 is up to 8.9e-6 from its float64
# (hf_qwen3_5_moe; the others 0.6-3.1e-6), so the float32-to-float32 check allows twice the bar.
FLOAT32_PAIR_TOL = 2 * REL_TOL
READ = ('hf_qwen3_5_moe', 'hf_qwen3_next', 'hf_granite_moe_hybrid', 'hf_nemotron_h_moe', 'hf_gpt_oss', 'hf_minimax')


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
  """(model config, params as jax arrays, reference outputs) of a fixture, imported once per test session."""
  config, params, _ = _read(DATA / name)
  return config, jax.tree.map(jnp.asarray, params), load_file(str(DATA / name / 'reference.safetensors'))


@pytest.mark.parametrize('name', READ)
def test_routing_logits_and_greedy_tokens_match_transformers(name):
  config, params, ref = _fixture(name)
  logits, routing = _logits_and_routing(config.model, params, jnp.asarray(ref['tokens']))
  assert routing.shape == ref['routing'].shape
  np.testing.assert_array_equal(routing, ref['routing'])
  assert _rel_err(np.asarray(logits, np.float64), ref['logits_float64']) <= REL_TOL
  assert _rel_err(logits, ref['logits']) <= FLOAT32_PAIR_TOL
  generator = Generator(state_lib.make_model_def(config.model), params, bucket=8)
  greedy = generator.generate(ref['tokens'].tolist(), max_new_tokens=ref['greedy'].shape[1])
  np.testing.assert_array_equal(np.asarray(greedy), ref['greedy'])


@pytest.mark.parametrize('name', default_tier(READ, keep=('hf_qwen3_5_moe', 'hf_minimax')))
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
  assert _rel_err(np.concatenate(steps, axis=1), ref['decode_logits']) <= FLOAT32_PAIR_TOL  # transformers' float32.


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
  oss, _, _ = _read(DATA / 'hf_gpt_oss')
  o, a, m = oss.model, oss.model.attention, oss.model.moe
  assert (tuple(o.cycle), o.window, o.rope_base, o.attention_sinks, a.bias) == (('swa', 'full'), 4, 150000.0, True,
                                                                                True)
  assert (a.rope_scaling, a.yarn_factor, a.yarn_original_positions, a.yarn_beta_fast, a.yarn_beta_slow,
          a.yarn_truncate, a.yarn_attention_factor) == ('yarn', 32.0, 4096, 32.0, 1.0, False, 0.0)
  assert (m.blocks, m.num_experts, m.top_k, m.router, m.router_logit_bias, m.activation, m.swiglu_limit,
          m.swiglu_alpha, m.expert_d_ff, m.shared_experts) == (
              'all', 6, 3, 'topk_softmax', True, 'swiglu_oai', 1.5, 1.702, 12, 0)
  mini, _, _ = _read(DATA / 'hf_minimax')
  o, lc, m = mini.model, mini.model.lightning, mini.model.moe
  # Layers lightning, lightning, softmax, lightning: the unit (lightning, lightning, full) and a tail.
  assert (tuple(o.cycle), o.scan_layers, o.recurrent_chunk_size) == (('lightning', 'lightning', 'full'), False, 8)
  assert (lc.num_heads, lc.key_dim, lc.value_dim, lc.layer_decay, lc.layer_decay_eps, lc.scale, lc.norm,
          lc.norm_eps) == (4, 8, 8, True, 1e-5, 1.0, 'all', 1e-6)
  assert (tuple(lc.normed_residual), tuple(o.attention.normed_residual), tuple(m.normed_residual)) == (
      (1.3, 1.1), (1.6, 0.9), (1.5, 0.8))
  assert (m.blocks, m.num_experts, m.top_k, m.router, m.norm_topk_prob, m.activation, m.expert_d_ff) == (
      'all', 4, 2, 'softmax_topk', True, 'swiglu', 12)
  for config, name in ((oss, 'hf_gpt_oss'), (mini, 'hf_minimax')):  # The counts know the new options.
    _, params, _ = _fixture(name)
    assert counting.param_counts(config.model)['total'] == sum(x.size for x in jax.tree.leaves(params))


def _yarn_reference(d, base, factor, original, beta_fast, beta_slow, truncate):
  """YaRN's inverse frequencies in float64, written out from the formula (docs/HF.md, gpt-oss)."""
  r = lambda n: d * math.log(original / (2 * math.pi * n)) / (2 * math.log(base))
  low, high = r(beta_fast), r(beta_slow)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, d - 1)
  omega = np.array([base ** (-2 * j / d) for j in range(d // 2)])
  ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
  return omega / factor * ramp + omega * (1 - ramp), omega


@pytest.mark.parametrize('d, base, factor, original, beta_fast, beta_slow, truncate', [
    (8, 150000.0, 32.0, 4096, 32.0, 1.0, False),  # The fixture's (and released gpt-oss') settings at head_dim 8.
    (64, 150000.0, 32.0, 4096, 32.0, 1.0, False),  # Released gpt-oss' head_dim.
    (64, 10000.0, 4.0, 2048, 32.0, 1.0, True),
])
def test_yarn_frequencies_follow_the_formula(d, base, factor, original, beta_fast, beta_slow, truncate):
  want, omega = _yarn_reference(d, base, factor, original, beta_fast, beta_slow, truncate)
  got, mscale = layers.yarn_inv_freq(d, base, (factor, original, beta_fast, beta_slow, truncate, 0.0))
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-6)
  assert mscale == pytest.approx(1 + 0.1 * math.log(factor))
  assert layers.yarn_inv_freq(d, base, (factor, original, beta_fast, beta_slow, truncate, 1.25))[1] == 1.25
  if d == 8:  # docs/HF.md: the fixture's w' = w x (1, 1, 0.177, 1/32), cos and sin x 1.347.
    np.testing.assert_allclose(want / omega, [1, 1, 0.177, 1 / 32], atol=5e-4)
    assert mscale == pytest.approx(1.347, abs=5e-4)
  # layers.rope rotates by those frequencies and scales by the factor: position 3 of a unit vector per pair.
  x = jnp.zeros((1, 1, 1, d)).at[..., 0].set(1.0)
  rotated = np.asarray(layers.rope(x, jnp.asarray([3]), base=base,
                                   yarn=(factor, original, beta_fast, beta_slow, truncate, 0.0)))[0, 0, 0]
  np.testing.assert_allclose(rotated[[0, d // 2]], mscale * np.array([math.cos(3 * want[0]), math.sin(3 * want[0])]),
                             rtol=1e-5, atol=1e-6)


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


# ---------------------------------------------------------------------------------------------------- gpt-oss, MiniMax
@pytest.mark.parametrize('name, edit, match', [
    # Five experts fused where config.json says six (gpt-oss' transposed [E, H, 2I]).
    ('hf_gpt_oss', lambda t: t.__setitem__('model.layers.1.mlp.experts.gate_up_proj',
                                           t['model.layers.1.mlp.experts.gate_up_proj'][:5]),
     r"tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape \(5, 16, 24\), but config.json implies "
     r'\(6, 16, 24\)'),
    # An expert bias of the wrong width.
    ('hf_gpt_oss', lambda t: t.__setitem__('model.layers.3.mlp.experts.down_proj_bias',
                                           t['model.layers.3.mlp.experts.down_proj_bias'][:, :8]),
     r"tensor 'model.layers.3.mlp.experts.down_proj_bias' has shape \(6, 8\), but config.json implies \(6, 16\)"),
    # MiniMax's last expert of layer 2 dropped: three per-expert tensors where config.json says four.
    ('hf_minimax', lambda t: [t.pop(f'model.layers.2.block_sparse_moe.experts.3.{w}.weight') for w in ('w1', 'w2',
                                                                                                       'w3')],
     r"tensor 'model.layers.2.block_sparse_moe.experts.\{0..2\}.w2.weight' has shape \(3, 16, 12\), but config.json "
     r'implies \(4, 16, 12\)'),
    # A missing expert part.
    ('hf_minimax', lambda t: t.pop('model.layers.0.block_sparse_moe.experts.1.w3.weight'),
     r"no tensor model.layers.0.block_sparse_moe.experts.1.'w3.weight'"),
    # A Lightning decay buffer that is not MiniMax's formula for its layer.
    ('hf_minimax', lambda t: t.__setitem__('model.layers.1.self_attn.slope_rate',
                                           t['model.layers.1.self_attn.slope_rate'] * 1.01),
     r"tensor 'model.layers.1.self_attn.slope_rate' differs from the value config.json implies"),
])
def test_gpt_oss_and_minimax_tensors_that_do_not_match_the_config_are_refused(tmp_path, name, edit, match):
  with pytest.raises(HFError, match=match):
    _read(_edited(tmp_path, name, edit))


def _config_copy(tmp_path, name, **changes):
  target = tmp_path / name
  shutil.copytree(DATA / name, target)
  config = json.loads((target / 'config.json').read_text())
  (target / 'config.json').write_text(json.dumps({**config, **changes}))
  return target


@pytest.mark.parametrize('name, changes, field', [
    ('hf_gpt_oss', dict(quantization_config={'quant_method': 'mxfp4'}), 'quantization_config'),
    ('hf_gpt_oss', dict(rope_parameters={'rope_type': 'longrope', 'rope_theta': 1e4}), 'rope_parameters.rope_type'),
    ('hf_minimax', dict(postnorm=False), 'postnorm'),
    ('hf_minimax', dict(rotary_dim=4), 'rotary_dim'),
])
def test_what_gpt_oss_and_minimax_configs_hold_beyond_the_model_is_one_line(tmp_path, capsys, name, changes, field):
  source = _config_copy(tmp_path, name, **changes)
  assert parsing.run(hf_cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count('\n') == 0 and err.startswith(f'error: config.json {field}=')
  assert not (tmp_path / 'run').exists()


def test_minimax_reads_transformers_names_and_the_remote_config_alike(tmp_path):
  """transformers' MiniMax class keeps the MoE under mlp. (mlp.gate, stacked mlp.experts.gate_up_proj = [w1; w3]
  and down_proj = w2); MiniMax-Text-01's remote-code config.json says attn_type_list and layernorm_*_alpha/beta.
  Both import to the fixture's model."""
  tensors = load_file(str(DATA / 'hf_minimax' / io.WEIGHTS_FILE))
  fused, parts = {}, {}
  for name, value in tensors.items():
    match = re.match(r'^(.+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$', name)
    if match:
      parts.setdefault(match[1], {}).setdefault(match[3], {})[int(match[2])] = value
    else:
      fused[name.replace('.block_sparse_moe.', '.mlp.')] = value
  for layer, ws in parts.items():
    stack = lambda w: np.stack([ws[w][e] for e in sorted(ws[w])])
    fused[f'{layer}.mlp.experts.gate_up_proj'] = np.concatenate([stack('w1'), stack('w3')], axis=1)
    fused[f'{layer}.mlp.experts.down_proj'] = stack('w2')
  source = _copy(tmp_path, 'hf_minimax', fused)
  config = json.loads((source / 'config.json').read_text())
  remote = {k: v for k, v in config.items() if k != 'layer_types' and not k.endswith('_factor')}
  remote.update(attn_type_list=[0, 0, 1, 0], postnorm=True, layernorm_linear_attention_alpha=1.3,
                layernorm_linear_attention_beta=1.1, layernorm_full_attention_alpha=1.6,
                layernorm_full_attention_beta=0.9, layernorm_mlp_alpha=1.5, layernorm_mlp_beta=0.8)
  (source / 'config.json').write_text(json.dumps(remote))
  config, params, _ = _read(source)
  want, direct, _ = _read(DATA / 'hf_minimax')
  assert config.model.to_dict() == want.model.to_dict()
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(direct)))


EXPORTED = ('hf_qwen3_5_moe', 'hf_qwen3_next', 'hf_nemotron_h_moe', 'hf_granite_moe_hybrid', 'hf_gpt_oss',
            'hf_minimax')


@pytest.mark.parametrize('name', default_tier(EXPORTED, keep=('hf_qwen3_next', 'hf_gpt_oss', 'hf_minimax')))
def test_export_round_trips_as_the_family(tmp_path, name):
  """Import, export with --arch auto: the family's class is chosen, the fixture's tensors come back under the
  fixture's own names and shapes (experts fused or one tensor each as the fixture stores them, MiniMax's decay
  buffers recomputed; a tied head written out), and the export imports to the same model and parameters, with the
  reference logits."""
  config, params, plan = io.read_hf(DATA / name)
  written = io.write_hf(tmp_path, config.model, params, max_positions=64)
  family = family_config.family(plan.model_type)
  assert written['model_type'] == plan.model_type and written['architectures'] == [family.hf_class]
  ours = load_file(str(tmp_path / io.WEIGHTS_FILE))
  theirs = load_file(str(DATA / name / io.WEIGHTS_FILE))
  theirs = {canonical: theirs[stored] for canonical, stored in family_weights.canonical_names(family, theirs).items()}
  tied = 'lm_head.weight' not in theirs
  assert set(ours) == set(theirs) | ({'lm_head.weight'} if tied else set())
  for key in theirs:
    assert ours[key].shape == theirs[key].shape, key
    np.testing.assert_allclose(ours[key], theirs[key], rtol=2e-6, atol=1e-7, err_msg=key)
  again, params_again, _ = io.read_hf(tmp_path)
  assert again.model.to_dict() == config.model.to_dict()
  flat, flat_again = jax.tree.leaves_with_path(params), jax.tree.leaves_with_path(params_again)
  assert [p for p, _ in flat] == [p for p, _ in flat_again]
  for (path, a), (_, b) in zip(flat, flat_again):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  logits, _ = _logits_and_routing(again.model, params_again, jnp.asarray(ref['tokens']))
  assert _rel_err(np.asarray(logits, np.float64), ref['logits_float64']) <= REL_TOL
  assert _rel_err(logits, ref['logits']) <= FLOAT32_PAIR_TOL


def test_export_refuses_what_the_moe_classes_compute_differently():
  """A model a family's class would compute otherwise is refused naming the key: gpt-oss without its sinks or
  router bias, MiniMax with a plain residual, an MoE model through an attention class; --arch auto names each
  MoE family's first difference."""
  oss, _, _ = _read(DATA / 'hf_gpt_oss')
  model = oss.model
  model.attention_sinks = False
  with pytest.raises(HFError, match=r'model.attention_sinks=False, but gpt_oss computes True'):
    io.check_exportable(model, 'gpt_oss')
  model.attention_sinks = True
  model.moe.router_logit_bias = False
  with pytest.raises(HFError, match=r'model.moe.router_logit_bias=False \(as used\), but gpt_oss computes True'):
    io.check_exportable(model, 'gpt_oss')
  with pytest.raises(HFError, match=r'no transformers class computes what this model does') as info:
    io.check_exportable(model, 'auto')
  assert all(f'{family}: ' in str(info.value) for family in family_export.MOE_AUTO)
  with pytest.raises(HFError, match=r'--arch=llama has no mixture-of-experts MLPs'):
    io.check_exportable(model, 'llama')
  mini, _, _ = _read(DATA / 'hf_minimax')
  mini.model.moe.normed_residual = ()
  with pytest.raises(HFError, match=r'model.moe.normed_residual=\(\) \(as used\), but minimax computes \(1.0, 1.0\)'):
    io.check_exportable(mini.model, 'minimax')
  dense = _read(DATA / 'hf_gpt_oss')[0].model
  dense.moe.blocks = 'none'
  with pytest.raises(HFError, match=r'model.attention.bias=True, which llama'):
    io.check_exportable(dense, 'auto')
