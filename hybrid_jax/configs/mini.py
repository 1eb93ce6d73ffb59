"""One run of the mini-study as a config: `--config=mini:arch=swa128,preset=mini,seed=0`.

The config is exactly the one `python -m hybrid_jax study --preset PRESET` trains for that arch and seed
(hybrid_jax.study.presets.run_config), named `mini_<arch>_seed<seed>` as the study names its run directories, so a
sweep can train the study's runs (`sweep run --sweep sweep:mini --root DIR`) and `study --out DIR` then only
scores them.

Arguments: arch (a study label such as SWA-128 or GDN, or its arch name such as swa128 or gdn), preset
(default mini; one of the study's --preset choices) and seed (default 0).
"""

from hybrid_jax import checks
from hybrid_jax.config import ConfigError, file_arguments
from hybrid_jax.study import presets

_USAGE = 'arch=NAME[,preset=NAME][,seed=K]'


def get_config(arg=None):
  fields = {'preset': 'mini', 'seed': '0', **file_arguments(arg, ('arch', 'preset', 'seed'), 'mini config', _USAGE)}
  if 'arch' not in fields:
    raise ConfigError(f'mini config: give {_USAGE}; arches: {", ".join(presets.ARCHES)} '
                      f'(or {", ".join(arch for arch, _ in presets.ARCHES.values())})')
  if fields['preset'] not in presets.PRESETS:
    raise ConfigError(f'mini config: preset={fields["preset"]!r} is unknown; allowed: {", ".join(presets.PRESETS)}')
  label = presets.label_of(fields['arch'], f'mini config: arch={fields["arch"]!r}')
  seed = checks.number(fields['seed'], 'mini config: seed', integer=True, nonnegative=True)
  return presets.run_config(label, presets.PRESETS[fields['preset']], seed)
