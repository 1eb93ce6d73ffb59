"""Every default of a hybrid_jax run, documented in one place.

Other config files start from `get_config()` here and change only what differs. Override any key on the command
line with absl syntax, e.g. `--config.train.steps=100`. `hybrid_jax.config.validate` checks all of it before
anything compiles.
"""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()

  c.name = 'base'  # Free-form run name; reports and logs carry it.
  c.seed = 0  # Seeds parameter init and the data order; same seed -> same batches and loss curve.

  # ----------------------------------------------------------------------------------------------- model
  m = c.model = ml_collections.ConfigDict()
  m.arch = 'swa128_nope'  # Study architecture name (informational here; configs/hybrid.py sets the fields below).
  m.scale = 'tiny'  # Study scale name (informational; configs/hybrid.py sets the shape fields).
  m.vocab_size = 257  # Embedding rows; must be >= the tokenizer's vocabulary (byte tokenizer: 256 bytes + EOS).
  m.d_model = 128  # Residual width.
  m.num_layers = 4  # Number of blocks.
  m.num_heads = 4  # Query heads per attention layer.
  m.num_kv_heads = 2  # Key/value heads (GQA); num_heads must be a multiple of it.
  m.head_dim = 32  # Per-head width (the study uses 64).
  m.d_ff = 320  # SwiGLU hidden width (the study uses 2.5 * d_model).
  # Layer pattern: layer i has kind cycle[i % len(cycle)]. Kinds: 'full' (full causal attention), 'swa'
  # (sliding-window attention), 'headwise' (SWA and full heads inside one layer). Default: 1:1 alternation with
  # full attention at odd 0-based layers.
  m.cycle = ('swa', 'full')
  m.window = 128  # Keys each SWA query sees, itself included.
  m.rope_full = True  # RoPE on full-attention layers (False = NoPE, the study's SWA-128-NoPE design).
  m.rope_swa = True  # RoPE on sliding-window layers.
  m.rope_base = 10000.0  # RoPE theta.
  m.headwise_full_kv_heads = 1  # 'headwise' layers: KV groups (with their query heads) that attend fully.
  m.norm_eps = 1e-5  # RMSNorm epsilon.
  m.init_std = 0.02  # Normal init std of every matrix (output projections scaled by 1/sqrt(2 * num_layers)).
  m.dtype = 'bfloat16'  # Compute dtype of matmuls and activations; softmax statistics and losses stay float32.
  m.param_dtype = 'float32'  # Master weights.
  m.scan_layers = False  # Scan over repeats of the layer cycle: compile time flat in depth.
  m.remat = 'none'  # Rematerialisation of each block: 'none' | 'full' | 'save_dots' (keep matmul outputs).
  m.attention_implementation = 'auto'  # 'auto' | 'xla' | 'reference' | 'cudnn' (see hybrid_jax.kernels).

  # ------------------------------------------------------------------------------------------------ data
  d = c.data = ml_collections.ConfigDict()
  d.source = 'builtin'  # 'builtin' (this Python's standard library sources) | 'files' | 'tfds'.
  d.paths = ''  # 'files': comma-separated files, directories or globs of .txt / .jsonl (.gz allowed).
  d.text_field = 'text'  # Field holding the document text in JSONL records and TFDS examples.
  d.tfds_name = ''  # 'tfds': dataset name, e.g. 'c4/en:3.1.0' or 'hybrid_jax_local_files'.
  d.tfds_data_dir = ''  # 'tfds': data_dir (local path or gs://...); '' = the TFDS default.
  d.tfds_train_split = 'train'  # 'tfds': split read for training.
  d.tfds_eval_split = 'validation'  # 'tfds': split read for held-out evaluation.
  d.tokenizer = 'byte'  # 'byte' or the path of a SentencePiece .model file.
  d.seq_len = 512  # Tokens per training sequence.
  d.long_short_ratio = 1.0  # Long:short document mixing weight (the study: 1:1). 0 = no mixing, source order.
  d.long_doc_min_tokens = 0  # A document is 'long' from this many tokens; 0 = seq_len.
  d.eval_fraction = 0.02  # 'builtin' / 'files': fraction of documents held out for evaluation (stable by hash).
  d.shuffle = True  # Shuffle documents each epoch (seeded).
  d.worker_count = 0  # grain worker processes (0 = in the main process).

  # ----------------------------------------------------------------------------------------------- train
  t = c.train = ml_collections.ConfigDict()
  t.steps = 300  # Optimizer steps.
  t.batch_size = 8  # Global sequences per optimizer step.
  t.grad_accum = 1  # Micro-batches per step (batch_size must divide evenly).
  t.lr = 3e-3  # Peak learning rate.
  t.schedule = 'wsd'  # 'wsd' (warmup-stable-decay, MiniCPM) | 'cosine' | 'constant' (after warmup).
  t.warmup_steps = 30  # Linear warmup from 0.
  t.decay_fraction = 0.2  # 'wsd': fraction of steps in the final decay.
  t.min_lr_ratio = 0.1  # Final lr / peak lr for 'wsd' and 'cosine'.
  t.b1 = 0.9  # AdamW beta1.
  t.b2 = 0.95  # AdamW beta2.
  t.eps = 1e-8  # AdamW epsilon.
  t.weight_decay = 0.1  # Decoupled weight decay on matrices (not on norms).
  t.grad_clip = 1.0  # Global gradient-norm clip; 0 disables.
  t.z_loss = 0.0  # Weight of the z-loss (log partition function squared); 0 disables.
  t.log_every = 10  # Steps between metric writes.
  t.eval_every = 100  # Steps between held-out evaluations; 0 = only at the end.
  t.eval_batches = 4  # Held-out batches per evaluation.
  t.checkpoint_every = 100  # Steps between checkpoints (also written at the end and on SIGTERM).
  t.keep_checkpoints = 3  # Checkpoints kept on disk.
  t.async_checkpointing = True  # Write checkpoints in the background.
  t.progress = True  # Progress line with tokens/s and ETA.

  # ------------------------------------------------------------------------------------------------ eval
  e = c.eval = ml_collections.ConfigDict()
  e.position_buckets = 8  # Equal-width position buckets for loss-by-position.
  e.batches = 8  # Held-out batches for the final evaluation.
  return c
