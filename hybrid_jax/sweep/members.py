"""The runs of a sweep as `sweep run` starts them: config string, overrides, validated config, run directory."""

import dataclasses
import pathlib
import re
import shlex

import ml_collections

from hybrid_jax.config import ConfigError, load_run, load_sweep


@dataclasses.dataclass
class Member:
  """One run of the sweep: `train_args()` is its `python -m hybrid_jax train` command line (after the module)."""
  name: str  # Its run directory's name (plan's naming: the config name, plus its arguments where names clash).
  spec: str
  overrides: list[str]  # The run string's own, then the command's.
  config: ml_collections.ConfigDict
  workdir: pathlib.Path
  tags: list[str]

  def train_args(self, workdir=None) -> list[str]:
    return ['train', f'--config={self.spec}', *self.overrides, f'--workdir={workdir or self.workdir}']

  def command(self) -> str:
    return shlex.join(self.train_args())


def load(sweep: str, root, overrides=()) -> list[Member]:
  """The runs of `sweep` (FILE:NAME), each with `overrides` after its own, in run directories under `root`.

  Every run's config is loaded and validated here, so a bad override or run string stops the sweep before any run
  starts."""
  extra = shlex.join(list(overrides))
  rows = []
  for run in load_sweep(sweep):
    spec, own, named = load_run(run)  # Names come from the run string alone: a command's override never renames a run.
    _, every, config = load_run(f'{run} {extra}'.strip())
    rows.append({'name': named.name, 'spec': spec, 'overrides': own, 'all': every, 'config': config})
  unique_workdirs(rows)
  sweep_name = sweep.partition(':')[2] or 'study'
  root = pathlib.Path(root)
  return [Member(name=r['workdir'].removeprefix('runs/'), spec=r['spec'], overrides=r['all'],
                 config=r['config'], workdir=root / r['workdir'].removeprefix('runs/'),
                 tags=[f'sweep:{sweep_name}', f'arch:{r["config"].model.arch}', f'scale:{r["config"].model.scale}'])
          for r in rows]


def unique_workdirs(rows):
  """Sets each row's 'workdir': runs/<config name>; runs that share a name (e.g. same arch and scale, two budgets)
  get their config arg. The one naming rule of run directories, for `plan` and `sweep` alike."""
  names = [r['name'] for r in rows]
  for r in rows:
    name = r['name']
    if names.count(name) > 1:
      arg = '_'.join([r['spec'].partition(':')[2]] + [o.removeprefix('--config.') for o in r['overrides']])
      name = f"{name}__{re.sub(r'[^A-Za-z0-9_.-]+', '-', arg).strip('-')}"
    r['workdir'] = f'runs/{name}'
  workdirs = [r['workdir'] for r in rows]
  duplicate = next((w for w in workdirs if workdirs.count(w) > 1), None)
  if duplicate:
    raise ConfigError(f'two runs of the sweep are identical (workdir {duplicate}); remove the duplicate')
