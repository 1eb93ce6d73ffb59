"""What each attention layer's TPU kernel computes against what it needs: splash computes every block its tables
list whole, so a layer computes `splash_tables.work_ratio` pairs per visible (query, key) pair at the block
`pallas_tpu.block_for` chooses for its window. compile-check reports it per attention layer (the forward's tables;
the backward's list the same blocks). Whole rows of data.seq_len tokens: a row split over chips (parallel.sequence)
runs each kernel on its part; documents are masked inside the blocks, not skipped by the tables, so they leave the
computed work as it is.
"""

from hybrid_jax.kernels.attention import pallas_tpu, splash_tables
from hybrid_jax.models import pattern
from hybrid_jax.models.mixers import attention as attention_mixer, registry


def layers(model_cfg, seq_len: int) -> list[dict]:
  """One entry per distinct (kind, window) of the model's attention layers, in layer order: the layer indices,
  the window (None: full causal, also a window >= T), the splash block, computed and visible pairs per row and
  head, and their ratio. Layers with learned sinks (model.attention_sinks) run XLA's attention: kernel 'xla' and
  no block."""
  out = {}
  learned = bool(model_cfg.get('attention_sinks'))
  for index in range(int(model_cfg.num_layers)):
    spec = pattern.layer_spec(model_cfg, index)
    if not registry.get(spec.kind).attention:
      continue
    for window, _ in attention_mixer.kv_groups(spec, int(model_cfg.num_kv_heads)):
      window = None if window is None or window >= seq_len else int(window)
      entry = out.get((spec.kind, window))
      if entry is None:
        visible = splash_tables.visible_pairs(seq_len, window)
        entry = out[spec.kind, window] = {'kind': spec.kind, 'window': window, 'layers': [], 'visible_pairs': visible}
        if learned:
          entry.update(kernel='xla', block=None, computed_pairs=None, computed_per_visible=None)
        else:
          block = pallas_tpu.block_for(seq_len, window)
          ratio = splash_tables.work_ratio(seq_len, block, window)
          entry.update(kernel='splash', block=block, computed_pairs=round(ratio * visible),
                       computed_per_visible=ratio)
      if index not in entry['layers']:
        entry['layers'].append(index)
  return list(out.values())


def line(row: dict) -> str:
  """One line of a compile-check row's attention work: 'swa w128 (5 layers): block 128, 2.00x; ...'."""
  entries = row.get('attention_work') or []
  if not entries:
    return ''
  parts = []
  for e in entries:
    name = f"{e['kind']} w{e['window']}" if e['window'] else 'full' if e['kind'] == 'full' else f"{e['kind']} full"
    where = f"{len(e['layers'])} layer{'s' if len(e['layers']) > 1 else ''}"
    work = ('XLA (learned sinks)' if e['kernel'] == 'xla' else
            f"block {e['block']}, {e['computed_per_visible']:.2f}x the visible pairs")
    parts.append(f'{name} ({where}): {work}')
  return (f"attention work on TPU, {row['arch']} {row['scale']} T={row['seq_len']} (splash computes each listed "
          f"block whole): " + '; '.join(parts))
