"""The study's grid: `--config=hybrid:arch=swa128_nope,scale=s1[,budget=200]` builds one run.

Arches and scales are tables (data), not code paths; `hybrid_jax.config.validate` rejects unknown names with the
list of known ones. Optional arguments size the run:

- `budget=M`: train on M x N tokens (N = non-embedding parameters), the study's S1-S4 budgets (100 ... 1000).
- `tokens=T`: train on T tokens (e.g. `tokens=100e9` for S5).
- `stage=extend32k,init_from=RUN_DIR[,rope_base=B]`: the context-extension stage: continue from a 16K run's
  newest checkpoint at 32,768 tokens for 5B tokens (or `tokens=`); `rope_base` changes the RoPE base of the
  RoPE layers (NoPE layers have none to change).
- `experts=E[,top_k=K]`: the arch's MoE twin: every block MLP a mixture of E SwiGLU experts, K (default 2) a
  token, each expert as wide as makes the active parameters equal the dense run's non-embedding count as nearly as
  whole widths allow (hybrid_jax.models.moe_matching; docs/MOE_SHAPES.md lists the counts). A budget counts active
  parameters, so an MoE run trains on the tokens of its dense twin.

Steps = ceil(tokens / (batch_size x seq_len)); warmup is 2% of the steps (at most 1000), checkpoints and evals
every tenth of the run.
"""

import math

import pathlib

import ml_collections

from hybrid_jax import checks
from hybrid_jax.config import ConfigError, file_arguments, load_config_file
from hybrid_jax.errors import InputError

_BASE = pathlib.Path(__file__).with_name('base.py')

# name -> model fields.
ARCHES = {
    'full': dict(cycle=('full',), rope_full=True),
    'swa128': dict(cycle=('swa', 'full'), window=128, rope_full=True),
    'swa512': dict(cycle=('swa', 'full'), window=512, rope_full=True),
    'swa2048': dict(cycle=('swa', 'full'), window=2048, rope_full=True),
    'swa128_nope': dict(cycle=('swa', 'full'), window=128, rope_full=False),
    'swa128_1to3': dict(cycle=('swa', 'swa', 'swa', 'full'), window=128, rope_full=True),
    'swa128_headwise': dict(cycle=('headwise',), window=128, rope_full=True),
    'lightning': dict(cycle=('lightning', 'full')),
    'mamba2': dict(cycle=('mamba2', 'full')),
    'gdn': dict(cycle=('gdn', 'full')),
}

STUDY_VOCAB = 73_448

# name -> (model fields, data/train fields). S1-S5 reproduce the study's exact non-embedding counts.
SCALES = {
    'tiny': dict(
        model=dict(d_model=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, d_ff=320,
                   vocab_size=257, dtype='float32'),
        data=dict(seq_len=512),
        # Warmup, eval and checkpoint intervals follow steps. Every held-out evaluation reads the same 8 batches as
        # the final one, so the curve compares like with like (BENCHMARKS.md, "The main job on CPU").
        train=dict(steps=300, batch_size=8, lr=1.5e-3, eval_batches=8),
    ),
    's1': dict(model=dict(d_model=384, num_layers=10, num_heads=6, d_ff=960)),
    's2': dict(model=dict(d_model=512, num_layers=12, num_heads=8, d_ff=1280)),
    's3': dict(model=dict(d_model=640, num_layers=16, num_heads=10, d_ff=1600)),
    's4': dict(model=dict(d_model=768, num_layers=18, num_heads=12, d_ff=1920)),
    's5': dict(model=dict(d_model=1280, num_layers=30, num_heads=20, d_ff=3200)),
}

# scale -> recurrent mixer inner shapes, chosen so each mixer's parameter count is within 5% of the attention
# layer's (2*d^2 + 2*d*kv_heads*head_dim); docs/MIXER_SHAPES.md lists the counts (hybrid_jax.study.mixer_shapes).
# Lightning and GDN keep key width 32 and value width 64 (16 / 32 at tiny) and scale the head count with d_model;
# Mamba-2 keeps the reference head width 64 (16 at tiny) and picks heads and state size.
MIXER_SHAPES = {
    'tiny': dict(lightning=dict(num_heads=3, key_dim=16, value_dim=32),
                 mamba2=dict(num_heads=5, head_dim=16, state_dim=64),
                 gdn=dict(num_heads=3, key_dim=16, value_dim=32)),
    's1': dict(lightning=dict(num_heads=4, key_dim=32, value_dim=64),
               mamba2=dict(num_heads=4, head_dim=64, state_dim=128),
               gdn=dict(num_heads=4, key_dim=32, value_dim=64)),
    's2': dict(lightning=dict(num_heads=5, key_dim=32, value_dim=64),
               mamba2=dict(num_heads=6, head_dim=64, state_dim=64),
               gdn=dict(num_heads=5, key_dim=32, value_dim=64)),
    's3': dict(lightning=dict(num_heads=6, key_dim=32, value_dim=64),
               mamba2=dict(num_heads=7, head_dim=64, state_dim=96),
               gdn=dict(num_heads=6, key_dim=32, value_dim=64)),
    's4': dict(lightning=dict(num_heads=7, key_dim=32, value_dim=64),
               mamba2=dict(num_heads=8, head_dim=64, state_dim=128),
               gdn=dict(num_heads=7, key_dim=32, value_dim=64)),
    's5': dict(lightning=dict(num_heads=11, key_dim=32, value_dim=64),
               mamba2=dict(num_heads=14, head_dim=64, state_dim=64),
               gdn=dict(num_heads=11, key_dim=32, value_dim=64)),
}

# Shared by S1-S5: the study's block and context.
_STUDY = dict(
    # remat save_dots: on CPU at S1 (2K x 1) 8.9 s/step and 2.45 GiB against 12.0 s and 4.0 GiB without remat
    # (BENCHMARKS.md, "The training step on CPU"); at 16K x 8 on a GPU without remat the saved activations would
    # approach the H200's memory.
    model=dict(num_kv_heads=2, head_dim=64, vocab_size=STUDY_VOCAB, dtype='bfloat16', scan_layers=True,
               remat='save_dots'),
    data=dict(seq_len=16_384),
    train=dict(batch_size=64, lr=1e-3, warmup_steps=1000, steps=10_000, checkpoint_every=1000,
               eval_every=1000, log_every=50, loss_chunk=2048),
)


# Training stages after pretraining: name -> (data/train fields, default token budget).
STAGES = {
    'extend32k': (dict(data=dict(seq_len=32_768), train=dict(lr=3e-4)), 5e9),
}

_ARGS = ('arch', 'scale', 'budget', 'tokens', 'stage', 'init_from', 'rope_base', 'experts', 'top_k')


def _parse(arg):
  usage = (f'arch=NAME,scale=NAME with optional budget=M | tokens=T, stage=NAME, init_from=DIR, rope_base=B, '
           f'experts=E[,top_k=K] '
           f'(arches: {", ".join(ARCHES)}; scales: {", ".join(SCALES)}; stages: {", ".join(STAGES)})')
  fields = {'arch': 'swa128_nope', 'scale': 'tiny', **file_arguments(arg, _ARGS, 'hybrid config', usage)}
  if fields['arch'] not in ARCHES:
    raise ConfigError(f'model.arch={fields["arch"]!r} is unknown; allowed: {", ".join(ARCHES)}')
  if fields['scale'] not in SCALES:
    raise ConfigError(f'model.scale={fields["scale"]!r} is unknown; allowed: {", ".join(SCALES)}')
  if 'stage' in fields and fields['stage'] not in STAGES:
    raise ConfigError(f'stage={fields["stage"]!r} is unknown; allowed: {", ".join(STAGES)}')
  if 'budget' in fields and 'tokens' in fields:
    raise ConfigError('hybrid config: give budget=M (x N tokens) or tokens=T, not both')
  if ('init_from' in fields or 'rope_base' in fields) and 'stage' not in fields:
    raise ConfigError('hybrid config: init_from / rope_base belong to a stage (e.g. stage=extend32k)')
  if 'stage' in fields and 'init_from' not in fields:
    raise ConfigError(f'stage={fields["stage"]} continues a pretrained run: add init_from=RUN_DIR')
  if 'top_k' in fields and 'experts' not in fields:
    raise ConfigError('hybrid config: top_k belongs to an MoE twin: add experts=E')
  try:
    for key in ('budget', 'tokens', 'rope_base'):
      if key in fields:  # Finite and positive: `budget=inf` or `tokens=1e400` would size an endless run.
        fields[key] = float(checks.number(fields[key], f'hybrid config: {key}', positive=True))
    for key in ('experts', 'top_k'):
      if key in fields:
        fields[key] = int(checks.number(fields[key], f'hybrid config: {key}', integer=True, positive=True))
  except InputError as e:
    raise ConfigError(str(e)) from None
  if fields.get('top_k', 2) > fields.get('experts', 2):
    raise ConfigError(f'hybrid config: top_k={fields["top_k"]} is invalid: must be at most experts='
                      f'{fields["experts"]}')
  return fields


def _moe_twin(c, experts: int, top_k: int):
  """Every block MLP an MoE of `experts` SwiGLU experts, `top_k` a token, sized to the dense run's parameters."""
  from hybrid_jax.models import moe_matching  # pylint: disable=g-import-not-at-top
  c.model.moe.update(dict(blocks='all', num_experts=experts, top_k=top_k))
  c.model.moe.expert_d_ff = moe_matching.matched_expert_width(c.model)
  c.name += f'_e{experts}k{top_k}'


def _size_run(c, tokens: float):
  """Steps for a token budget; warmup, checkpoints and evals scaled to the run's length."""
  steps = max(1, math.ceil(tokens / (c.train.batch_size * c.data.seq_len)))
  c.train.steps = steps
  c.train.warmup_steps = max(1, min(1000, round(0.02 * steps)))
  every = max(1, steps // 10)
  c.train.checkpoint_every, c.train.eval_every = every, every


def get_config(arg=None):
  fields = _parse(arg)
  arch, scale = fields['arch'], fields['scale']
  c = load_config_file(str(_BASE))
  c.name = f'{arch}_{scale}'
  c.model.arch = arch
  c.model.scale = scale
  c.model.update(ARCHES[arch])
  for group in ([SCALES[scale]] if scale == 'tiny' else [_STUDY, SCALES[scale]]):
    for section, values in group.items():
      c[section].update(values)
  for mixer, shape in MIXER_SHAPES[scale].items():
    c.model[mixer].update(shape)
  if 'experts' in fields:
    _moe_twin(c, fields['experts'], fields.get('top_k', 2))
  tokens = fields.get('tokens')
  if 'budget' in fields:
    from hybrid_jax.models.counting import param_counts  # pylint: disable=g-import-not-at-top
    tokens = fields['budget'] * param_counts(c.model)['active_non_embedding']
    c.name += f'_{fields["budget"]:g}n'
  if 'stage' in fields:
    overrides, default_tokens = STAGES[fields['stage']]
    for section, values in overrides.items():
      c[section].update(values)
    c.train.init_from = fields['init_from']
    if 'rope_base' in fields:
      c.model.rope_base = fields['rope_base']
    tokens = tokens or default_tokens
    c.name += f'_{fields["stage"]}'
  if tokens is not None:
    _size_run(c, tokens)
    if 'budget' not in fields:
      c.name += f'_{tokens:.3g}tok'
  return c


def get_hyper_names():
  return ml_collections.ConfigDict({'arches': list(ARCHES), 'scales': list(SCALES)})
