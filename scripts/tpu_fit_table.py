"""Writes docs/TPU_FIT.md: the study's train steps compiled for TPU topologies sized per scale (compile-check's rows).

  python scripts/tpu_fit_table.py --out docs/TPU_FIT.md                        # every arch x S1-S5 at 16K, S5 at 32K
  python scripts/tpu_fit_table.py --archs swa128,gdn --scales s1 --chips v5p   # a part of it
  python scripts/tpu_fit_table.py --add rows.json       # merge compile-check --json rows (the MoE twins' section)

Each (arch, scale, context, chip) is one `python -m hybrid_jax compile-check --topology=...` row, in one process
(libtpu loads once). Rows are kept in OUT.json as they finish, so an interrupted run resumes where it stopped.
Compiling takes minutes per row on a 2-core host (more for large topologies).
"""

import argparse
import datetime
import importlib.metadata
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# chip -> scale -> topology: sized so that the study's 64 x 16K batch splits evenly and the step fits.
TOPOLOGIES = {
    'v5p': {'s1': 'v5p:2x2x1', 's2': 'v5p:2x2x1', 's3': 'v5p:2x2x2', 's4': 'v5p:2x2x2', 's5': 'v5p:2x4x4'},
    'v6e': {'s1': 'v6e:2x4', 's2': 'v6e:2x4', 's3': 'v6e:4x4', 's4': 'v6e:4x4', 's5': 'v6e:4x8'},
}
# context -> (tokens per sequence, config arguments that set it)
CONTEXTS = {'16k': (16384, ''), '32k': (32768, ',stage=extend32k,init_from=runs/none')}
EXTENDED_SCALES = ('s5',)  # The study extends only its largest models to 32K (PAPER.md, training recipe).
# What the rows were compiled with. Add a revision when a change alters what compile-check reports (memory, FLOPs):
# the next run compiles the rows of older revisions again, and until then the page lists them apart.
REVISIONS = {
    1: 'a whole layer cycle was one remat unit, so a hybrid\'s peak grew with its cycle length (swa128_1to3 at S1 on '
       'v5p: 48.9 GB, 38.3 GB at revision 2)',
    2: 'each block is its own remat unit',
    3: 'the estimate counts recomputed FLOPs, accumulation and collectives; the fix is the fastest that fits among '
       'optimizer-state sharding, remat minimal, FSDP, accumulation and full remat',
    4: 'per-head projections (q/k/v, the recurrent mixers\' inputs) are kept for the backward flat, [B, T, heads * '
       'head_dim]: kept per head, head_dim 64 took 128 lanes',
    5: 'remat recompute_mlp (recomputes the MLP\'s gate and up projections, keeps the mixers\') is offered before '
       'full; full\'s estimate no longer counts the MLP\'s down projection, which XLA never recomputes',
}
REVISION = max(REVISIONS)


def main(argv=None):
  from hybrid_jax.configs import hybrid
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--out', default=str(ROOT / 'docs' / 'TPU_FIT.md'))
  p.add_argument('--archs', default=','.join(hybrid.ARCHES))
  p.add_argument('--scales', default='s1,s2,s3,s4,s5')
  p.add_argument('--chips', default=','.join(TOPOLOGIES))
  p.add_argument('--contexts', default=','.join(CONTEXTS))
  p.add_argument('--render-only', action='store_true', help='rewrite OUT from OUT.json; compile nothing')
  p.add_argument('--add', default='', metavar='JSON[,JSON]',
                 help='merge the rows of these `compile-check --json` files (e.g. MoE twins with the expert axis: '
                 'their own section) into OUT.json at this revision, then render; compile nothing')
  args = p.parse_args(argv)
  chosen = {}
  for flag, allowed in (('archs', hybrid.ARCHES), ('scales', TOPOLOGIES['v5p']), ('chips', TOPOLOGIES),
                        ('contexts', CONTEXTS)):
    chosen[flag] = getattr(args, flag).split(',')
    unknown = [item for item in chosen[flag] if item not in allowed]
    if unknown:
      p.error(f'--{flag}: {", ".join(map(repr, unknown))} not among {", ".join(allowed)}')
  from hybrid_jax.config import load_config_file, resolve_spec, validate
  from hybrid_jax.compile_check import fit as compile_check
  out = pathlib.Path(args.out)
  store = out.with_suffix('.json')
  rows = json.loads(store.read_text()) if store.exists() else []
  for path in filter(None, args.add.split(',')):
    added = [dict(r, revision=REVISION) for r in json.loads(pathlib.Path(path).read_text())]
    rows = [r for r in rows if _key(r) not in {_key(a) for a in added}] + added
    store.write_text(json.dumps(rows, indent=1) + '\n')
  current = {_key(r) for r in rows if _revision(r) == REVISION}
  targets = {}
  grid = len(hybrid.ARCHES) * len(TOPOLOGIES) * (len(TOPOLOGIES['v5p']) + len(EXTENDED_SCALES))
  for context in ([] if args.render_only or args.add else chosen['contexts']):
    for scale in chosen['scales']:
      if context != '16k' and scale not in EXTENDED_SCALES:
        continue
      for arch in chosen['archs']:
        for chip in chosen['chips']:
          topology = TOPOLOGIES[chip][scale]
          seq_len, context_args = CONTEXTS[context]
          config = validate(load_config_file(resolve_spec(f'hybrid:arch={arch},scale={scale}{context_args}')))
          if config.data.seq_len != seq_len:
            raise SystemExit(f'the packaged hybrid config sets seq_len {config.data.seq_len} for {context}; CONTEXTS '
                             f'says {seq_len}')
          key = (arch, scale, seq_len, topology, '')
          if key in current:
            continue
          if topology not in targets:
            targets[topology] = compile_check.tpu_target(topology)
          row = dict(compile_check.check(config, targets[topology]), revision=REVISION)
          rows = [r for r in rows if _key(r) != key] + [row]
          store.write_text(json.dumps(rows, indent=1) + '\n')
          _write(out, rows, grid)
          print(compile_check.table(rows[-1:]).splitlines()[-1], flush=True)
  _write(out, rows, grid)
  print(f'wrote {out} ({len(rows)} rows)')


def _write(out, rows, grid):
  from hybrid_jax.compile_check import fit as compile_check
  versions = ', '.join(f'{n} {importlib.metadata.version(n)}' for n in ('jax', 'jaxlib', 'libtpu', 'flax'))
  header = (f'# The study on Cloud TPU: what fits where\n\nGenerated {datetime.date.today()} by '
            f'`python scripts/tpu_fit_table.py` ({versions}) on a CPU host: each row is\n'
            '`python -m hybrid_jax compile-check --config=hybrid:arch=A,scale=S --topology=T`, the '
            "study's train step\n(64 x 16,384 tokens, or 64 x 32,768 for the extension stage) compiled for the "
            'topology through the Pallas TPU kernels.\n`fits`: compiled peak per chip within the HBM below; '
            '`fix`: of the changes compile-check compiled that fit, the one with the lowest estimate (bold), then the\n'
            'others it tried. **est. step s** is a roofline estimate per chip, max(compute, memory) + collectives '
            '(BUILD.md):\nthe model\'s FLOPs plus what remat and the chunked loss recompute, XLA\'s bytes accessed '
            'times the accumulation\nsteps, the gradient reduction and FSDP gathers over ICI; not a measurement. XLA\'s '
            'counts take each loop body once\n(the scan over layer cycles) and see nothing inside the Pallas kernels, '
            'so the memory term is a lower bound. A step\nthe compiler refuses shows `-` for its peak. '
            f'This page holds {len(_dense(rows))} of the {grid} rows of the whole grid (every arch x S1-S5 '
            'at 16K and S5 at 32K, x v5p/v6e);\n`python scripts/tpu_fit_table.py` adds the rest, resuming from '
            'docs/TPU_FIT.json.\n\n')
  current = [r for r in _dense(rows) if _revision(r) == REVISION]
  older = [r for r in _dense(rows) if _revision(r) != REVISION]
  body = glance(rows) + f'\n\nCompiled at revision {REVISION} ({REVISIONS[REVISION]}), {len(current)} rows:\n\n'
  body += compile_check.table(sorted(current, key=_grid_order)) + '\n'
  if older:
    revisions = '; '.join(f'revision {n}: {REVISIONS[n]}' for n in sorted({_revision(r) for r in older}))
    body += (f'\nCompiled at an older revision, `*` in the matrix, {len(older)} rows that the next run of the script '
             f'compiles again\n({revisions}):\n\n' + compile_check.table(sorted(older, key=_grid_order)) + '\n')
  twins = [r for r in rows if r.get('moe')]
  if twins:
    body += ('\n## MoE twins\n\nThe study grid\'s MoE twins (`--config=hybrid:arch=A,scale=S,experts=E,top_k=K`, '
             "docs/MOE_SHAPES.md: arch `gdn e8k2` is gdn's twin of 8 experts, top 2), compiled by `compile-check` "
             f'(the mesh cell names the expert axis) and merged with `--add`, {len(twins)} rows:\n\n'
             + compile_check.table(sorted(twins, key=_moe_order)) + '\n')
  out.write_text(header + body)


def _key(row):
  return row['arch'], row['scale'], row['seq_len'], row['target'], _twin(row)


def _twin(row):
  """'e8k2' for an MoE twin's row (experts and top k), '' for the dense grid's."""
  moe = row.get('moe')
  return f"e{moe['experts']}k{moe['top_k']}" if moe else ''


def _dense(rows):
  return [r for r in rows if not r.get('moe')]


def _moe_order(row):
  from hybrid_jax.configs import hybrid
  return (row['seq_len'], row['scale'], list(hybrid.ARCHES).index(row['arch']), _twin(row), row['chips'],
          row['target'])


def _revision(row):
  return row.get('revision', 1)  # Rows from before revisions were recorded.


def _grid_order(row):
  """Context, then scale, then the arch order of hybrid_jax/configs/hybrid.py, then chip: the order a reader scans."""
  from hybrid_jax.configs import hybrid
  chip = next(c for c, scales in TOPOLOGIES.items() if row['target'] in scales.values())
  return row['seq_len'], row['scale'], list(hybrid.ARCHES).index(row['arch']), list(TOPOLOGIES).index(chip)


def _verdict(row):
  """'yes', the verified change in short ('grad_accum=2', 'remat=full'), or 'no fit found'."""
  if row.get('fits'):
    return 'yes'
  overrides = (row.get('fix') or {}).get('overrides')
  if not overrides:
    return 'no fit found'
  from hybrid_jax.compile_check import fit as compile_check
  return compile_check.short(overrides)


def glance(rows) -> str:
  """One line per arch, one column per (scale, context): whether the study's step fits each chip as set, and if
  not, the change that was verified to fit; `…` where the row has not been compiled yet, `*` where it was compiled
  at an older revision."""
  from hybrid_jax.configs import hybrid
  chips = list(TOPOLOGIES)
  columns = ([(s, CONTEXTS['16k'][0]) for s in TOPOLOGIES['v5p']] +
             [(s, CONTEXTS['32k'][0]) for s in EXTENDED_SCALES])
  by_key = {_key(r): r for r in rows}
  head = '| arch | ' + ' | '.join(f"{s.upper()} {t // 1024}K" for s, t in columns) + ' |'
  slices = '; '.join(f"{s.upper()} on {' / '.join(TOPOLOGIES[c][s] for c in chips)}" for s in TOPOLOGIES['v5p'])
  lines = [f"At a glance: does the step fit as the study sets it ({' / '.join(chips)})? Slices: {slices}.\n", head,
           '|---|' + '---|' * len(columns)]
  for arch in hybrid.ARCHES:
    cells = []
    for scale, seq_len in columns:
      found = [by_key.get((arch, scale, seq_len, TOPOLOGIES[c][scale], '')) for c in chips]
      cells.append(' / '.join(_verdict(r) + ('*' if _revision(r) != REVISION else '') if r else '…'
                              for r in found))
    lines.append(f"| {arch} | {' | '.join(cells)} |")
  return '\n'.join(lines)


if __name__ == '__main__':
  main()
