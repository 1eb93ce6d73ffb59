"""Writes tests/data/trained_text/: small hybrids trained on the built-in corpus, for kernel agreement on real text.

Kernel tests draw Gaussian inputs, whose keys are nearly orthogonal; a trained GDN layer on text with repeated
structure (indented code, a repeated line, a constant row) gives keys that share a direction inside a chunk, with
beta and the decay as training set them, and that is where an intra-chunk inverse summing powers of L lost float32
precision (docs/KERNELS.md, "Agreement on trained models"). This trains one hybrid each of GDN, Mamba-2 and
Lightning (the arch's cycle: the recurrent layer, then full attention) at the sizes of `REDUCED` and `LAYERS`, small
enough for the repository, on 512-byte rows of the built-in corpus (this Python's standard library), and keeps
each model's config and float32 parameters:

  PYTHONPATH=$PWD .venv/bin/python scripts/make_text_fixtures.py tests/data/trained_text

Each model is a folder named by its arch: `config.json` (the run's config as training wrote it, so
`train.runs.load_config` reads it) and `params.npz` (one float32 array per parameter, named by its path in the
params tree joined with '/'). `rows.json` holds the text rows the tests feed them, excerpted here once so that later
edits of the excerpted files leave the rows as they were. The runs are seeded and the corpus is the installed
standard library, so the same checkout and environment write the same files. tests/test_trained_text_agreement.py
reads them.
"""

import argparse
import json
import pathlib
import shutil
import tempfile

import jax
import numpy as np

from hybrid_jax import standard_hooks
from hybrid_jax.config import load_config_file, resolve_spec
from hybrid_jax.train import runs

ARCHES = ('gdn', 'mamba2', 'lightning')
# The tiny scale's mixer shapes and training at half its width (about 120K parameters, 0.5 MB, for two layers).
REDUCED = dict(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=128)
# One cycle (recurrent, full attention); GDN adds a second delta-rule layer after the attention, as in the tiny
# model: trained, that layer's chunks of indented code are where the product-series inverse fell apart (its terms
# reached 1e11 there, 1e7 in the first layer), so the fixture covers the regime on code, not only on a constant row.
LAYERS = {'gdn': 3, 'mamba2': 2, 'lightning': 2}
TRAIN = dict(steps=300, batch_size=8, warmup_steps=30, eval_every=0, checkpoint_every=300, keep_checkpoints=1,
             async_checkpointing=False, progress=False)


def config(arch: str):
  """The fixture's run config: `hybrid:arch=ARCH,scale=tiny` (float32, 512-byte rows) with REDUCED, LAYERS and
  TRAIN."""
  c = load_config_file(resolve_spec(f'hybrid:arch={arch},scale=tiny'))
  c.model.update(REDUCED, num_layers=LAYERS[arch])
  c.train.update(TRAIN)
  return c


ROOT = pathlib.Path(__file__).resolve().parents[1]
ROW_BYTES = 512


def excerpt(path: str, start: str) -> str:
  text = (ROOT / path).read_text()
  return text[text.index(start):][:ROW_BYTES]


def text_rows() -> dict:
  """Rows of ROW_BYTES bytes with the structure of real text: indented code (a method of the project's whose
  continuation line is aligned by 95 spaces), one line repeated, a constant row and prose (the README's)."""
  rows = {'code': excerpt('hybrid_jax/hf/families/rules.py', '  def join(self, pieces, shapes):'),
          'repeat': ('import jax.numpy as jnp\n' * 32)[:ROW_BYTES],
          'zeros': '0' * ROW_BYTES,
          'prose': excerpt('README.md', 'Train, evaluate and dissect')}
  assert all(len(text.encode()) == ROW_BYTES for text in rows.values()), rows
  return rows


def param_key(path) -> str:
  """A parameter's name in params.npz: its path in the params tree joined with '/'."""
  return '/'.join(str(getattr(p, 'key', getattr(p, 'idx', p))) for p in path)


def save(run: runs.Run, out: pathlib.Path) -> None:
  out.mkdir(parents=True, exist_ok=True)
  shutil.copyfile(run.workdir / 'config.json', out / 'config.json')
  leaves = jax.tree_util.tree_flatten_with_path(run.params)[0]
  np.savez(out / 'params.npz', **{param_key(path): np.asarray(leaf, np.float32) for path, leaf in leaves})


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('out', type=pathlib.Path, help='the fixture directory, e.g. tests/data/trained_text')
  parser.add_argument('--arches', default=','.join(ARCHES), help='comma-separated arches to (re)write')
  args = parser.parse_args()
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / 'rows.json').write_text(json.dumps(text_rows(), indent=1) + '\n')
  for arch in args.arches.split(','):
    with tempfile.TemporaryDirectory() as workdir:
      standard_hooks.train(config(arch), workdir)
      save(runs.load_run(workdir), args.out / arch)
    print(f'wrote {args.out / arch}')


if __name__ == '__main__':
  main()
