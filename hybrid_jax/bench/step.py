"""The whole training step: compile time, steady step time, tokens/s, model TFLOP/s, MFU, memory, and where the
time goes by layer kind (`python -m hybrid_jax bench step`).

  python -m hybrid_jax bench step --config configs/hybrid.py:arch=gdn,scale=s1 --seq_len 2048 --batch_size 1 \
      --steps 5 --set model.remat=full --json out.json

The step is the one training uses (hybrid_jax.train.step, same shardings, state donated) on random tokens, so the
numbers are the data pipeline's ceiling. Compile time is measured apart from the steps; the step time is the
median of `--steps` device-synchronised steps after one warm-up step. FLOPs are model FLOPs
(hybrid_jax.models.flops: window- and chunk-aware, training = 3 x forward, no remat recompute), so MFU is honest
for hybrids. XLA's own count of the compiled step is reported beside it for reference: it includes remat
recompute, the optimizer and elementwise work, and counts a loop body (scanned layers, scan-over-chunks) once.

Breakdown by layer kind: each distinct block (e.g. the SWA block and the full block) is compiled and timed
*in isolation* (forward + backward of one block on a micro-batch of the step's shape, same remat policy), as is
the final norm + LM head + loss; times are multiplied by the layer counts. The rest of the step (embedding,
optimizer update, glue, and any difference between isolated and in-step cost) is reported as 'rest'. This is
not a profile: fusion across blocks and scan overheads land in 'rest', and shared-machine noise affects each
measurement separately.
"""

import argparse
import ast
import datetime
import json
import math
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hybrid_jax.bench import timing
from hybrid_jax.config import ConfigError, key_parent, load_config_file, validate
from hybrid_jax.models import flops as flops_lib, pattern
from hybrid_jax.models.layers import RMSNorm, dtype_of
from hybrid_jax.models.model import _REMAT_POLICIES, Block
from hybrid_jax.parallel import distributed, mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import metrics, optim, state as state_lib, step as step_lib


def _parse(argv):
  p = argparse.ArgumentParser(prog='python -m hybrid_jax bench step', description=__doc__.split('\n')[0])
  p.add_argument('--config', required=True, help='config file[:arg], e.g. configs/hybrid.py:arch=gdn,scale=s1')
  p.add_argument('--seq_len', type=int, help='override data.seq_len')
  p.add_argument('--batch_size', type=int, help='override train.batch_size (global sequences per step)')
  p.add_argument('--grad_accum', type=int, help='override train.grad_accum')
  p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                 help='any config override, repeatable, e.g. --set model.remat=full --set model.scan_layers=False')
  p.add_argument('--steps', type=int, default=5, help='timed steady steps (after one warm-up step)')
  p.add_argument('--no-breakdown', action='store_true', help='skip the per-layer-kind isolated timings')
  p.add_argument('--breakdown-repeats', type=int, default=3, help='timed runs of each isolated block')
  p.add_argument('--json', metavar='OUT', help='write the full result to this JSON file')
  p.add_argument('--dry-run', action='store_true', help='validate the config and print its model FLOPs; no compile')
  args = p.parse_args(argv)
  if args.steps < 1:
    p.error('--steps must be >= 1')
  return args


def _literal(text):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # A bare word: a string value.


def load_config(spec, *, seq_len=None, batch_size=None, grad_accum=None, overrides=()):
  """The validated config of `spec` with the benchmark's overrides applied (clear errors for unknown keys)."""
  config = load_config_file(spec)
  values = [('data.seq_len', seq_len), ('train.batch_size', batch_size), ('train.grad_accum', grad_accum)]
  for item in overrides:
    key, sep, value = item.partition('=')
    if not sep:
      raise ConfigError(f'--set {item!r}: expected KEY=VALUE, e.g. model.remat=full')
    values.append((key, _literal(value)))
  for key, value in values:
    if value is None:
      continue
    node, leaf = key_parent(config, key, '--set')
    try:
      node[leaf] = value
    except TypeError as e:
      raise ConfigError(f'--set {key}={value!r}: {e}') from e
  return validate(config)


def _device_peak_bytes():
  """Peak bytes in use on device 0 since start (GPU/TPU allocators report it; CPU does not): None if unknown."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  # Not every backend implements it.
    return None
  return int(stats['peak_bytes_in_use']) if stats and 'peak_bytes_in_use' in stats else None


def measure_step(config, steps: int) -> dict:
  """Compile the sharded train step, run 1 + `steps` steps on random tokens, and report times and memory."""
  t, seq_len = config.train, config.data.seq_len
  mesh = mesh_lib.make_mesh(config.parallel)
  model_def = state_lib.make_model_def(config.model)
  tx = optim.make_optimizer(t)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh, rules_lib.parse_rules(config.parallel.rules))
  state = state_lib.init_sharded_train_state(config.model, config.seed, tx, shardings.state)
  rows = t.batch_size // jax.process_count()
  tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, (rows, seq_len + 1), dtype=np.int32)
  batch = distributed.global_batch({'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]}, shardings.batch)

  tic = time.perf_counter()
  compiled = step_lib.make_train_step(model_def, tx, t, shardings).lower(state, batch).compile()
  compile_s = time.perf_counter() - tic
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}

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
  loss = float(m['loss'])
  step_s = statistics.median(times)

  model = flops_lib.model_flops(config.model, seq_len)
  flops_per_step = model['training_per_token'] * t.batch_size * seq_len
  device = jax.devices()[0]
  peak = metrics.peak_tflops(device.device_kind, t.peak_tflops)
  result = {
      'compile_s': compile_s, 'first_step_s': first_step_s, 'step_s_median': step_s, 'step_s_all': times,
      'tokens_per_s': t.batch_size * seq_len / step_s, 'loss_after': loss,
      'model_flops_per_token': model['training_per_token'], 'model_flops_per_step': flops_per_step,
      'xla_flops_per_step_per_device': float(cost.get('flops', math.nan)),
      'peak_tflops_per_device': peak,
      'memory_bytes_per_device': {
          'arguments': int(mem.argument_size_in_bytes), 'outputs': int(mem.output_size_in_bytes),
          'aliased': int(mem.alias_size_in_bytes), 'temporaries': int(mem.temp_size_in_bytes),
          'compiled_peak': int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                               + mem.temp_size_in_bytes),
          'device_peak_in_use': _device_peak_bytes()},
      'devices': jax.device_count(), 'mesh': dict(mesh.shape),
  }
  result.update(metrics.throughput(flops_per_step, step_s, jax.device_count(), peak))
  del state
  return result


def _block_kinds(cfg):
  """Distinct layer specs of the stack, in order of first appearance, with how many layers each has."""
  specs = {}
  for i in range(cfg.num_layers):
    spec = pattern.layer_spec(cfg, i)
    key = (spec.kind, spec.window, spec.rope, spec.full_kv_heads, spec.decay_scale)
    specs.setdefault(key, [spec, 0])[1] += 1
  return list(specs.values())


def _label(spec):
  return f'{spec.kind}(w={spec.window})' if spec.window else spec.kind


def _fwd_bwd(apply, remat):
  """(params, x, dy) -> (value, grads w.r.t. params and x) of sum(apply(params, x) * dy), under the remat policy."""
  if remat != 'none':
    apply = jax.checkpoint(apply, policy=_REMAT_POLICIES[remat])
  return jax.value_and_grad(lambda p, x, dy: jnp.sum(apply(p, x).astype(jnp.float32) * dy), argnums=(0, 1))


def measure_breakdown(config, repeats: int) -> dict:
  """Isolated forward + backward time of each layer kind's block and of the LM head, on one micro-batch."""
  cfg, t = config.model, config.train
  micro, seq_len = t.batch_size // t.grad_accum, config.data.seq_len
  dt = dtype_of(cfg.dtype)
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (micro, seq_len, cfg.d_model), dt)
  dy = jax.random.normal(keys[1], (micro, seq_len, cfg.d_model), jnp.float32)
  positions = jnp.arange(seq_len, dtype=jnp.int32)
  rows = []
  for spec, count in _block_kinds(cfg):
    graphdef, params = nnx.split(Block(cfg, spec, rngs=nnx.Rngs(0)))
    fn = _fwd_bwd(lambda p, x, g=graphdef: nnx.merge(g, p)(x, positions), cfg.remat)
    compile_s, ms = timing.timed(fn, (params, x, dy), repeats, 0.0)
    block_flops = flops_lib.TRAIN_MULTIPLIER * flops_lib.layer_flops(cfg, spec, seq_len)['total'] * micro
    rows.append({'part': _label(spec), 'layers': count, 'ms_per_layer': ms, 'compile_s': compile_s,
                 'model_flops_per_layer': block_flops, 'tflops': block_flops / ms / 1e9})
    del params

  norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=dtype_of(cfg.param_dtype), dtype=dt)
  head = {'norm': nnx.split(norm)[1],
          'w': 0.02 * jax.random.normal(keys[2], (cfg.d_model, cfg.vocab_size), dtype_of(cfg.param_dtype))}
  norm_def = nnx.split(norm)[0]
  targets = jnp.zeros((micro, seq_len), jnp.int32)

  def head_loss(p, x, targets):
    logits = nnx.merge(norm_def, p['norm'])(x) @ p['w'].astype(dt)
    return jnp.mean(step_lib.token_nll(logits, targets)[0])

  fn = jax.value_and_grad(head_loss, argnums=(0, 1))
  compile_s, ms = timing.timed(fn, (head, x, targets), repeats, 0.0)
  head_flops = flops_lib.TRAIN_MULTIPLIER * 2 * micro * seq_len * cfg.d_model * cfg.vocab_size
  rows.append({'part': 'lm_head+loss', 'layers': 1, 'ms_per_layer': ms, 'compile_s': compile_s,
               'model_flops_per_layer': head_flops, 'tflops': head_flops / ms / 1e9})
  for row in rows:
    row['ms_per_step'] = row['ms_per_layer'] * row['layers'] * t.grad_accum
  return {'method': 'isolated fwd+bwd per layer kind on one micro-batch, times layer count and grad_accum',
          'micro_batch': micro, 'rows': rows}


def _add_rest(breakdown, step_s):
  rows = breakdown['rows']
  total_ms = 1e3 * step_s
  accounted = sum(r['ms_per_step'] for r in rows)
  for r in rows:
    r['share'] = r['ms_per_step'] / total_ms
  breakdown['rest_ms'] = total_ms - accounted
  breakdown['rest_share'] = breakdown['rest_ms'] / total_ms


def report(result) -> str:
  """Human-readable summary and breakdown table (Markdown)."""
  s, c = result['step'], result['config']
  mem = s['memory_bytes_per_device']
  gib = lambda b: 'n/a' if b is None else f'{b / 2**30:.2f} GiB'
  mfu = f"{100 * s['mfu']:.1f}%" if 'mfu' in s else 'n/a (peak unknown for this device; see train.peak_tflops)'
  lines = [
      f"{c['name']}: {c['seq_len']} tokens x {c['batch_size']} sequences (grad_accum {c['grad_accum']}), "
      f"remat {c['remat']}, scan_layers {c['scan_layers']}, dtype {c['dtype']}, on {result['meta']['device_kind']}",
      f"compile {s['compile_s']:.1f} s, first step {s['first_step_s']:.2f} s, steady step {s['step_s_median']:.3f} s "
      f"(median of {len(s['step_s_all'])})",
      f"{s['tokens_per_s']:,.0f} tokens/s, {s['tflops_per_device']:.4g} model TFLOP/s per device, MFU {mfu}",
      f"model FLOPs {s['model_flops_per_token'] / 1e6:.2f} MFLOP/token (training); XLA's count of the compiled step "
      f"{s['xla_flops_per_step_per_device'] / max(s['model_flops_per_step'] / s['devices'], 1):.2f} x model "
      f"(includes remat, optimizer, elementwise; loop bodies counted once)",
      f"memory per device: compiled peak {gib(mem['compiled_peak'])} (arguments {gib(mem['arguments'])}, "
      f"temporaries {gib(mem['temporaries'])}), device peak in use {gib(mem['device_peak_in_use'])}",
  ]
  b = result.get('breakdown')
  if b:
    lines += ['', f"breakdown ({b['method']}; micro-batch {b['micro_batch']}):", '',
              '| part | layers | ms / layer | ms / step | share of step | model TFLOP/s |',
              '| --- | ---: | ---: | ---: | ---: | ---: |']
    for r in b['rows']:
      lines.append(f"| {r['part']} | {r['layers']} | {r['ms_per_layer']:.2f} | {r['ms_per_step']:.1f} | "
                   f"{100 * r['share']:.1f}% | {r['tflops']:.4g} |")
    lines.append(f"| rest (embedding, optimizer, glue) | | | {b['rest_ms']:.1f} | {100 * b['rest_share']:.1f}% | |")
  return '\n'.join(lines)


def run(args) -> dict:
  config = load_config(args.config, seq_len=args.seq_len, batch_size=args.batch_size, grad_accum=args.grad_accum,
                       overrides=args.set)
  device = jax.devices()[0]
  meta = {'time': datetime.datetime.now(datetime.timezone.utc).isoformat(), 'jax': jax.__version__,
          'backend': jax.default_backend(), 'device_kind': device.device_kind,
          'load_average_start': os.getloadavg()[0], 'argv': list(args.argv)}
  m = config.model
  summary = {'name': config.name, 'arch': m.arch, 'scale': m.scale, 'seq_len': config.data.seq_len,
             'batch_size': config.train.batch_size, 'grad_accum': config.train.grad_accum, 'remat': m.remat,
             'scan_layers': m.scan_layers, 'dtype': m.dtype, 'attention_implementation': m.attention_implementation,
             'recurrent_implementation': m.recurrent_implementation, 'overrides': list(args.set)}
  result = {'meta': meta, 'config': summary, 'step': measure_step(config, args.steps),
            'model_flops_by_kind': {k: {'layers': v['layers'], 'forward_per_token': v['forward_per_token'],
                                        'share': v['share']}
                                    for k, v in flops_lib.model_flops(m, config.data.seq_len)['by_kind'].items()}}
  if not args.no_breakdown:
    result['breakdown'] = measure_breakdown(config, args.breakdown_repeats)
    _add_rest(result['breakdown'], result['step']['step_s_median'])
  meta['load_average_end'] = os.getloadavg()[0]
  return result


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = _parse(argv)
  args.argv = argv
  try:
    if args.dry_run:
      config = load_config(args.config, seq_len=args.seq_len, batch_size=args.batch_size,
                           grad_accum=args.grad_accum, overrides=args.set)
      print(f'{config.name}: config valid ({config.data.seq_len} x {config.train.batch_size}, grad_accum '
            f'{config.train.grad_accum}, remat {config.model.remat}, scan_layers {config.model.scan_layers})')
      print(flops_lib.breakdown_markdown(config.model, config.data.seq_len))
      return 0
    result = run(args)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(report(result))
  if args.json:
    with open(args.json, 'w') as fh:
      json.dump(result, fh, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
