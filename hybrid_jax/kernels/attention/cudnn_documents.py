"""Packed documents for cuDNN's fused attention: segment ids [B, T] to its per-row document lengths and offsets.

cuDNN states documents as a packed layout (jax's `fused_attention_stablehlo.dot_product_attention`): row b holds up
to M sequences, the m-th `q_seqlen[b, m]` tokens long from token `q_offsets[b, m]`, and every sequence attends as a
row of its own (causal from its first token, the sliding window counted inside it), so key j is visible to query i
exactly when both lie in one document, j <= i and i - window < j: the reference's document mask. Entries past a
row's documents are -1 (lengths [B, M] and offsets [B, M + 1]; the extra offset column stays -1): jax packs the
non-negative entries of the whole batch to the left before cuDNN reads them, so a 0 in place of a -1 would shift
every later document of the batch onto the wrong tokens.

Every token lies in a document: padding (id 0) is a run like any other (hybrid_jax.kernels.segments), so cuDNN
writes every output row, as the reference does. A token outside every sequence would be left unwritten.

M is static (it sizes the arrays, and cuDNN's saved softmax statistics: [B * M, Hq, T] float32, 4M bytes per token
and head beside the 2D of a bf16 output). A row with more documents cannot be stated; `attention` then runs the
fallback kernel for the whole call (a runtime `lax.cond` on the batch's document counts, warning once), never a
layout that drops documents. An error instead would stop a training run on one unusual batch.
"""

import functools
import warnings

import jax
import jax.numpy as jnp

DEFAULT_MAX_DOCUMENTS = 64  # Documents per row (model.attention.max_documents): 64 x 4 B = a bf16 output at D 128.
MIN_CUDNN_VERSION = 90600  # jax's own test of the packed layout needs cuDNN 9.6.0.
MIN_COMPUTE_CAPABILITY = '9.0'  # jax refuses the packed layout below Hopper.
_warned = set()


def layout(runs, max_documents: int):
  """(lengths [B, M], offsets [B, M + 1], fits [B]) of run indices [B, T] (`segments.runs`: 0 at t = 0, +1 at
  every new document), M = max_documents: int32 lengths and first tokens of each row's documents, -1 past its last;
  `fits` is False for a row of more than M documents (its layout would leave the later ones out)."""
  runs = jnp.asarray(runs, jnp.int32)
  count = runs[:, -1] + 1
  # The first token of run m is the number of tokens of earlier runs (T for m past the last run).
  firsts = jax.vmap(lambda row: jnp.searchsorted(row, jnp.arange(max_documents + 1, dtype=jnp.int32)))(runs)
  present = jnp.arange(max_documents, dtype=jnp.int32) < count[:, None]
  lengths = jnp.where(present, firsts[:, 1:] - firsts[:, :-1], -1)
  offsets = jnp.concatenate([jnp.where(present, firsts[:, :-1], -1), jnp.full_like(count[:, None], -1)], axis=1)
  return lengths.astype(jnp.int32), offsets.astype(jnp.int32), count <= max_documents


@functools.cache
def unsupported() -> str | None:
  """Why this process's GPU cannot run the packed layout (cuDNN missing or older than 9.6, a GPU before Hopper),
  or None when it can."""
  from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=import-outside-toplevel
  try:
    version = fused.check_cudnn_version()
  except RuntimeError as e:
    return f'no cuDNN ({e})'
  if version < MIN_CUDNN_VERSION:
    return f'cuDNN {version} is older than {MIN_CUDNN_VERSION} (9.6.0), the first with packed documents'
  if not fused.check_compute_capability(MIN_COMPUTE_CAPABILITY):
    return f'packed documents need compute capability >= {MIN_COMPUTE_CAPABILITY} (Hopper)'
  return None


def fused(q, k, v, lengths, offsets, *, window, scale):
  """cuDNN flash attention over the packed documents; window None = full causal, else keys i - window < j <= i."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn  # pylint: disable=import-outside-toplevel
  return cudnn.dot_product_attention(q, k, v, None, None, lengths, lengths, offsets, offsets, scale=scale,
                                     mask_type=cudnn.MaskType.PADDING_CAUSAL, sliding_window_length=window)


def _warn_once(reason):
  if reason not in _warned:
    _warned.add(reason)
    warnings.warn(reason)


def attention(q, k, v, *, window, scale, segment_ids, max_documents, fallback, fallback_name):
  """Attention over the documents of run indices `segment_ids` [B, T] through cuDNN's packed layout; when a row
  holds more than `max_documents`, the whole call runs `fallback(q, k, v, window=, scale=, sinks=0, segment_ids=)`
  instead (decided on device), which warns once."""
  t, d = q.shape[1], q.shape[3]
  scale = d**-0.5 if scale is None else scale  # cuDNN's own default is 1.
  window = None if window is None or window >= t else window
  lengths, offsets, fits = layout(segment_ids, max_documents)

  def packed(q, k, v, segment_ids):
    del segment_ids
    return fused(q, k, v, lengths, offsets, window=window, scale=scale)

  def other(q, k, v, segment_ids):
    jax.debug.callback(functools.partial(
        _warn_once, f'attention: a row holds more than {max_documents} documents (model.attention.max_documents), '
                    f'more than cuDNN\'s packed layout is sized for; calls with such rows run {fallback_name!r}'))
    return fallback(q, k, v, window=window, scale=scale, sinks=0, segment_ids=segment_ids).astype(q.dtype)

  # A conditional on the device: both kernels are compiled, and autodiff keeps both branches' residuals (merged where
  # their shapes agree).
  return jax.lax.cond(jnp.all(fits), packed, other, q, k, v, segment_ids)
