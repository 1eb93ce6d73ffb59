"""NoPE on the full-attention layers of an SWA hybrid, the study's design against large-window laziness, in a run
that records when retrieval forms: `--config=configs/nope_fix.py:scale=s1[,window=512][,full_pe=rope]`.

It starts from the packaged grid's SWA hybrid (hybrid_jax/configs/hybrid.py) and changes:
- `window=W` (default 128; the study's windows are 128, 512 and 2048): keys each SWA query sees;
- no positional encoding on the full-attention layers, the SWA layers keeping RoPE (model.rope_full False). At 128
  this is the grid's `swa128_nope`; `full_pe=rope` keeps RoPE there, the control that differs in that key alone.
  The arch is named `swa<W>_nope` (or `swa<W>`) and the run as the grid names its runs;
- a checkpoint every tenth of the run, each one kept (the grid keeps the newest 3), so `analyze tracing` follows
  the retrieval heads' entropy and Q/K weights through training;
- the retrieval probe at each checkpoint (needle accuracy and the best retrieval-head score of the full layers,
  probe/* in metrics.jsonl), so the step where retrieval forms shows while the run trains.
The other arguments are the grid's: scale (default tiny), budget=M or tokens=T, stage, init_from, rope_base.
"""

from hybrid_jax import checks
from hybrid_jax.config import ConfigError, file_arguments, packaged_module
from hybrid_jax.errors import InputError

FILE = 'configs/nope_fix.py'
GRID_ARGS = ('scale', 'budget', 'tokens', 'stage', 'init_from', 'rope_base')  # Passed to the packaged grid.
USAGE = 'scale=NAME[,window=W][,full_pe=nope|rope] and the grid\'s budget=M | tokens=T, stage, init_from, rope_base'
CHECKPOINTS = 10  # Checkpoints and probes per run: the points where tracing sees the retrieval heads.


def get_config(arg=None):
  fields = {'window': '128', 'full_pe': 'nope', **file_arguments(arg, ('window', 'full_pe', *GRID_ARGS), FILE, USAGE)}
  if fields['full_pe'] not in ('nope', 'rope'):
    raise ConfigError(f'{FILE}: full_pe={fields["full_pe"]!r} is unknown; allowed: nope, rope')
  try:
    window = checks.number(fields['window'], f'{FILE}: window', integer=True, positive=True)
  except InputError as e:
    raise ConfigError(str(e)) from None
  grid = ','.join(f'{key}={value}' for key, value in fields.items() if key in GRID_ARGS)
  c = packaged_module('hybrid').get_config(f'arch=swa128,{grid}')  # The grid's arches differ in these two keys.
  c.model.window = window
  c.model.rope_full = fields['full_pe'] == 'rope'
  arch = f'swa{window}' + ('' if c.model.rope_full else '_nope')
  c.name = arch + c.name.removeprefix(c.model.arch)
  c.model.arch = arch
  t = c.train
  t.checkpoint_every = (t.get_ref('steps') + CHECKPOINTS - 1) // CHECKPOINTS  # Follows --config.train.steps.
  t.keep_checkpoints = 2 * CHECKPOINTS  # Room for the saves of a stopped and resumed run: the first are kept.
  t.retrieval_probe_every = t.get_ref('checkpoint_every')
  return c
