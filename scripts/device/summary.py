"""The summary table of one `scripts/device/measure.sh` call: every measured ratio against its target.

Reads OUT/attention.json, OUT/scan.json and OUT/step.json (whatever of them exists; a missing or partial file gives
'not measured' cells, never an error) and writes OUT/summary.md. Targets are same-run ratios on one H200 at the
shapes of docs/BENCHMARKING.md (attention 1 x 32K, scans 4 x 8K, training step S4 16K x 8).

  python3 scripts/device/summary.py OUT
"""

import json
import pathlib
import sys

ATTENTION_TARGETS = {128: 1.5, 512: 1.2, 2048: 1.0, None: 0.8}  # window -> pallas_gpu fwd+bwd speed vs cuDNN.
SCAN_TARGET = 1.0  # pallas_gpu fwd+bwd speed vs fla, both scans.
MFU_TARGETS = {'full': 0.45, 'swa128_nope': 0.40, 'gdn': 0.30}  # Training-step MFU (bf16 dense peak).
DOCUMENTS_TARGET = 1.0  # cuDNN (packed documents) fwd+bwd speed vs pallas_gpu on the same documents, w128 and full.


def _load(path):
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _cell(value, target, fmt='{:.2f}'):
  if value is None:
    return 'not measured', ''
  return fmt.format(value), 'met' if value >= target else 'missed'


def attention_rows(data):
  rows = ((data or {}).get('bench') or {}).get('rows', [])
  out = []
  for window, target in ATTENTION_TARGETS.items():
    row = next((r for r in rows if r.get('impl') == 'pallas_gpu' and r.get('window') == window), {})
    value, verdict = _cell(row.get('fwd_bwd_vs_cudnn'), target)
    if 'error' in row:
      value = 'error: ' + row['error'].splitlines()[0][:80]
    out.append((f"attention w{window or 'full'} fwd+bwd vs cuDNN", value, f'>= {target}', verdict))
  out += documents_rows(data)
  parity = (data or {}).get('parity') or {}
  cases = parity.get('rows', [])
  passed = sum(bool(r.get('ok')) for r in cases)
  out.append(('attention parity cases passed', f'{passed}/{len(cases)}' if cases else 'not measured',
              'all', 'met' if cases and passed == len(cases) else ('missed' if cases else '')))
  return out


def documents_rows(data):
  """cuDNN's packed documents against pallas_gpu on the same rows, at the longest T measured, per window."""
  rows = [r for r in ((data or {}).get('cudnn_documents') or {}).get('rows', []) if r.get('documents')]
  out = []
  for window in (128, None):
    here = [r for r in rows if r.get('window') == window]
    t = max((r.get('T', 0) for r in here), default=None)
    cudnn, pallas = (next((r for r in here if r.get('impl') == impl and r.get('T') == t), {})
                     for impl in ('cudnn', 'pallas_gpu'))
    ms = cudnn.get('fwd_bwd_ms'), pallas.get('fwd_bwd_ms')
    value, verdict = _cell(ms[1] / ms[0] if None not in ms else None, DOCUMENTS_TARGET)
    if cudnn.get('ran'):  # The dispatcher fell back: the row timed another kernel.
      value, verdict = f"ran {cudnn['ran']}", ''
    for row in (cudnn, pallas):
      if 'error' in row:
        value, verdict = 'error: ' + row['error'].splitlines()[0][:80], ''
    out.append((f"attention documents w{window or 'full'} fwd+bwd cuDNN vs pallas_gpu", value,
                f'>= {DOCUMENTS_TARGET}', verdict))
  cases = ((data or {}).get('documents_parity') or {}).get('rows', [])
  passed = sum(bool(r.get('ok')) for r in cases)
  out.append(('attention documents parity cases passed', f'{passed}/{len(cases)}' if cases else 'not measured',
              'all', 'met' if cases and passed == len(cases) else ('missed' if cases else '')))
  return out


def scan_rows(data):
  rows = (data or {}).get('rows', [])
  out = []
  for kernel in ('linear_scan', 'gated_delta_rule'):
    for impl in ('pallas_gpu', 'xla'):
      row = next((r for r in rows if r.get('kernel') == kernel and r.get('impl') == impl), {})
      value, verdict = _cell(row.get('fwd_bwd_vs_fla'), SCAN_TARGET)
      if 'error' in row:
        value = 'error: ' + row['error'].splitlines()[0][:80]
      out.append((f'{kernel} {impl} fwd+bwd vs fla', value, f'>= {SCAN_TARGET}', verdict))
  cases = (data or {}).get('parity', [])
  passed = sum(bool(r.get('ok')) for r in cases)
  out.append(('scan parity cases passed', f'{passed}/{len(cases)}' if cases else 'not measured', 'all',
              'met' if cases and passed == len(cases) else ('missed' if cases else '')))
  return out


def step_rows(data):
  runs = {r.get('run'): r for r in data or []}
  out = []
  for arch, target in MFU_TARGETS.items():
    run = runs.get(arch, {})
    value, verdict = _cell((run.get('step') or {}).get('mfu'), target, '{:.1%}')
    if 'error' in run:
      value = run['error']
    out.append((f'step {arch} MFU', value, f'>= {target:.0%}', verdict))
  run = runs.get('gdn_pallas_scan', {})
  gdn = (runs.get('gdn', {}).get('step') or {}).get('step_s_median')
  mine = (run.get('step') or {}).get('step_s_median')
  value = 'not measured' if gdn is None or mine is None else f'{gdn / mine:.2f}'
  out.append(('step gdn with Pallas scans, speed vs the XLA scans', value, '> 1 to switch', ''))
  return out


def summary(out_dir) -> str:
  out_dir = pathlib.Path(out_dir)
  rows = (attention_rows(_load(out_dir / 'attention.json')) + scan_rows(_load(out_dir / 'scan.json'))
          + step_rows(_load(out_dir / 'step.json')))
  lines = ['| measure | value | target | |', '| --- | --- | --- | --- |']
  lines += [f'| {name} | {value} | {target} | {verdict} |' for name, value, target, verdict in rows]
  return '\n'.join(lines) + '\n'


def main(argv=None):
  [out_dir] = sys.argv[1:] if argv is None else argv
  text = summary(out_dir)
  (pathlib.Path(out_dir) / 'summary.md').write_text(text)
  print(text, end='')
  return 0


if __name__ == '__main__':
  sys.exit(main())
