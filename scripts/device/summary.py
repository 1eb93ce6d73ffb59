"""The summary of one scripts/device/measure.sh call: every row beside its target, and the dispatchers' choice tables.

  python3 scripts/device/summary.py OUT [--dry-run] [--step-runs "RUN ..."]

Reads OUT/scans.json and OUT/attention.json (scripts/device/kernels.py) and OUT/step.json (scripts/device/steps.py),
whatever of them exists, and writes OUT/summary.md: one line per row the call was to measure (the kernels' cases,
the step runs), measured or not: a missing or partial file gives 'not measured' cells, never an error. Also writes
OUT/choices.json, the tables the automatic choices read that these measurements support: the attention kernel per
window on GPU (`kernels/attention/api.py` `_GPU_BY_WINDOW`) and each scan's GPU implementation
(`kernels/scan_checks.py` `GPU_MEASURED_CHOICE`). All ratios are same-run speeds (other ms / this ms: above 1 is
faster).
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import kernels  # pylint: disable=wrong-import-position
import steps  # pylint: disable=wrong-import-position

ATTENTION_TARGET = 0.9  # Attention on documents (the faster kernel) fwd+bwd vs cuDNN without documents.
SCAN_TARGET = 1.0  # Our faster scan fwd+bwd vs fla (GDN: chunk_gated_delta_rule; Mamba-2, Lightning: chunk_simple_gla).
MFU_TARGETS = {'full': 0.45, 'swa128_nope': 0.45, 'gdn': 0.35}  # S4 16K x 8 step MFU (bf16 dense peak).
FORMS = {'gdn': 'GDN', 'mamba2': 'Mamba-2', 'lightning': 'Lightning'}
DEFAULT_STEP_RUNS = ('full swa128_nope gdn full_concat swa128_nope_concat gdn_concat swa128 mamba2 lightning '
                     'swa128_concat mamba2_concat lightning_concat')
# Attention buckets the dispatcher has and this call does not measure keep their current kernel.
CURRENT_GPU_BY_WINDOW = ((128, 'cudnn'), (512, 'cudnn'), (2048, 'cudnn'), (None, 'cudnn'))


def _load(path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _rows(data, key='rows'):
  if isinstance(data, list):
    return data
  return (data or {}).get(key) or []


def _error(row):
  return 'error: ' + row['error'].splitlines()[0][:80] if row and 'error' in row else None


def _verdict(value, target):
  return '' if value is None or target is None else ('met' if value >= target else 'missed')


def _shape(shape):
  return (f"{shape.name}, {shape.batch} x {shape.t // 1024 if shape.t >= 1024 else shape.t}"
          f"{'K' if shape.t >= 1024 else ''}, {shape.heads}/{shape.key_heads} heads, K {shape.k} V {shape.v}")


def _find(rows, **want):
  return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)


def _best(rows):
  """(ms, impl) of the fastest measured row, or (None, the first error)."""
  done = [r for r in rows if r and r.get('fwd_bwd_ms')]
  if done:
    best = min(done, key=lambda r: r['fwd_bwd_ms'])
    return best['fwd_bwd_ms'], best['impl']
  return None, next((_error(r) for r in rows if _error(r)), None)


def scan_rows(data, dry_run):
  """Per scan case: our faster implementation against fla on the same shape and documents."""
  rows, out = _rows(data), []
  for form, shape, documents, impls in kernels.scan_cases(dry_run):
    where = dict(form=form, shape=shape.name, T=shape.t, documents=documents)
    fla = _find(rows, impl=f'fla:{kernels.FLA_KERNEL[form]}', **where)
    ours_ms, ours = _best([_find(rows, impl=i, **where) for i in impls if i != 'fla'])
    value = fla['fwd_bwd_ms'] / ours_ms if ours_ms and fla and fla.get('fwd_bwd_ms') else None
    note = (f'{ours} {ours_ms:.3f} ms, fla {fla["fwd_bwd_ms"]:.3f} ms' if value else
            ours if not ours_ms else _error(fla) and 'fla ' + _error(fla) or '')
    name = (f'{FORMS[form]} fwd+bwd vs fla {kernels.FLA_KERNEL[form]}, {_shape(shape)}'
            + (f', documents of {documents}' if documents else ''))
    out.append((name, value, SCAN_TARGET, note))
  parity = _rows(data, 'parity')
  out.append(_parity_row('scan parity cases passed', parity))
  return out


def attention_rows(data, dry_run):
  """Per (shape, T, window): attention on documents (the faster of its kernels) against the unmasked call."""
  rows, out, seen = _rows(data), [], set()
  for shape, window, _, _ in kernels.attention_cases(dry_run):
    if (shape, window) in seen:
      continue
    seen.add((shape, window))
    where = dict(shape=shape.name, T=shape.t, window=window)
    plain = next((r for r in rows if r.get('documents') is None and all(r.get(k) == v for k, v in where.items())),
                 None)
    docs = [r for r in rows if r.get('documents') and all(r.get(k) == v for k, v in where.items())]
    ms, impl = _best(docs)
    value = plain['fwd_bwd_ms'] / ms if ms and plain and plain.get('fwd_bwd_ms') else None
    ran = next((r.get('ran') for r in docs if r.get('impl') == impl and r.get('ran')), None)
    note = (f"{impl}{f' (ran {ran})' if ran else ''} {ms:.3f} ms, unmasked {plain['impl']} "
            f"{plain['fwd_bwd_ms']:.3f} ms" if value else impl if not ms else _error(plain) or '')
    name = (f"attention documents vs {'cuDNN' if not dry_run else 'xla'} unmasked, w{window or 'full'}, "
            f'{_shape(shape)}')
    out.append((name, value, ATTENTION_TARGET, note))
  out.append(_parity_row('attention documents parity cases passed', (data or {}).get('documents_parity') or []))
  return out


def _parity_row(name, cases):
  passed = sum(bool(r.get('ok')) for r in cases)
  return (name, f'{passed}/{len(cases)}' if cases else None, 'all',
          'met' if cases and passed == len(cases) else ('missed' if cases else ''))


def step_rows(data, runs, dry_run=False):
  got = {r.get('run'): r for r in _rows(data)}
  shape = steps.DRY_SHAPE if dry_run else steps.SHAPE
  where = f"{shape['scale'].upper()} {shape['seq_len'] // 1024 or shape['seq_len']}{'K' * (shape['seq_len'] >= 1024)}"
  where += f" x {shape['batch_size']}"
  out = []
  for name in runs:
    arch, concat = steps.parse_run(name)
    run = got.get(name) or {}
    step = run.get('step') or {}
    mfu = step.get('mfu')
    note = _error(run) or ''
    if step.get('step_s_median'):
      note = f"{step['step_s_median']:.3f} s/step, {step['tokens_per_s']:,.0f} tokens/s"
      if mfu is None:
        note += f" (no MFU: no bf16 peak for {(run.get('meta') or {}).get('device_kind', 'this device')})"
    out.append((f"step {arch} {'concat' if concat else 'documents'} MFU ({where})", mfu, MFU_TARGETS.get(arch),
                note))
  return out


def _cells(name, value, target, note):
  if isinstance(value, str) or isinstance(target, str):  # Parity: value 'p/n', verdict given.
    return name, value or 'not measured', target, note
  note = note or ''
  text = 'not measured' if value is None else (f'{value:.1%}' if name.startswith('step') else f'{value:.2f}')
  shown = '' if target is None else (f'>= {target:.0%}' if name.startswith('step') else f'>= {target}')
  verdict = _verdict(value, target)
  return name, text, shown, verdict + (f' ({note})' if note and verdict else note)


def choices(scans, attention):
  """The tables the measurements support: per attention window bucket the faster kernel on documents (training's
  rows) summed over the study shapes and T where both ran; per scan pallas_gpu where it beat xla over the study
  shapes (documents included) and passed every parity case, else xla. Unmeasured buckets keep their kernel."""
  att = _rows(attention)
  table, evidence = [], {}
  for bound, current in CURRENT_GPU_BY_WINDOW:
    docs = [r for r in att if r.get('documents') and r.get('window') == bound and r.get('shape') != kernels.ANCHOR]
    totals = {}
    for key in {(r['shape'], r['T'], r['window']) for r in docs}:
      here = {r['impl']: r.get('fwd_bwd_ms') for r in docs if (r['shape'], r['T'], r['window']) == key}
      if here and all(here.values()):
        for impl, ms in here.items():
          totals[impl] = totals.get(impl, 0.0) + ms
    chosen = min(totals, key=totals.get) if totals else current
    table.append([bound, chosen])
    evidence[str(bound)] = {'fwd_bwd_ms_summed': totals} if totals else 'not measured: kept'
  scan_rows_ = _rows(scans)
  parity = _rows(scans, 'parity')
  choice, scan_evidence = {}, {}
  for kernel, forms in (('gated_delta_rule', ('gdn',)), ('linear_scan', ('mamba2', 'lightning'))):
    totals = {}
    study = [r for r in scan_rows_ if r.get('form') in forms and not str(r.get('shape')).startswith(kernels.ANCHOR)]
    for key in {(r['form'], r['shape'], r['documents']) for r in study}:
      here = {r['impl']: r.get('fwd_bwd_ms') for r in study if (r['form'], r['shape'], r['documents']) == key
              and r['impl'] in ('pallas_gpu', 'xla')}
      if len(here) == 2 and all(here.values()):
        for impl, ms in here.items():
          totals[impl] = totals.get(impl, 0.0) + ms
    cases = [r for r in parity if r.get('kernel') == kernel and r.get('impl') in ('pallas_gpu', 'None')]
    parity_ok = bool(cases) and all(r.get('ok') for r in cases)
    faster = bool(totals) and totals['pallas_gpu'] < totals['xla']
    choice[kernel] = 'pallas_gpu' if faster and parity_ok else 'xla'
    scan_evidence[kernel] = {'fwd_bwd_ms_summed': totals or 'not measured', 'parity_passed': parity_ok}
  return {'attention': {'_GPU_BY_WINDOW': table, 'measured': evidence},
          'scans': {'GPU_MEASURED_CHOICE': choice, 'measured': scan_evidence}}


def summary(out_dir, dry_run=False, step_runs=DEFAULT_STEP_RUNS) -> str:
  out_dir = pathlib.Path(out_dir)
  scans, attention = _load(out_dir / 'scans.json'), _load(out_dir / 'attention.json')
  rows = (scan_rows(scans, dry_run) + attention_rows(attention, dry_run)
          + step_rows(_load(out_dir / 'step.json'), step_runs.split(), dry_run))
  lines = ['| row | value | target | verdict |', '| --- | --- | --- | --- |']
  lines += ['| ' + ' | '.join(_cells(*row)) + ' |' for row in rows]
  table = choices(scans, attention)
  (out_dir / 'choices.json').write_text(json.dumps(table, indent=1) + '\n')
  att = tuple(tuple(x) for x in table['attention']['_GPU_BY_WINDOW'])
  lines += ['', 'Choice tables these measurements support (choices.json):',
            f'  kernels/attention/api.py: _GPU_BY_WINDOW = {att}',
            f"  kernels/scan_checks.py: GPU_MEASURED_CHOICE = {table['scans']['GPU_MEASURED_CHOICE']}"]
  return '\n'.join(lines) + '\n'


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('out')
  p.add_argument('--dry-run', action='store_true', help="the dry run's cases (tiny shapes)")
  p.add_argument('--step-runs', default=DEFAULT_STEP_RUNS, help='the step runs the call was to measure')
  args = p.parse_args(argv)
  text = summary(args.out, args.dry_run, args.step_runs)
  (pathlib.Path(args.out) / 'summary.md').write_text(text)
  print(text, end='')
  return 0


if __name__ == '__main__':
  sys.exit(main())
