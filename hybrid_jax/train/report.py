"""The end-of-run report: report.json and a PNG of the loss curves."""

import json
import pathlib

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402


def plot_losses(records: list[dict], path) -> None:
  """Train loss per logged step, with held-out evaluations as points."""
  train = [r for r in records if r['kind'] == 'train' and 'loss' in r]
  evals = [r for r in records if r['kind'] == 'eval' and 'packed_loss' in r]
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([r['step'] for r in train], [r['loss'] for r in train], label='train loss', lw=1)
  if evals:
    ax.plot([r['step'] for r in evals], [r['packed_loss'] for r in evals], 'o-', label='held-out loss (packed rows)')
  ax.set_xlabel('step')
  ax.set_ylabel('loss (nats / token)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(workdir, report: dict, records: list[dict]) -> pathlib.Path:
  workdir = pathlib.Path(workdir)
  (workdir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  plot_losses(records, workdir / 'loss_curve.png')
  return workdir / 'report.json'
