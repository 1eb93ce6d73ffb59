"""Hugging Face checkpoints in and out (hybrid_jax.hf), against logits computed by `transformers` itself.

tests/data/hf/ holds tiny checkpoints and, beside each, `reference.safetensors`: the logits and greedy tokens that
transformers (CPU torch, eager attention) produced for them (scripts/hf_reference_logits.py; jax_* directories were
written by hybrid_jax's exporter, hf_* ones by transformers' save_pretrained). No torch is imported here.
"""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hybrid_jax import commands

from hybrid_jax.train import runs
from hybrid_jax.config import BASE_CONFIG, load_config_file, validate
from hybrid_jax.eval.generate import Generator
from hybrid_jax.commands import hf as cli, parsing
from hybrid_jax.hf import HFError, io
from hybrid_jax.hf.attention import config as attention_config, weights as attention_weights
from hybrid_jax.train import state as state_lib
from tests.conftest import default_tier

DATA = pathlib.Path(__file__).parent / 'data' / 'hf'
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / 'reference.safetensors').is_file())
EXPORTED = [name for name in FIXTURES if name.startswith('jax_')]
REL_TOL = 1e-5


def _logits(model_cfg, params, tokens):
  model_def = state_lib.make_model_def(model_cfg)
  return np.asarray(jax.jit(lambda p, t: model_def.bind(p)(t))(params, tokens))


def _rel_err(ours, ref):
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def _tiny_config(**fields):
  config = load_config_file(str(BASE_CONFIG))
  config.model.update({**dict(vocab_size=40, d_model=16, num_heads=4, num_kv_heads=2, head_dim=8, d_ff=24,
                              num_layers=3, dtype='float32'), **fields})
  return validate(config)


def test_fixture_set_covers_every_class():
  classes = {json.loads((DATA / n / 'config.json').read_text())['model_type'] for n in FIXTURES}
  assert classes == set(attention_config.IMPORT_TYPES) | set(attention_config.FAMILY_TYPES)
  assert sum(f.stat().st_size for f in DATA.rglob('*') if f.is_file()) < 1_250_000


@pytest.mark.parametrize('name', FIXTURES)
def test_logits_match_transformers(name):
  config, params, _ = io.read_hf(DATA / name)
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  ours = _logits(config.model, params, ref['tokens'])
  assert ours.shape == ref['logits'].shape
  assert _rel_err(ours, ref['logits']) <= REL_TOL


# Windows shorter than the prompt, NoPE, an irregular pattern and the scalings in the default tier; the rest in the
# end-to-end tier (-m e2e).
DEFAULT_GREEDY = ('hf_granite_swa_nope', 'jax_mistral_swa', 'hf_granite_swa_scaled', 'hf_granite_swa_sinks',
                  'hf_qwen3_5', 'hf_nemotron_h')


@pytest.mark.parametrize('name', default_tier(FIXTURES, keep=DEFAULT_GREEDY))
def test_greedy_tokens_match_transformers(name):
  """The decode path (KV caches, SWA rings) continues greedily exactly as transformers' generate did."""
  config, params, _ = io.read_hf(DATA / name)
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  generator = Generator(state_lib.make_model_def(config.model), params, bucket=8)
  greedy = generator.generate(ref['tokens'].tolist(), max_new_tokens=ref['greedy'].shape[1])
  np.testing.assert_array_equal(np.asarray(greedy), ref['greedy'])


def test_imported_layer_patterns():
  """The per-layer pattern of each transformers config becomes hybrid_jax's shortest cycle and RoPE flags."""
  def fields(name):
    return attention_config.plan_import(io.read_hf_config(DATA / name)).model_fields

  granite = fields('hf_granite_swa_nope')  # full(NoPE), swa, swa, full(NoPE), swa
  assert (granite['cycle'], granite['window'], granite['rope_full'], granite['rope_swa']) == (
      ('full', 'swa', 'swa'), 4, False, True)
  smol = fields('hf_smollm3_untied')
  assert (smol['cycle'], smol['window'], smol['rope_full'], smol['rope_base']) == (
      ('swa', 'swa', 'full'), 6, False, 1000.0)
  # A SmolLM3 config without layer_types: transformers makes the NoPE layers the sliding ones.
  derived = {**io.read_hf_config(DATA / 'hf_smollm3_untied'), 'no_rope_layers': [1, 1, 0, 1], 'num_hidden_layers': 4}
  del derived['layer_types']
  derived = attention_config.plan_import(derived).model_fields
  assert (derived['cycle'], derived['rope_full'], derived['rope_swa']) == (('full', 'full', 'swa'), True, False)
  assert fields('hf_llama_tied')['cycle'] == ('full',)
  assert fields('jax_mistral_swa')['cycle'] == ('swa',)
  scaled = fields('hf_granite_swa_scaled')  # Granite's multipliers become the model options of the same meaning.
  assert {k: scaled[k] for k in ('embedding_multiplier', 'residual_multiplier', 'logits_scaling',
                                 'attention_scale')} == dict(embedding_multiplier=12.0, residual_multiplier=0.6,
                                                             logits_scaling=4.0, attention_scale=0.2)
  assert fields('hf_granite_swa_nope')['attention_scale'] == 0.0  # Its multiplier is head_dim**-0.5: the default.


def test_minicpm_checkpoint_is_the_granite_model_with_minicpm_names():
  """minicpm_from_granite is hf_granite_minicpm's tensors under a MiniCPM config.json (remote-code layout: Llama
  names, scale_emb, scale_depth, dim_model_base). MiniCPM's block is GraniteSWA's with embedding multiplier
  scale_emb, residual multiplier scale_depth / sqrt(num_layers), logits divided by hidden_size / dim_model_base
  (MiniCPM divides the final hidden state instead: the same here, the factor 4 being a power of two), full attention
  with RoPE, head_dim**-0.5 and no sinks; so its reference logits are the GraniteSWA's, which
  test_logits_match_transformers checks it against."""
  minicpm = attention_config.plan_import(io.read_hf_config(DATA / 'minicpm_from_granite'))
  granite = attention_config.plan_import(io.read_hf_config(DATA / 'hf_granite_minicpm'))
  assert minicpm.model_fields == granite.model_fields and minicpm.tied and granite.tied
  assert (minicpm.model_fields['embedding_multiplier'], minicpm.model_fields['logits_scaling']) == (12.0, 4.0)
  assert minicpm.model_fields['residual_multiplier'] == 1.4 / 2 ** 0.5
  (_, ours, _), (_, theirs, _) = io.read_hf(DATA / 'minicpm_from_granite'), io.read_hf(DATA / 'hf_granite_minicpm')
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
    np.testing.assert_array_equal(a, b)


def test_a_tensor_name_table_reads_renamed_checkpoints(tmp_path, capsys):
  """A checkpoint with other tensor names (as remote modeling code may save them) imports given its JSON table."""
  table = {'top': {'embed': 'wte', 'final_norm.scale': 'ln_f', 'lm_head': 'head'},
           'layer': {key: f'h.{{i}}.{key.replace(".", "_")}' for key in attention_weights.TABLES['llama'].layer}}
  source = tmp_path / 'renamed'
  source.mkdir()
  shutil.copy(DATA / 'hf_llama_tied' / 'config.json', source / 'config.json')
  tensors = load_file(str(DATA / 'hf_llama_tied' / io.WEIGHTS_FILE))
  renamed = {}
  for key, name in attention_weights.TABLES['llama'].top.items():
    if name in tensors:
      renamed[table['top'][key]] = tensors.pop(name)
  for i in range(3):
    for key, name in attention_weights.TABLES['llama'].layer.items():
      renamed[table['layer'][key].format(i=i)] = tensors.pop(name.format(i=i))
  assert not tensors
  save_file(renamed, str(source / io.WEIGHTS_FILE))
  (tmp_path / 'table.json').write_text(json.dumps(table))
  with pytest.raises(HFError, match="no tensor 'model.embed_tokens.weight'"):
    io.read_hf(source)
  assert cli.main(['import', str(source), '--workdir', str(tmp_path / 'run'), '--tensor-names',
                   str(tmp_path / 'table.json')]) == 0
  capsys.readouterr()
  run = runs.load_run(tmp_path / 'run')
  _, direct, _ = io.read_hf(DATA / 'hf_llama_tied')
  for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(direct)):
    np.testing.assert_array_equal(a, b)
  del table['layer']['mlp.up']
  (tmp_path / 'bad.json').write_text(json.dumps(table))
  assert parsing.run(cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run2'), '--tensor-names',
                                str(tmp_path / 'bad.json')]) == 2
  assert "\"layer\" must map exactly" in capsys.readouterr().err and "missing ['mlp.up']" in str(
      pytest.raises(HFError, attention_weights.read_table, tmp_path / 'bad.json').value)
  assert not (tmp_path / 'run2').exists()


@pytest.mark.parametrize('name', EXPORTED)
def test_export_of_imported_fixture_is_identical(name, tmp_path):
  """Import then export reproduces the committed exporter output: same config.json, same tensors bit for bit."""
  config, params, plan = io.read_hf(DATA / name)
  io.write_hf(tmp_path, config.model, params, arch=plan.model_type, max_positions=64)
  assert json.loads((tmp_path / 'config.json').read_text()) == json.loads((DATA / name / 'config.json').read_text())
  ours, theirs = load_file(str(tmp_path / io.WEIGHTS_FILE)), load_file(str(DATA / name / io.WEIGHTS_FILE))
  assert ours.keys() == theirs.keys()
  for key in ours:
    np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


def test_learned_sinks_import_as_model_sinks_and_round_trip(tmp_path):
  """Finite GraniteSWA sinks become model.attention_sinks with the same values (-inf heads included); export writes
  them back bit for bit; all -inf sinks import as a model without sinks."""
  config, params, _ = io.read_hf(DATA / 'hf_granite_swa_sinks')
  assert config.model.attention_sinks and config.model.attention_implementation == 'auto'
  source = load_file(str(DATA / 'hf_granite_swa_sinks' / io.WEIGHTS_FILE))
  np.testing.assert_array_equal(params['tail'][1]['mixer']['sinks'], source['model.layers.1.self_attn.sinks'])
  assert io.read_hf(DATA / 'hf_granite_swa_nope')[0].model.attention_sinks is False
  hf = io.write_hf(tmp_path, config.model, params, max_positions=64)
  assert hf['model_type'] == 'granite_swa'
  out = load_file(str(tmp_path / io.WEIGHTS_FILE))
  for i in range(3):
    name = f'model.layers.{i}.self_attn.sinks'
    np.testing.assert_array_equal(out[name], source[name])
  with pytest.raises(HFError, match=r'--arch=smollm3 has no .* sinks, but the model sets model.attention_sinks'):
    io.write_hf(tmp_path / 'smol', config.model, params, arch='smollm3', max_positions=64)


def test_scalings_export_as_granite_and_round_trip(tmp_path):
  """The scaled fixture re-exports (auto) as GraniteSWA with its four factors, and that re-imports identically."""
  config, params, _ = io.read_hf(DATA / 'hf_granite_swa_scaled')
  hf = io.write_hf(tmp_path, config.model, params, max_positions=64)
  source = io.read_hf_config(DATA / 'hf_granite_swa_scaled')
  for field in ('model_type', 'embedding_multiplier', 'residual_multiplier', 'logits_scaling',
                'attention_multiplier', 'layer_types', 'layer_rope_theta', 'sliding_window'):
    assert hf[field] == source[field], field
  back_config, back, _ = io.read_hf(tmp_path)
  assert back_config.model.to_dict() == config.model.to_dict()
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('sinks, model_type', [(False, 'smollm3'), (True, 'granite_swa')])
def test_round_trip_of_a_scanned_model(tmp_path, sinks, model_type):
  """A scanned model (2 stacked cycles + 1 tail layer) exports and re-imports to identical params and logits."""
  config = _tiny_config(num_layers=5, cycle=('swa', 'full'), window=3, rope_full=False, scan_layers=True,
                        attention_sinks=sinks)
  shapes = jax.eval_shape(lambda: state_lib.init_params(config.model, 0))
  rng = np.random.default_rng(7)
  params = jax.tree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32) * 0.3, shapes)
  io.write_hf(tmp_path, config.model, params, max_positions=32)
  assert json.loads((tmp_path / 'config.json').read_text())['model_type'] == model_type
  back_config, back, _ = io.read_hf(tmp_path, {'scan_layers': True})
  assert back_config.model.attention_sinks is sinks
  assert back_config.model.cycle == ('swa', 'full') and back_config.model.window == 3
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
    np.testing.assert_array_equal(a, b)
  # Imported unscanned, the same weights compute the same function as the scanned original.
  flat_config, flat, _ = io.read_hf(tmp_path)
  assert 'cycles' not in flat
  tokens = np.arange(24, dtype=np.int32).reshape(2, 12) % 40
  assert _rel_err(_logits(flat_config.model, flat, tokens), _logits(config.model, params, tokens)) <= REL_TOL


def test_cli_import_run_then_export(tmp_path, capsys):
  """`hf import` writes a run that runs.load_run reads; `hf export` of it writes the tied head out untied."""
  source = DATA / 'hf_llama_tied'
  with pytest.raises(SystemExit) as exit_info:  # Through `python -m hybrid_jax hf ...`'s dispatch.
    commands.main(['hybrid_jax', 'hf', 'import', str(source), '--workdir', str(tmp_path / 'run')])
  assert exit_info.value.code == 0
  assert json.loads(capsys.readouterr().out)['tied_embeddings'] is True
  run = runs.load_run(tmp_path / 'run')
  ref = load_file(str(source / 'reference.safetensors'))
  assert run.step == 0
  assert _rel_err(_logits(run.config.model, run.params, ref['tokens']), ref['logits']) <= REL_TOL
  assert cli.main(['export', '--workdir', str(tmp_path / 'run'), '--out', str(tmp_path / 'out')]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary['architectures'] == ['LlamaForCausalLM'] and summary['step'] == 0
  assert json.loads((tmp_path / 'out' / 'config.json').read_text())['eos_token_id'] == 256  # The byte tokenizer's.
  out, original = load_file(str(tmp_path / 'out' / io.WEIGHTS_FILE)), load_file(str(source / io.WEIGHTS_FILE))
  assert set(out) == set(original) | {'lm_head.weight'}
  for key in original:
    np.testing.assert_array_equal(out[key], original[key], err_msg=key)
  np.testing.assert_array_equal(out['lm_head.weight'], original['model.embed_tokens.weight'])
  assert parsing.run(cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run')]) == 2
  assert f"--workdir={tmp_path / 'run'} is not empty" in capsys.readouterr().err


def test_hf_commands_write_over_no_file_without_a_word(tmp_path, capsys):
  """A non-empty --out (export) or --workdir (import) is refused naming a file it holds, and the file survives;
  export's --overwrite takes the folder over. A shard size under a byte and integer tensors are refused too."""
  source = DATA / 'hf_llama_tied'
  assert cli.main(['import', str(source), '--workdir', str(tmp_path / 'run')]) == 0
  for folder in ('out', 'into'):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / 'notes.txt').write_text('mine')
  cases = [(['export', '--workdir', str(tmp_path / 'run'), '--out', str(tmp_path / 'out')], '--out='),
           (['import', str(source), '--workdir', str(tmp_path / 'into')], '--workdir=')]
  for argv, flag in cases:
    capsys.readouterr()
    assert parsing.run(cli.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and 'is not empty (it holds notes.txt)' in err, err
  assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['notes.txt']
  assert sorted(p.name for p in (tmp_path / 'into').iterdir()) == ['notes.txt']
  assert cli.main(cases[0][0] + ['--overwrite']) == 0
  assert (tmp_path / 'out' / 'notes.txt').read_text() == 'mine' and (tmp_path / 'out' / 'config.json').is_file()
  assert parsing.run(cli.main, ['export', '--workdir', str(tmp_path / 'run'), '--out', str(tmp_path / 'o2'),
                                '--max-shard-size', '0.5']) == 2
  assert "--max-shard-size='0.5' is invalid" in capsys.readouterr().err and not (tmp_path / 'o2').exists()
  ints = tmp_path / 'ints'
  shutil.copytree(source, ints)
  tensors = load_file(str(ints / io.WEIGHTS_FILE))
  tensors['model.norm.weight'] = tensors['model.norm.weight'].astype(np.int32)
  save_file(tensors, str(ints / io.WEIGHTS_FILE))
  assert parsing.run(cli.main, ['import', str(ints), '--workdir', str(tmp_path / 'r2')]) == 2
  assert "tensor 'model.norm.weight' is int32; only floating-point weights" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize('fields, arch, match', [
    (dict(cycle=('lightning', 'full')), 'auto', r"layer 0 is a 'lightning' mixer .*they hold full, swa layers, and the released hybrids"),
    (dict(cycle=('full', 'gdn')), 'auto', r"layer 1 is a 'gdn' mixer"),
    (dict(cycle=('headwise',), window=4), 'auto', r"'headwise' mixer \(SWA and full heads inside one layer\)"),
    (dict(cycle=('swa', 'full'), window=4), 'llama', r'--arch=llama has no sliding windows'),
    (dict(cycle=('swa', 'full'), window=4), 'mistral', r'--arch=mistral gives every layer the same window'),
    (dict(cycle=('full',), rope_full=False), 'llama', r'layers \[0, 1, 2\] are NoPE'),
    (dict(cycle=('full',)), 'gpt2', r"--arch='gpt2' is not a supported"),
    (dict(cycle=('full',), logits_scaling=2.0, attention_scale=0.1), 'llama',
     r'--arch=llama has no .* attention scale or sinks, but the model sets model.logits_scaling, '
     r'model.attention_scale; use granite_swa'),
])
def test_export_refuses_what_no_class_expresses(fields, arch, match):
  config = _tiny_config(**fields)
  with pytest.raises(HFError, match=match):
    attention_config.to_hf_config(config.model, arch, max_positions=32)


def test_export_command_refuses_recurrent_run_before_reading_weights(tmp_path, capsys):
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'config.json').write_text(_tiny_config(cycle=('mamba2', 'full')).to_json_best_effort())
  # (no checkpoints)
  assert parsing.run(cli.main, ['export', '--workdir', str(run), '--out', str(tmp_path / 'out')]) == 2
  # Mamba-2 layers are the released hybrids', but none computes this one: one line, the key each differs in.
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith('error: no transformers class computes what this model does') and 'bamba: ' in line
  assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('name, change, match', [
    ('hf_llama_tied', dict(model_type='qwen3'), r"model_type='qwen3'.*supported model types: llama, mistral"),
    ('hf_llama_tied', dict(attention_bias=True), r'attention_bias=True .*no biases'),
    ('hf_llama_tied', dict(hidden_act='gelu'), r"hidden_act='gelu'"),
    ('hf_llama_tied', dict(rope_parameters={'rope_type': 'yarn', 'rope_theta': 1e4, 'factor': 4.0}),
     r"rope_type='yarn'"),
    ('hf_granite_swa_scaled', dict(residual_multiplier=0), r'residual_multiplier=0 .*a finite number > 0'),
    ('hf_granite_swa_scaled', dict(attention_multiplier=-0.2), r'attention_multiplier=-0.2 .*a finite number > 0'),
    ('hf_granite_swa_nope', dict(layer_rope_theta=[0, 1e4, 5e5, 0, 1e4]), r'one RoPE base'),
    ('hf_granite_swa_nope', dict(layer_rope_theta=[1e4, 1e4, 1e4, 0, 1e4]),
     r'full-attention layers mix RoPE and NoPE \(NoPE at layers \[3\]\)'),
    ('hf_smollm3_untied', dict(layer_types=['full_attention'] * 5), r'one entry per layer \(6\)'),
    ('minicpm_from_granite', dict(scale_emb=None), r'scale_emb=None .*a finite number > 0'),
    ('minicpm_from_granite', dict(use_mup=False), r"use_mup=False .*MiniCPM's scaled block"),
    ('minicpm_from_granite', dict(sparse_config={'kernel_size': 32}), r'sparse_config=.*no sparse attention'),
    ('minicpm_from_granite', dict(rope_scaling={'rope_type': 'longrope'}), r'rope_scaling=.*no scaling'),
])
def test_import_refuses_unrepresentable_configs(name, change, match):
  hf = {**io.read_hf_config(DATA / name), **change}
  with pytest.raises(HFError, match=match):
    attention_config.plan_import(hf)


def test_import_refuses_config_before_reading_weights(tmp_path):
  source = tmp_path / 'source'
  shutil.copytree(DATA / 'hf_llama_tied', source)
  (source / io.WEIGHTS_FILE).write_bytes(b'not safetensors')
  hf = {**io.read_hf_config(source), 'mlp_bias': True}
  (source / 'config.json').write_text(json.dumps(hf))
  with pytest.raises(HFError, match='mlp_bias=True'):
    io.import_hf(source, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def _edited_copy(tmp_path, name, edit):
  target = tmp_path / name
  shutil.copytree(DATA / name, target)
  tensors = load_file(str(target / io.WEIGHTS_FILE))
  edit(tensors)
  save_file(tensors, str(target / io.WEIGHTS_FILE))
  return target


@pytest.mark.parametrize('name, edit, match', [
    ('hf_llama_tied', lambda t: t.__setitem__('model.layers.1.mlp.up_proj.weight', np.zeros((8, 16), np.float32)),
     r"'model.layers.1.mlp.up_proj.weight' has shape \(8, 16\), but config.json implies \(32, 16\)"),
    ('hf_llama_tied', lambda t: t.pop('model.layers.2.self_attn.o_proj.weight'),
     r"no tensor 'model.layers.2.self_attn.o_proj.weight'"),
    ('hf_llama_tied', lambda t: t.__setitem__('model.layers.0.self_attn.q_norm.weight', np.ones(8, np.float32)),
     r'no place for: \[.model.layers.0.self_attn.q_norm.weight.\]'),
    ('hf_llama_tied', lambda t: t.__setitem__('lm_head.weight', t['model.embed_tokens.weight'] + 1),
     r'tie_word_embeddings is true but lm_head.weight differs'),
])
def test_import_refuses_unrepresentable_weights(tmp_path, name, edit, match):
  with pytest.raises(HFError, match=match):
    io.read_hf(_edited_copy(tmp_path, name, edit))


def test_sharded_and_bfloat16_checkpoints_read(tmp_path):
  """Shards listed in model.safetensors.index.json and bfloat16 tensors import (bf16 exactly representable)."""
  import ml_dtypes
  name = 'jax_llama_gqa'
  shutil.copy(DATA / name / 'config.json', tmp_path / 'config.json')
  tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in load_file(str(DATA / name / io.WEIGHTS_FILE)).items()}
  keys = sorted(tensors)
  shards = {'a.safetensors': keys[::2], 'b.safetensors': keys[1::2]}
  for shard, names in shards.items():
    save_file({k: tensors[k] for k in names}, str(tmp_path / shard))
  weight_map = {k: shard for shard, names in shards.items() for k in names}
  (tmp_path / io.INDEX_FILE).write_text(json.dumps({'weight_map': weight_map}))
  _, params, _ = io.read_hf(tmp_path)
  _, direct, _ = io.read_hf(DATA / name)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(direct)):
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, np.asarray(b).astype(ml_dtypes.bfloat16).astype(np.float32))


def test_sharded_export_round_trips(tmp_path, capsys):
  """--max-shard-size writes transformers' shard layout (files in tensor order, none over the limit unless one
  tensor is, an index with the total size); import reads it back bit for bit; a later unsharded export replaces it."""
  config, params, _ = io.read_hf(DATA / 'hf_granite_swa_sinks')
  io.write_hf(tmp_path, config.model, params, max_positions=64, max_shard_bytes=io.parse_size('12KB'))
  index = json.loads((tmp_path / io.INDEX_FILE).read_text())
  files = sorted(set(index['weight_map'].values()))
  assert len(files) > 2 and files[0] == 'model-00001-of-%05d.safetensors' % len(files)
  assert not (tmp_path / io.WEIGHTS_FILE).exists()
  total = 0
  for file in files:
    tensors = load_file(str(tmp_path / file))
    size = sum(x.nbytes for x in tensors.values())
    assert size <= 12_000 or len(tensors) == 1
    assert all(index['weight_map'][n] == file for n in tensors)
    total += size
  assert index['metadata']['total_size'] == total
  _, back, _ = io.read_hf(tmp_path)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
    np.testing.assert_array_equal(a, b)
  io.write_hf(tmp_path, config.model, params, max_positions=64)
  assert sorted(p.name for p in tmp_path.glob('*.safetensors')) == [io.WEIGHTS_FILE]
  assert not (tmp_path / io.INDEX_FILE).exists()
  with pytest.raises(HFError, match=r"--max-shard-size='5 parsecs' is invalid"):
    io.parse_size('5 parsecs')
  assert (io.parse_size('5GB'), io.parse_size('2MiB'), io.parse_size(1000)) == (5 * 10**9, 2 * 2**20, 1000)


def _word_tokenizer(path):
  """A small word-level tokenizer.json (the `tokenizers` library; EOS found by its usual name '</s>')."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  words = ['[UNK]', '<s>', '</s>'] + [f'w{i}' for i in range(20)]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='[UNK]'))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(['<s>', '</s>'])
  tok.save(str(path))


def test_hf_tokenizer_travels_both_ways(tmp_path, capsys):
  """A checkpoint's tokenizer.json becomes the imported run's tokenizer; export writes it back with a
  tokenizer_config.json naming its EOS and BOS, which a re-import reads."""
  source = tmp_path / 'source'
  shutil.copytree(DATA / 'jax_llama_gqa', source)
  _word_tokenizer(source / io.HF_TOKENIZER_FILE)
  assert cli.main(['import', str(source), '--workdir', str(tmp_path / 'run')]) == 0
  run = runs.load_run(tmp_path / 'run')
  assert run.config.data.tokenizer == str((tmp_path / 'run' / io.HF_TOKENIZER_FILE).absolute())
  assert run.tokenizer.decode(run.tokenizer.encode('w3 w1 w17')) == 'w3 w1 w17' and run.tokenizer.eos_id == 2
  assert cli.main(['export', '--workdir', str(tmp_path / 'run'), '--out', str(tmp_path / 'out')]) == 0
  assert json.loads(capsys.readouterr().out.splitlines()[-1])['tokenizer_files'] == [io.HF_TOKENIZER_FILE,
                                                                                     io.HF_TOKENIZER_CONFIG]
  out = tmp_path / 'out'
  assert (out / io.HF_TOKENIZER_FILE).read_bytes() == (source / io.HF_TOKENIZER_FILE).read_bytes()
  assert json.loads((out / io.HF_TOKENIZER_CONFIG).read_text()) == {
      'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': '</s>', 'bos_token': '<s>', 'model_max_length': 512}
  assert json.loads((out / 'config.json').read_text())['eos_token_id'] == 2
  assert not (out / io.SENTENCEPIECE_FILE).exists()
  # The exported tokenizer_config.json names EOS for the next import (here a token without a usual name).
  config = json.loads((out / io.HF_TOKENIZER_CONFIG).read_text())
  (out / io.HF_TOKENIZER_CONFIG).write_text(json.dumps({**config, 'eos_token': 'w19'}))
  assert cli.main(['import', str(out), '--workdir', str(tmp_path / 'again')]) == 0
  assert runs.load_run(tmp_path / 'again').tokenizer.eos_id == 22
  assert (tmp_path / 'again' / io.HF_TOKENIZER_CONFIG).is_file()
  # A tokenizer with more ids than the model's vocabulary is refused before the run directory exists.
  big = tmp_path / 'big'
  shutil.copytree(DATA / 'hf_llama_tied', big)  # vocab_size 64
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  tok = Tokenizer(models.WordLevel({**{f'w{i}': i for i in range(80)}, '</s>': 80}, unk_token='w0'))
  tok.add_special_tokens(['</s>'])
  tok.save(str(big / io.HF_TOKENIZER_FILE))
  assert parsing.run(cli.main, ['import', str(big), '--workdir', str(tmp_path / 'no')]) == 2
  assert 'has 81 ids but config.json vocab_size=64' in capsys.readouterr().err
  assert not (tmp_path / 'no').exists()


def test_sentencepiece_tokenizer_travels_both_ways(tmp_path, capsys):
  """A checkpoint's tokenizer.model becomes the imported run's tokenizer, and export copies it back with its EOS."""
  import sentencepiece as spm
  (tmp_path / 'text.txt').write_text('\n'.join(f'abc cab bca {i}' for i in range(50)))
  spm.SentencePieceTrainer.train(input=str(tmp_path / 'text.txt'), model_prefix=str(tmp_path / 'sp'), vocab_size=30,
                                 model_type='char', minloglevel=2)
  source = tmp_path / 'source'
  shutil.copytree(DATA / 'jax_llama_gqa', source)
  shutil.copy(tmp_path / 'sp.model', source / io.SENTENCEPIECE_FILE)
  assert cli.main(['import', str(source), '--workdir', str(tmp_path / 'run')]) == 0
  run = runs.load_run(tmp_path / 'run')
  assert run.config.data.tokenizer == str((tmp_path / 'run' / io.SENTENCEPIECE_FILE).absolute())
  assert run.tokenizer.decode(run.tokenizer.encode('abc cab')) == 'abc cab'
  assert cli.main(['export', '--workdir', str(tmp_path / 'run'), '--out', str(tmp_path / 'out')]) == 0
  assert (tmp_path / 'out' / io.SENTENCEPIECE_FILE).read_bytes() == (tmp_path / 'sp.model').read_bytes()
  assert json.loads((tmp_path / 'out' / 'config.json').read_text())['eos_token_id'] == run.tokenizer.eos_id
  capsys.readouterr()
