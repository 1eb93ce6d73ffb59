"""The study planner: what a sweep costs before anything runs (`python -m hybrid_jax plan`).

  python -m hybrid_jax plan --sweep sweep:main --tflops 989 --mfu 0.4 --launch-list runs.txt
  python -m hybrid_jax plan --runs hybrid:arch=gdn,scale=s1 'hybrid:arch=full,scale=s2 \
      --config.train.steps=500'
  python -m hybrid_jax plan --sweep sweep:main --fit docs/TPU_FIT.json --chip v5p

For every run: tokens = train.steps x train.batch_size x data.seq_len, D/N (tokens per non-embedding parameter,
the study's budget unit), training FLOPs = tokens x model FLOPs per training token (hybrid_jax.models.flops:
window- and chunk-aware, LM head included, 3 x forward, no remat), and accelerator-hours =
FLOPs / (tflops x 1e12 x mfu) / 3600 on one device of the stated peak and utilisation. Evaluation, checkpointing
and compile time are not included.

`--fit FILE` (compile-check's `--json` rows, e.g. docs/TPU_FIT.json) adds the TPU view: for each run, the row of
the same arch, scale and sequence length on the `--chip` generation gives the topology and its roofline step time
(the fixed step's where the study's setting needed a fix); wall hours = steps x step time x (run batch / row batch)
/ mfu, and TPU chip-hours = wall hours x chips. The roofline is a lower bound, so `--mfu` scales it as it does the
FLOP count; both remain estimates.

A run is one config string: `FILE[:ARG]` optionally followed by `--config.KEY=VALUE` overrides (what `train`
accepts). A sweep is a Python file whose `runs(name)` returns such strings (`--sweep FILE:NAME`). `--launch-list`
writes one line per run, the hybrid_jax command that follows `--` in the launchers, e.g.
  xargs -L1 python launch/gpu.py local --gpus=1 -- < runs.txt
"""

import shlex

from hybrid_jax.config import ConfigError, load_run
from hybrid_jax.models.counting import param_counts
from hybrid_jax.models.flops import training_flops_per_token
from hybrid_jax.sweep import members as sweep_members


def plan_run(run: str, tflops: float, mfu: float) -> dict:
  """Tokens, steps, FLOPs and accelerator-hours of one run string."""
  spec, overrides, config = load_run(run)
  t, seq_len = config.train, config.data.seq_len
  tokens = t.steps * t.batch_size * seq_len
  per_token = training_flops_per_token(config.model, seq_len)
  n = param_counts(config.model)['non_embedding']
  total = per_token * tokens
  return {'run': run, 'spec': spec, 'overrides': overrides, 'name': config.name, 'arch': config.model.arch,
          'scale': config.model.scale, 'seq_len': seq_len, 'batch_size': t.batch_size, 'steps': t.steps,
          'tokens': tokens, 'non_embedding_params': n, 'tokens_per_param': tokens / n,
          'flops_per_token': per_token, 'training_flops': total,
          'accelerator_hours': total / (tflops * 1e12 * mfu) / 3600}


def tpu_estimate(run: dict, fit_row: dict | None, mfu: float) -> dict:
  """Topology, wall hours and chip-hours of one planned run from its compile-check row (None fields if no row)."""
  if fit_row is None:
    return {'tpu_target': None, 'tpu_change': None, 'tpu_wall_hours': None, 'tpu_chip_hours': None}
  fix = fit_row.get('fix') or {}
  estimate = fit_row.get('estimate') if fit_row.get('fits') else fix.get('estimate')
  change = None if fit_row.get('fits') else fix.get('change', 'does not fit; no fix found')
  if estimate is None:
    return {'tpu_target': fit_row['target'], 'tpu_change': change, 'tpu_wall_hours': None, 'tpu_chip_hours': None}
  wall = run['steps'] * estimate['step_s'] * (run['batch_size'] / fit_row['batch_size']) / mfu / 3600
  return {'tpu_target': fit_row['target'], 'tpu_change': change, 'tpu_wall_hours': wall,
          'tpu_chip_hours': wall * fit_row['chips']}


def make_plan(runs: list[str], tflops: float, mfu: float, fit_rows: dict | None = None) -> dict:
  if not tflops > 0:
    raise ConfigError(f'--tflops={tflops} must be > 0 (peak TFLOP/s of one device)')
  if not 0 < mfu <= 1:
    raise ConfigError(f'--mfu={mfu} must be in (0, 1] (a fraction, e.g. 0.4)')
  rows = [plan_run(r, tflops, mfu) for r in runs]
  sweep_members.unique_workdirs(rows)
  keys = ['tokens', 'steps', 'training_flops', 'accelerator_hours']
  if fit_rows is not None:
    for r in rows:
      r.update(tpu_estimate(r, fit_rows.get((r['arch'], r['scale'], r['seq_len'])), mfu))
    keys += ['tpu_wall_hours', 'tpu_chip_hours']
  total = {k: sum(r[k] or 0 for r in rows) for k in keys}
  return {'tflops': tflops, 'mfu': mfu, 'tpu': fit_rows is not None, 'runs': rows, 'total': total}


def launch_lines(plan: dict) -> list[str]:
  """One hybrid_jax command per run, as the launchers take it after `--`."""
  return [shlex.join(['train', f"--config={r['spec']}", *r['overrides'], f"--workdir={r['workdir']}"])
          for r in plan['runs']]


def _si(x):
  for unit, scale in (('Z', 1e21), ('E', 1e18), ('P', 1e15), ('T', 1e12), ('G', 1e9), ('M', 1e6), ('k', 1e3)):
    if abs(x) >= scale:
      return f'{x / scale:.3g}{unit}'
  return f'{x:.3g}'


def _hours(x):
  return f'{x:.3g}' if x < 100 else f'{x:,.0f}'


def table(plan: dict) -> str:
  tpu = plan.get('tpu')
  head = '| run | seq_len | batch | steps | tokens | D/N | FLOP/token | training FLOPs | accelerator-hours |'
  rule = '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
  if tpu:
    head += ' TPU topology (est.) | TPU wall h (est.) | TPU chip-hours (est.) |'
    rule += ' --- | ---: | ---: |'
  lines = [f"accelerator: {plan['tflops']:g} TFLOP/s peak per device at {100 * plan['mfu']:g}% MFU "
           '(training steps only; no eval, checkpoint or compile time)', '', head, rule]
  for r in plan['runs']:
    line = (f"| {r['workdir'].removeprefix('runs/')} | {r['seq_len']} | {r['batch_size']} | {r['steps']:,} | "
            f"{_si(r['tokens'])} | {r['tokens_per_param']:.1f} | {_si(r['flops_per_token'])} | "
            f"{_si(r['training_flops'])} | {_hours(r['accelerator_hours'])} |")
    if tpu:
      target = r['tpu_target'] or 'no compile-check row'
      target += f" with {r['tpu_change']}" if r['tpu_change'] else ''
      line += ' ' + ' | '.join([target] + ['-' if r[k] is None else _hours(r[k])
                                           for k in ('tpu_wall_hours', 'tpu_chip_hours')]) + ' |'
    lines.append(line)
  t = plan['total']
  total = (f"| **total ({len(plan['runs'])} runs)** | | | {t['steps']:,} | {_si(t['tokens'])} | | | "
           f"{_si(t['training_flops'])} | {_hours(t['accelerator_hours'])} |")
  if tpu:
    total += f" | {_hours(t['tpu_wall_hours'])} | {_hours(t['tpu_chip_hours'])} |"
  lines.append(total)
  if tpu and any(r['tpu_chip_hours'] is None for r in plan['runs']):
    lines.append('\nRuns without a TPU estimate (`-`) count as zero in the TPU totals.')
  return '\n'.join(lines)
