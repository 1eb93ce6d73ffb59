"""Does a run fit its target, and which change that makes it fit is fastest? The train step compiled from shapes.

`compile_step` compiles the sharded train step (kernels chosen for the target's platform) for fake CPU devices or
for a TPU topology described by libtpu (no TPU needed) and reports per chip: compiled memory against the chip's HBM,
XLA's FLOPs and bytes accessed, and `estimate.step_estimate`, a roofline of the step time that counts recomputed
FLOPs, accumulation and the mesh's collectives (labelled an estimate everywhere it appears). XLA's cost analysis
counts a loop body once, not times its trip count, and sees nothing inside Pallas kernels, so its FLOPs are far
below the step's (the estimate uses the model's) and its bytes are a lower bound. A configuration that does not fit
gets `recommend`: the changes that trade speed or memory (optimizer-state sharding, remat 'minimal', gradient
accumulation, full remat, FSDP over every chip, each row split over several chips by context parallelism, an MoE
model's experts split over several chips by expert parallelism), each compiled, and of those that fit the one with
the lowest estimate.
"""

import dataclasses
import math
import time

import jax

from hybrid_jax.compile_check import attention_work, estimate as estimate_lib
from hybrid_jax.kernels import platform
from hybrid_jax.models import moe
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


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What compiling a config for a target needs, and what the estimate reads before compiling."""
  config: object
  mesh: object
  shards: int  # Ways the batch is split.
  model_def: object
  tx: object
  shardings: object
  abstract: dict
  param_bytes: int  # All parameters, unsharded.


def _plan(config, target: Target) -> _Plan:
  config = _with_slices(config, target)
  mesh = mesh_lib.make_mesh(config.parallel, list(target.devices))
  rules = rules_lib.parse_rules(config.parallel.rules)
  # A sequence axis that resolves (-1) to ways data.seq_len does not divide: one line, before anything is built.
  mesh_lib.check_sequence(int(config.data.seq_len), dict(mesh.shape), rules)
  model_def = state_lib.make_model_def(config.model)
  tx = optim.make_optimizer(config.train)
  shardings = mesh_lib.train_shardings(model_def, tx, mesh, rules, bool(config.parallel.shard_optimizer))
  abstract = state_lib.abstract_train_state(state_lib.abstract_initial_state(config.model, config.seed, tx),
                                            shardings.state)
  param_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(abstract['params']))
  return _Plan(config, mesh, mesh_lib.batch_shards(mesh, rules), model_def, tx, shardings, abstract,
               int(param_bytes))


def _estimate(plan: _Plan, target: Target, xla_bytes=None):
  return estimate_lib.step_estimate(plan.config, target.chip, chips=len(target.devices),
                                    mesh_shape=dict(plan.mesh.shape), param_bytes=plan.param_bytes,
                                    xla_bytes=xla_bytes)


def compile_step(config, target: Target, memory_limit: float | None = None) -> dict:
  """One row: the step compiled for `target` (or why it could not be), memory per chip, FLOPs, estimate.

  It fits when the compiled peak is within `memory_limit` bytes (default: the chip's HBM; unknown for CPUs).
  """
  plan = _plan(config, target)
  config, t, seq_len = plan.config, plan.config.train, int(plan.config.data.seq_len)
  row = {'arch': config.model.arch, 'scale': config.model.scale, 'seq_len': seq_len, 'target': target.name,
         'device_kind': target.devices[0].device_kind, 'chips': len(target.devices), 'mesh': dict(plan.mesh.shape),
         'batch_size': int(t.batch_size), 'per_chip_batch': int(t.batch_size) / plan.shards,
         'grad_accum': int(t.grad_accum), 'remat': config.model.remat,
         'shard_optimizer': bool(config.parallel.shard_optimizer), 'packing': config.data.get('packing', 'concat')}
  row['attention_work'] = attention_work.layers(config.model, seq_len)  # Splash's computed work per layer.
  if moe.layer_count(config.model):  # An MoE model: not its dense arch's step (tables name it `gdn e8k2`).
    m = config.model.moe
    with platform.targeting(list(target.devices)):
      dispatch = moe.implementation(str(m.implementation))
    row['moe'] = {'experts': int(m.num_experts), 'top_k': int(m.top_k), 'expert_width': moe.expert_width(
        config.model), 'layers': moe.layer_count(config.model), 'implementation': dispatch}
  try:
    mesh_lib.check_batch(t, row['mesh'], rules_lib.parse_rules(config.parallel.rules))
  except mesh_lib.MeshError as e:
    # Fewer rows than batch shards (one long sequence over many chips): no layout to compile, but a fix (each row
    # over several chips, parallel.sequence) may have one, so the row does not fit rather than stopping the check.
    row.update(compile_s=0.0, fits=False, error=str(e))
    return row
  tic = time.perf_counter()
  try:
    compiled = step_lib.compile_train_step(plan.model_def, plan.tx, t, plan.shardings, plan.abstract, seq_len,
                                           config.data.get('packing', 'concat'))
  except Exception as e:  # pylint: disable=broad-except
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    # The compiler itself refused: the step cannot fit this chip's memory. Keep its own explanation.
    row.update(compile_s=time.perf_counter() - tic, fits=False, error=_first_line(str(e)))
    return row
  row['compile_s'] = time.perf_counter() - tic
  row.update(_memory(compiled, plan.abstract, target, memory_limit))
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  row.update(xla_flops_per_chip=float(cost.get('flops', math.nan)),
             xla_bytes_accessed_per_chip=float(cost.get('bytes accessed', math.nan)))
  xla_bytes = row['xla_bytes_accessed_per_chip']
  estimate = _estimate(plan, target, None if math.isnan(xla_bytes) else xla_bytes)
  if estimate:
    row.update(model_flops_per_chip=estimate['model_flops_per_chip'], estimate=estimate)
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


def _changed(config, overrides: dict):
  """A copy of `config` with `overrides` ({'train.grad_accum': 2, ...}) applied."""
  c = config.copy_and_resolve_references()
  for key, value in overrides.items():
    *parents, name = key.split('.')
    node = c
    for part in parents:
      node = node[part]
    node[name] = value
  return c


def _describe(overrides: dict, per_chip: float, config) -> str:
  """The overrides for a reader: 'train.grad_accum=4 (micro-batch 2 per chip), model.remat=full'. `per_chip`: rows
  per chip per step as `config` sets it; a change to more sequence ways gives each chip as many times the rows,
  each as many times shorter."""
  ways = int(config.parallel.sequence)
  split = int(overrides.get('parallel.sequence', ways))
  rows = per_chip * split / ways
  parts = []
  for key, value in overrides.items():
    if key == 'parallel.data' and overrides.get('parallel.fsdp') == -1:
      continue  # Said by the fsdp part.
    if key == 'parallel.sequence':
      tokens = int(config.data.seq_len) // (value * int(config.parallel.dcn_sequence))
      note = f' (each row split over {value} chips, {tokens:,} tokens on each)'
    elif key == 'parallel.expert':
      num = int(config.model.moe.num_experts)
      note = f' (each chip holds {num // (value * int(config.parallel.dcn_expert))} of the {num} experts)'
    else:
      note = (f' (micro-batch {rows / value:g} per chip)' if key == 'train.grad_accum' else
              ' (parallel.data=1: params and optimizer state over every chip)' if key == 'parallel.fsdp' else '')
    parts.append(f'{key}={value}{note}')
  return ', '.join(parts)


def _sequence_splits(config, per_chip: float, ici_data: int) -> list[dict]:
  """Context parallelism as a memory fix: s = 2, 4, ... of the data ways within a slice become sequence ways, while
  s divides them and data.seq_len still splits. Each chip then holds s times the rows (`per_chip` x s), each 1/s as
  long: the same tokens, so the same memory, unless accumulation splits them further; each change comes with the
  accumulation that makes a micro-batch one row, T/s tokens per chip, which no accumulation of whole rows reaches.
  None when the sequence axis is free (-1), split by no rule, or the batch is not split over 'data'."""
  p = config.parallel
  rules = rules_lib.parse_rules(p.rules)
  ways, dcn = int(p.sequence), int(p.dcn_sequence)
  if -1 in (ways, dcn) or 'sequence' not in rules.get('seq', ()) or 'data' not in rules.get('batch', ()):
    return []
  seq_len, accum = int(config.data.seq_len), int(config.train.grad_accum)
  out, s = [], 2
  while ici_data % s == 0:
    rows = per_chip * s
    if rows >= 1 and rows == int(rows) and seq_len % (ways * s * dcn) == 0:
      change = {} if int(p.data) == -1 else {'parallel.data': ici_data // s}  # -1 takes what the others leave.
      change['parallel.sequence'] = ways * s
      if int(rows) != accum:
        change['train.grad_accum'] = int(rows)
      out.append(change)
    s *= 2
  return out


def _expert_splits(config, ici_data: int) -> list[dict]:
  """Expert parallelism as a memory fix for a model with MoE layers: e = 2, 4, ... of the data ways within a slice
  become expert ways, while e divides them and the expert count, so each chip holds 1/e of every MoE layer's
  experts, their gradients and optimizer state; the batch keeps its split (over data x expert) and no FLOPs are
  added, only the exchange of each MoE layer. None when the rules do not split the experts and the batch over
  'expert', or the batch is not split over 'data'."""
  p = config.parallel
  rules = rules_lib.parse_rules(p.rules)
  batch = rules.get('batch', ())
  if not (moe.layer_count(config.model) and 'expert' in rules.get('expert', ()) and {'data', 'expert'} <= set(batch)):
    return []
  ways, num = int(p.expert) * int(p.dcn_expert), int(config.model.moe.num_experts)
  out, e = [], 2
  while ici_data % e == 0 and num % (ways * e) == 0:
    change = {} if int(p.data) == -1 else {'parallel.data': ici_data // e}  # -1 takes what the others leave.
    out.append({**change, 'parallel.expert': int(p.expert) * e})
    e *= 2
  return out


def candidates(config, per_chip: float, data_ways: int, ici_data: int | None = None) -> list[dict]:
  """The changes that make a step need less memory per chip, as config overrides, those that change least first
  (compile-check's order for ties): optimizer state over the data-parallel chips, remat 'minimal', both; FSDP over
  every chip, alone and with 'minimal' (offered to steps without remat); the experts of a model with MoE layers
  split over 2, 4, ... of the data ways (`_expert_splits`: no FLOPs, an exchange per MoE layer); gradient
  accumulation (2 alone, then each power of two up to one sequence per chip with the cheap changes, then with
  FSDP); each row split over more chips
  (`_sequence_splits`, the fewest alone, then each with the cheap changes; offered where accumulation reaches one
  row per chip or the batch has fewer rows than batch shards: it costs exchanges every layer, and at the same
  micro-batch tokens saves nothing); then remat 'recompute_mlp', then full remat, each with the sharded optimizer
  without and with the most accumulation, with FSDP and the most accumulation, and with the widest split.

  `per_chip`: rows per chip per step, below 1 or not whole when the batch does not split over the batch shards:
  then only the changes that split rows remain (nothing else lays the batch out). `ici_data`: the data ways within
  a slice (default `data_ways`)."""
  accum, remat = int(config.train.grad_accum), config.model.remat
  shard = {'parallel.shard_optimizer': True} if data_ways > 1 and not config.parallel.shard_optimizer else {}
  # 'minimal' saves no more than 'save_dots' (35.6 against 35.5 GB for S1 full on v5p: BENCHMARKS.md, "TPU memory,
  # compiled on CPU"), so it is offered to a step without remat only.
  minimal = {'model.remat': 'minimal'} if remat == 'none' else {}
  fsdp = ({'parallel.data': 1, 'parallel.fsdp': -1}
          if int(config.parallel.tensor) == 1 and int(config.parallel.fsdp) != -1 and data_ways > 1 else {})
  whole = per_chip >= 1 and per_chip == int(per_chip)
  steps, step = [], accum * 2
  while whole and step <= max(per_chip, accum) and per_chip % (step // accum) == 0:
    steps.append(step)
    step *= 2
  # Accumulation keeps whole rows: at one row per chip and micro-batch only a split of the rows saves more.
  floor = per_chip / (steps[-1] if steps else accum)
  splits = _sequence_splits(config, per_chip, ici_data or data_ways) if not whole or floor <= 1 else []
  ways = int(config.parallel.sequence)
  # The sharded optimizer over what data ways a split leaves (none left: nothing to shard over).
  shard_of = lambda split: shard if data_ways * ways // split['parallel.sequence'] > 1 else {}
  out = [shard, minimal, {**shard, **minimal}, fsdp, fsdp and {**fsdp, **minimal}]
  out += _expert_splits(config, ici_data or data_ways)
  out += [{'train.grad_accum': steps[0]}] if steps else []
  out += [{**shard, **minimal, 'train.grad_accum': a} for a in steps]
  # FSDP also shards the parameters: with accumulation it can fit where the sharded optimizer with accumulation is
  # just over (S5 at 32K on v6e:4x8), without recomputing the forward.
  out += [fsdp and {**fsdp, **minimal, 'train.grad_accum': a} for a in steps]
  # Exchanges every layer but no FLOPs: after the changes that cost neither, before any recompute.
  out += splits[:1] + [{**shard_of(split), **minimal, **split} for split in splits]
  deepest = {'train.grad_accum': steps[-1]} if steps else {}
  for policy in [p for p in ('recompute_mlp', 'full') if REMAT_SAVINGS[p] > REMAT_SAVINGS.get(remat, 0)]:
    # Recomputing costs FLOPs, so it comes after every change that does not; 'recompute_mlp' (the MLP's gate and up
    # only) before 'full' (the whole forward).
    change = {'model.remat': policy}
    out += [{**shard, **change}, {**shard, **deepest, **change}, fsdp and {**fsdp, **deepest, **change},
            splits and {**shard_of(splits[-1]), **splits[-1], **change}]
  unique = []
  for o in out:
    if o and o not in unique and (whole or 'parallel.sequence' in o):
      unique.append(o)
  return unique


# How much activation memory each remat policy saves, in order: a policy saves at least what every policy of a
# lower rank saves. 'minimal' and 'save_dots' keep the same bytes (q/k after RoPE against before); 'recompute_mlp'
# keeps 'minimal's tensors but the MLP's; 'full' keeps none.
REMAT_SAVINGS = {'none': 0, 'save_dots': 1, 'minimal': 1, 'recompute_mlp': 2, 'full': 3}


def _dominates(a: dict, b: dict) -> bool:
  """Whether change `a` saves at least the memory that `b` saves: every change of `b` is in `a` (a remat policy
  counts for one that saves no more, by REMAT_SAVINGS; FSDP counts as the sharded optimizer), with at least as many
  accumulation steps. A sequence split counts for one over fewer ways (its data ways are what the split leaves):
  split or not, a micro-batch holds the tokens of (rows per chip as set) / (accumulation steps) whole rows, so the
  accumulation steps compare the activations; but a split does not count for the sharded optimizer of a change
  that splits fewer ways, whose moments it divides over fewer data-parallel chips."""
  splits_more = a.get('parallel.sequence', 0) > b.get('parallel.sequence', 0)
  for key, value in b.items():
    if key == 'train.grad_accum':
      if a.get(key, 1) < value:
        return False
    elif key == 'model.remat':
      if a.get(key) != value and REMAT_SAVINGS.get(a.get(key), -1) <= REMAT_SAVINGS[value]:
        return False
    elif key == 'parallel.shard_optimizer':
      if splits_more or not (a.get(key) or a.get('parallel.fsdp') == -1):
        return False
    elif key == 'parallel.sequence':
      if a.get(key, 0) < value:
        return False
    elif key == 'parallel.data' and 'parallel.sequence' in b and 'parallel.sequence' in a:
      continue  # Follows from the sequence ways.
    elif a.get(key) != value:
      return False
  return True


def pick(tried: list[dict]) -> dict | None:
  """The fastest of the compiled candidates that fit: the lowest estimated step time, ties to the earliest."""
  fitting = [t for t in tried if t.get('fits')]
  return min(fitting, key=lambda t: t['estimate']['step_s'] if t.get('estimate') else math.inf, default=None)


def recommend(config, target: Target, memory_limit=None, max_compiles: int = 8) -> dict:
  """Every candidate change (`candidates`) priced before compiling (the estimate without its memory term, a lower
  bound), then compiled cheapest first, skipping those that cannot beat the best fit so far and those that save
  less than one that did not fit, until `max_compiles` are spent; of those that fit, the lowest estimate (`pick`).
  `tried` lists every candidate with what is known of it (and its mesh)."""
  plan = _plan(config, target)
  per_chip = int(config.train.batch_size) / plan.shards
  per_chip = int(per_chip) if per_chip == int(per_chip) else per_chip
  slices = len({getattr(d, 'slice_index', 0) for d in target.devices})
  ici_data = mesh_lib.mesh_shape(plan.config.parallel, len(target.devices), slices)[0]['data']
  tried = []
  for rank, overrides in enumerate(candidates(config, per_chip, int(plan.mesh.shape['data']), ici_data)):
    changed = _changed(config, overrides)
    changed_plan = _plan(changed, target)
    prior = _estimate(changed_plan, target)
    tried.append({'change': _describe(overrides, per_chip, config), 'overrides': overrides, 'rank': rank,
                  'mesh': dict(changed_plan.mesh.shape), 'prior_step_s': prior['step_s'] if prior else None,
                  'config': changed})
  compiled = 0
  for t in sorted(tried, key=lambda t: (t['prior_step_s'] or 0, t['rank'])):
    best = pick(tried)
    if best and best.get('estimate') and t['prior_step_s'] is not None and (
        t['prior_step_s'] >= best['estimate']['step_s']):
      t['skipped'] = 'cannot beat the best fit (its estimate before compiling is already as slow)'
    elif any(u.get('fits') is False and _dominates(u['overrides'], t['overrides']) for u in tried):
      t['skipped'] = 'saves less memory than a change that did not fit'
    elif compiled >= max_compiles:
      t['skipped'] = f'not compiled ({max_compiles} compiles spent)'
    else:
      row = compile_step(t['config'], target, memory_limit)
      compiled += 1
      t.update({k: row.get(k) for k in ('fits', 'estimate', 'compile_s', 'error', 'per_device_bytes')},
               peak_bytes=row.get('per_device_bytes', {}).get('peak'))
  for t in tried:
    del t['config']
  out = {'tried': tried}
  best = pick(tried)
  if best:
    out.update({k: best.get(k) for k in ('overrides', 'change', 'mesh', 'per_device_bytes', 'compile_s', 'estimate')})
  return out


def check(config, target: Target, *, memory_limit=None, find_fit: bool = True) -> dict:
  """`compile_step`, and when it does not fit, `recommend`'s fastest verified change (row['fix'])."""
  row = compile_step(config, target, memory_limit)
  if row.get('fits') is False and find_fit:
    row['fix'] = recommend(config, target, memory_limit)
  return row


def _num(x, unit, spec):
  return '-' if x is None or math.isnan(x) else format(x / unit, spec)


def _gb(n):
  return '-' if n is None else f'{n / 1e9:.1f}'


def short(overrides: dict) -> str:
  """'grad_accum=2, remat=minimal': a change by its keys' last parts (parallel.data=1 goes without saying)."""
  return ', '.join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()
                   if not (k == 'parallel.data' and overrides.get('parallel.fsdp') == -1))


def fix_cell(fix: dict) -> str:
  """The recommended change, then every other candidate: peak and estimate when compiled, why not otherwise."""
  def said(t):
    if 'skipped' in t:
      return f"{short(t['overrides'])}: not compiled"
    peak = f"{_gb(t.get('peak_bytes'))} GB" if t.get('peak_bytes') else 'refused'
    est = f", {t['estimate']['step_s']:.3f} s" if t.get('estimate') and t.get('fits') else ''
    return f"{short(t['overrides'])}: {'fits' if t.get('fits') else 'no'} {peak}{est}"
  others = [said(t) for t in fix.get('tried', []) if t.get('overrides') != fix.get('overrides')]
  head = f"**{short(fix['overrides'])}**" if fix.get('overrides') else 'none found'
  return head + (f" (others: {'; '.join(others)})" if others else '')


def _ici_note(est: dict) -> str:
  share = est.get('collective_s', 0) / est['step_s']
  return f' + {share:.0%} ICI' if share >= 0.005 else ''


def table(rows: list[dict]) -> str:
  """A Markdown table, one line per (run, target). A row split over several chips (parallel.sequence) shows its
  batch per chip as rows of T/n tokens, and a fix that splits rows says so in the fix column (sequence=n). A mesh
  with an expert axis names it in its cell ('2/1/1/1, expert 4'); an MoE model's arch cell names its experts and
  top k ('gdn e8k2')."""
  # The header comes before the rows compile: the expert axis is named in the cells of the rows that use it.
  axes = [a for a in mesh_lib.AXES if a not in mesh_lib.OPTIONAL_AXES]
  head = (f"| arch | scale | T | target | chips | mesh ({'/'.join(axes)}) | batch/chip | fits | "
          'peak GB / HBM GB | compile s | XLA TFLOP/chip | XLA GB accessed/chip | est. step s (bound) | est. tok/s | '
          'fix |')
  lines = [head, '|' + '---|' * head.count(' | ') + '---|']
  for r in rows:
    mesh = '/'.join(str(r['mesh'].get(a, 1)) for a in axes)  # Rows from before an axis existed: 1 way.
    mesh += ''.join(f', {a} {r["mesh"][a]}' for a in mesh_lib.OPTIONAL_AXES if r['mesh'].get(a, 1) > 1)
    split = r['mesh'].get('sequence', 1)
    est = r.get('estimate') or (r.get('fix') or {}).get('estimate')  # A step that needs its fix: the fixed one.
    bound = est and (est['bound'] + _ici_note(est) + ('' if r.get('estimate') else ', with the fix'))
    fix = fix_cell(r['fix']) if 'fix' in r else ''
    fits = {True: 'yes', False: 'no', None: '?'}[r.get('fits')]
    peak = r.get('per_device_bytes', {}).get('peak')
    batch = (f"{r['per_chip_batch']:g}" + (f" of T/{split}" if split > 1 else '') +
             (f" ({r['grad_accum']} accum)" if r['grad_accum'] > 1 else ''))
    arch = r['arch'] + (f" e{r['moe']['experts']}k{r['moe']['top_k']}" if r.get('moe') else '')
    lines.append(
        f"| {arch} | {r['scale']} | {r['seq_len']} | {r['target']} | {r['chips']} | {mesh} | {batch} | {fits} | "
        f"{_gb(peak)} / {_gb(r.get('hbm_bytes'))} | {r['compile_s']:.0f} | "
        f"{_num(r.get('xla_flops_per_chip'), 1e12, '.1f')} | {_num(r.get('xla_bytes_accessed_per_chip'), 1e9, '.0f')} | "
        + (f"{est['step_s']:.3f} ({bound}) | {est['tokens_per_s']:,.0f}" if est else '- | -')
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

