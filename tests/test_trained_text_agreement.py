"""Every kernel implementation gives the XLA path's logits for trained models on real text.

Kernel tests draw Gaussian inputs; a trained GDN layer on text with repeated structure (indented code, a repeated
line, a constant row) gives keys that share a direction inside a chunk, where an intra-chunk inverse computed as a
series of powers loses float32 precision, which no Gaussian input exposed
(docs/KERNELS.md, "Agreement on trained models"). The models are tests/data/trained_text/
(scripts/make_text_fixtures.py: GDN, Mamba-2 and Lightning hybrids, each with its full-attention layer, trained on
the built-in corpus by `train`). The rows have the structure of real text, and `test_code_row_is_the_regime` holds
the fixture to the regime, so the file notices if a retrained fixture stops covering it.
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_jax.config import validate
from hybrid_jax.models.mixers import recurrent
from hybrid_jax.train import runs, state as state_lib
from tests.conftest import default_tier

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / 'tests' / 'data' / 'trained_text'
TOLERANCE = 1e-3  # Max abs logit difference from 'xla' in float32; the defect this guards gave up to 6.6.
ROW_BYTES = 512
# The regime: the powers of L in some chunk of the code row exceed this (the GDN fixture: 3.7e7 in its first delta-rule
# layer, 1.5e10 in the one after attention; a two-layer fixture without that layer reached 1.2e6, and there the old
# inverse missed the code row by only 9e-4).
GROWTH = 1e8
RECURRENT = ('pallas_gpu', 'pallas_tpu', 'reference')  # Each against 'xla'; the Pallas kernels interpret on CPU.
ATTENTION = ('reference', 'pallas_gpu', 'pallas_tpu')  # 'cudnn' needs a GPU.


@functools.cache
def text_rows() -> dict[str, str]:
  """The rows the fixtures were made for (tests/data/trained_text/rows.json): indented code (a method of the
  project's with a continuation line aligned by 95 spaces), one line repeated, a constant row and README prose."""
  return json.loads((FIXTURES / 'rows.json').read_text())


def tokens(rows: dict[str, str]) -> jnp.ndarray:
  """The rows as byte ids [len(rows), ROW_BYTES] (the fixtures' byte tokenizer)."""
  data = [np.frombuffer(text.encode(), np.uint8) for text in rows.values()]
  assert all(len(d) == ROW_BYTES for d in data), [len(d) for d in data]
  return jnp.asarray(np.stack(data).astype(np.int32))


def param_key(path) -> str:
  """A parameter's name in params.npz (scripts/make_text_fixtures.py)."""
  return '/'.join(str(getattr(p, 'key', getattr(p, 'idx', p))) for p in path)


def with_overrides(config, **model):
  config = config.copy_and_resolve_references()
  config.unlock()
  config.model.update(dict(dtype='float32', **model))
  return validate(config)


@functools.cache
def fixture(arch: str):
  """(run config, params) of tests/data/trained_text/ARCH."""
  config = runs.load_config(FIXTURES / arch)
  stored = np.load(FIXTURES / arch / 'params.npz')
  leaves, treedef = jax.tree_util.tree_flatten_with_path(runs.abstract_params(config.model))
  assert sorted(stored.files) == sorted(param_key(p) for p, _ in leaves)
  params = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(stored[param_key(p)]) for p, _ in leaves])
  return config, params


@functools.cache
def logits(arch: str, recurrent_impl: str, attention_impl: str) -> np.ndarray:
  """The fixture's float32 logits of every text row, one batch (one compiled program per implementation pair)."""
  config, params = fixture(arch)
  return forward(config, params, recurrent_impl, attention_impl)


def forward(config, params, recurrent_impl, attention_impl):
  config = with_overrides(config, recurrent_implementation=recurrent_impl, attention_implementation=attention_impl)
  model_def = state_lib.make_model_def(config.model)
  return np.asarray(jax.jit(lambda p, t: model_def.bind(p)(t))(params, tokens(text_rows())))


def gaps(out, ref) -> dict[str, float]:
  """Max abs logit difference per row."""
  return {name: float(np.abs(out[i] - ref[i]).max()) for i, name in enumerate(text_rows())}


def assert_agree(out, ref, what):
  row_gaps = gaps(out, ref)
  assert max(row_gaps.values()) <= TOLERANCE, f'{what}: max abs logit difference from xla per row {row_gaps}'


# The default tier runs every implementation of the delta rule, whose inverse failed here, and one of each scalar-decay
# scan (interpreted Pallas compiles for 5-20 s a kernel); the e2e tier runs the rest and the attention kernels.
RECURRENT_CASES = [(arch, impl) for arch in ('gdn', 'mamba2', 'lightning') for impl in RECURRENT]
DEFAULT_TIER = {('gdn', impl) for impl in RECURRENT} | {('mamba2', 'pallas_tpu'), ('lightning', 'pallas_tpu')}


@pytest.mark.parametrize('arch,impl', default_tier(RECURRENT_CASES, DEFAULT_TIER))
def test_recurrent_implementations_agree_on_text(arch, impl):
  assert_agree(logits(arch, impl, 'xla'), logits(arch, 'xla', 'xla'), f'{arch} recurrent {impl}')


@pytest.mark.e2e
@pytest.mark.parametrize('impl', ATTENTION)
def test_attention_implementations_agree_on_text(impl):
  assert_agree(logits('gdn', 'xla', impl), logits('gdn', 'xla', 'xla'), f'attention {impl}')


def delta_rule_inputs(config, params, row: str) -> list:
  """(k [T, H, K], beta [T, H], log_decay [T, H]) that each GDN layer hands its scan for one text row, in float64
  (read by wrapping `recurrent.scan` while the model is traced)."""
  seen = []
  scan = recurrent.scan

  def spy(q, k, v, log_decay, beta=None, **kwargs):
    if beta is not None:
      seen.append((k, beta, log_decay))
    return scan(q, k, v, log_decay, beta, **kwargs)

  model_def = state_lib.make_model_def(with_overrides(config, recurrent_implementation='xla').model)

  def inputs(p, t):
    model_def.bind(p)(t)
    return seen

  recurrent.scan = spy
  try:
    layers = jax.jit(inputs)(params, tokens({row: text_rows()[row]}))
  finally:
    recurrent.scan = scan
  return [tuple(np.asarray(a[0], np.float64) for a in layer) for layer in layers]


def chunk_regime(k, beta, log_decay, chunk: int) -> tuple[float, float]:
  """(cosine, growth) of one GDN layer's chunks: the largest mean cosine between the keys of two tokens of one chunk
  (over chunks and heads), and the largest entry of any power of a chunk's L = strictly_lower((beta K K^T) o Gamma),
  the terms a power series for (I + L)^-1 sums: float32 keeps about 7 digits of the inverse's O(1) entries, so
  terms of 1e8 leave it none."""
  t, h, d = k.shape
  k = k.reshape(t // chunk, chunk, h, d).transpose(0, 2, 1, 3)  # [n, H, C, K]
  gram = k @ k.transpose(0, 1, 3, 2)
  cosine = (gram.sum((-1, -2)) - np.trace(gram, axis1=-2, axis2=-1)) / (chunk * (chunk - 1))
  cum = np.cumsum(log_decay.reshape(t // chunk, chunk, h), 1).transpose(0, 2, 1)  # [n, H, C]
  lower = np.tril(np.exp(np.minimum(cum[..., :, None] - cum[..., None, :], 0.0)), -1)
  lower *= beta.reshape(t // chunk, chunk, h).transpose(0, 2, 1)[..., None] * gram
  growth, power = 0.0, lower
  for _ in range(chunk - 1):
    growth = max(growth, float(np.abs(power).max()))
    power = power @ lower
  return float(cosine.max()), growth


def test_code_row_is_the_regime():
  """The GDN fixture on the code row is where the old inverse failed: in some chunk the keys share one direction
  (Gaussian keys of width 16: mean cosine ~0) and the powers of L grow past GROWTH, with beta and the decay as
  trained.
  A retrained fixture that loses this no longer guards the inverse."""
  config, params = fixture('gdn')
  regimes = [chunk_regime(*layer, config.model.recurrent_chunk_size)
             for layer in delta_rule_inputs(config, params, 'code')]
  assert regimes and max(cosine for cosine, _ in regimes) > 0.9, regimes
  assert max(growth for _, growth in regimes) > GROWTH, regimes
