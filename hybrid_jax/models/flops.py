"""Model FLOPs per token, per layer kind, from the config and the sequence length (no arrays allocated).

Why this exists: MFU is only honest when the numerator counts the work the *model* needs, not a formula that
assumes every layer is full attention (which flatters SWA and recurrent hybrids by 10x or more at 16K context).

What is counted (one multiply-add = 2 FLOPs):
- every dense projection (q/k/v/o, gates, recurrent in/out projections, MLP) and the LM head: 2 x weights per token;
- attention scores and values: 4 * heads * head_dim * P per sequence, P = visible (query, key) pairs; exact for
  causal full attention, P = T(T+1)/2, and for a window w, P = w(w+1)/2 + (T - w)w (docs/KERNELS.md, "FLOP model");
Each mixer's count lives in its registry entry (hybrid_jax.models.mixers.registry), built from the terms below:
- chunked scans by the chunk FLOP model of docs/KERNELS.md at model.recurrent_chunk_size (terms listed in
  `scalar_scan_flops` and `delta_rule_flops`); the last partial chunk is counted at its real length, so the count
  is exact for any T;
- depthwise causal convs: 2 x width per channel per token;
- a mixture-of-experts MLP: its active weights only (router, the k experts a token goes to, shared experts).
Not counted: norms, activations, softmax, RoPE, gating and decay exponentials (elementwise, a few % at most), the
embedding lookup (a gather: 0 FLOPs), the optimizer update, and any rematerialisation (`recomputed_flops_per_token`
counts that apart: hardware work, not model work). Training = 3 x forward
(the backward of every matmul is two matmuls of the same size), the PaLM "model FLOPs" convention, so remat never
raises MFU. (The attention kernel benchmark uses 3.5 x forward for attention, which counts the flash backward's
recompute of Q K^T: a kernel's work, not the model's.)
"""

from hybrid_jax.models import layers, moe, pattern
from hybrid_jax.models.mixers import registry

TRAIN_MULTIPLIER = 3  # forward + backward (2 x forward) in model FLOPs.


def visible_pairs(t: int, window: int | None) -> int:
  """(query, key) pairs a causal attention with `window` keys per query (itself included; None = full) sees."""
  if t <= 0:
    raise ValueError(f'sequence length must be positive, got {t}')
  if window is not None and window <= 0:
    raise ValueError(f'window must be positive or None, got {window}')
  w = t if window is None else min(window, t)
  return w * (w + 1) // 2 + (t - w) * w


def attention_core_flops(t: int, heads: int, head_dim: int, window: int | None) -> int:
  """Forward FLOPs of softmax(Q K^T) V for one sequence: Q K^T and P V over the visible pairs only."""
  return 4 * heads * head_dim * visible_pairs(t, window)


def _chunk_sums(t: int, chunk: int) -> tuple[int, int]:
  """(sum of c^2, sum of c^3) over the chunk lengths c of T tokens cut into chunks of `chunk` (last one partial)."""
  if chunk <= 0:
    raise ValueError(f'chunk size must be positive, got {chunk}')
  full, rest = divmod(t, chunk)
  return full * chunk**2 + rest**2, full * chunk**3 + rest**3


def scalar_scan_flops(t: int, chunk: int, key_heads: int, key_dim: int, value_heads: int, value_dim: int) -> int:
  """Forward FLOPs of the chunked scalar-decay scan (Lightning, Mamba-2) for one sequence.

  docs/KERNELS.md steps, per chunk of c tokens: 1. Q K^T (2c^2 K per key head) and ((Q K^T) o Gamma) V (2c^2 V per value
  head); 2. the chunk's state increment (K o exp(gamma - G))^T V (2cKV per value head); 4. the inter-chunk
  read-out (Q o exp(G)) S (2cKV per value head). Step 3 (S <- exp(gamma) S + dS) is elementwise. For whole chunks
  of C and K = V with one key head per value head this is 2C(K+V) + 4KV per token and head, as docs/KERNELS.md states.
  Grouped value heads (Mamba-2: one B/C head shared by all) compute Q K^T once per key head.
  """
  sq, _ = _chunk_sums(t, chunk)
  return 2 * sq * key_dim * key_heads + value_heads * (2 * sq * value_dim + 4 * t * key_dim * value_dim)


def delta_rule_flops(t: int, chunk: int, heads: int, key_dim: int, value_dim: int) -> int:
  """Forward FLOPs of the chunked gated delta rule (UT / WY form of docs/KERNELS.md) for one sequence.

  Per chunk of c tokens and head: 1. beta K K^T (2c^2 K); 2. T = (I + L)^-1 of a unit lower-triangular c x c matrix,
  counted as c^3 / 3 (a triangular inverse, LAPACK's trtri count; the XLA path's row-by-row substitution does
  more); 3. W = T (beta K o exp G) (2c^2 K) and U = T (beta V) (2c^2 V); 4. V_new = U - W S (2cKV);
  5. O = (Q o exp G) S (2cKV) + ((Q K^T) o Gamma) V_new (2c^2 K + 2c^2 V); 6. S update (K o exp(gamma - G))^T V_new
  (2cKV). Per token for whole chunks: 6CK + 4CV + 6KV + C^2/3.
  """
  sq, cube = _chunk_sums(t, chunk)
  per_head = 6 * sq * key_dim + 4 * sq * value_dim + 6 * t * key_dim * value_dim + cube / 3
  return heads * per_head


def layer_flops(cfg, spec: pattern.LayerSpec, seq_len: int) -> dict:
  """Forward FLOPs of one block over one sequence of `seq_len` tokens: mixer parts, MLP and their total."""
  if seq_len <= 0:
    raise ValueError(f'seq_len must be positive, got {seq_len}')
  parts = registry.get(spec.kind).flops(cfg, spec, seq_len)
  mlp = 2 * seq_len * layers.mlp_params(cfg) if cfg.block_mlp else 0
  mixer = parts['projections'] + parts['core'] + parts['conv']
  # mlp_in: the MLP's matmuls but the down projection (SwiGLU's gate and up: what remat runs again of it).
  mlp_in = mlp - 2 * seq_len * cfg.d_model * cfg.d_ff if cfg.block_mlp else 0
  if spec.moe:  # A mixture of experts: the router, a token's k experts and the shared experts (active weights).
    moe_flops = moe.forward_flops(cfg, seq_len)
    mlp, mlp_in = moe_flops['total'], moe_flops['input']
  return {'kind': spec.kind, 'window': spec.window, **parts, 'mixer': mixer, 'mlp': mlp,
          'mlp_in': mlp_in, 'total': mixer + mlp}


def model_flops(cfg, seq_len: int) -> dict:
  """Forward and training FLOPs of the model config `cfg` (config.model) at `seq_len`, per layer and in total.

  Per-sequence numbers are exact integers (up to the c^3/3 of the delta rule); `*_per_token` divide by seq_len.
  `by_kind` sums the blocks of each layer kind (mixer + MLP), the unit the step benchmark's breakdown uses.
  """
  layers = [layer_flops(cfg, pattern.layer_spec(cfg, i), seq_len) for i in range(cfg.num_layers)]
  lm_head = 2 * seq_len * cfg.d_model * cfg.vocab_size
  forward = sum(layer['total'] for layer in layers) + lm_head
  by_kind = {}
  for layer in layers:
    entry = by_kind.setdefault(layer['kind'], {'layers': 0, 'forward': 0})
    entry['layers'] += 1
    entry['forward'] += layer['total']
  by_kind['lm_head'] = {'layers': 0, 'forward': lm_head}
  for entry in by_kind.values():
    entry['forward_per_token'] = entry['forward'] / seq_len
    entry['share'] = entry['forward'] / forward
  return {'seq_len': seq_len, 'layers': layers, 'lm_head': lm_head, 'embedding': 0,
          'forward_per_sequence': forward, 'forward_per_token': forward / seq_len,
          'training_per_token': TRAIN_MULTIPLIER * forward / seq_len, 'by_kind': by_kind}


def training_flops_per_token(cfg, seq_len: int) -> float:
  """Model FLOPs of one training token (forward + backward) at context `seq_len`."""
  return model_flops(cfg, seq_len)['training_per_token']


# The forward parts (layer_flops keys) each remat policy (hybrid_jax.models.model) computes again in the backward.
# 'save_dots' and 'minimal' keep the weight matmuls' outputs, so only what is not a weight matmul runs again: the
# attention and scan kernels (custom calls, never saved) and the convs. 'recompute_mlp' also runs the MLP's gate and
# up again; 'full' keeps nothing but the block input, so every mixer part and the gate and up run again. Never the
# MLP's down projection: its output feeds only the block's output, which no backward needs (XLA's FLOPs of a
# two-block gradient under 'full' count 6 more matmuls per block than under 'save_dots', not 7).
RECOMPUTED_PARTS = {'none': (), 'save_dots': ('core', 'conv'), 'minimal': ('core', 'conv'),
                    'recompute_mlp': ('core', 'conv', 'mlp_in'), 'full': ('projections', 'core', 'conv', 'mlp_in')}


def recomputed_flops_per_token(cfg, seq_len: int, loss_chunk: int = 0) -> float:
  """Forward FLOPs per token that the backward computes again: the blocks' parts under `cfg.remat`, plus the LM
  head when the loss is chunked (train.loss_chunk below seq_len: each chunk's logits are recomputed)."""
  if cfg.remat not in RECOMPUTED_PARTS:
    raise ValueError(f'no recompute model for remat policy {cfg.remat!r}; known: {", ".join(RECOMPUTED_PARTS)}')
  f = model_flops(cfg, seq_len)
  blocks = sum(layer[part] for layer in f['layers'] for part in RECOMPUTED_PARTS[cfg.remat])
  head = f['lm_head'] if 0 < loss_chunk < seq_len else 0
  return (blocks + head) / seq_len


def breakdown_markdown(cfg, seq_len: int) -> str:
  """A Markdown table of forward FLOPs per token by layer kind (for reports and `bench step`)."""
  f = model_flops(cfg, seq_len)
  lines = [f'model FLOPs at T = {seq_len}: forward {f["forward_per_token"] / 1e6:.2f} MFLOP/token, '
           f'training {f["training_per_token"] / 1e6:.2f} MFLOP/token', '',
           '| kind | layers | fwd MFLOP/token | share |', '| --- | ---: | ---: | ---: |']
  for kind, e in f['by_kind'].items():
    lines.append(f"| {kind} | {e['layers']} | {e['forward_per_token'] / 1e6:.3f} | {100 * e['share']:.1f}% |")
  return '\n'.join(lines) + '\n'
