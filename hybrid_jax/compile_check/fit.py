"""Does a run fit its target, and how fast could it go? The train step compiled for a mesh from shapes alone.

`python -m hybrid_jax compile-check` compiles the sharded train step (kernels chosen for the target's platform) for
fake CPU devices or for a TPU topology described by libtpu (no TPU needed) and reports per chip: compiled memory
against the chip's HBM, XLA's FLOPs and bytes accessed, and a roofline estimate of the step time,
max(model FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth): a lower bound that ignores communication and
kernel efficiency, labelled an estimate everywhere it appears. XLA's cost analysis counts a loop body once, not
times its trip count (the scan over layer cycles, gradient accumulation), and sees nothing inside Pallas kernels,
so its FLOPs and bytes are far below the step's (the estimate therefore uses the model's FLOP count, and the
bytes term is a lower bound too). A configuration that does not fit is retried with
the changes that trade speed for memory (full remat, gradient accumulation, FSDP over every chip), each one
compiled, and the first that fits is reported.
"""

import dataclasses
import math
import time

import jax

from hybrid_jax.models import flops as flops_lib
from hybrid_jax.parallel import chips, mesh as mesh_lib, rules as rules_lib
from hybrid_jax.train import optim, state as state_lib, step as step_lib


@dataclasses.dataclass(frozen=True)
class Target:
  """The devices a step is compiled for, and how the user named them."""
  name: str  # 'v5p:2x2x1', 'v5p:2x2x1 x 2 slices' or 'cpu x 8'
  devices: tuple

  @property
  def chip(self):
    return chips.chip(self.devices[0].device_kind)


def tpu_target(topology: str, num_slices: int = 1) -> Target:
  """A TPU topology (e.g. 'v5p:4x4x4'), optionally `num_slices` slices joined over the data-center network."""
  name = topology if num_slices == 1 else f'{topology} x {num_slices} slices'
  return Target(name, tuple(mesh_lib.topology_devices(topology, num_slices)))


def _with_slices(config, target: Target):
  """A multislice target with no across-slice shape in the config gets data parallelism across slices."""
  slices = len({getattr(d, 'slice_index', 0) for d in target.devices})
  p = config.parallel
  if slices > 1 and all(int(p[f'dcn_{a}']) == 1 for a in mesh_lib.AXES):
    config = config.copy_and_resolve_references()
    config.parallel.dcn_data = -1
  return config


def compile_step(config, target: Target, memory_limit: float | None = None) -> dict:
  """One row: the step compiled for `target` (or why it could not be), memory per chip, FLOPs, estimate.

  It fits when the compiled peak is within `memory_limit` bytes (default: the chip's HBM; unknown for CPUs).
  """
  config = _with_slices(config, target)
  mesh = mesh_lib.make_mesh(config.parallel, list(target.devices))
  rules = rules_lib.parse_rules(config.parallel.rules)
  t, seq_len = config.train, int(config.data.seq_len)
  shards = mesh_lib.batch_shards(mesh, rules)
  row = {'arch': config.model.arch, 'scale': config.model.scale, 'seq_len': seq_len, 'target': target.name,
         'device_kind': target.devices[0].device_kind, 'chips': len(target.devices), 'mesh': dict(mesh.shape),
         'batch_size': int(t.batch_size), 'per_chip_batch': int(t.batch_size) / shards,
         'grad_accum': int(t.grad_accum), 'remat': config.model.remat}
  model_def = state_lib.make_model_def(config.model)
  tx = optim.make_optimizer(t)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh, rules)
  abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(config.model, config.seed, tx),
                                            shardings.state)
  tic = time.perf_counter()
  try:
    compiled = step_lib.compile_train_step(model_def, tx, t, shardings, abstract, seq_len)
  except Exception as e:  # pylint: disable=broad-except
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    # The compiler itself refused: the step cannot fit this chip's memory. Keep its own explanation.
    row.update(compile_s=time.perf_counter() - tic, fits=False, error=_first_line(str(e)))
    return row
  row['compile_s'] = time.perf_counter() - tic
  row.update(_memory(compiled, abstract, target, memory_limit))
  row.update(_speed(compiled, config, target, shards))
  return row


def _first_line(message: str) -> str:
  return next((line.strip() for line in message.splitlines() if 'RESOURCE_EXHAUSTED' in line), message)[:400]


def _memory(compiled, abstract, target: Target, memory_limit) -> dict:
  def per_device(tree):
    return int(sum(math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(tree)))

  mem = compiled.memory_analysis()
  args, out, temp = mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.temp_size_in_bytes
  peak = int(args + out - mem.alias_size_in_bytes + temp)
  hbm = memory_limit or (target.chip.hbm_bytes if target.chip else None)
  return {'per_device_bytes': {'parameters': per_device(abstract['params']),
                               'optimizer': per_device(abstract['opt_state']), 'arguments': int(args),
                               'outputs': int(out), 'activations_and_temporaries': int(temp), 'peak': peak},
          'hbm_bytes': hbm, 'fits': None if hbm is None else peak <= hbm}


def _speed(compiled, config, target: Target, shards: int) -> dict:
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  seq_len = int(config.data.seq_len)
  tokens_per_chip = int(config.train.batch_size) * seq_len / len(target.devices)
  model_flops = flops_lib.training_flops_per_token(config.model, seq_len) * tokens_per_chip
  out = {'xla_flops_per_chip': float(cost.get('flops', math.nan)),
         'xla_bytes_accessed_per_chip': float(cost.get('bytes accessed', math.nan)),
         'model_flops_per_chip': model_flops}
  spec = target.chip
  if spec and spec.hbm_bytes_per_s and not math.isnan(out['xla_bytes_accessed_per_chip']):
    compute_s = model_flops / (spec.peak_bf16_tflops * 1e12)
    memory_s = out['xla_bytes_accessed_per_chip'] / spec.hbm_bytes_per_s
    step_s = max(compute_s, memory_s)
    out['estimate'] = {'step_s': step_s, 'bound': 'compute' if compute_s >= memory_s else 'memory',
                       'tokens_per_s': int(config.train.batch_size) * seq_len / step_s,
                       'basis': f'roofline: {spec.peak_bf16_tflops:g} TFLOP/s, '
                                f'{spec.hbm_bytes_per_s / 1e9:g} GB/s ({spec.source})'}
  return out


def _changed(config, *, accum=None, remat=None, fsdp_all=False):
  c = config.copy_and_resolve_references()
  if accum:
    c.train.grad_accum = accum
  if remat:
    c.model.remat = remat
  if fsdp_all:
    c.parallel.data, c.parallel.fsdp = 1, -1
  return c


def _overrides(step, run_accum) -> dict:
  """A ladder step as the config overrides it makes (`--config.KEY=VALUE`), the record a fix is kept as."""
  out = {'train.grad_accum': step['accum']} if step['accum'] != run_accum else {}
  out.update({'model.remat': step['remat']} if step['remat'] else {})
  out.update({'parallel.data': 1, 'parallel.fsdp': -1} if step['fsdp_all'] else {})
  return out


def _describe(overrides: dict, per_chip: int) -> str:
  """The overrides for a reader: 'train.grad_accum=4 (micro-batch 2 per chip), model.remat=full'."""
  parts = []
  for key, value in overrides.items():
    note = (f' (micro-batch {per_chip // value} per chip)' if key == 'train.grad_accum' else
            ' (state over every chip)' if key == 'parallel.fsdp' else '')
    parts.append(f'{key}={value}{note}')
  return ', '.join(parts)


def find_fix(config, target: Target, memory_limit=None, max_compiles: int = 5) -> dict:
  """The least intrusive change that fits, each candidate compiled: gradient accumulation down to one sequence
  per chip (then the fewest accumulation steps that still fit), then full remat, then FSDP over every chip."""
  mesh = mesh_lib.make_mesh(_with_slices(config, target).parallel, list(target.devices))
  per_chip = int(config.train.batch_size) // mesh_lib.batch_shards(mesh, rules_lib.parse_rules(config.parallel.rules))
  accum = int(config.train.grad_accum)
  most = max(per_chip, accum)
  ladder = [dict(accum=most, remat=None, fsdp_all=False), dict(accum=most, remat='full', fsdp_all=False)]
  if int(config.parallel.tensor) == 1 and int(config.parallel.fsdp) != -1:
    ladder.append(dict(accum=most, remat='full', fsdp_all=True))
  if config.model.remat == 'full':
    ladder = [step for step in ladder if step['remat'] is None or step['fsdp_all']]
  ladder = [step for step in ladder if step['accum'] != accum or step['remat'] or step['fsdp_all']]
  tried, best = [], None

  def attempt(step):
    """Compiles the run with `step`'s changes and records the outcome in `tried`."""
    row = compile_step(_changed(config, **step), target, memory_limit)
    overrides = _overrides(step, accum)
    tried.append({'change': _describe(overrides, per_chip), 'overrides': overrides, 'fits': row.get('fits'),
                  'peak_bytes': row.get('per_device_bytes', {}).get('peak')})
    return row

  for step in ladder:
    if len(tried) >= max_compiles:
      break
    row = attempt(step)
    if row.get('fits'):
      best = (step, row)
      break
  while best and len(tried) < max_compiles:  # Fewer accumulation steps run faster.
    step = dict(best[0], accum=best[0]['accum'] // 2)
    if step['accum'] < accum or (step['accum'] == accum and not (step['remat'] or step['fsdp_all'])):
      break  # Never below the run's own count, nor back to the unchanged run (which did not fit).
    row = attempt(step)
    if not row.get('fits'):
      break
    best = (step, row)
  out = {'tried': tried}
  if best:
    step, row = best
    out['overrides'] = _overrides(step, accum)
    out['change'] = _describe(out['overrides'], per_chip)
    out.update({k: row.get(k) for k in ('per_device_bytes', 'compile_s', 'estimate')})
  return out


def check(config, target: Target, *, memory_limit=None, find_fit: bool = True) -> dict:
  """`compile_step`, and when it does not fit, `find_fix`'s verified change (row['fix'])."""
  row = compile_step(config, target, memory_limit)
  if row.get('fits') is False and find_fit:
    row['fix'] = find_fix(config, target, memory_limit)
  return row


def _num(x, unit, spec):
  return '-' if x is None or math.isnan(x) else format(x / unit, spec)


def _gb(n):
  return '-' if n is None else f'{n / 1e9:.1f}'


def table(rows: list[dict]) -> str:
  """A Markdown table, one line per (run, target)."""
  head = ('| arch | scale | T | target | chips | mesh (data/fsdp/tensor) | batch/chip | fits | peak GB / HBM GB | '
          'compile s | XLA TFLOP/chip | XLA GB accessed/chip | est. step s (bound) | est. tok/s | fix |')
  lines = [head, '|' + '---|' * head.count(' | ') + '---|']
  for r in rows:
    mesh = '/'.join(str(r['mesh'][a]) for a in mesh_lib.AXES)
    est = r.get('estimate') or (r.get('fix') or {}).get('estimate')  # A step that needs its fix: the fixed one.
    bound = est and (est['bound'] + ('' if r.get('estimate') else ', with the fix'))
    fix = r.get('fix', {}).get('change') or ('none found' if 'fix' in r else '')
    fits = {True: 'yes', False: 'no', None: '?'}[r.get('fits')]
    peak = r.get('per_device_bytes', {}).get('peak')
    batch = f"{r['per_chip_batch']:g}" + (f" ({r['grad_accum']} accum)" if r['grad_accum'] > 1 else '')
    lines.append(
        f"| {r['arch']} | {r['scale']} | {r['seq_len']} | {r['target']} | {r['chips']} | {mesh} | {batch} | {fits} | "
        f"{_gb(peak)} / {_gb(r.get('hbm_bytes'))} | {r['compile_s']:.0f} | "
        f"{_num(r.get('xla_flops_per_chip'), 1e12, '.1f')} | {_num(r.get('xla_bytes_accessed_per_chip'), 1e9, '.0f')} | "
        + (f"{est['step_s']:.2f} ({bound}) | {est['tokens_per_s']:,.0f}" if est else '- | -')
        + f' | {fix} |')
  return '\n'.join(lines)


def fake_cpu_target(devices: int | None) -> Target:
  """`devices` fake CPU devices (only before jax starts: compile-check sets jax_num_cpu_devices)."""
  if devices:
    try:
      jax.config.update('jax_num_cpu_devices', int(devices))
    except Exception:  # pylint: disable=broad-except  # Backends already running: the check below explains.
      pass
  if devices and jax.default_backend() == 'cpu' and jax.device_count() < devices:
    raise mesh_lib.MeshError(f'--devices={devices}: only {jax.device_count()} CPU devices; compile-check fakes '
                             'them when started fresh (python -m hybrid_jax compile-check sets jax_num_cpu_devices)')
  found = jax.devices()[:devices] if devices else jax.devices()
  return Target(f'{found[0].platform} x {len(found)}', tuple(found))

