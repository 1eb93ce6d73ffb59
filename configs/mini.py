"""One run of the mini-study as a config: `configs/mini.py:arch=swa128,preset=mini,seed=0`.

The config is exactly the one `python -m hybrid_jax study --preset PRESET` trains for that arch and seed
(hybrid_jax.study.mini.run_config), named `mini_<arch>_seed<seed>` as the study names its run directories, so a
sweep can train the study's runs (`sweep run --sweep configs/sweep.py:mini --root DIR`) and `study --out DIR` then
only scores them.

Arguments: arch (a study label such as SWA-128, or its arch name: swa128, swa2048, swa128_nope, full), preset
(default mini; one of the study's --preset choices) and seed (default 0).
"""

from hybrid_jax import checks
from hybrid_jax.config import ConfigError, file_arguments
from hybrid_jax.study import mini

_USAGE = 'arch=NAME[,preset=NAME][,seed=K]'


def get_config(arg=None):
  fields = {'preset': 'mini', 'seed': '0', **file_arguments(arg, ('arch', 'preset', 'seed'), 'configs/mini.py',
                                                           _USAGE)}
  if 'arch' not in fields:
    raise ConfigError(f'configs/mini.py: give {_USAGE}; arches: {", ".join(mini.ARCHES)} '
                      f'(or {", ".join(arch for arch, _ in mini.ARCHES.values())})')
  if fields['preset'] not in mini.PRESETS:
    raise ConfigError(f'configs/mini.py: preset={fields["preset"]!r} is unknown; allowed: {", ".join(mini.PRESETS)}')
  label = mini.label_of(fields['arch'], f'configs/mini.py: arch={fields["arch"]!r}')
  seed = checks.number(fields['seed'], 'configs/mini.py: seed', integer=True, nonnegative=True)
  return mini.run_config(label, mini.PRESETS[fields['preset']], seed)
