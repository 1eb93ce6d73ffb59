"""Tracing retrieval heads across a run's saved checkpoints (how fast they sharpen and settle).

For given heads (default: the top-4 attention-mass retrieval heads of the final checkpoint), at every saved step:
- normalised attention entropy over the last 4 prompt queries (H / ln(visible keys); lower = sharper), and the
  head's retrieval mass, on the same needle prompts at every step;
- Q/K weight distance to a reference checkpoint (default: the final one): ||W_t - W_ref||_F and, relative,
  ||W_t - W_ref||_F / ||W_ref||_F, for the head's query slice wq[:, h] and its KV group's key slice wk[:, h // G].
`overlay` draws several runs' traces on one figure (e.g. SWA-128 vs SWA-512 vs SWA-2048 vs Full).
"""

import pathlib

import numpy as np
import tqdm

from hybrid_jax import readers
from hybrid_jax.inspection import forward as forward_lib
from hybrid_jax.analysis import needle_probe, needles, report, retrieval_heads
from hybrid_jax.errors import InputError
from hybrid_jax.train.runs import RunError, checkpoint_steps, load_run


def parse_heads(text: str) -> list[tuple[int, int]]:
  """'3:1,5:0' -> [(3, 1), (5, 0)] (layer:head pairs)."""
  heads = []
  for item in filter(None, (text or '').split(',')):
    layer, sep, head = item.partition(':')
    if not sep or not layer.strip().isdigit() or not head.strip().isdigit():
      raise InputError(f'bad head {item!r}: expected LAYER:HEAD, e.g. 3:1')
    heads.append((int(layer), int(head)))
  return heads


def head_weights(run_or_model, cfg, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
  """(query slice [d, head_dim], key slice [d, head_dim]) of one attention head (scanned stacks included)."""
  mixer = forward_lib.blocks(run_or_model)[layer].mixer
  groups = cfg.num_heads // cfg.num_kv_heads
  return np.asarray(mixer.wq[...])[:, head], np.asarray(mixer.wk[...])[:, head // groups]


def _check_heads(heads, cfg):
  attention = {l.index for l in forward_lib.layers(cfg) if l.is_attention}
  for layer, head in heads:
    if layer not in attention:
      raise InputError(f'layer {layer} is not an attention layer; attention layers: {sorted(attention)}')
    if not 0 <= head < cfg.num_heads:
      raise InputError(f'head {head} outside 0..{cfg.num_heads - 1}')


def trace(workdir, *, heads=None, reference_step=None, source='study', num_samples=20, length=None, seed=42,
          top_k=4, batch_size=8, progress=True) -> dict:
  """The trace of `heads` ([(layer, head)]) over every saved step of the run in `workdir`."""
  steps = checkpoint_steps(workdir)
  if not steps:
    raise RunError(f'{workdir} has no checkpoints to trace')
  final = load_run(workdir, steps[-1])
  cfg, tokenizer = final.config.model, final.tokenizer
  if heads is not None:
    _check_heads(heads, cfg)
  length = length or int(final.config.data.seq_len)
  samples = needles.make_samples(source, num_samples, length=length, tokenizer=tokenizer, seed=seed, values=None,
                                 data_cfg=final.config.data)
  if heads is None:
    found = retrieval_heads.score(final.model_def, cfg, final.params, samples, tokenizer, top_k=top_k,
                                  batch_size=batch_size)
    heads = [(h['layer'], h['head']) for h in found['top_heads']['mass']]
  reference = final if reference_step in (None, steps[-1]) else load_run(workdir, reference_step)
  ref_weights = {h: head_weights(reference.model, cfg, *h) for h in heads}
  encoded, _ = retrieval_heads.encode_all(samples, tokenizer)
  probe = needle_probe.NeedleProbe(final.model_def, cfg)
  rows = {l.index: i for i, l in enumerate(probe.layers)}
  per_head = {h: {k: [] for k in ('entropy', 'mass', 'q_distance', 'q_relative', 'k_distance', 'k_relative')}
              for h in heads}
  for step in tqdm.tqdm(steps, desc='checkpoints', disable=not progress):
    run = final if step == steps[-1] else load_run(workdir, step)
    stats = probe.run(run.params, encoded, pad_id=tokenizer.eos_id, batch_size=batch_size)
    model = run.model
    for h in heads:
      entry = per_head[h]
      entry['entropy'].append(float(stats['entropy'][:, rows[h[0]], h[1]].mean()))
      entry['mass'].append(float(stats['mass'][:, rows[h[0]], h[1]].mean()))
      for name, w, w_ref in zip('qk', head_weights(model, cfg, *h), ref_weights[h]):
        distance = float(np.linalg.norm(w - w_ref))
        entry[f'{name}_distance'].append(distance)
        entry[f'{name}_relative'].append(distance / max(float(np.linalg.norm(w_ref)), 1e-30))
  heads_out = [{'layer': h[0], 'head': h[1], **per_head[h]} for h in heads]
  return {'workdir': str(workdir), 'steps': steps, 'reference_step': reference.step, 'heads': heads_out,
          'mean_entropy': np.mean([h['entropy'] for h in heads_out], axis=0).tolist(),
          'mean_qk_relative': np.mean([np.add(h['q_relative'], h['k_relative']) / 2 for h in heads_out],
                                      axis=0).tolist(),
          'source': source, 'length': length, 'num_samples': len(encoded), 'seed': seed}


def plot(result: dict, path, *, title: str = '') -> str:
  fig = report.figure(10, 3.6)
  ax_e, ax_d = fig.subplots(1, 2)
  for h in result['heads']:
    label = f"L{h['layer']}H{h['head']}"
    ax_e.plot(result['steps'], h['entropy'], marker='o', label=label)
    ax_d.plot(result['steps'], h['q_relative'], marker='o', label=f'{label} Q')
    ax_d.plot(result['steps'], h['k_relative'], marker='x', linestyle='--', label=f'{label} K')
  ax_e.set(xlabel='step', ylabel='normalised entropy (last 4 queries)', title=f'{title} attention entropy'.strip())
  ax_d.set(xlabel='step', ylabel=f"relative distance to step {result['reference_step']}",
           title=f'{title} Q/K weight distance'.strip())
  ax_e.legend(fontsize=7)
  ax_d.legend(fontsize=6, ncol=2)
  return str(report.save(fig, path))


TRACE_KEYS = ('workdir', 'steps', 'mean_entropy', 'mean_qk_relative')  # What an overlay reads of each trace.


def overlay(inputs, *, labels=None, out='.') -> dict:
  """Overlays the mean entropy and mean relative Q/K distance of several traces (run dirs or tracing.json files)."""
  traces = []
  for item in inputs:
    path = pathlib.Path(item)
    path = path / 'analysis' / 'tracing.json' if path.is_dir() else path
    if not path.is_file():
      raise RunError(f'no trace at {path}: run `python -m hybrid_jax analyze tracing --workdir RUN` first')
    traces.append(readers.read_json(path, 'trace', required=TRACE_KEYS))
  labels = list(labels) if labels else [pathlib.Path(t['workdir']).name for t in traces]
  if len(labels) != len(traces):
    raise InputError(f'{len(labels)} labels for {len(traces)} traces')
  fig = report.figure(10, 3.6)
  ax_e, ax_d = fig.subplots(1, 2)
  for label, t in zip(labels, traces):
    ax_e.plot(t['steps'], t['mean_entropy'], marker='o', label=label)
    ax_d.plot(t['steps'], t['mean_qk_relative'], marker='o', label=label)
  ax_e.set(xlabel='step', ylabel='mean normalised entropy', title='retrieval heads: attention entropy')
  ax_d.set(xlabel='step', ylabel='mean relative Q/K distance', title='retrieval heads: distance to reference')
  ax_e.legend()
  ax_d.legend()
  directory = report.output_dir(None, out)
  result = {'runs': [{'label': l, 'workdir': t['workdir'], 'steps': t['steps'], 'mean_entropy': t['mean_entropy'],
                      'mean_qk_relative': t['mean_qk_relative']} for l, t in zip(labels, traces)]}
  result['plot'] = str(report.save(fig, directory / 'tracing_overlay.png'))
  result['json'] = str(report.write_json(directory / 'tracing_overlay.json', result))
  return result


def run(workdir, *, out=None, **kwargs) -> dict:
  """The tool: `tracing.json` and `tracing.png` in the run's analysis folder."""
  result = trace(workdir, **kwargs)
  directory = report.output_dir(workdir, out)
  result['plot'] = plot(result, directory / 'tracing.png', title=pathlib.Path(workdir).name)
  result['json'] = str(report.write_json(directory / 'tracing.json', result))
  return result
