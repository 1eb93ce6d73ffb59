"""Large-window laziness, the study's grid for it: the SWA hybrid at windows 128, 512 and 2048, each with RoPE and
with NoPE on its full-attention layers, every run built by configs/nope_fix.py (probed and traceable through
training). The study finds retrieval heads forming later in the full layers the larger the window; the grid also
asks whether NoPE, its fix at window 128, moves that formation at the larger windows.

`--sweep configs/laziness.py[:scale=NAME[,budget=M | tokens=T]]` (default scale tiny), e.g.
`python -m hybrid_jax sweep run --sweep configs/laziness.py:scale=s1,budget=200 --root runs/laziness`, then
`analyze tracing --workdir` each run and compare probe/retrieval_top_score over steps. At tiny (a 512-token
context) the 512 and 2048 windows see the whole context: a quick check of the grid, not the experiment.
"""

import pathlib

from hybrid_jax.config import file_arguments

CONFIG = pathlib.Path(__file__).resolve().with_name('nope_fix.py')
WINDOWS = (128, 512, 2048)
FULL_PE = ('rope', 'nope')  # The full layers' positional encoding; the SWA layers keep RoPE.


def runs(name=None):
  fields = file_arguments(name, ('scale', 'budget', 'tokens'), 'configs/laziness.py',
                          'scale=NAME[,budget=M | tokens=T]')
  grid = ''.join(f',{key}={value}' for key, value in fields.items())
  return [f'{CONFIG}:window={window},full_pe={pe}{grid}' for window in WINDOWS for pe in FULL_PE]
