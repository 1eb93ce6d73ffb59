"""Every default of a hybrid_jax run, documented in one place.

Other config files start from `get_config()` here and change only what differs. Override any key on the command
line with absl syntax, e.g. `--config.train.steps=100`. `hybrid_jax.config.validate` checks all of it before
anything compiles.
"""

import ml_collections

from hybrid_jax.models.mixers import registry


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()

  c.name = 'base'  # Free-form run name; reports and logs carry it.
  c.seed = 0  # Seeds parameter init and the data order; same seed -> same batches and loss curve.

  # ----------------------------------------------------------------------------------------------- model
  m = c.model = ml_collections.ConfigDict()
  m.arch = 'swa128_nope'  # Study architecture name (informational here; the hybrid config sets the fields below).
  m.scale = 'tiny'  # Study scale name (informational; the hybrid config sets the shape fields).
  m.vocab_size = 257  # Embedding rows; must be >= the tokenizer's vocabulary (byte tokenizer: 256 bytes + EOS).
  m.d_model = 128  # Residual width.
  m.num_layers = 4  # Number of blocks.
  m.num_heads = 4  # Query heads per attention layer.
  m.num_kv_heads = 2  # Key/value heads (GQA); num_heads must be a multiple of it.
  m.head_dim = 32  # Per-head width (the study uses 64).
  m.d_ff = 320  # MLP hidden width (the study uses 2.5 * d_model).
  m.mlp = 'swiglu'  # 'swiglu' (down(silu(gate x) * up x), the study's) | 'relu2' (down(relu(up x)^2): Nemotron-H).
  # Every block is mixer then MLP; False = a block is its mixer alone, and MLPs are layers of their own (cycle kind
  # 'mlp': Nemotron-H's pattern).
  m.block_mlp = True
  # Layer pattern: layer i has kind cycle[i % len(cycle)]. Kinds: 'full' (full causal attention), 'swa'
  # (sliding-window attention), 'headwise' (SWA and full heads inside one layer), the recurrent mixers
  # 'lightning', 'mamba2', 'gdn' (see below), 'mlp' (an MLP layer of its own; needs block_mlp False), and any kind
  # a module of `mixer_modules` registers. A cycle as long as the stack lists every layer's kind (imported
  # checkpoints whose pattern does not repeat). Default: 1:1 alternation with full attention at odd 0-based layers.
  m.cycle = ('swa', 'full')
  m.window = 128  # Keys each SWA query sees, itself included.
  m.rope_full = True  # RoPE on full-attention layers (False = NoPE, the study's SWA-128-NoPE design).
  m.rope_swa = True  # RoPE on sliding-window layers.
  m.rope_base = 10000.0  # RoPE theta.
  m.headwise_full_kv_heads = 1  # 'headwise' layers: KV groups (with their query heads) that attend fully.
  m.norm_eps = 1e-5  # RMSNorm epsilon.
  # Scalings of the plain pre-norm block, for checkpoints trained with them (`hf import` sets them for Granite and
  # MiniCPM; the study's models keep the defaults, which leave the computation untouched).
  m.embedding_multiplier = 1.0  # Input embeddings are multiplied by this (Granite; MiniCPM's scale_emb).
  # Each mixer and MLP output is multiplied by this before it joins the residual stream (Granite; MiniCPM's
  # scale_depth / sqrt(num_layers)).
  m.residual_multiplier = 1.0
  m.logits_scaling = 1.0  # Logits are divided by this (Granite; MiniCPM's hidden_size / dim_model_base).
  # Factor on q·k inside every attention softmax; 0 = head_dim**-0.5 (Granite's attention_multiplier).
  m.attention_scale = 0.0
  # A learned logit per attention head in every softmax denominator, with value zero (GraniteSWA's and gpt-oss'
  # sinks; 0 at init). These layers run the 'xla' attention path, which also returns the row log-sum-exp.
  m.attention_sinks = False
  m.init_std = 0.02  # Normal init std of every matrix (output projections scaled by 1/sqrt(2 * num_layers)).
  m.dtype = 'bfloat16'  # Compute dtype of matmuls and activations; softmax statistics and losses stay float32.
  m.param_dtype = 'float32'  # Master weights.
  m.scan_layers = False  # Scan over repeats of the layer cycle: compile time flat in depth.
  # Rematerialisation of each block: 'none' | 'full' | 'save_dots' (keep matmul outputs) | 'minimal' (keep the
  # named matmul outputs the backward needs: q/k after RoPE, v, projections in, mixer out, MLP gate and up) |
  # 'recompute_mlp' (what 'minimal' keeps but the MLP's gate and up, which are recomputed: the largest kept tensors).
  m.remat = 'none'
  m.attention_implementation = 'auto'  # 'auto' | 'xla' | 'reference' | 'cudnn' | 'pallas_gpu' | 'pallas_tpu'.
  # Recurrent mixers (cycle kinds 'lightning', 'mamba2', 'gdn'). Inner shapes are chosen per scale in
  # hybrid_jax/configs/hybrid.py so each mixer's parameter count is within 5% of the attention layer's
  # (docs/MIXER_SHAPES.md); the defaults here match the tiny scale (d_model 128).
  m.recurrent_implementation = 'auto'  # 'auto' | 'reference' | 'xla' | 'pallas_gpu' | 'pallas_tpu' (kernels).
  m.recurrent_chunk_size = 64  # Tokens per chunk of the chunked scans.
  # Each mixer's own section (model.lightning, model.mamba2, model.gdn, ...): its keys, defaults and what each
  # means are declared in the mixer's module (hybrid_jax/models/mixers/<mixer>.py, FIELDS), its registry entry.
  # model.moe (hybrid_jax/models/mixers/moe_layer.py, docs/MOE.md): mixture-of-experts MLPs, off by default
  # (model.moe.blocks='none'); which block MLPs are MoE, the router, the experts, the auxiliary loss weights.
  registry.add_sections(m, ml_collections.ConfigDict)
  # Modules outside the package that define more mixer kinds (importable names, e.g. ('my_lab.kda',)); they are
  # imported before the config is checked, so their kinds can appear in `cycle` (docs/ARCHITECTURE.md).
  m.mixer_modules = ()

  # ------------------------------------------------------------------------------------------------ data
  d = c.data = ml_collections.ConfigDict()
  # 'builtin' (this Python's standard library sources) | 'files' | 'tfds' | 'parquet' | 'pretokenized'
  # (a directory written by `python -m hybrid_jax pretokenize`) | 'recall' (the synthetic recall task below).
  d.source = 'builtin'
  # 'files': comma-separated files, directories or globs of .txt / .jsonl (.gz allowed); 'parquet': the same of
  # .parquet files; 'pretokenized': the directory `pretokenize` wrote.
  d.paths = ''
  d.text_field = 'text'  # Field holding the document text in JSONL records, TFDS examples and parquet columns.
  d.tfds_name = ''  # 'tfds': dataset name, e.g. 'c4/en:3.1.0' or 'hybrid_jax_local_files'.
  d.tfds_data_dir = ''  # 'tfds': data_dir (local path or gs://...); '' = the TFDS default.
  d.tfds_train_split = 'train'  # 'tfds': split read for training.
  d.tfds_eval_split = 'validation'  # 'tfds': split read for held-out evaluation.
  d.tokenizer = 'byte'  # 'byte', a Hugging Face tokenizer.json path, or a SentencePiece .model path.
  d.seq_len = 512  # Tokens per training sequence.
  # How documents share a packed row: 'documents' (each batch also carries segment_ids, positions and
  # target_segment_ids, so the model keeps documents apart and the EOS closing one is not asked to predict the next
  # one's first token) | 'concat' (inputs and targets only: one stream of text across documents).
  d.packing = 'documents'
  d.long_short_ratio = 1.0  # Long:short document mixing weight (the study: 1:1). 0 = no mixing, source order.
  d.long_doc_min_tokens = 0  # A document is 'long' from this many tokens; 0 = seq_len.
  d.eval_fraction = 0.02  # 'builtin' / 'files' / 'parquet': fraction of documents held out (stable by hash).
  d.shuffle = True  # Shuffle documents each epoch (seeded).
  d.worker_count = 0  # grain worker processes (0 = in the main process).
  # 'recall': multi-query associative recall documents (VALUEKEY pairs in a filler sentence, each key asked
  # again later), every one data.seq_len bytes long, mixed with built-in text (hybrid_jax/data/recall.py). Needs
  # the byte tokenizer; set data.long_short_ratio=0 so the text fraction below is the mixture's.
  rc = d.recall = ml_collections.ConfigDict()
  rc.pairs = 6  # Key-value pairs (and queries) per recall document; 1 = a needle document.
  # Fewest pairs of a training document: each draws its count uniformly from pairs_min..pairs (a mixture of loads);
  # 0 = always `pairs`. Held-out documents never mix: each holds eval_pairs pairs (0 = `pairs`).
  rc.pairs_min = 0
  rc.eval_pairs = 0
  # Characters of haystack between a record's value and its key (VALUE...KEY; the query stays KEYVALUE): at least a
  # mixer's conv width keeps its short convolution from binding the value to the key.
  rc.record_gap = 0
  # Around the records: 'filler' (rc.filler repeated, or rc.filler_random's draws) | 'text' (the built-in corpus,
  # lower-cased, digits removed: nothing in it reads as a key or a value).
  rc.haystack = 'filler'
  # Records whose key is never asked, placed at random among the others: "the nearest record not asked yet" then no
  # longer names the answer, so only the key match does (hybrid_jax/data/recall.py).
  rc.distractors = 0
  rc.key_length = 1  # Characters per key.
  rc.key_chars = 26  # Keys use the first key_chars upper-case letters (unique within a document).
  rc.value_length = 2  # Characters per value (the answer).
  rc.value_chars = 10  # Values use the first value_chars digits.
  # Distance from the pair's key to the query's key in tokens, both counted (a window of w tokens, the query
  # included, sees the pair iff distance <= w): a range is picked with probability proportional to its weight,
  # then a distance uniformly inside it (inclusive).
  rc.distance_ranges = ((6, 16), (40, 128), (160, 400))
  rc.distance_weights = (1.0, 1.0, 1.0)
  # Text between the records, repeated from a random offset; no upper-case letters or digits (keys and values).
  rc.filler = 'the grass is green. the sky is blue. the sun is yellow. here we go. there and back again. '
  # If not '': each filler character is drawn at random from these instead (no upper-case letters). With digits
  # here, a value looks like any other filler digit: only its key tells where the answer is, so neither its type
  # ("the digits") nor its distance can stand in for the key match (the mini-study's task).
  rc.filler_random = ''
  rc.text_fraction = 0.25  # Fraction of documents that are built-in text instead of recall.
  rc.documents = 1_000_000  # Training documents (held out: ceil(documents * eval_fraction), generated apart).
  rc.seed = 0  # Seeds the documents themselves (config.seed only orders them), so every run sees the same task.

  # ----------------------------------------------------------------------------------------------- train
  t = c.train = ml_collections.ConfigDict()
  # Defaults derived from steps follow an override of steps (--config.train.steps=N): they are lazy references
  # (ml_collections.FieldReference), resolved when read; setting one of them explicitly replaces the reference.
  steps = ml_collections.FieldReference(300)
  t.steps = steps  # Optimizer steps.
  t.batch_size = 8  # Global sequences per optimizer step.
  t.grad_accum = 1  # Micro-batches per step (batch_size must divide evenly).
  t.lr = 3e-3  # Peak learning rate.
  t.schedule = 'wsd'  # 'wsd' (warmup-stable-decay, MiniCPM) | 'cosine' | 'constant' (after warmup).
  t.warmup_steps = steps // 10  # Linear warmup from 0 (default: a tenth of the steps).
  t.decay_fraction = 0.2  # 'wsd': fraction of steps in the final decay.
  t.min_lr_ratio = 0.1  # Final lr / peak lr for 'wsd' and 'cosine'.
  t.b1 = 0.9  # AdamW beta1.
  t.b2 = 0.95  # AdamW beta2.
  t.eps = 1e-8  # AdamW epsilon.
  t.weight_decay = 0.1  # Decoupled weight decay on matrices (not on norms).
  t.grad_clip = 1.0  # Global gradient-norm clip; 0 disables.
  t.z_loss = 0.0  # Weight of the z-loss (log partition function squared); 0 disables.
  # Positions per chunk of the LM head + loss (train step and held-out eval): the [batch, seq, vocab] logits are
  # then never held at once, at the cost of recomputing each chunk's logits in the backward pass. 0 = whole
  # sequence. Study scales use 2048 (8 x 16K x 73K-vocab logits would be 38 GB in float32).
  t.loss_chunk = 0
  t.log_every = 10  # Steps between metric writes.
  t.eval_every = (steps + 2) // 3  # Steps between held-out evaluations (3 per run); 0 = only at the end.
  t.eval_batches = 4  # Held-out batches per evaluation.
  t.checkpoint_every = (steps + 2) // 3  # Steps between checkpoints (also at the end and on SIGTERM); 3 per run.
  t.keep_checkpoints = 3  # Checkpoints kept on disk.
  t.async_checkpointing = True  # Write checkpoints in the background.
  t.progress = True  # Progress line with tokens/s and ETA.
  # Start a fresh run from the parameters of another run's newest checkpoint (e.g. context extension); the
  # optimizer starts fresh. '' = random init. Ignored once this run has its own checkpoints (resume wins).
  t.init_from = ''
  # During-training retrieval probe (hybrid_jax.analysis.callbacks): every N steps, log NIAH accuracy at needle
  # depths 0.1/0.5/0.9 and the top retrieval-head score of the full-attention layers as probe/* metrics. 0 = off.
  t.retrieval_probe_every = 0
  t.retrieval_probe_samples = 4  # Needle prompts per depth.
  t.retrieval_probe_length = 0  # Prompt length in tokens; 0 = data.seq_len.
  # A denser probe before retrieval forms, so its formation step is seen finely: every retrieval_probe_dense_every
  # steps up to step retrieval_probe_dense_until, every retrieval_probe_every after. 0 and 0 = off.
  t.retrieval_probe_dense_every = 0
  t.retrieval_probe_dense_until = 0
  # Train until formed, within a cap (train.steps): the name of a metric the probe logs, e.g.
  # 'recall_accuracy_32_56' (recall of the bucket beyond the mini-study's large window); '' = off. The run stops at
  # the probe where formed_probes probes in a row reach formed_threshold (hybrid_jax.analysis.formation),
  # checkpoints there and reports stopped_early; a rerun finds it finished.
  t.stop_when_formed = ''
  t.formed_threshold = 0.95
  t.formed_probes = 2  # Consecutive probes at or above the threshold: one good probe can be luck on few documents.
  # Peak bf16 TFLOP/s of one device, for the logged MFU (model FLOPs from hybrid_jax.models.flops / this peak).
  # 0 = look it up by device kind (the chip table, hybrid_jax.parallel.chips); with no entry (CPU) only model
  # TFLOP/s per device is logged.
  t.peak_tflops = 0.0
  # Profile train steps profile_start + 1 .. profile_start + profile_steps (0 = off): the trace goes to
  # <workdir>/tensorboard (TensorBoard's profile tab, Perfetto), the time by model part to profile_breakdown.json.
  t.profile_start = 0
  t.profile_steps = 3
  # Numerics canary (hybrid_jax.train.canary): at step 1 and every N steps, the first layer of each mixer kind is
  # rerun on a slice of the batch with the configured kernels (model.dtype) and with the 'xla' ones (float32), and
  # the relative gap |a - b| / |b| is logged as canary/layer<i>_<kind>_gap; a gap above the tolerance of
  # model.dtype logs one warning per layer. An integer N (0 = off), or 'auto': off on CPU, whose kernels are the
  # 'xla' ones already, and 500 on GPU and TPU, where Pallas and cuDNN kernels run: a check is a forward pass of one
  # row through the first layers, under 0.1% of training at that cadence (docs/SPEED.md, "The numerics canary"),
  # and a kernel that goes wrong only on later training's inputs (stronger decays, other documents) shows within
  # 500 steps.
  t.numerics_canary_every = ml_collections.FieldReference('auto', field_type=object)
  t.numerics_canary_rows = 1  # Rows of the batch rerun (at most train.batch_size).
  # Tokens of each row rerun, from its start (at most data.seq_len; 0 = data.seq_len). The 'xla' reference of full
  # attention holds a T x T score matrix per head in float32: 2048 tokens keep it at 16 MB a head.
  t.numerics_canary_tokens = 2048
  # The largest gap that is not a defect, by model.dtype: float32 kernels agree to about 1e-5 (docs/KERNELS.md,
  # "Tolerances"); a bfloat16 layer rounds its projections and activations: 3e-3 to 7e-3 against float32 for the
  # S1 scale's attention, GDN, Mamba-2 and Lightning layers at 2048 tokens (initial parameters, XLA:CPU).
  # float32's holds where float32 dots are float32 (CPU, or jax_default_matmul_precision 'highest'); on GPU and TPU
  # they round to TF32 or bfloat16 at the default precision, and bfloat16's holds, as for float16.
  t.numerics_canary_tolerance_float32 = 1e-4
  t.numerics_canary_tolerance_bfloat16 = 2e-2

  # ------------------------------------------------------------------------------------------------ eval
  e = c.eval = ml_collections.ConfigDict()
  # Loss by position is measured on whole held-out documents read from their start, the same documents at every
  # context length (hybrid_jax.eval.position): `documents` of them, each at least as long as the longest context.
  # 0 leaves loss by position out of the training report (held-out text without documents that long).
  e.documents = 16
  e.position_buckets = 8  # Equal-width position buckets over the (shortest) context, for loss by position.
  e.batches = 8  # Packed held-out batches for the final held-out loss (packed_loss, what training optimises).

  # -------------------------------------------------------------------------------------------- parallel
  # Device mesh ('data', 'fsdp', 'expert', 'sequence', 'tensor') and how logical axes map onto it (see
  # hybrid_jax.parallel). The defaults give pure data parallelism over every device, which is also right for a single
  # CPU or GPU.
  p = c.parallel = ml_collections.ConfigDict()
  p.data = -1  # Data-parallel ways (replicated params); -1 = the devices the other axes leave.
  p.fsdp = 1  # Fully-sharded data-parallel ways: params and optimizer state split over this axis too.
  # Expert-parallel ways (models with MoE layers; docs/MOE.md): each chip holds model.moe.num_experts / ways of every
  # MoE layer's experts, and the batch is split over this axis too, so the other layers run data-parallel on it.
  # Must divide model.moe.num_experts; not -1.
  p.expert = 1
  # Sequence (context) parallel ways: every row's tokens split into this many contiguous shards, one per chip,
  # each mixer exchanging what its math needs (hybrid_jax.parallel.sequence); data.seq_len must divide by it.
  p.sequence = 1
  p.tensor = 1  # Tensor-parallel ways: attention heads, MLP hidden units and vocabulary split.
  # The Adam moments split over the 'data' axis too (ZeRO-1): less memory per chip, the same update.
  p.shard_optimizer = False
  p.dcn_data = 1  # Multislice: data-parallel ways across slices (over the data-center network); -1 = the rest.
  p.dcn_fsdp = 1  # Multislice: FSDP ways across slices (rarely worth the slow network).
  p.dcn_expert = 1  # Multislice: expert ways across slices (keep 1: its exchange is every MoE layer's).
  p.dcn_sequence = 1  # Multislice: sequence ways across slices (keep 1: its exchanges are every layer's).
  p.dcn_tensor = 1  # Multislice: tensor ways across slices (keep 1: tensor parallelism needs fast links).
  # Logical axis -> comma-separated mesh axes ('' = replicated). One tensor may not use a mesh axis twice.
  r = p.rules = ml_collections.ConfigDict()
  r.batch = 'data,fsdp,expert'  # Batch dimension of inputs and activations.
  r.seq = 'sequence'  # Sequence positions (split only when parallel.sequence > 1).
  r.embed = 'fsdp'  # Residual width: the FSDP split of every matrix.
  r.heads = 'tensor'  # Query heads.
  r.kv_heads = 'tensor'  # Key/value heads.
  r.head_dim = ''  # Per-head width.
  r.mlp = 'tensor'  # MLP hidden units.
  r.vocab = 'tensor'  # Vocabulary rows of the embedding and LM head.
  r.state = ''  # Recurrent state width.
  r.layers = ''  # Leading axis of scanned layer cycles.
  r.expert = 'expert'  # Leading axis of stacked MoE expert weights (and of the router's output).
  # Multi-host start-up (jax.distributed); ignored by a single process.
  dist = p.distributed = ml_collections.ConfigDict()
  # 'auto': initialize when the environment names a cluster (TPU VM pod, SLURM, HYBRID_JAX_COORDINATOR);
  # 'always' | 'never'.
  dist.initialize = 'auto'
  dist.coordinator_address = ''  # host:port of process 0; '' = from the environment.
  dist.num_processes = 0  # 0 = from the environment.
  dist.process_id = -1  # -1 = from the environment.
  dist.initialization_timeout_s = 300  # Seconds to wait for every process to join before failing clearly.
  dist.heartbeat_timeout_s = 60  # Seconds without a heartbeat before a process counts as dead and the job fails.
  dist.barrier_timeout_s = 300  # Seconds to wait at start-up checks (config hash) for the other processes.
  dist.cpu_collectives = 'gloo'  # CPU cross-process collectives: 'gloo' | 'mpi' | 'none'.
  return c
