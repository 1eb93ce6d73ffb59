"""The released recurrent hybrids (Qwen3.5, OLMo Hybrid, Nemotron-H, Bamba, Granite-4.0-H) in and out of hybrid_jax.

Each fixture under tests/data/hf/ is a tiny random model saved by transformers 5.23 with, in reference.safetensors,
its logits over the whole prompt (prefill), `decode_logits` fed one token at a time through its cache, and 8 greedy
tokens (scripts/hf_reference_logits.py). Prefill and greedy are checked by test_hf.py's parametrised tests; here:
the cached decode, the refusals, the analyses and training on an imported model, and export as Qwen3.5.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hybrid_jax.commands import analyze, hf as hf_cli, parsing, train as train_cli
from hybrid_jax.hf import HFError, io
from hybrid_jax.hf.families import config as family_config, export as family_export, weights as family_weights
from hybrid_jax.train import runs
from tests.conftest import default_tier
from tests.test_hf import DATA, REL_TOL, _edited_copy, _logits, _rel_err, _tiny_config

HYBRIDS = {'qwen3_5_text': 'hf_qwen3_5', 'olmo_hybrid': 'hf_olmo_hybrid', 'nemotron_h': 'hf_nemotron_h',
           'bamba': 'hf_bamba', 'granitemoehybrid': 'hf_granite_hybrid'}
# OLMo Hybrid exactly as transformers' save_pretrained wrote it: its fused q | k | v conv (8 + 8 + 16 channels) in
# q/k/v_conv1d tensors of 11 / 11 / 10 channels (hf_olmo_hybrid holds the released split, at the q / k / v widths).
OLMO_AS_SAVED = 'hf_olmo_hybrid_saved'


def test_every_family_has_a_fixture():
  assert set(HYBRIDS) == set(family_config.FAMILIES)
  for model_type, name in HYBRIDS.items():
    assert json.loads((DATA / name / 'config.json').read_text())['model_type'] == model_type


@pytest.mark.parametrize('name', [*HYBRIDS.values(), OLMO_AS_SAVED])
def test_cached_decode_matches_transformers(name):
  """Prefill of the first token, then one step per token through the decode states (KV caches, conv and scan
  states), against transformers' own cached decode."""
  config, params, _ = io.read_hf(DATA / name)
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  from hybrid_jax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  model = state_lib.make_model_def(config.model).bind(params)
  tokens = jnp.asarray(ref['tokens'])
  state = model.init_decode_state(tokens.shape[0], tokens.shape[1])
  logits, state = model.prefill(tokens[:, :1], state)
  steps = [np.asarray(logits)]
  for t in range(1, tokens.shape[1]):
    step, state = model.step(tokens[:, t], jnp.int32(t), state)
    steps.append(np.asarray(step)[:, None])
  assert _rel_err(np.concatenate(steps, axis=1), ref['decode_logits']) <= REL_TOL


def test_imported_options():
  """Each family's config.json becomes the model options of the same meaning."""
  plan = lambda name: family_config.FAMILIES[io.read_hf_config(DATA / name)['model_type']].plan(
      io.read_hf_config(DATA / name))[0]
  qwen = plan('hf_qwen3_5')
  assert qwen['cycle'] == ('gdn', 'gdn', 'gdn', 'full') and qwen['attention'] == dict(
      qk_norm='head', output_gate=True, rope_dims=4)
  assert qwen['gdn'] == dict(num_heads=2, value_heads=4, key_dim=8, value_dim=6, conv_width=4)
  olmo = plan('hf_olmo_hybrid')
  assert olmo['cycle'] == ('gdn', 'gdn', 'full') and olmo['attention']['post_norm'] and olmo['gdn']['neg_eigval']
  nemo = plan('hf_nemotron_h')
  assert (nemo['cycle'], nemo['block_mlp'], nemo['mlp'], nemo['rope_full']) == (
      ('mamba2', 'mlp', 'mamba2', 'full'), False, 'relu2', False)
  assert nemo['mamba2']['num_groups'] == 2 and nemo['mamba2']['dt_floor'] == 0.001
  bamba = plan('hf_bamba')
  assert bamba['cycle'] == ('mamba2', 'mamba2', 'full') and bamba['attention'] == dict(rope_dims=4)
  granite = plan('hf_granite_hybrid')
  assert (granite['rope_full'], granite['attention_scale'], granite['d_ff']) == (False, 0.3, 24)


def _no_weights_copy(tmp_path, name, change):
  """A copy of fixture `name` with config.json changed and a model.safetensors that cannot be read: a refusal
  from it was made before any weight was read."""
  target = tmp_path / name
  shutil.copytree(DATA / name, target)
  (target / io.WEIGHTS_FILE).write_bytes(b'not safetensors')
  config = {**json.loads((target / 'config.json').read_text()), **change}
  (target / 'config.json').write_text(json.dumps({k: v for k, v in config.items() if v != 'DROP'}))
  return target


@pytest.mark.parametrize('name, change, match', [
    ('hf_qwen3_5', dict(linear_num_value_heads=3), r'linear_num_value_heads=3 .*multiple of linear_num_key_heads=2'),
    ('hf_qwen3_5', dict(attention_bias=True), r'attention_bias=True .*no biases'),
    ('hf_qwen3_5', dict(hidden_act='gelu'), r"hidden_act='gelu'"),
    ('hf_qwen3_5', dict(rope_parameters={'rope_type': 'yarn', 'rope_theta': 1e4}), r"rope_type='yarn'"),
    ('hf_qwen3_5', dict(layer_types=['linear_attention'] * 3), r'one entry per layer \(num_hidden_layers=4\)'),
    ('hf_olmo_hybrid', dict(layer_types=['linear_attention', 'sliding_attention', 'full_attention',
                                         'linear_attention']), r"layer_types=.*'linear_attention', 'full_attention'"),
    ('hf_nemotron_h', dict(layers_block_type=['linear_attention', 'moe', 'full_attention'], moe_latent_size=8),
     r'moe_latent_size=8 .*LatentMoE'),
    ('hf_nemotron_h', dict(layers_block_type='DROP', hybrid_override_pattern='M-X*'),
     r"hybrid_override_pattern='M-X\*' .*M, \*, -, E"),
    ('hf_nemotron_h', dict(use_bias=True), r'use_bias=True'),
    ('hf_nemotron_h', dict(mlp_hidden_act='gelu'), r"mlp_hidden_act='gelu' .*squared ReLU"),
    ('hf_bamba', dict(attn_layer_indices=[7]), r'attn_layer_indices=\[7\] .*layer indices in 0..3'),
    ('hf_bamba', dict(mamba_proj_bias=True), r'mamba_proj_bias=True'),
    ('hf_bamba', dict(time_step_limit=[0.0, 0.5]), r'time_step_limit=\[0.0, 0.5\] .*no ceiling'),
    ('hf_bamba', dict(mamba_d_head=3), r'mamba_d_head=3 .*inner width 32'),
    ('hf_granite_hybrid', dict(num_local_experts=-1), r'num_local_experts=-1 .*a number of experts >= 0'),
    ('hf_granite_hybrid', dict(attention_multiplier=0), r'attention_multiplier=0 .*finite number > 0'),
])
def test_import_refuses_what_the_model_cannot_hold(tmp_path, name, change, match):
  with pytest.raises(HFError, match=match):
    io.read_hf(_no_weights_copy(tmp_path, name, change))


@pytest.mark.parametrize('name, edit, match', [
    # An MoE expert tensor in a checkpoint whose config says dense: no place for it.
    ('hf_granite_hybrid', lambda t: t.__setitem__('model.layers.0.block_sparse_moe.router.layer.weight',
                                                  np.zeros((8, 16), np.float32)),
     r'no place for: \[.model.layers.0.block_sparse_moe.router.layer.weight.\]'),
    ('hf_nemotron_h', lambda t: t.pop('backbone.layers.0.mixer.conv1d.bias'),
     r"no tensor 'model.layers.0.mixer.conv1d.bias'"),
    ('hf_qwen3_5', lambda t: t.__setitem__('model.layers.0.linear_attn.in_proj_qkv.weight', np.zeros((48, 16),
                                                                                                      np.float32)),
     r"in_proj_qkv.weight' has shape \(48, 16\), but config.json implies \(56, 16\)"),
    ('hf_bamba', lambda t: t.__setitem__('model.layers.0.mamba.in_proj.bias', np.zeros(100, np.float32)),
     r'no place for: \[.model.layers.0.mamba.in_proj.bias.\]'),
])
def test_import_refuses_tensors_it_has_no_place_for(tmp_path, name, edit, match):
  with pytest.raises(HFError, match=match):
    io.read_hf(_edited_copy(tmp_path, name, edit))


def _import_with_tokenizer(tmp_path, name):
  """`hf import` of a fixture given a 46-character tokenizer (its vocabulary is 64 ids: the byte tokenizer's
  257 would not fit)."""
  source = tmp_path / 'source'
  shutil.copytree(DATA / name, source)
  for file in (DATA / 'char_tokenizer').iterdir():
    shutil.copy(file, source / file.name)
  run = tmp_path / 'run'
  assert hf_cli.main(['import', str(source), '--workdir', str(run)]) == 0
  return run


@pytest.mark.parametrize('name', default_tier(HYBRIDS.values(), keep=('hf_qwen3_5',)))
def test_retrieval_heads_and_restriction_run_on_an_imported_model(tmp_path, capsys, name):
  run = _import_with_tokenizer(tmp_path, name)
  assert analyze.main(['retrieval-heads', '--workdir', str(run), '--source', 'study', '--length', '200',
                       '--samples', '2', '--no-progress']) == 0
  heads = json.loads((run / 'analysis' / 'retrieval_heads.json').read_text())
  config = runs.load_config(run)
  attention = [l for l in heads['layers'] if l['scored']]
  assert [l['kind'] for l in attention] == ['full'] and len(attention[0]['mass']) == config.model.num_heads
  assert all(np.isfinite(attention[0]['mass'])) and heads['layers'][0]['kind'] == config.model.cycle[0]
  assert analyze.main(['restriction', '--workdir', str(run), '--windows', '8', '--metrics', 'loss', '--seq-len',
                       '64', '--batches', '1', '--no-progress']) == 0
  rows = {row['target']: row['loss'] for row in json.loads((run / 'analysis' / 'restriction.json').read_text())
          ['rows']}
  assert set(rows) == {None, 'full', 'efficient'} and all(np.isfinite(v) for v in rows.values())
  assert rows['full'] != rows[None] and rows['efficient'] != rows[None]  # Both restrictions changed the function.
  capsys.readouterr()


def test_an_imported_model_without_a_fitting_tokenizer_is_refused_by_the_analyses(tmp_path, capsys):
  """No tokenizer in the checkpoint: the run gets the byte tokenizer, whose 257 ids do not fit a 64-row embedding;
  an analysis says so instead of reading past the table."""
  run = tmp_path / 'run'
  assert hf_cli.main(['import', str(DATA / 'hf_bamba'), '--workdir', str(run)]) == 0
  capsys.readouterr()
  status = parsing.run(analyze.main, ['retrieval-heads', '--workdir', str(run), '--source', 'study',
                                      '--length', '200', '--samples', '2', '--no-progress'])
  assert status == 2 and 'model.vocab_size=64 is invalid' in capsys.readouterr().err


@pytest.mark.e2e
def test_training_continues_from_an_imported_model(tmp_path, capsys):
  run = _import_with_tokenizer(tmp_path, 'hf_nemotron_h')
  out = tmp_path / 'trained'
  config = runs.load_config(run)
  tokenizer = config.data.tokenizer
  flags = [f'--workdir={out}', f'--config.train.init_from={run}', '--config.train.steps=2',
           '--config.train.batch_size=2', '--config.data.seq_len=32', f'--config.data.tokenizer={tokenizer}',
           '--config.model.vocab_size=64', '--config.model.d_model=16', '--config.model.num_layers=6',
           '--config.model.num_heads=4', '--config.model.num_kv_heads=2', '--config.model.head_dim=8',
           '--config.model.d_ff=32', "--config.model.cycle=('mamba2','mlp','mamba2','full')",
           '--config.model.block_mlp=False', '--config.model.mlp=relu2', '--config.model.rope_full=False',
           '--config.model.norm_eps=1e-5', '--config.model.mamba2.num_heads=4', '--config.model.mamba2.head_dim=4',
           '--config.model.mamba2.state_dim=8', '--config.model.mamba2.num_groups=2',
           '--config.model.mamba2.conv_bias=True', '--config.model.mamba2.norm_by_group=True',
           '--config.model.mamba2.dt_floor=0.001', '--config.train.checkpoint_every=1', '--config.train.log_every=1',
           '--config.eval.documents=0', '--config.eval.batches=1', '--config.train.progress=False']
  status = parsing.run(train_cli.main, flags)
  err = capsys.readouterr().err
  assert status in (0, None), err[-3000:]
  records = [json.loads(line) for line in (out / 'metrics.jsonl').read_text().splitlines()]
  losses = [r['loss'] for r in records if 'loss' in r]
  assert losses and all(np.isfinite(losses))
  # The first step's loss is the imported model's own (the parameters came from it, not from init).
  imported = runs.load_run(run)
  trained = runs.load_run(out)
  assert trained.step == 2 and set(trained.params) == set(imported.params)
  # Tracing reads the run's checkpoints (steps 1 and 2) against the last.
  assert analyze.main(['tracing', '--workdir', str(out), '--length', '200', '--samples', '2', '--no-progress']) == 0
  tracing = json.loads((out / 'analysis' / 'tracing.json').read_text())
  assert tracing['steps'] == [1, 2] and len(tracing['heads']) == 4  # The full layer's heads.


def test_evaluations_and_probing_run_on_an_imported_model(tmp_path, capsys):
  """Perplexity with loss by position, NIAH and RULER, and the residual probes, on an imported Granite-4.0-H (its
  multipliers, tied head, NoPE attention and Mamba-2 groups)."""
  run = _import_with_tokenizer(tmp_path, 'hf_granite_hybrid')
  from hybrid_jax.commands import eval as eval_cli  # pylint: disable=g-import-not-at-top
  assert eval_cli.main(['--workdir', str(run), '--tasks', 'ppl,niah:niah_single_1,ruler:niah_single_2',
                        '--context-lengths', '600', '--samples', '2', '--depths', '0.5', '--ppl-batches', '1',
                        '--ppl-documents', '2', '--no-progress']) == 0
  by_context = json.loads((run / 'eval' / 'ppl.json').read_text())['by_context']['600']
  assert np.isfinite(by_context['loss']) and all(np.isfinite(b['loss']) for b in by_context['loss_by_position'])
  assert (run / 'eval' / 'ppl_by_position.png').is_file()
  assert (run / 'eval' / 'niah.json').is_file() and (run / 'eval' / 'ruler.json').is_file()
  assert analyze.main(['probing', '--workdir', str(run), '--samples', '40', '--length', '200', '--no-progress']) == 0
  probing = json.loads((run / 'analysis' / 'probing.json').read_text())
  assert [layer['kind'] for layer in probing['layers']] == ['mamba2', 'mamba2', 'full', 'mamba2']
  capsys.readouterr()


@pytest.mark.parametrize('model_type, name', HYBRIDS.items())
def test_export_round_trips_as_the_family(tmp_path, model_type, name):
  """Import, then export with --arch auto: the family's class is chosen, the checkpoint's tensors come back (the
  zero-centred norms to one rounding; a tied head is written out), and the config.json imports to the same model
  with the same logits. (transformers loads these exports with the fixtures' logits: docs/HF.md.)"""
  config, params, _ = io.read_hf(DATA / name)
  written = io.write_hf(tmp_path, config.model, params, max_positions=64)
  family = family_config.FAMILIES[model_type]
  assert written['model_type'] == model_type and written['architectures'] == [family.hf_class]
  ours = load_file(str(tmp_path / io.WEIGHTS_FILE))
  theirs = load_file(str(DATA / name / io.WEIGHTS_FILE))
  theirs = {canonical: theirs[stored] for canonical, stored in family_weights.canonical_names(family, theirs).items()}
  tied = 'lm_head.weight' not in theirs
  assert set(ours) == set(theirs) | ({'lm_head.weight'} if tied else set())
  for key in theirs:
    np.testing.assert_allclose(ours[key], theirs[key], rtol=0, atol=1e-7, err_msg=key)
  if tied:
    np.testing.assert_array_equal(ours['lm_head.weight'], theirs['model.embed_tokens.weight'])
  again, params_again, _ = io.read_hf(tmp_path)
  assert again.model.to_dict() == config.model.to_dict()
  ref = load_file(str(DATA / name / 'reference.safetensors'))
  assert _rel_err(_logits(again.model, params_again, ref['tokens']), ref['logits']) <= REL_TOL


@pytest.mark.parametrize('fields, match', [
    (dict(cycle=('gdn', 'full')), r"model.attention.qk_norm='none', but qwen3_5_text computes 'head'"),
    (dict(cycle=('gdn', 'full'), attention=dict(qk_norm='head', output_gate=False)),
     r'model.attention.output_gate=False'),
    (dict(cycle=('gdn', 'full'), attention=dict(qk_norm='head', output_gate=True), gdn=dict(neg_eigval=True)),
     r'model.gdn.neg_eigval=True'),
    (dict(cycle=('gdn', 'swa'), attention=dict(qk_norm='head', output_gate=True)), r'model.cycle'),
])
def test_export_refuses_what_qwen3_5_computes_differently(fields, match):
  config = _tiny_config()
  fields = dict(fields)
  sections = {k: fields.pop(k) for k in ('attention', 'gdn') if k in fields}
  config.model.update(fields)
  for section, values in sections.items():
    config.model[section].update(values)
  with pytest.raises(HFError, match=match):
    io.check_exportable(config.model, 'qwen3_5_text')


def test_export_refuses_a_mamba_width_bamba_cannot_size():
  config = _tiny_config(cycle=('mamba2', 'full'))
  config.model.mamba2.update(num_heads=3, head_dim=4)  # Inner width 12 against d_model 16.
  with pytest.raises(HFError, match=r'inner width model.mamba2.num_heads \* head_dim = 12 is not a whole multiple '
                                    r'of model.d_model=16'):
    io.check_exportable(config.model, 'bamba')


def test_auto_export_names_why_each_family_differs():
  """A Mamba-2 hybrid with the study's plain Mamba-2 layer (one norm over all heads, no conv bias): no family holds
  it, and the one-line refusal says, per family, the first key it differs in. A kind no family has (Lightning) is
  named with its layer instead."""
  config = _tiny_config(cycle=('mamba2', 'full'))
  with pytest.raises(HFError, match=r'no transformers class computes what this model does') as info:
    io.check_exportable(config.model, 'auto')
  assert all(f'{family}: ' in str(info.value) for family in family_export.DENSE_AUTO)
  assert '\n' not in str(info.value) and 'model.mamba2.' in str(info.value)
  with pytest.raises(HFError, match=r"layer 0 is a 'lightning' mixer \(not attention\)"):
    io.check_exportable(_tiny_config(cycle=('lightning', 'full')).model, 'auto')


def test_a_vision_language_qwen3_5_checkpoint_imports_its_text_model(tmp_path, capsys):
  """Hub Qwen3.5 checkpoints are its vision-language model: config.json nests text_config, the text model's tensors
  sit under model.language_model., beside a vision tower and multi-token-prediction heads. The text model imports
  with the same logits; the other tensors are left out and counted in the summary; an unknown tensor inside the
  language model is still refused."""
  source = tmp_path / 'vl'
  source.mkdir()
  text = json.loads((DATA / 'hf_qwen3_5' / 'config.json').read_text())
  (source / 'config.json').write_text(json.dumps(dict(
      model_type='qwen3_5', architectures=['Qwen3_5ForConditionalGeneration'], tie_word_embeddings=False,
      text_config=text, vision_config=dict(depth=1, hidden_size=8))))
  tensors = load_file(str(DATA / 'hf_qwen3_5' / io.WEIGHTS_FILE))
  tensors = {name.replace('model.', 'model.language_model.', 1): value for name, value in tensors.items()}
  tensors['model.visual.patch_embed.proj.weight'] = np.ones((8, 3), np.float32)
  tensors['mtp.fc.weight'] = np.ones((16, 32), np.float32)
  save_file(tensors, str(source / io.WEIGHTS_FILE))
  assert hf_cli.main(['import', str(source), '--workdir', str(tmp_path / 'run')]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary['model_type'] == 'qwen3_5_text'
  assert summary['ignored_tensors'] == {'count': 2, 'first': 'model.visual.patch_embed.proj.weight'}
  run = runs.load_run(tmp_path / 'run')
  ref = load_file(str(DATA / 'hf_qwen3_5' / 'reference.safetensors'))
  assert _rel_err(_logits(run.config.model, run.params, ref['tokens']), ref['logits']) <= REL_TOL
  tensors['model.language_model.layers.0.linear_attn.extra.weight'] = np.ones(4, np.float32)
  save_file(tensors, str(source / io.WEIGHTS_FILE))
  with pytest.raises(HFError, match=r'no place for: \[.model.language_model.layers.0.linear_attn.extra.weight.\]'):
    io.read_hf(source)


def test_a_latent_mixture_of_experts_is_one_line_at_the_command_line(tmp_path, capsys):
  source = _no_weights_copy(tmp_path, 'hf_nemotron_h', dict(layers_block_type=['linear_attention', 'moe'],
                                                             moe_latent_size=8))
  assert parsing.run(hf_cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count('\n') == 0 and err.startswith('error: ') and 'moe_latent_size=8' in err
  assert not (tmp_path / 'run').exists()


def test_a_tied_checkpoint_may_store_its_head_only_as_the_embedding(tmp_path):
  """Granite-4.0-H's fixture is tied: an lm_head.weight equal to the embedding is read (and the logits stay), a
  different one is refused naming both tensors."""
  ref = load_file(str(DATA / 'hf_granite_hybrid' / 'reference.safetensors'))
  same = _edited_copy(tmp_path / 'same', 'hf_granite_hybrid',
                 lambda t: t.__setitem__('lm_head.weight', t['model.embed_tokens.weight'].copy()))
  config, params, _ = io.read_hf(same)
  assert _rel_err(_logits(config.model, params, ref['tokens']), ref['logits']) <= REL_TOL
  other = _edited_copy(tmp_path / 'other', 'hf_granite_hybrid',
                  lambda t: t.__setitem__('lm_head.weight', t['model.embed_tokens.weight'] + 1))
  with pytest.raises(HFError, match='tie_word_embeddings is true but lm_head.weight differs from '
                                    'model.embed_tokens.weight'):
    io.read_hf(other)


def _olmo_convs(tensors, layer):
  return [tensors[f'model.layers.{layer}.linear_attn.{part}_conv1d.weight'] for part in 'qkv']


def test_an_olmo_hybrid_checkpoint_as_transformers_saves_it_imports(tmp_path):
  """transformers runs OLMo Hybrid's short conv as one fused depthwise conv over [q | k | v] and saves it cut into
  near-equal thirds, not at the q / k / v widths. Read as the one tensor they came from and split by the layer's
  own widths, the checkpoint computes transformers' prefill logits, cached decode (test_cached_decode_matches_
  transformers) and greedy tokens; exported, the conv is written in the released split, the same fused tensor."""
  saved = load_file(str(DATA / OLMO_AS_SAVED / io.WEIGHTS_FILE))
  for layer in (0, 2):
    assert [t.shape for t in _olmo_convs(saved, layer)] == [(11, 1, 4), (11, 1, 4), (10, 1, 4)]  # Not 8, 8, 16.
  config, params, _ = io.read_hf(DATA / OLMO_AS_SAVED)
  gdn = config.model.gdn
  assert (config.model.cycle, config.model.num_layers, gdn.num_heads, gdn.value_heads, gdn.key_dim, gdn.value_dim,
          gdn.neg_eigval, config.model.rope_full) == (('gdn', 'full'), 3, 2, 4, 4, 4, False, False)
  ref = load_file(str(DATA / OLMO_AS_SAVED / 'reference.safetensors'))
  assert _rel_err(_logits(config.model, params, ref['tokens']), ref['logits']) <= REL_TOL
  from hybrid_jax.eval.generate import Generator  # pylint: disable=g-import-not-at-top
  from hybrid_jax.train import state as state_lib  # pylint: disable=g-import-not-at-top
  generator = Generator(state_lib.make_model_def(config.model), params, bucket=8)
  greedy = generator.generate(ref['tokens'].tolist(), max_new_tokens=ref['greedy'].shape[1])
  np.testing.assert_array_equal(np.asarray(greedy), ref['greedy'])

  io.write_hf(tmp_path, config.model, params, max_positions=64)
  written = load_file(str(tmp_path / io.WEIGHTS_FILE))
  for layer in (0, 2):
    assert [t.shape for t in _olmo_convs(written, layer)] == [(8, 1, 4), (8, 1, 4), (16, 1, 4)]
    np.testing.assert_array_equal(np.concatenate(_olmo_convs(written, layer)),
                                  np.concatenate(_olmo_convs(saved, layer)))
  _, again, _ = io.read_hf(tmp_path)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)))


def test_olmo_hybrid_conv_channels_that_do_not_add_up_are_one_line(tmp_path, capsys):
  """Any cut of the fused conv is read, but the channels must add up to the layer's q + k + v widths."""
  v = 'model.layers.2.linear_attn.v_conv1d.weight'
  source = _edited_copy(tmp_path, OLMO_AS_SAVED, lambda t: t.__setitem__(v, t[v][:-1]))
  assert parsing.run(hf_cli.main, ['import', str(source), '--workdir', str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.count('\n') == 0 and err.startswith('error: '), err
  for part in 'qkv':
    assert f"'model.layers.2.linear_attn.{part}_conv1d.weight'" in err, err
  assert '11 + 11 + 9 = 31' in err and '8 + 8 + 16 = 32' in err, err
  assert not (tmp_path / 'run').exists()
