"""The whole training step: compile time, steady step time, tokens/s, model TFLOP/s, MFU, memory, and where the
time goes by layer kind (`python -m hybrid_jax bench step`).

  python -m hybrid_jax bench step --config hybrid:arch=gdn,scale=s1 --seq_len 2048 --batch_size 1 \
      --steps 5 --set model.remat=full --json out.json

The step is the one training uses (hybrid_jax.train.step, same shardings, state donated) on random tokens, so the
numbers are the data pipeline's ceiling. Its batch follows data.packing as training's does: with 'documents' (the
default) the rows hold documents of `--documents` tokens (default data.seq_len // 4) with their segment ids,
positions and target segment ids, so every mixer runs document-masked; with 'concat' only inputs and targets (time
one against the other with `--set data.packing=concat`). Compile time is measured apart from the steps; the step
time is the median of `--steps` device-synchronised steps after one warm-up step. FLOPs are model FLOPs
(hybrid_jax.models.flops: window- and chunk-aware, training = 3 x forward, no remat recompute), so MFU is honest
for hybrids. XLA's own count of the compiled step is reported beside it for reference: it includes remat
recompute, the optimizer and elementwise work, and counts a loop body (scanned layers, scan-over-chunks) once.

Breakdown by part: `--profile-steps` further steps run under jax.profiler, and each traced operation's time goes
to the named scope it was compiled from (hybrid_jax.bench.profile): every block kind's mixer and MLP (backward
and remat recompute included), embedding, final norm, LM head, loss, optimizer, and 'other' (layer-scan slicing,
copies). Each part also gets its model TFLOP/s, so a slow mixer kernel stands out.
"""

import collections
import contextlib
import datetime
import json
import math
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from hybrid_jax.bench import documents as bench_documents, profile
from hybrid_jax.config import ConfigError, apply_override, key_parent, load_config_file, resolve_spec, validate
from hybrid_jax.models import counting, flops as flops_lib, moe, pattern
from hybrid_jax.parallel import distributed, mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import metrics, optim, state as state_lib, step as step_lib


def load_config(spec, *, seq_len=None, batch_size=None, grad_accum=None, overrides=()):
  """The validated config of `spec` with the benchmark's overrides applied (clear errors for unknown keys)."""
  config = load_config_file(resolve_spec(spec))
  values = [('data.seq_len', seq_len), ('train.batch_size', batch_size), ('train.grad_accum', grad_accum)]
  for item in overrides:
    key, sep, value = item.partition('=')
    if not sep:
      raise ConfigError(f'--set {item!r}: expected KEY=VALUE, e.g. model.remat=full')
    key_parent(config, key, '--set')
    apply_override(config, key, value)  # The text read as the key's type, as --config.KEY=VALUE reads it.
  for key, value in values:
    if value is None:
      continue
    node, leaf = key_parent(config, key, '--set')
    try:
      node[leaf] = value
    except TypeError as e:
      raise ConfigError(f'--set {key}={value!r}: {e}') from e
  return validate(config)


def packing(config) -> str:
  """The batch layout of the config's training (data.packing; configs older than the key: 'concat')."""
  return str(config.data.get('packing', 'concat'))


def document_length(config, documents=None):
  """Tokens per document of the benchmark's rows: `documents`, or data.seq_len // 4 (at least 1); None where the
  config trains on concatenated rows (a length given there is refused: it would time nothing)."""
  if packing(config) != 'documents':
    if documents is not None:
      raise ConfigError(f"--documents={documents} needs data.packing='documents'; the config sets "
                        f'data.packing={packing(config)!r}')
    return None
  return int(documents) if documents is not None else max(1, int(config.data.seq_len) // 4)


def make_batch(config, rows: int, documents=None) -> dict:
  """A batch of random tokens of `rows` sequences in the layout of the config's data.packing (the keys of
  hybrid_jax.train.step.BATCH_KEYS), documents of document_length(config, documents) tokens."""
  seq_len = int(config.data.seq_len)
  tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, (rows, seq_len + 1), dtype=np.int32)
  length = document_length(config, documents)
  if length is None:
    return {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]}
  return bench_documents.batch(tokens, length)


def _device_peak_bytes():
  """Peak bytes in use on device 0 since start (GPU/TPU allocators report it; CPU does not): None if unknown."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  # Not every backend implements it.
    return None
  return int(stats['peak_bytes_in_use']) if stats and 'peak_bytes_in_use' in stats else None


def _step_setup(config):
  """(model_def, optimizer, shardings) of the config's train step on its mesh."""
  mesh = mesh_lib.make_mesh(config.parallel)
  model_def = state_lib.make_model_def(config.model)
  tx = optim.make_optimizer(config.train)
  return model_def, tx, mesh_lib.train_shardings(model_def, tx, mesh, rules_lib.parse_rules(config.parallel.rules),
                                                bool(config.parallel.shard_optimizer))


def xla_flops(cost: dict):
  """XLA's FLOP count from a compiled program's cost analysis, or None where the backend reports none (the GPU
  backend returns 0 or no entry for programs of custom calls and fusions, which is no count at all)."""
  value = float(cost.get('flops', 0.0) or 0.0)
  return value if math.isfinite(value) and value > 0 else None


def _compile(config, model_def, tx, shardings, state, batch) -> dict:
  """Compiles the train step for (abstract or concrete) state and batch; its compile time, memory and XLA FLOPs."""
  tic = time.perf_counter()
  compiled = step_lib.make_train_step(model_def, tx, config.train, shardings).lower(state, batch).compile()
  compile_s = time.perf_counter() - tic
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  t, seq_len = config.train, config.data.seq_len
  model = flops_lib.model_flops(config.model, seq_len)
  return compiled, {
      'compile_s': compile_s,
      'model_flops_per_token': model['training_per_token'],
      'model_flops_per_step': model['training_per_token'] * t.batch_size * seq_len,
      'xla_flops_per_step_per_device': xla_flops(cost),
      'memory_bytes_per_device': {
          'arguments': int(mem.argument_size_in_bytes), 'outputs': int(mem.output_size_in_bytes),
          'aliased': int(mem.alias_size_in_bytes), 'temporaries': int(mem.temp_size_in_bytes),
          'compiled_peak': int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                               + mem.temp_size_in_bytes),
          'device_peak_in_use': None},
      'devices': jax.device_count(), 'mesh': dict(shardings.mesh.shape),
  }


def compile_only(config) -> dict:
  """Compiles the step from shapes alone (nothing allocated or run): does it fit, and how long does it compile?
  The batch has the keys of the config's data.packing, as compile-check's."""
  model_def, tx, shardings = _step_setup(config)
  state = state_lib.abstract_train_state(
      state_lib.abstract_initial_state(config.model, config.seed, tx), shardings.state)
  shape = (int(config.train.batch_size), int(config.data.seq_len))
  row = jax.ShapeDtypeStruct(shape, np.int32, sharding=shardings.batch)
  batch = {key: row for key in step_lib.BATCH_KEYS[packing(config)]}
  return _compile(config, model_def, tx, shardings, state, batch)[1]


def measure_step(config, steps: int, profile_steps: int = 0, trace_dir: str = '', documents=None) -> dict:
  """Compile the sharded train step, run 1 + `steps` steps on random tokens (`make_batch`: documents of `documents`
  tokens where the config trains on documents), and report times and memory.

  With `profile_steps` > 0, that many further steps run under the profiler for the breakdown by part.
  """
  t, seq_len = config.train, config.data.seq_len
  model_def, tx, shardings = _step_setup(config)
  state = state_lib.init_sharded_train_state(config.model, config.seed, tx, shardings.state)
  readers = distributed.batch_readers(shardings.batch, (t.batch_size, seq_len))[1]
  batch = distributed.global_batch(make_batch(config, t.batch_size // readers, documents), shardings.batch,
                                   t.batch_size)
  compiled, result = _compile(config, model_def, tx, shardings, state, batch)

  tic = time.perf_counter()
  state, m = compiled(state, batch)
  float(m['loss'])
  first_step_s = time.perf_counter() - tic
  times = []
  for _ in range(steps):
    tic = time.perf_counter()
    state, m = compiled(state, batch)
    float(m['loss'])  # Syncs with the device.
    times.append(time.perf_counter() - tic)
  step_s = statistics.median(times)
  peak = metrics.peak_tflops(jax.devices()[0].device_kind, t.peak_tflops)
  result.update({'first_step_s': first_step_s, 'step_s_median': step_s, 'step_s_all': times,
                 'tokens_per_s': t.batch_size * seq_len / step_s, 'loss_after': float(m['loss']),
                 'peak_tflops_per_device': peak})
  result['memory_bytes_per_device']['device_peak_in_use'] = _device_peak_bytes()
  result.update(metrics.throughput(result['model_flops_per_step'], step_s, jax.device_count(), peak))
  if profile_steps:
    result['breakdown'] = measure_breakdown(config, compiled, state, batch, profile_steps, trace_dir)
  del state
  return result


def _part_flops(cfg, seq_len: int, tokens_per_step: int) -> dict[str, float]:
  """Model training FLOPs per step of each profiled part: blocks by scope and mixer/mlp, and the LM head."""
  out = {}
  for i in range(cfg.num_layers):
    spec = pattern.layer_spec(cfg, i)
    layer = flops_lib.layer_flops(cfg, spec, seq_len)
    for sub in ('mixer', 'mlp'):
      key = f'{spec.scope}/{sub}'
      out[key] = out.get(key, 0.0) + flops_lib.TRAIN_MULTIPLIER * layer[sub] * tokens_per_step / seq_len
  out['lm_head'] = flops_lib.TRAIN_MULTIPLIER * 2 * cfg.d_model * cfg.vocab_size * tokens_per_step
  return out


def measure_breakdown(config, compiled, state, batch, steps: int, trace_dir: str) -> dict:
  """Profiles `steps` train steps and splits their operation time by part (hybrid_jax.bench.profile)."""
  def one_step(compiled, args):
    state, batch = args
    state, m = compiled(state, batch)
    float(m['loss'])
    return state, batch

  result, _ = profile.profile_compiled(compiled, (state, batch), steps, trace_dir, one_step)
  cfg, seq_len = config.model, config.data.seq_len
  layers = collections.Counter(pattern.layer_spec(cfg, i).scope for i in range(cfg.num_layers))
  part_flops = _part_flops(cfg, seq_len, config.train.batch_size * seq_len)
  for row in result['parts']:
    block = row['part'].split('/')[0]
    row['layers'] = layers.get(block, 0)
    if row['part'] in part_flops:
      row['model_tflops'] = part_flops[row['part']] / jax.device_count() / (row['ms_per_step'] / 1e3) / 1e12
  return result


def report(result) -> str:
  """Human-readable summary and breakdown table (Markdown)."""
  s, c = result['step'], result['config']
  mem = s['memory_bytes_per_device']
  gib = lambda b: 'n/a' if b is None else f'{b / 2**30:.2f} GiB'
  mfu = f"{100 * s['mfu']:.1f}%" if 'mfu' in s else 'n/a (peak unknown for this device; see train.peak_tflops)'
  rows = f"documents of {c['documents']} tokens" if c.get('documents') else 'concatenated'
  lines = [
      f"{c['name']}: {c['seq_len']} tokens x {c['batch_size']} sequences ({rows}; grad_accum {c['grad_accum']}), "
      f"remat {c['remat']}, scan_layers {c['scan_layers']}, loss_chunk {c['loss_chunk']}, dtype {c['dtype']}, "
      f"on {result['meta']['device_kind']}",
  ]
  if c.get('moe'):
    e, p = c['moe'], c['params']
    lines.append(f"MoE: {e['layers']} layers of {e['experts']} experts (width {e['expert_width']}), top {e['top_k']}, "
                 f"dispatch {e['implementation']}; {p['active']:,} active of {p['total']:,} parameters (MFU counts "
                 'the active)')
  if 'step_s_median' in s:
    lines += [
        f"compile {s['compile_s']:.1f} s, first step {s['first_step_s']:.2f} s, steady step {s['step_s_median']:.4g} "
        f"s (median of {len(s['step_s_all'])})",
        f"{s['tokens_per_s']:,.0f} tokens/s, {s['tflops_per_device']:.4g} model TFLOP/s per device, MFU {mfu}"]
  else:
    lines.append(f"compile {s['compile_s']:.1f} s (compiled from shapes only; nothing ran)")
  if s['xla_flops_per_step_per_device'] is None:
    xla = f"XLA reports no FLOP count for the compiled step on {result['meta'].get('backend', 'this backend')}"
  else:
    ratio = s['xla_flops_per_step_per_device'] / max(s['model_flops_per_step'] / s['devices'], 1)
    xla = (f"XLA's count of the compiled step {ratio:.2f} x model (includes remat, optimizer, elementwise; loop "
           'bodies counted once)')
  lines += [
      f"model FLOPs {s['model_flops_per_token'] / 1e6:.2f} MFLOP/token (training); {xla}",
      f"memory per device: compiled peak {gib(mem['compiled_peak'])} (arguments {gib(mem['arguments'])}, "
      f"temporaries {gib(mem['temporaries'])}), device peak in use {gib(mem['device_peak_in_use'])}",
  ]
  b = s.get('breakdown')
  if b:
    lines += ['', f"breakdown ({b['method']}; {b['steps']} steps, {b['op_ms_per_step']:.1f} ms of operations per "
              f"step):", '', '| part | layers | ms / step | share | model TFLOP/s |', '| --- | ---: | ---: | ---: | ---: |']
    for r in b['parts']:
      tflops = f"{r['model_tflops']:.4g}" if 'model_tflops' in r else ''
      lines.append(f"| {r['part']} | {r['layers'] or ''} | {r['ms_per_step']:.2f} | {100 * r['share']:.1f}% | "
                   f"{tflops} |")
  return '\n'.join(lines)


def _moe_summary(cfg):
  """An MoE model's experts (layers, experts, top k, expert width, the dispatch 'auto' picks here); None for a
  dense model. Its MFU counts active parameters (`params`), so it compares with the dense run of as many."""
  if not moe.layer_count(cfg):
    return None
  return {'layers': moe.layer_count(cfg), 'experts': int(cfg.moe.num_experts), 'top_k': int(cfg.moe.top_k),
          'expert_width': moe.expert_width(cfg), 'implementation': moe.implementation(str(cfg.moe.implementation))}


def measure(args, argv: list[str]) -> dict:
  """The result of the step `args` sets up (the flags of `bench step`, one attribute each, read from `argv`)."""
  config = load_config(args.config, seq_len=args.seq_len, batch_size=args.batch_size, grad_accum=args.grad_accum,
                       overrides=args.set)
  device = jax.devices()[0]
  meta = {'time': datetime.datetime.now(datetime.timezone.utc).isoformat(), 'jax': jax.__version__,
          'backend': jax.default_backend(), 'device_kind': device.device_kind,
          'load_average_start': os.getloadavg()[0], 'argv': list(argv)}
  m = config.model
  summary = {'name': config.name, 'arch': m.arch, 'scale': m.scale, 'seq_len': config.data.seq_len,
             'packing': packing(config), 'documents': document_length(config, args.documents),
             'batch_size': config.train.batch_size, 'grad_accum': config.train.grad_accum, 'remat': m.remat,
             'loss_chunk': config.train.loss_chunk,
             'scan_layers': m.scan_layers, 'dtype': m.dtype, 'attention_implementation': m.attention_implementation,
             'recurrent_implementation': m.recurrent_implementation, 'overrides': list(args.set),
             'params': {k: v for k, v in counting.param_counts(m).items() if k != 'layers'}, 'moe': _moe_summary(m)}
  with contextlib.ExitStack() as stack:
    trace_dir = args.trace_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix='hybrid_jax_trace_'))
    if args.compile_only:
      step = compile_only(config)
    else:
      step = measure_step(config, args.steps, args.profile_steps, trace_dir, args.documents)
  if args.trace_dir is None and 'breakdown' in step:
    step['breakdown']['trace'] = None  # Deleted with its temporary directory.
  result = {'meta': meta, 'config': summary, 'step': step,
            'model_flops_by_kind': {k: {'layers': v['layers'], 'forward_per_token': v['forward_per_token'],
                                        'share': v['share']}
                                    for k, v in flops_lib.model_flops(m, config.data.seq_len)['by_kind'].items()}}
  meta['load_average_end'] = os.getloadavg()[0]
  return result


def run(args, argv: list[str]) -> int:
  """Validates (--dry-run), compiles or measures the step of `args`, the flags of `bench step` read from `argv`."""
  if args.dry_run:
    config = load_config(args.config, seq_len=args.seq_len, batch_size=args.batch_size,
                         grad_accum=args.grad_accum, overrides=args.set)
    length = document_length(config, args.documents)
    rows = f'documents of {length} tokens' if length else 'concatenated'
    print(f'{config.name}: config valid ({config.data.seq_len} x {config.train.batch_size}, {rows}, grad_accum '
          f'{config.train.grad_accum}, remat {config.model.remat}, scan_layers {config.model.scan_layers}, '
          f'loss_chunk {config.train.loss_chunk})')
    print(flops_lib.breakdown_markdown(config.model, config.data.seq_len))
    return 0
  result = measure(args, argv)
  print(report(result))
  if args.json:
    with open(args.json, 'w') as fh:
      json.dump(result, fh, indent=1)
  return 0

