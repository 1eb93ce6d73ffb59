"""Reference logits from `transformers` (CPU torch) for the checkpoints under tests/data/hf/ (run outside the tests).

Needs Python 3.11 with torch and transformers >= 5.15 (GraniteSWA); the test suite never imports torch:

  python3.11 -m venv /tmp/hfref311
  /tmp/hfref311/bin/pip install torch==2.13.0 && /tmp/hfref311/bin/pip install "transformers>=5.15" safetensors
  /tmp/hfref311/bin/python scripts/hf_reference_logits.py tests/data/hf [--build] [--length=N] [--only=A,B]

`--build` first writes the transformers-side fixtures (tiny random models saved by `save_pretrained`: a tied Llama
with GQA, a GraniteSWA with an irregular per-layer SWA/full and NoPE pattern and -inf sinks, an untied SmolLM3, a
GraniteSWA with every scaling away from its plain value, a full-attention GraniteSWA with MiniCPM's scalings, a
GraniteSWA with learned (finite) attention sinks).
`--only` limits building and references to the named fixture directories.

`--compare DIR ...`: the re-load check of exports written by `scripts/hf_export_fixtures.py --run`: loads DIR in
float32 (eager attention, and sdpa where the class has it), runs hybrid_jax's token rows, and prints the max
|logit difference| (absolute and relative to max |logit|), whether the 8 greedy tokens per row agree, and whether
AutoTokenizer on DIR encodes the sample text to hybrid_jax's ids.

MiniCPM checkpoints load through remote modeling code, which transformers does not ship; its block is Llama's with
embeddings times `scale_emb`, residual branches times `scale_depth / sqrt(num_layers)` and the final hidden state
divided by `hidden_size / dim_model_base`, which is GraniteSWA with those three multipliers (logits divided instead
of the hidden state: the same up to rounding), head_dim**-0.5 attention, full attention with RoPE and -inf sinks.
So `minicpm_from_granite` is written from `hf_granite_minicpm`: the same tensors (sinks dropped) under a MiniCPM
config.json, with the GraniteSWA reference logits.
Then, for every directory given (or every checkpoint directory under it), it loads the checkpoint with
AutoModelForCausalLM in float32 and writes `reference.safetensors`: `tokens` [2, N] (int32; N = --length, default
16), `logits` [2, N, vocab] from the eager attention path, and `greedy` [2, 8]: 8 greedily generated tokens per row. It
prints how far the sdpa path's logits are from the eager ones (where the class has an sdpa path).
"""

import json
import math
import pathlib
import shutil
import sys

import numpy as np
import safetensors
import safetensors.numpy
import torch
import transformers

SMALL = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
BUILT = {
    'hf_llama_tied': (transformers.LlamaConfig, dict(num_hidden_layers=3, tie_word_embeddings=True,
                                                     rms_norm_eps=1e-6,
                                                     rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    'hf_granite_swa_nope': (transformers.GraniteSWAConfig, dict(
        num_hidden_layers=5, tie_word_embeddings=True, sliding_window=4,
        layer_types=['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention',
                     'sliding_attention'],
        layer_rope_theta=[0, 10000.0, 10000.0, 0, 10000.0], attention_multiplier=8 ** -0.5,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    'hf_smollm3_untied': (transformers.SmolLM3Config, dict(
        num_hidden_layers=6, tie_word_embeddings=False, use_sliding_window=True, sliding_window=6,
        no_rope_layers=[1, 1, 0, 1, 1, 0],
        layer_types=['sliding_attention', 'sliding_attention', 'full_attention'] * 2,
        rope_parameters={'rope_type': 'default', 'rope_theta': 1000.0})),
    # Every Granite scaling away from the plain block (MiniCPM-like embedding and logit factors), an attention
    # scale other than head_dim**-0.5, untied, a window shorter than the sequence, NoPE on the full layer.
    'hf_granite_swa_scaled': (transformers.GraniteSWAConfig, dict(
        num_hidden_layers=3, tie_word_embeddings=False, sliding_window=3,
        layer_types=['sliding_attention', 'full_attention', 'sliding_attention'],
        layer_rope_theta=[10000.0, 0, 10000.0], attention_multiplier=0.2, embedding_multiplier=12.0,
        residual_multiplier=0.6, logits_scaling=4.0,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    # MiniCPM's scalings as GraniteSWA multipliers (scale_emb 12, scale_depth 1.4, dim_model_base 4), tied; heads
    # hidden_size / num_attention_heads wide, as MiniCPM's are.
    'hf_granite_minicpm': (transformers.GraniteSWAConfig, dict(
        num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2, tie_word_embeddings=True,
        layer_types=['full_attention'] * 2,
        layer_rope_theta=[10000.0] * 2, attention_multiplier=8 ** -0.5, embedding_multiplier=12.0,
        residual_multiplier=1.4 / math.sqrt(2), logits_scaling=16 / 4,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    # Learned sinks: finite per-head logits N(1, 1), one head left at -inf (no sink); window 4 < 16 tokens.
    'hf_granite_swa_sinks': (transformers.GraniteSWAConfig, dict(
        num_hidden_layers=3, tie_word_embeddings=True, sliding_window=4,
        layer_types=['sliding_attention', 'full_attention', 'sliding_attention'],
        layer_rope_theta=[10000.0, 0, 10000.0], attention_multiplier=8 ** -0.5,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
}
FINITE_SINKS = ('hf_granite_swa_sinks',)
# derived fixture -> (its GraniteSWA source, the MiniCPM fields that give the source's multipliers)
DERIVED = {'minicpm_from_granite': ('hf_granite_minicpm', dict(scale_emb=12.0, scale_depth=1.4, dim_model_base=4))}
BATCH, LENGTH, NEW_TOKENS = 2, 16, 8


def build(root: pathlib.Path, only=None):
  for seed, (name, (config_class, fields)) in enumerate(BUILT.items()):
    if only and name not in only:
      continue
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config_class(**{**SMALL, **fields}))
    with torch.no_grad():
      for pname, p in model.named_parameters():
        if pname.endswith('sinks') and name in FINITE_SINKS:
          p.copy_(1 + torch.randn_like(p))
          if pname.startswith('model.layers.1.'):
            p[2] = -float('inf')
        elif pname.endswith('sinks'):
          p.fill_(-float('inf'))
        elif pname.endswith('norm.weight') or 'layernorm' in pname:
          p.copy_(1 + 0.2 * torch.randn_like(p))
        else:
          p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(root / name)
    print(f'built {name}: {type(model).__name__}')


def tokens_for(vocab: int, length: int) -> np.ndarray:
  """Fixed token ids: two rows of a simple permutation pattern covering the vocabulary."""
  return ((np.arange(BATCH * length).reshape(BATCH, length) * 37 + 11) % vocab).astype(np.int32)


def reference(path: pathlib.Path, length: int = LENGTH) -> dict:
  config = json.loads((path / 'config.json').read_text())
  tokens = tokens_for(config['vocab_size'], length)
  ids = torch.from_numpy(tokens.astype(np.int64))
  logits = {}
  for impl in ('sdpa', 'eager'):
    try:
      model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=impl)
    except ValueError as e:  # GraniteSWA has no sdpa path (its sinks need the eager softmax).
      print(f'{path.name}: no {impl} path ({str(e)[:60]}...)')
      continue
    model.eval()
    with torch.no_grad():
      logits[impl] = model(ids).logits.numpy()
  with torch.no_grad():  # (the eager model, loaded last)
    # An explicit all-ones mask: otherwise generate treats prompt tokens equal to pad_token_id as padding.
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=0)
  greedy = generated[:, length:].numpy().astype(np.int32)
  safetensors.numpy.save_file({'tokens': tokens, 'logits': logits['eager'], 'greedy': greedy},
                              str(path / 'reference.safetensors'),
                              metadata={'transformers': transformers.__version__, 'torch': torch.__version__,
                                        'class': type(model).__name__})
  gap = float(np.abs(logits['sdpa'] - logits['eager']).max()) if 'sdpa' in logits else None
  return {'class': type(model).__name__, 'max_abs_logit': float(np.abs(logits['eager']).max()),
          'sdpa_vs_eager_max_abs': gap}


def write_minicpm(source: pathlib.Path, target: pathlib.Path, scalings: dict):
  """A MiniCPM checkpoint (config.json as MiniCPM's remote code reads it) holding the GraniteSWA source's weights."""
  granite = json.loads((source / 'config.json').read_text())
  config = dict(
      architectures=['MiniCPMForCausalLM'], model_type='minicpm',
      auto_map={'AutoConfig': 'configuration_minicpm.MiniCPMConfig',
                'AutoModelForCausalLM': 'modeling_minicpm.MiniCPMForCausalLM'},
      bos_token_id=None, eos_token_id=None, hidden_act='silu', hidden_size=granite['hidden_size'],
      intermediate_size=granite['intermediate_size'], max_position_embeddings=granite['max_position_embeddings'],
      num_attention_heads=granite['num_attention_heads'], num_hidden_layers=granite['num_hidden_layers'],
      num_key_value_heads=granite['num_key_value_heads'], rms_norm_eps=granite['rms_norm_eps'], rope_scaling=None,
      rope_theta=granite['rope_parameters']['rope_theta'], torch_dtype='float32', vocab_size=granite['vocab_size'],
      **scalings)  # tie_word_embeddings left out: MiniCPM's default (true), as in its 2B checkpoints.
  assert granite['tie_word_embeddings'] and granite['residual_multiplier'] == (
      scalings['scale_depth'] / math.sqrt(granite['num_hidden_layers']))
  target.mkdir(parents=True, exist_ok=True)
  (target / 'config.json').write_text(json.dumps(config, indent=2) + '\n')
  tensors = safetensors.numpy.load_file(str(source / 'model.safetensors'))
  sinks = {name: t for name, t in tensors.items() if name.endswith('self_attn.sinks')}
  assert all(np.all(t == -np.inf) for t in sinks.values())
  safetensors.numpy.save_file({n: t for n, t in tensors.items() if n not in sinks}, str(target / 'model.safetensors'),
                              metadata={'format': 'pt'})
  shutil.copyfile(source / 'reference.safetensors', target / 'reference.safetensors')


def compare(path: pathlib.Path) -> dict:
  ours = safetensors.numpy.load_file(str(path / 'hybrid_jax_reference.safetensors'))
  with safetensors.safe_open(str(path / 'hybrid_jax_reference.safetensors'), framework='numpy') as f:
    metadata = f.metadata()
  ids = torch.from_numpy(ours['tokens'].astype(np.int64))
  files = sorted(p.name for p in path.iterdir() if p.name != 'hybrid_jax_reference.safetensors')
  result = {'class': None, 'files': files}
  for impl in ('eager', 'sdpa'):
    try:
      model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=impl)
    except ValueError:
      continue
    model.eval()
    result['class'] = type(model).__name__
    with torch.no_grad():
      logits = model(ids).logits.numpy()
      if impl == 'eager':
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=ours['greedy'].shape[1],
                                   do_sample=False, pad_token_id=0)
        result['greedy_equal'] = bool(np.array_equal(generated[:, ids.shape[1]:].numpy(), ours['greedy']))
    gap = float(np.abs(logits - ours['logits']).max())
    result[f'{impl}_max_abs_diff'] = gap
    result[f'{impl}_rel_diff'] = gap / float(np.abs(ours['logits']).max())
  result['max_abs_logit'] = float(np.abs(ours['logits']).max())
  if 'text_ids' in ours:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    theirs = tokenizer(metadata['text'], add_special_tokens=False)['input_ids']
    result['tokenizer_class'] = type(tokenizer).__name__
    result['tokenizer_ids_equal'] = theirs == ours['text_ids'].tolist()
    result['eos'] = [tokenizer.eos_token, tokenizer.eos_token_id]
  return result


def main(argv):
  roots = [pathlib.Path(a) for a in argv if not a.startswith('--')]
  if '--compare' in argv:
    for path in roots:
      print(path.name, json.dumps(compare(path)))
    return
  length = next((int(a.split('=', 1)[1]) for a in argv if a.startswith('--length=')), LENGTH)
  only = next((set(a.split('=', 1)[1].split(',')) for a in argv if a.startswith('--only=')), None)
  if '--build' in argv:
    build(roots[0], only)
  for root in roots:
    dirs = [root] if (root / 'config.json').is_file() else sorted(p for p in root.iterdir()
                                                                  if (p / 'config.json').is_file())
    dirs = [path for path in dirs if (not only or path.name in only) and path.name not in DERIVED]
    for path in dirs:
      print(path.name, json.dumps(reference(path, length)))
      for name, (source, scalings) in DERIVED.items():
        if source == path.name:
          write_minicpm(path, path.parent / name, scalings)
          print(f'wrote {name} from {source}')


if __name__ == '__main__':
  main(sys.argv[1:])
