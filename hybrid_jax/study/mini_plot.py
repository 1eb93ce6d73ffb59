"""The mini-study's figure (report.png): what each verdict is read from, one panel per quantity, means over seeds
with the standard deviation as error bars."""

import textwrap

import numpy as np


def mean_curve(report: dict, label: str, key: str) -> list:
  """[(step, mean over seeds)] of curve `key` of arch `label` (steps every seed logged)."""
  curves = [dict(r['curves'].get(key, [])) for r in report['runs'].values() if r['label'] == label]
  steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
  return [(s, float(np.mean([c[s] for c in curves]))) for s in steps]


def _signal_curve(report: dict, label: str, name: str) -> list:
  """[(step, mean over seeds of the q/k gradient norm over every full layer)] for bucket suffix `name`."""
  layers = list(report['summary'][label]['ablation'])
  per_layer = [dict(mean_curve(report, label, f'probe_qk_grad_layer{layer}_{name}')) for layer in layers]
  steps = sorted(set.intersection(*(set(c) for c in per_layer))) if per_layer else []
  return [(s, float(np.sqrt(sum(c[s] ** 2 for c in per_layer)))) for s in steps]


def _colors(report: dict) -> dict:
  return {label: f'C{i}' for i, label in enumerate(report['arches'])}


def _bars(ax, report: dict, key: str, buckets, edges, title: str) -> None:
  labels = list(report['summary'])
  colors = _colors(report)
  width = 0.8 / max(len(labels), 1)
  for i, label in enumerate(labels):
    stats = [report['summary'][label][key][b] for b in buckets]
    ax.bar(np.arange(len(buckets)) + i * width, [s['mean'] or 0 for s in stats], width,
           yerr=[s['std'] or 0 for s in stats], color=colors[label], label=label, capsize=3)
  ax.set_xticks(np.arange(len(buckets)) + 0.4 - width / 2,
                [f'{b}\n({lo} < d <= {hi})' for b, lo, hi in zip(buckets, edges, edges[1:])], fontsize=6)
  ax.set(title=title, ylim=(0, 1.05), ylabel='exact-match accuracy')


def plot_report(report: dict, path) -> None:
  """Eight panels: train loss; recall by distance as trained, restricted and at the longest extrapolation length;
  recall, each full layer's head-ablation score and the gradient to its queries and keys over training; the
  verdicts."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  settings, names, buckets = report['settings'], report['probe_names'], report['buckets']
  labels = list(report['summary'])
  colors = _colors(report)
  fig = Figure(figsize=(20, 9))
  axes = fig.subplots(2, 4)
  ax = axes[0, 0]
  for label in labels:
    curve = mean_curve(report, label, 'train_loss')
    if curve:
      ax.plot(*zip(*curve), color=colors[label], label=label)
  ax.set(title='train loss (mean over seeds)', xlabel='step')
  _bars(axes[0, 1], report, 'accuracy', buckets, report['edges'], 'recall accuracy, as trained')
  _bars(axes[0, 2], report, 'restricted', buckets, report['edges'],
        f"full layers restricted to {settings['small_window']} tokens")
  longest = report['extrapolation'][-1]
  _bars(axes[0, 3], report, 'extrapolation', longest['buckets'], longest['edges'],
        f"documents of {longest['length']} tokens ({settings['seq_len']} in training)")
  ax = axes[1, 0]
  for label in labels:
    curve = mean_curve(report, label, f'probe_recall_accuracy_{names[2]}')
    if curve:
      ax.plot(*zip(*curve), color=colors[label], marker='.', label=label)
  ax.axhline(report['formation_threshold'], color='k', lw=0.8, ls=':', label='formed (beyond the large window)')
  ax.set(title=f'recall {buckets[2]} over training (probe)', xlabel='step', ylim=(0, 1.05))
  ax = axes[1, 1]
  for label in labels:
    for k, layer in enumerate(report['summary'][label]['ablation']):
      curve = mean_curve(report, label, f'probe_recall_ablation_layer{layer}_all_{names[2]}')
      if curve:
        ax.plot(*zip(*curve), ('-', '--', ':', '-.')[k % 4], color=colors[label], marker='.',
                label=f'{label} layer {layer}')
  ax.axhline(settings['ablation_threshold'], color='k', lw=0.8, ls=':', label='formed')
  ax.set(title=f"recall lost by ablating a layer's full heads\n{buckets[2]}", xlabel='step', ylim=(-0.05, 1.05))
  ax = axes[1, 2]
  for label in labels:
    curve = _signal_curve(report, label, names[1])
    if curve:
      ax.plot(*zip(*curve), color=colors[label], marker='.', label=label)
  ax.axvline(settings['signal_until'], color='k', lw=0.8, ls=':', label='read up to here')
  ax.set(title=f"gradient of answers {buckets[1]}\nto the full layers' queries and keys", xlabel='step',
         yscale='log')
  ax = axes[1, 3]
  ax.axis('off')
  lines = [f"{name}: {status.upper()}" for name, status in report.get('verdict_status', {}).items()]
  ax.text(0, 1, 'Verdicts (report.json holds the evidence):\n\n' + '\n\n'.join(textwrap.fill(line, 60) for line in lines),
          va='top', fontsize=7, family='monospace')
  for ax in axes.ravel()[:-1]:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  fig.suptitle(f"mini-study on the recall task, preset {report['preset']}, seeds {report['seeds']}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def plot_seeds(report: dict, path) -> None:
  """One panel per arch: recall beyond the large window over training, one line per seed. The means of report.png
  hide whether an arch forms late in every seed or forms in some seeds and never in others; this shows which."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  labels = list(report['summary'])
  key = f"probe_recall_accuracy_{report['probe_names'][2]}"
  columns = min(5, max(len(labels), 1))
  rows = -(-len(labels) // columns)
  fig = Figure(figsize=(3.2 * columns, 2.6 * rows))
  axes = np.atleast_1d(fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False)).ravel()
  for ax, label in zip(axes, labels):
    runs = sorted((r for r in report['runs'].values() if r['label'] == label), key=lambda r: r['seed'])
    for run in runs:
      curve = run['curves'].get(key, [])
      if curve:
        ax.plot(*zip(*curve), lw=1, label=f"seed {run['seed']}")
    ax.axhline(report['formation_threshold'], color='k', lw=0.8, ls=':')
    ax.set(title=label, ylim=(0, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=5)
  for ax in axes[len(labels):]:
    ax.axis('off')
  for ax in axes[-columns:]:
    ax.set_xlabel('step')
  fig.suptitle(f"recall {report['buckets'][2]} over training, per seed (preset {report['preset']})")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
