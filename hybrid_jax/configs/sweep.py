"""The study's sweeps as data: each sweep is a list of run config strings for the packaged config `hybrid` (the
mini-study's for `mini`), named without a path so they resolve to the same files wherever the package is installed.

`python -m hybrid_jax plan --sweep sweep:main` prints their cost; each string is one `--config` of
`python -m hybrid_jax train`. The run's name (and so its workdir) follows from the string.

Sweeps:
- `main`: the seven parameter-matched arches x S1-S4 x budgets {100, 200, 300, 400, 500, 1000} x N, at 16K.
- `s5`: the seven arches at S5 on ~100B tokens.
- `variants`: the three design variants (SWA-128-NoPE, 1:3 ratio, head-wise mixing) on the `main` grid.
- `extension`: the 32K context-extension stage of each S5 run (init_from its 16K run directory).
- `moe`: the `main` grid's MoE twins (`experts=E,top_k=K` of the config `hybrid`, active parameters matched to the
  dense runs: docs/MOE_SHAPES.md); `moe,experts=E,top_k=K` picks them (default 8 experts, top 2). Not in `study`.
- `study`: all of the above but `moe`.
- `mini`: the mini-study's runs, each arch of `python -m hybrid_jax study` at each seed, under the study's run
  directory names, so `study --out` on the sweep's root only scores them; `mini,preset=NAME,seeds=N` picks the
  preset (default mini) and the seed count (default the preset's, as `study --seeds`), e.g.
  `--sweep sweep:mini,seeds=3`.
"""

from hybrid_jax import checks
from hybrid_jax.config import file_arguments

ARCHES = ('full', 'swa128', 'swa512', 'swa2048', 'lightning', 'mamba2', 'gdn')
VARIANTS = ('swa128_nope', 'swa128_1to3', 'swa128_headwise')
SCALES = ('s1', 's2', 's3', 's4')
BUDGETS = (100, 200, 300, 400, 500, 1000)  # Multiples of the non-embedding parameter count N.
S5_TOKENS = 100e9
RUNS_ROOT = 'runs'  # Where `train --workdir` puts each run by default (runs/<config name>).
CONFIG = 'hybrid'  # The packaged configs (hybrid_jax/configs/hybrid.py, mini.py).
MINI_CONFIG = 'mini'


def _grid(arches, suffix=''):
  return [f'{CONFIG}:arch={a},scale={s},budget={b}{suffix}' for a in arches for s in SCALES for b in BUDGETS]


def _moe(experts='8', top_k='2'):
  return _grid(ARCHES, f',experts={experts},top_k={top_k}')


def _s5(arches):
  return [f'{CONFIG}:arch={a},scale=s5,tokens={S5_TOKENS:g}' for a in arches]


def _extension(arches):
  # The S5 runs' names are `<arch>_s5_1e+11tok` (the config `hybrid` names runs from their arguments).
  return [f'{CONFIG}:arch={a},scale=s5,stage=extend32k,init_from={RUNS_ROOT}/{a}_s5_{S5_TOKENS:.3g}tok'
          for a in arches]


def _mini(preset='mini', seeds=None):
  """The runs `study --preset PRESET --seeds N` trains, seed by seed (the study's tables: imported here, so the other
  sweeps do not load the study and its training code)."""
  from hybrid_jax.study import presets  # pylint: disable=g-import-not-at-top
  if preset not in presets.PRESETS:
    raise ValueError(f'preset={preset!r} is unknown; allowed: {", ".join(presets.PRESETS)}')
  if seeds is not None:
    seeds = checks.number(seeds, 'sweep mini: seeds', integer=True, positive=True)
  seeds = presets.PRESETS[preset].seeds if seeds is None else seeds
  return [f'{MINI_CONFIG}:arch={presets.ARCHES[label][0]},preset={preset},seed={seed}' for seed in range(seeds)
          for label in presets.PRESETS[preset].arches]


SWEEPS = {
    'main': lambda: _grid(ARCHES),
    's5': lambda: _s5(ARCHES + ('swa128_nope',)),
    'variants': lambda: _grid(VARIANTS),
    'extension': lambda: _extension(ARCHES + ('swa128_nope',)),
    'mini': _mini,
    'moe': _moe,
}
SWEEPS['study'] = lambda: [r for name in ('main', 'variants', 's5', 'extension') for r in SWEEPS[name]()]
ARGUMENTS = {'mini': ('preset', 'seeds'), 'moe': ('experts', 'top_k')}  # Sweeps that take `NAME,KEY=VALUE,...`: their keys.


def runs(name: str | None = None) -> list[str]:
  """The config strings of sweep `name` (default: the whole study), `NAME[,KEY=VALUE,...]`."""
  name, _, arg = (name or 'study').partition(',')
  if name not in SWEEPS:
    raise ValueError(f'unknown sweep {name!r}: choose from {", ".join(SWEEPS)}')
  keys = ARGUMENTS.get(name, ())
  usage = ','.join([name, *(f'{k}=...' for k in keys)]) if keys else f'{name} (it takes no arguments)'
  return SWEEPS[name](**file_arguments(arg, keys, f'sweep {name}', usage))
