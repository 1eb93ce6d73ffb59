"""An optional Weights & Biases sink: each run's metrics.jsonl records, logged to a W&B run of the same name.

Off by default (`sweep run --wandb PROJECT`); needs `pip install 'hybrid_jax[wandb]'`. The records are the ones
training writes (hybrid_jax.train.metrics), logged as `<kind>/<name>` at their step after each attempt, so the
trainer itself never depends on W&B. The W&B run is named after the run directory, grouped by the sweep and tagged
with sweep, arch and scale; its id is kept in the run's sweep.json, so a resumed run logs into the same W&B run,
from the first step not yet logged. WANDB_MODE=offline writes to files only (`wandb sync` uploads them later).
"""

import importlib

from hybrid_jax.config import ConfigError
from hybrid_jax.sweep import record
from hybrid_jax.train import config_history, metrics


def _wandb():
  try:
    return importlib.import_module('wandb')
  except ImportError:
    raise ConfigError("--wandb needs the wandb package: pip install 'hybrid_jax[wandb]'") from None


class WandbSink:

  def __init__(self, project: str):
    self.project, self.wandb = project, _wandb()

  def sync(self, member, sweep: str) -> int:
    """Logs the run's records after the last step logged before; returns how many records it logged."""
    workdir = member.workdir
    path = workdir / 'metrics.jsonl'
    if not path.exists():
      return 0
    seen = record.read(workdir).get('wandb', {})
    logged = int(seen.get('step', 0))
    new = [r for r in metrics.read_jsonl(path) if r['step'] > logged]
    if not new:
      return 0
    # A first attempt lets W&B choose the id (its generator is no public API); later ones resume that run.
    run = self.wandb.init(project=self.project, name=member.name, id=seen.get('id'), resume='allow', group=sweep,
                          tags=member.tags, config=config_history.flatten(member.config), dir=str(workdir),
                          reinit='finish_previous')
    try:
      for step in sorted({r['step'] for r in new}):
        values = {f"{r['kind']}/{k}": v for r in new if r['step'] == step
                  for k, v in r.items() if k not in ('step', 'kind') and isinstance(v, (int, float))}
        run.log(values, step=step)
    finally:
      run.finish()
    record.update(workdir, wandb={'id': run.id, 'step': max(r['step'] for r in new)})
    return len(new)
