"""The end-of-run report: report.json and a PNG of the loss curves."""

import json
import pathlib

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402


def resume_marks(sessions) -> list[tuple[int, str]]:
  """(step, label) of every resume in a run's sessions (config_history.json), with the keys it changed."""
  marks = []
  for s in sessions or ():
    if s.get('resumed_from') is not None:
      changed = ', '.join(f'{k}={json.dumps(c["to"])}' for k, c in s['changes'].items())
      marks.append((s['resumed_from'], 'resumed' + (f': {changed}' if changed else '')))
  return marks


def loss_figure(records: list[dict], sessions=()):
  """Train loss per logged step (the mean over each logging interval), held-out evaluations as points, and a dotted
  line where the run resumed."""
  train = [r for r in records if r['kind'] == 'train' and 'loss' in r]
  evals = [r for r in records if r['kind'] == 'eval' and 'packed_loss' in r]
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([r['step'] for r in train], [r['loss'] for r in train], label='train loss (mean of each logging interval)',
          lw=1)
  if evals:
    ax.plot([r['step'] for r in evals], [r['packed_loss'] for r in evals], 'o-', label='held-out loss (packed rows)')
  for step, label in resume_marks(sessions):
    ax.axvline(step, color='gray', ls=':', lw=1)
    ax.annotate(label, (step, 1), xycoords=('data', 'axes fraction'), rotation=90, va='top', ha='right',
                fontsize=7, color='dimgray')
  ax.set_xlabel('step')
  ax.set_ylabel('loss (nats / token)')
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  return fig


def plot_losses(records: list[dict], path, sessions=()) -> None:
  fig = loss_figure(records, sessions)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(workdir, report: dict, records: list[dict]) -> pathlib.Path:
  workdir = pathlib.Path(workdir)
  (workdir / 'report.json').write_text(json.dumps(report, indent=2) + '\n')
  plot_losses(records, workdir / 'loss_curve.png', report.get('sessions'))
  return workdir / 'report.json'
