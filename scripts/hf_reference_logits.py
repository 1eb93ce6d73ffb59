"""Reference logits from `transformers` (CPU torch) for the checkpoints under tests/data/hf/ (run outside the tests).

Needs Python 3.11 with torch and transformers >= 5.15 (GraniteSWA); the test suite never imports torch:

  python3.11 -m venv /tmp/hfref311
  /tmp/hfref311/bin/pip install torch==2.13.0 && /tmp/hfref311/bin/pip install "transformers>=5.15" safetensors
  /tmp/hfref311/bin/python scripts/hf_reference_logits.py tests/data/hf [--build] [--length=N] [--only=A,B]

`--build` first writes the transformers-side fixtures (tiny random models saved by `save_pretrained`: a tied Llama
with GQA, a GraniteSWA with an irregular per-layer SWA/full and NoPE pattern and -inf sinks, an untied SmolLM3, a
GraniteSWA with every scaling away from its plain value, a full-attention GraniteSWA with MiniCPM's scalings, a
GraniteSWA with learned (finite) attention sinks), then six dense recurrent hybrids, each with a `decode_logits`
reference (below):
  hf_qwen3_5 (qwen3_5_text): 3 Gated DeltaNet layers then 1 full-attention layer; GDN with 4 value heads over 2 key
    heads, key dim 8 != value dim 6, conv 4; attention with its sigmoid output gate (interleaved per head in q_proj),
    per-head zero-centred q/k norm, partial RoPE 0.25 of head_dim 16 (4 dims); zero-centred `1 + weight` RMSNorms
    (drawn around 0), a plain-weight gated GDN output norm; untied.
  hf_olmo_hybrid (olmo_hybrid): GDN, GDN, attention, GDN; separate q/k/v/a/b/g projections, per-q/k/v conv weights
    (rewritten to the released split, see split_olmo_hybrid_conv), beta in [0, 2] (allow_neg_eigval), key dim 4 !=
    value dim 8; post-norm attention layers (no input norm) with q/k RMSNorm over the whole projection, RoPE; untied.
  hf_olmo_hybrid_saved (olmo_hybrid): kept as save_pretrained wrote it (AS_SAVED: its q/k/v_conv1d hold the fused
    8 + 8 + 16-channel conv cut into 11 / 11 / 10, as transformers itself writes every OLMo hybrid); GDN, NoPE
    attention, GDN; 4 value heads over 2 key heads of width 4, beta in [0, 1]; untied.
  hf_nemotron_h (nemotron_h): "M-M*M-": Mamba-2 (4 heads of 4, 2 groups, state 8, conv bias), squared-ReLU MLP
    blocks, one attention block without RoPE; one norm per block; untied.
  hf_bamba (bamba): Mamba-2 (expand 2, 2 groups, conv bias) with attention only at layer 2 (attn_layer_indices [2]),
    partial RoPE 0.5 of head_dim 8; SwiGLU MLP in every layer; untied.
  hf_granite_hybrid (granitemoehybrid): dense (num_local_experts 0, shared MLP only), mamba, mamba, NoPE attention,
    mamba; embedding/residual/attention multipliers and logits_scaling away from 1; Mamba-2 expand 1, 2 groups; tied.
`--build` into a directory named hf_moe (tests/data/hf_moe/, kept apart because the importer's tests read every
checkpoint under tests/data/hf/ and the importer does not read MoE yet) writes instead six MoE hybrids, vocabulary 64,
hidden 16, every one with `decode_logits`, `routing` and `logits_float64` (the model in float64) (below), each under 160 KB:
  hf_qwen3_5_moe (qwen3_5_moe_text): hf_qwen3_5's layers (3 GDN, 1 gated attention) with a sparse MoE block in each:
    8 SwiGLU experts of width 8, top-3 of a softmax over all experts, renormalised (the class always does), plus a
    shared SwiGLU expert of width 20 times sigmoid(shared_expert_gate x). Experts FUSED: mlp.experts.gate_up_proj
    [8, 16, 16] (each expert's gate rows then up rows) and down_proj [8, 16, 8], rewritten so by fuse_experts
    (save_pretrained writes one tensor per expert).
  hf_qwen3_next (qwen3_next): GDN, attention, GDN, GDN; its GDN projections fused per key head (in_proj_qkvz,
    in_proj_ba; 4 value heads over 2 key heads, key dim 8, value dim 6); layer 2 a dense SwiGLU (mlp_only_layers),
    the others 6 experts of width 8, top-2 with norm_topk_prob false (the softmax weights as they are), and the
    sigmoid-gated shared expert (width 16). Experts PER EXPERT: mlp.experts.{e}.gate_proj/up_proj/down_proj.weight.
  hf_nemotron_h_moe (nemotron_h): "MEM*E"; sigmoid router in float32 with a nonzero e_score_correction_bias
    (0.3 N(0, 1)), 8 experts in n_group 2 groups of 4 with topk_group 1 (a group ranked by the sum of its two best
    biased scores), top-3, renormalised, times routed_scaling_factor 2.5; squared-ReLU experts (up, down) of width
    12 and a squared-ReLU shared expert of width 20; Mamba-2 as hf_nemotron_h. Experts PER EXPERT:
    backbone.layers.{i}.mixer.experts.{e}.up_proj/down_proj.weight. The bias changes 35 of the 64 token choices and
    the group restriction 56.
  hf_granite_moe_hybrid (granitemoehybrid): mamba, NoPE attention, mamba, mamba; 8 SwiGLU experts of width 12, top-2
    (softmax over the two chosen logits), beside the shared SwiGLU MLP (width 24); Granite multipliers away from 1;
    tied. Experts FUSED: block_sparse_moe.input_linear.weight [8, 24, 16] (gate rows then up rows),
    output_linear.weight [8, 16, 12], router.layer.weight.
  hf_gpt_oss (gpt_oss): sliding (window 4), full, sliding, full; attention biases, learned sinks 1 + N(0, 1); YaRN
    RoPE as released (theta 150000, factor 32, original 4096, beta 32 / 1, not truncated: one of the 4 frequencies
    blended); 6 experts of width 12, top-3 (softmax over the chosen router logits, router bias); experts with biases
    and the clamped SwiGLU, swiglu_limit 1.5 so that the clamp binds (8-16 % of gates, 21-28 % of ups). Experts
    FUSED and transposed: mlp.experts.gate_up_proj [6, 16, 24] (gate and up in alternate columns), down_proj
    [6, 12, 16], each with a bias.
  hf_minimax (minimax): lightning, lightning, softmax with RoPE, lightning; block_size 8 (two prefill blocks); every
    alpha/beta residual factor away from 1; 4 SwiGLU experts of width 12, top-2 of a softmax, renormalised. Experts
    PER EXPERT: block_sparse_moe.experts.{e}.w1/w2/w3.weight (gate, down, up). The file also holds the lightning
    layers' precomputed decay buffers.
Their router weights are drawn like every other weight (0.3 N(0, 1)), which spreads the 32 tokens over every expert
of every layer (checked: `routing` prints the tokens per expert). docs/HF.md ("MoE fixtures") gives each family's
routing as transformers computes it.
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
For the recurrent hybrids (DECODED) it also writes `decode_logits` [2, N, vocab] (float32): the tokens fed one at a time
through the model's own cache (use_cache=True, the first call the first token alone, explicit position_ids) and
prints their max |difference| from `logits`, the same without position_ids (Bamba's forward does not offset its
default positions by the cache length, nor MiniMax's, which reads it from a lightning layer, so their cached decode
needs them), and whether `greedy` equals the argmax tokens recomputed without a cache. For the MoE fixtures it also
writes `routing` [MoE layers, 2 * N, top_k] (int32): the experts each token chose in each MoE layer, ascending per
token (see routing()), prints the tokens per expert and the routing checks, and the max |difference| between the
logits of transformers' per-expert loop (experts_implementation eager) and of its default experts path. Every load
must find every tensor (no missing, unexpected or misshapen key). The Mamba-2 and GDN paths are transformers' torch
fallbacks (no mamba_ssm, causal_conv1d or fla), which only log that they are slower.
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

DROP = object()  # a SMALL field that the fixture leaves out of its config
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
    # Recurrent hybrids (dense, float32). Classes whose config has no head_dim field get it dropped (DROP): their
    # attention heads are hidden_size / num_attention_heads wide, as in their released config.json files.
    # Qwen3.5 text: 3 Gated DeltaNet layers then 1 gated full-attention layer; GDN with 4 value heads over 2 key heads
    # and key dim 8 != value dim 6; attention heads 16 wide so that partial_rotary_factor 0.25 rotates 4 dims (two
    # frequencies: 2 would not tell rotate-half from interleaved pairs); mrope keys as in the released configs (text
    # positions are equal on all three sections, so plain RoPE).
    'hf_qwen3_5': (transformers.Qwen3_5TextConfig, dict(
        num_hidden_layers=4, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6,
        layer_types=['linear_attention'] * 3 + ['full_attention'],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.25,
                         'mrope_section': [1, 1, 0], 'mrope_interleaved': True})),
    # OLMo hybrid: GDN, GDN, attention, GDN; GDN heads 2 x (key 4, value 8), beta in [0, 2] (allow_neg_eigval);
    # attention with q/k RMSNorm over the whole projection and RoPE (the class default; rope_parameters null is NoPE).
    'hf_olmo_hybrid': (transformers.OlmoHybridConfig, dict(
        head_dim=DROP, num_hidden_layers=4, tie_word_embeddings=False,
        layer_types=['linear_attention', 'linear_attention', 'full_attention', 'linear_attention'],
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=4, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, linear_allow_neg_eigval=True,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    # OLMo hybrid kept as save_pretrained wrote it (not rewritten to the released split): its fused q | k | v conv
    # (8 + 8 + 16 channels) stored as q/k/v_conv1d of 11 / 11 / 10, a cut at none of the q / k / v widths. GDN,
    # attention, GDN; GDN heads 2 key heads of 4 under 4 value heads of 4 (value width twice the key width, as in the
    # released models); beta in (0, 1) (no allow_neg_eigval); NoPE attention (rope_theta null).
    'hf_olmo_hybrid_saved': (transformers.OlmoHybridConfig, dict(
        head_dim=DROP, num_hidden_layers=3, tie_word_embeddings=False,
        layer_types=['linear_attention', 'full_attention', 'linear_attention'],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=4,
        linear_conv_kernel_dim=4, linear_allow_neg_eigval=False,
        rope_parameters={'rope_type': 'default', 'rope_theta': None})),
    # Nemotron-H: "M-M*M-" (mamba, squared-ReLU MLP, mamba, attention without RoPE, mamba, MLP); Mamba-2 with 4 heads
    # of 4 in 2 groups, state 8, conv bias; chunk 8 < 16 tokens (two chunks in the torch prefill).
    'hf_nemotron_h': (transformers.NemotronHConfig, dict(
        hybrid_override_pattern='M-M*M-', tie_word_embeddings=False, layer_norm_epsilon=1e-5,
        mamba_num_heads=4, mamba_head_dim=4, n_groups=2, ssm_state_size=8, conv_kernel=4, use_conv_bias=True,
        chunk_size=8, mlp_hidden_act='relu2')),
    # Bamba: attention only at layer 2 (attn_layer_indices, no cycle), heads 8 wide with the class's fixed
    # partial_rotary_factor 0.5 (4 rotated dims); Mamba-2 with expand 2 (4 heads of 8), 2 groups, state 8, conv bias.
    'hf_bamba': (transformers.BambaConfig, dict(
        head_dim=DROP, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=4, attn_layer_indices=[2],
        tie_word_embeddings=False, rms_norm_eps=1e-5, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
    # Granite 4.0-H style: dense (num_local_experts 0: only the shared MLP), NoPE attention, every Granite multiplier
    # away from 1, tied; Mamba-2 with expand 1 (4 heads of 4), 2 groups, state 8, conv bias.
    'hf_granite_hybrid': (transformers.GraniteMoeHybridConfig, dict(
        head_dim=DROP, num_hidden_layers=4, tie_word_embeddings=True, rms_norm_eps=1e-5,
        layer_types=['mamba', 'mamba', 'attention', 'mamba'], position_embedding_type=None,
        num_local_experts=0, shared_intermediate_size=24, embedding_multiplier=2.0, residual_multiplier=0.7,
        logits_scaling=1.5, attention_multiplier=0.3, mamba_n_heads=4, mamba_d_head=4, mamba_n_groups=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8, mamba_conv_bias=True)),
}
# Mixture-of-experts hybrids (float32), written into a directory of their own (tests/data/hf_moe/: the importer's
# tests read every checkpoint under tests/data/hf/, and the importer does not read these yet). Experts' matrices,
# routers and their biases are drawn like any other weight; Nemotron-H's e_score_correction_bias (a buffer) 0.3 N(0, 1).
MOE_ROOT = 'hf_moe'
MOE_BUILT = {
    # Qwen3.5-MoE text: 3 GDN layers then 1 gated-attention layer (as hf_qwen3_5), a sparse MoE block in every layer:
    # 8 experts, top-3, softmax over all experts then the top 3 renormalised (the class always does), plus a
    # shared SwiGLU expert (width 20) scaled by sigmoid(shared_expert_gate(x)). Experts fused (gate_up_proj).
    'hf_qwen3_5_moe': (transformers.Qwen3_5MoeTextConfig, dict(
        intermediate_size=DROP, num_hidden_layers=4, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6,
        layer_types=['linear_attention'] * 3 + ['full_attention'],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=8,
        shared_expert_intermediate_size=20,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.25,
                         'mrope_section': [1, 1, 0], 'mrope_interleaved': True})),
    # Qwen3-Next: GDN, attention, GDN, GDN, its GDN projections fused per key head (in_proj_qkvz, in_proj_ba; 4 value
    # heads over 2 key heads); layer 2 a dense SwiGLU MLP (mlp_only_layers), the others 6 experts, top-2, not
    # renormalised (norm_topk_prob false), with the sigmoid-gated shared expert. One tensor per expert.
    'hf_qwen3_next': (transformers.Qwen3NextConfig, dict(
        intermediate_size=24, num_hidden_layers=4, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-6,
        layer_types=['linear_attention', 'full_attention', 'linear_attention', 'linear_attention'],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
        linear_conv_kernel_dim=4, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=8,
        shared_expert_intermediate_size=16, norm_topk_prob=False, mlp_only_layers=[2], decoder_sparse_step=1,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.25})),
    # Nemotron-H MoE (Nemotron 3 style): "MEM*E"; sigmoid router with e_score_correction_bias, 8 experts in 2 groups
    # of 4, the group whose two best biased scores sum highest kept (topk_group 1), top-3 in it, renormalised, times
    # routed_scaling_factor 2.5; squared-ReLU experts (up, down: no gate) and one squared-ReLU shared expert. One
    # tensor per expert.
    'hf_nemotron_h_moe': (transformers.NemotronHConfig, dict(
        hybrid_override_pattern='MEM*E', tie_word_embeddings=False, layer_norm_epsilon=1e-5,
        mamba_num_heads=4, mamba_head_dim=4, n_groups=2, ssm_state_size=8, conv_kernel=4, use_conv_bias=True,
        chunk_size=8, mlp_hidden_act='relu2', n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, moe_intermediate_size=12,
        moe_shared_expert_intermediate_size=20, n_shared_experts=1)),
    # Granite-4.0-H MoE: mamba, NoPE attention, mamba, mamba; 8 experts, top-2 (softmax over the top-2 logits) beside
    # the shared SwiGLU MLP; every Granite multiplier away from 1, tied. Experts fused (input_linear, output_linear).
    'hf_granite_moe_hybrid': (transformers.GraniteMoeHybridConfig, dict(
        head_dim=DROP, intermediate_size=12, num_hidden_layers=4, tie_word_embeddings=True, rms_norm_eps=1e-5,
        layer_types=['mamba', 'attention', 'mamba', 'mamba'], position_embedding_type=None,
        num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=24, embedding_multiplier=2.0,
        residual_multiplier=0.7, logits_scaling=1.5, attention_multiplier=0.3, mamba_n_heads=4, mamba_d_head=4,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8,
        mamba_conv_bias=True)),
    # gpt-oss: sliding (window 4), full, sliding, full; learned sinks 1 + N(0, 1); q/k/v/o biases; YaRN as released
    # (theta 150000, factor 32, original 4096, beta 32 / 1, not truncated: with head_dim 8 one of the 4 frequencies
    # is blended); 6 experts, top-3 (softmax over the top-3 router logits, router bias), experts with biases and the
    # clamped SwiGLU, swiglu_limit 1.5 so that the clamp binds. Experts fused, transposed, gate/up interleaved.
    'hf_gpt_oss': (transformers.GptOssConfig, dict(
        intermediate_size=12, num_hidden_layers=4, tie_word_embeddings=False, rms_norm_eps=1e-5, sliding_window=4,
        layer_types=['sliding_attention', 'full_attention'] * 2, num_local_experts=6, num_experts_per_tok=3,
        swiglu_limit=1.5, max_position_embeddings=131072,
        rope_parameters={'rope_type': 'yarn', 'rope_theta': 150000.0, 'factor': 32.0, 'beta_fast': 32.0,
                         'beta_slow': 1.0, 'truncate': False, 'original_max_position_embeddings': 4096})),
    # MiniMax(-Text-01): lightning, lightning, softmax (RoPE), lightning; block_size 8 < 16 tokens (two blocks in the
    # prefill); alpha/beta residual factors away from 1; 4 experts, top-2, softmax then renormalised. One tensor per
    # expert (w1, w2, w3).
    'hf_minimax': (transformers.MiniMaxConfig, dict(
        intermediate_size=12, num_hidden_layers=4, tie_word_embeddings=False, rms_norm_eps=1e-5,
        layer_types=['linear_attention', 'linear_attention', 'full_attention', 'linear_attention'], block_size=8,
        num_local_experts=4, num_experts_per_tok=2, full_attn_alpha_factor=1.6, full_attn_beta_factor=0.9,
        linear_attn_alpha_factor=1.3, linear_attn_beta_factor=1.1, mlp_alpha_factor=1.5, mlp_beta_factor=0.8,
        rope_parameters={'rope_type': 'default', 'rope_theta': 10000.0})),
}
FINITE_SINKS = ('hf_granite_swa_sinks', 'hf_gpt_oss')
# Fixtures with finite sinks whose layer 1 keeps one head at -inf (no sink).
SINKLESS_HEAD = ('hf_granite_swa_sinks',)
# MoE fixtures saved with their experts fused into one tensor per projection (see fuse_experts).
FUSED_EXPERTS = ('hf_qwen3_5_moe',)
# Fixtures whose reference also holds `decode_logits` (token by token through the model's cache).
DECODED = ('hf_qwen3_5', 'hf_olmo_hybrid', 'hf_olmo_hybrid_saved', 'hf_nemotron_h', 'hf_bamba', 'hf_granite_hybrid',
           *MOE_BUILT)
# OLMo hybrid fixtures whose conv tensors stay as save_pretrained cut them (the others get the released split).
AS_SAVED = ('hf_olmo_hybrid_saved',)
# Norms whose scale is `1 + weight` (zero-centred); their weights are drawn around 0 instead of 1.
ZERO_CENTRED_NORMS = ('Qwen3_5RMSNorm', 'Qwen3_5MoeRMSNorm', 'Qwen3NextRMSNorm')
# derived fixture -> (its GraniteSWA source, the MiniCPM fields that give the source's multipliers)
DERIVED = {'minicpm_from_granite': ('hf_granite_minicpm', dict(scale_emb=12.0, scale_depth=1.4, dim_model_base=4))}
BATCH, LENGTH, NEW_TOKENS = 2, 16, 8


def build(root: pathlib.Path, only=None):
  # A directory named hf_moe gets the MoE fixtures (seeds from 100), any other the rest.
  table, first_seed = (MOE_BUILT, 100) if root.name == MOE_ROOT else (BUILT, 0)
  for seed, (name, (config_class, fields)) in enumerate(table.items(), start=first_seed):
    if only and name not in only:
      continue
    torch.manual_seed(seed)
    fields = {key: value for key, value in {**SMALL, **fields}.items() if value is not DROP}
    model = transformers.AutoModelForCausalLM.from_config(config_class(**fields))
    # Norm weights 1 + 0.2 N(0, 1) (0.2 N(0, 1) for the zero-centred `1 + weight` norms), everything else 0.3 N(0, 1),
    # except the recurrence parameters, drawn so that every decay is in a useful range (neither ~0 nor ~1) and the
    # logits stay O(1): A_log = log U(0.25, 1.5) (A = -exp(A_log)), dt_bias = -0.5 + 0.5 N(0, 1) (dt or the GDN gate
    # = softplus(projection + dt_bias), the projection being ~1 wide), Mamba-2's skip D = 1 + 0.3 N(0, 1). The
    # Mamba-2 and GDN conv weights and biases are 0.3 N(0, 1) like any other weight.
    norms = {id(m.weight): type(m).__name__ in ZERO_CENTRED_NORMS for m in model.modules()
             if 'Norm' in type(m).__name__ and getattr(m, 'weight', None) is not None}
    with torch.no_grad():
      for pname, p in model.named_parameters():
        leaf = pname.rsplit('.', 1)[-1]
        if leaf == 'A_log':
          p.copy_(torch.log(torch.empty_like(p).uniform_(0.25, 1.5)))
        elif leaf == 'dt_bias':
          p.copy_(-0.5 + 0.5 * torch.randn_like(p))
        elif leaf == 'D':
          p.copy_(1 + 0.3 * torch.randn_like(p))
        elif norms.get(id(p)):
          p.copy_(0.2 * torch.randn_like(p))
        elif pname.endswith('sinks') and name in FINITE_SINKS:
          p.copy_(1 + torch.randn_like(p))
          if pname.startswith('model.layers.1.') and name in SINKLESS_HEAD:
            p[2] = -float('inf')
        elif pname.endswith('sinks'):
          p.fill_(-float('inf'))
        elif pname.endswith('norm.weight') or 'layernorm' in pname or id(p) in norms:
          p.copy_(1 + 0.2 * torch.randn_like(p))
        else:
          p.copy_(0.3 * torch.randn_like(p))
      for bname, b in model.named_buffers():
        if bname.endswith('e_score_correction_bias'):
          b.copy_(0.3 * torch.randn_like(b))
    model.save_pretrained(root / name)
    if model.config.model_type == 'olmo_hybrid' and name not in AS_SAVED:
      split_olmo_hybrid_conv(root / name, model.config)
    if name in FUSED_EXPERTS:
      fuse_experts(root / name)
    print(f'built {name}: {type(model).__name__}')


def split_olmo_hybrid_conv(path: pathlib.Path, config):
  """Rewrites the GDN conv weights as the released OLMo hybrid checkpoints hold them: q_conv1d [key heads * key dim],
  k_conv1d [the same], v_conv1d [value heads * value dim]. transformers 5.23 saves the module's fused conv1d through
  the reverse of its load-time Concatenate, which cuts it into three equal thirds (here 11, 11, 10 channels) whatever
  the key and value widths; loading concatenates either split back into the same tensor."""
  tensors = safetensors.numpy.load_file(str(path / 'model.safetensors'))
  key, value = (config.linear_num_key_heads * config.linear_key_head_dim,
                config.linear_num_value_heads * config.linear_value_head_dim)
  for name in [n for n in tensors if n.endswith('linear_attn.q_conv1d.weight')]:
    prefix = name[:-len('q_conv1d.weight')]
    fused = np.concatenate([tensors[f'{prefix}{p}_conv1d.weight'] for p in 'qkv'])
    assert fused.shape[0] == 2 * key + value
    for p, part in zip('qkv', np.split(fused, [key, 2 * key])):
      tensors[f'{prefix}{p}_conv1d.weight'] = np.ascontiguousarray(part)
  safetensors.numpy.save_file(tensors, str(path / 'model.safetensors'), metadata={'format': 'pt'})


def fuse_experts(path: pathlib.Path):
  """Rewrites one-tensor-per-expert SwiGLU experts (`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, which
  transformers 5.25 saves for every Qwen MoE class through the reverse of its load-time merge) as the fused tensors
  the class holds: `mlp.experts.gate_up_proj` [experts, 2 * width, hidden] (each expert's gate rows, then its up
  rows) and `mlp.experts.down_proj` [experts, hidden, width]; transformers loads either layout into the same
  parameters."""
  tensors = safetensors.numpy.load_file(str(path / 'model.safetensors'))
  prefixes = sorted({n[:n.index('experts.') + len('experts.')] for n in tensors if '.experts.0.gate_proj.' in n})
  for prefix in prefixes:
    count = len({n for n in tensors if n.startswith(prefix) and n.endswith('.down_proj.weight')})
    take = lambda e, part: tensors.pop(f'{prefix}{e}.{part}.weight')
    parts = [(take(e, 'gate_proj'), take(e, 'up_proj'), take(e, 'down_proj')) for e in range(count)]
    tensors[f'{prefix}gate_up_proj'] = np.stack([np.concatenate([gate, up]) for gate, up, _ in parts])
    tensors[f'{prefix}down_proj'] = np.stack([down for _, _, down in parts])
  assert prefixes and not any('.experts.0.' in n for n in tensors)
  safetensors.numpy.save_file(tensors, str(path / 'model.safetensors'), metadata={'format': 'pt'})


def routing(model, ids: torch.Tensor) -> tuple[np.ndarray, dict]:
  """The experts each token of the rows chose in every MoE layer, [moe layers, batch * N, top_k] (int32, ascending
  per token), from the routers' own outputs in a full forward, and checks that routing is not degenerate: per layer
  the number of tokens each expert took (each must be > 0); for a router with e_score_correction_bias and groups,
  how many (layer, token) choices change without the bias and without the group restriction; for experts with a
  SwiGLU clamp, the fraction of gate and up pre-activations (all tokens through all experts) beyond the limit."""
  routers = [(n, m) for n, m in model.named_modules() if type(m).__name__.lower().endswith('router')]
  clamped = [m for m in model.modules() if hasattr(m, 'limit') and hasattr(m, 'gate_up_proj')]
  chosen, inputs, clamp = {}, {}, []

  def on_router(name, module, args, out):
    chosen[name], inputs[name] = out[2], args[0]

  def on_experts(module, args):
    h = args[0]
    gate_up = torch.einsum('th,ehf->etf', h, module.gate_up_proj) + module.gate_up_proj_bias[:, None]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    clamp.append(((gate > module.limit).float().mean().item(), (up.abs() > module.limit).float().mean().item()))

  hooks = [m.register_forward_hook(lambda m, a, o, n=n: on_router(n, m, a, o)) for n, m in routers]
  hooks += [m.register_forward_pre_hook(on_experts) for m in clamped]
  with torch.no_grad():
    model(ids)
  for hook in hooks:
    hook.remove()
  picks = np.stack([np.sort(chosen[n].reshape(ids.numel(), -1).numpy(), axis=-1) for n, _ in routers])
  checks = {'expert_counts': [np.bincount(p.ravel(), minlength=m.num_experts).tolist()
                              for p, (_, m) in zip(picks, routers)]}
  checks['every_expert_chosen'] = all(min(c) > 0 for c in checks['expert_counts'])
  if routers and hasattr(routers[0][1], 'e_score_correction_bias'):
    def changed(**attrs):
      count = 0
      for (name, router), p in zip(routers, picks):
        saved = {k: getattr(router, k) for k in attrs}
        for k, v in attrs.items():
          setattr(router, k, v(router) if callable(v) else v)
        with torch.no_grad():
          other = np.sort(router(inputs[name])[2].numpy(), axis=-1)
        for k, v in saved.items():
          setattr(router, k, v)
        count += int((other != p).any(-1).sum())
      return count
    checks['changed_without_bias'] = changed(e_score_correction_bias=lambda r: torch.zeros_like(
        r.e_score_correction_bias))
    checks['changed_without_groups'] = changed(num_group=1, topk_group=1)
  if clamp:
    checks['clamped_gate_up_fraction'] = [[round(g, 3), round(u, 3)] for g, u in clamp]
  return picks.astype(np.int32), checks


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
      model, info = transformers.AutoModelForCausalLM.from_pretrained(
          path, dtype=torch.float32, attn_implementation=impl, output_loading_info=True)
    except ValueError as e:  # GraniteSWA has no sdpa path (its sinks need the eager softmax).
      print(f'{path.name}: no {impl} path ({str(e)[:60]}...)')
      continue
    assert not (info['missing_keys'] or info['unexpected_keys'] or info['mismatched_keys']), info
    model.eval()
    with torch.no_grad():
      logits[impl] = model(ids).logits.numpy()
  with torch.no_grad():  # (the eager model, loaded last)
    # An explicit all-ones mask: otherwise generate treats prompt tokens equal to pad_token_id as padding.
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                               pad_token_id=0)
  greedy = generated[:, length:].numpy().astype(np.int32)
  arrays = {'tokens': tokens, 'logits': logits['eager'], 'greedy': greedy}
  result = {'class': type(model).__name__, 'max_abs_logit': float(np.abs(logits['eager']).max()),
            'sdpa_vs_eager_max_abs': float(np.abs(logits['sdpa'] - logits['eager']).max()) if 'sdpa' in logits
            else None}
  if path.name in MOE_BUILT:
    arrays['routing'], result['routing'] = routing(model, ids)
    # transformers' default experts path (grouped_mm) against its per-expert loop (eager).
    loop = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation='eager',
                                                             experts_implementation='eager').eval()
    with torch.no_grad():
      result['experts_eager_vs_default_max_abs'] = float(np.abs(loop(ids).logits.numpy() - logits['eager']).max())
    # The same model in float64 (grouped_mm takes no float64: the per-expert loop): the reference a float32 import
    # is held to, since transformers' own float32 logits carry rounding of the same size as the bar.
    wide = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation='eager',
                                                             experts_implementation='eager').eval()
    with torch.no_grad():
      arrays['logits_float64'] = wide(ids).logits.double().numpy()
    result['float32_vs_float64_rel'] = float(np.abs(logits['eager'] - arrays['logits_float64']).max()
                                             / np.abs(arrays['logits_float64']).max())
  if path.name in DECODED:
    arrays['decode_logits'] = decode(model, ids, positions=True)
    gap = float(np.abs(arrays['decode_logits'] - logits['eager']).max())
    result |= {'decode_vs_prefill_max_abs': gap, 'decode_vs_prefill_rel': gap / result['max_abs_logit'],
               # Without explicit position_ids (each step's model forward derives them from the cache, or not).
               'decode_no_position_ids_max_abs': float(np.abs(decode(model, ids, positions=False)
                                                              - logits['eager']).max()),
               'greedy_equals_uncached_argmax': bool(np.array_equal(greedy, uncached_greedy(model, ids)))}
  safetensors.numpy.save_file(arrays, str(path / 'reference.safetensors'),
                              metadata={'transformers': transformers.__version__, 'torch': torch.__version__,
                                        'class': type(model).__name__})
  return result


def decode(model, ids: torch.Tensor, positions: bool) -> np.ndarray:
  """Logits [batch, N, vocab] from feeding the tokens one at a time through the model's cache (use_cache=True: the
  first call, the first token alone, starts the family's cache, then each call passes it back), with explicit
  position_ids when `positions`."""
  cache, steps = None, []
  with torch.no_grad():
    for t in range(ids.shape[1]):
      extra = {'position_ids': torch.full((ids.shape[0], 1), t, dtype=torch.long)} if positions else {}
      out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True, **extra)
      cache = out.past_key_values
      steps.append(out.logits[:, -1].float().numpy())
  return np.stack(steps, axis=1)


def uncached_greedy(model, ids: torch.Tensor) -> np.ndarray:
  """The NEW_TOKENS greedy tokens recomputed from full uncached forwards (a check on generate's cached path)."""
  with torch.no_grad():
    for _ in range(NEW_TOKENS):
      ids = torch.cat([ids, model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
  return ids[:, -NEW_TOKENS:].numpy()


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
