"""Structured kernel inputs in the regimes real text produces, for checking kernels against float64.

Gaussian keys in 32-128 dims are nearly orthogonal, which is the easy case for every chunked kernel: the delta
rule's (I + L)^-1 is then close to I and a softmax row is close to flat. Text is not like that: keys inside a
chunk share a direction, tokens repeat (one token, or a short period as indentation does), gates sit at 0 or
decay to nothing, a document starts inside a chunk, a softmax row puts nearly all its mass on one key or on a sink.

Each family below builds one batch row of such inputs in NumPy float64, deterministically from a seed, and returns
it as a `Regime` with what was measured of it (the realised in-chunk cosine of the keys, the largest scaled logit,
the share of tokens that repeat an earlier one...), so a test can assert that its inputs really are in the regime
they are named after. Rows of one family stack along the batch axis (`stack`), so one compiled program checks
them all.
"""

import dataclasses

import numpy as np

RESET_LOG_DECAY = -1.0e4  # As hybrid_jax.kernels.segments: exp of it is exactly 0 in float32 and float64.


@dataclasses.dataclass(frozen=True)
class Regime:
  """One batch row: `arrays` named as the kernel's arguments ([1, ...] float64; segment_ids int32), plus the
  cotangents `do` (and `dS` for the scans); `measured` holds what the family measured of them; `static` the
  kernel's static arguments (window, sinks) that rows stacked together must share."""
  name: str
  arrays: dict
  measured: dict
  static: tuple = ()


def stack(regimes):
  """{name: [B, ...] array} of regimes sharing their shapes and static arguments, in order."""
  assert len({r.static for r in regimes}) == 1, [r.static for r in regimes]
  return {key: np.concatenate([r.arrays[key] for r in regimes]) for key in regimes[0].arrays}


# Measurements.


def chunk_cosine(k, chunk):
  """The lowest, over (row, head, chunk), mean pairwise cosine of distinct keys inside one chunk. k [B, T, H, D]."""
  unit = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-300)
  worst = np.inf
  for start in range(0, k.shape[1], chunk):
    u = unit[:, start:start + chunk]
    n = u.shape[1]
    if n < 2:
      continue
    gram = np.einsum('bihd,bjhd->bhij', u, u)
    worst = min(worst, float(((gram.sum((-1, -2)) - n) / (n * (n - 1))).min()))
  return worst


def repeat_share(x, period):
  """Share of tokens t >= period equal, in every trailing dim, to token t - period. x [B, T, ...]."""
  same = np.all((x[:, period:] == x[:, :-period]).reshape(x.shape[0], x.shape[1] - period, -1), axis=-1)
  return float(same.mean())


def document_starts(segment_ids):
  """Indices t > 0 where a row's id changes (a document starts), as (row, t) pairs."""
  return np.argwhere(segment_ids[:, 1:] != segment_ids[:, :-1]) + [0, 1]


def resets_inside_chunks(segment_ids, chunk):
  """How many document starts fall strictly inside a chunk (not on its first token)."""
  return int(sum(t % chunk != 0 for _, t in document_starts(segment_ids)))


def one_token_documents(segment_ids):
  """How many documents (runs of equal ids) are a single token long."""
  count = 0
  for row in segment_ids:
    ends = np.r_[np.flatnonzero(row[1:] != row[:-1]), len(row) - 1]
    count += int(np.sum(np.diff(np.r_[-1, ends]) == 1))
  return count


def reset_gates(log_decay, segment_ids):
  """log_decay [B, T, H] with every document start written as RESET_LOG_DECAY: the recurrence's own way of
  starting from zero, computed here apart from the kernels' own `segments.reset_log_decay`."""
  out = np.array(log_decay, np.float64)
  for b, t in document_starts(segment_ids):
    out[b, t] = RESET_LOG_DECAY
  return out


def visible_logits(q, k, scale, window=None, sinks=0, segment_ids=None):
  """float64 [B, Hq, T, T] scaled logits with -inf where a key is not visible (the attention contract's mask)."""
  t, hq, hkv = q.shape[1], q.shape[2], k.shape[2]
  kk = np.repeat(k, hq // hkv, axis=2)
  logits = np.einsum('bihd,bjhd->bhij', q, kk) * scale
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  mask = j <= i
  if window is not None:
    mask &= (i - window < j) | (j < sinks)
  mask = np.broadcast_to(mask, (q.shape[0], t, t))
  if segment_ids is not None:
    mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
  return np.where(mask[:, None], logits, -np.inf)


def softmax_profile(q, k, scale, window=None, sinks=0, segment_ids=None):
  """(mean over queries of the largest visible scaled logit, mean over queries past the sinks of the probability
  on the first `sinks` keys)."""
  logits = visible_logits(q, k, scale, window, sinks, segment_ids)
  top = np.max(logits, -1)
  p = np.exp(logits - top[..., None])
  p /= p.sum(-1, keepdims=True)
  return float(np.mean(top)), float(p[..., :sinks].sum(-1)[..., sinks:].mean()) if sinks else 0.0


def longest_run(x):
  """Longest run of equal consecutive tokens (all channels equal), over the rows of x [B, T, C]."""
  best = 0
  for row in x:
    same = np.r_[False, np.all(row[1:] == row[:-1], axis=-1)]
    run = 0
    for s in same:
      run = run + 1 if s else 1
      best = max(best, run)
  return best


# Families. Shapes: keys and queries [1, T, Hk, K], values [1, T, Hv, V].


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def shared_direction_keys(rng, t, heads, dim, cosine, chunk):
  """L2-normalised keys [1, T, H, D] whose mean pairwise cosine inside every chunk is at least `cosine`: each
  key is a u + (1 - a) n_t, normalised, with u one direction per head and n_t Gaussian, and the weight a the
  smallest (by bisection) that reaches the target in every chunk. cosine 1: every key is u (identical keys)."""
  u = _unit(rng.standard_normal((1, 1, heads, dim)))
  noise = _unit(rng.standard_normal((1, t, heads, dim)))
  if cosine >= 1:
    return np.broadcast_to(u, (1, t, heads, dim)).copy()
  make = lambda a: _unit(a * u + (1 - a) * noise)
  lo, hi = 0.0, 1.0
  for _ in range(40):
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if chunk_cosine(make(mid), chunk) >= cosine else (mid, hi)
  return make(hi)


def repeated_tokens(rng, t, shapes, period):
  """Arrays of the given shapes [1, T, ...] holding a pattern of `period` random tokens repeated along T: one
  token repeated (period 1), or a short period, as indentation and boilerplate repeat."""
  out = []
  for shape in shapes:
    pattern = rng.standard_normal((1, period) + tuple(shape))
    out.append(np.tile(pattern, (1, -(-t // period)) + (1,) * len(shape))[:, :t])
  return out


def gates(rng, t, heads, kind):
  """Log decays [1, T, H]: 'mild' (log U(0.9, 1), long memory), 'zero' (exactly 0: no decay at all), 'strong'
  (-50 per token: every decay underflows to exactly 0 in float32), 'mixed' (runs of 0 and of -50 beside mild)."""
  mild = np.log(rng.uniform(0.9, 1.0, (1, t, heads)))
  if kind == 'mild':
    return mild
  if kind == 'zero':
    return np.zeros((1, t, heads))
  if kind == 'strong':
    return np.full((1, t, heads), -50.0)
  assert kind == 'mixed', kind
  pick = rng.integers(0, 3, (1, t // 8 + 1, heads)).repeat(8, axis=1)[:, :t]
  return np.choose(pick, [mild, np.zeros_like(mild), np.full_like(mild, -50.0)])


def documents(t, chunk, one_token=4):
  """segment_ids [1, T] with starts inside chunks (never on a chunk edge), `one_token` one-token documents in a
  row right after the first start, and a document ending one token before a chunk edge."""
  starts = {5} | {6 + i for i in range(one_token)} | {chunk // 2 + 3, chunk - 1, chunk + 17}
  starts = sorted(s for s in starts if 0 < s < t and s % chunk)
  ids = np.zeros((1, t), np.int32)
  for s in starts:
    ids[0, s:] += 1
  return ids


def peaked_queries(rng, k, scale, logit, window=None, sinks=0):
  """Queries [1, T, H, D] that each pick one visible key j(t) (a sink key, if any, for one query in three) and
  give it the scaled logit `logit`: q_t = logit k_j / (scale |k_j|^2). k [1, T, H, D] (H = query heads)."""
  t = k.shape[1]
  q = np.empty_like(k)
  for i in range(t):
    lo = 0 if window is None else max(0, i - window + 1)
    j = int(rng.integers(0, min(sinks, i + 1))) if sinks and i % 3 == 0 else int(rng.integers(lo, i + 1))
    kj = k[:, j]
    q[:, i] = logit * kj / (scale * np.sum(kj * kj, -1, keepdims=True))
  return q


# The cases the tests and `bench kernel-errors` run.


def scan_regimes(seed, t, hk, hv, dk, dv, chunk, delta=True):
  """One Regime per case of the scans (the delta rule's beta cases when `delta`): keys sharing a direction
  (mean in-chunk cosine 0 = Gaussian, 0.8, 0.95, identical), repeated tokens (period 1 and 6), beta at 0, 1 and 2
  under zero decay (beta 0 then carries the initial state unchanged, which a decay would shrink below float32's
  range on long rows), log decays at 0, at -50 per token and mixed, and documents starting inside chunks (with
  one-token documents) under zero decay, where any leak across a start is undamped. Arrays: q, k, v, log_decay,
  beta, initial_state, segment_ids, do, dS; `oracle_log_decay` is log_decay with the documents' starts written in
  (`reset_gates`)."""
  rng = np.random.default_rng(seed)
  out = []

  def case(name, k=None, q=None, v=None, g='mild', beta=None, segment_ids=None, **measured):
    q = rng.standard_normal((1, t, hk, dk)) if q is None else q
    k = _unit(rng.standard_normal((1, t, hk, dk))) if k is None else k
    v = rng.standard_normal((1, t, hv, dv)) if v is None else v
    g = gates(rng, t, hv, g) if isinstance(g, str) else g
    beta = rng.uniform(0.5, 1.0, (1, t, hv)) if beta is None else np.broadcast_to(beta, (1, t, hv)).astype(float)
    seg = np.zeros((1, t), np.int32) if segment_ids is None else segment_ids
    arrays = dict(q=q, k=k, v=v, log_decay=g, beta=beta, initial_state=rng.standard_normal((1, hv, dk, dv)),
                  segment_ids=seg, do=rng.standard_normal((1, t, hv, dv)), dS=rng.standard_normal((1, hv, dk, dv)),
                  oracle_log_decay=reset_gates(g, seg))
    if not delta:
      arrays.pop('beta')
    measured = dict(measured, cosine=chunk_cosine(k, chunk), log_decay_min=float(g.min()),
                    log_decay_max=float(g.max()), resets_inside_chunks=resets_inside_chunks(seg, chunk),
                    one_token_documents=one_token_documents(seg) if segment_ids is not None else 0)
    out.append(Regime(name, arrays, measured))

  for cosine in (0.0, 0.8, 0.95, 1.0):
    keys = _unit(rng.standard_normal((1, t, hk, dk))) if cosine == 0 else shared_direction_keys(
        rng, t, hk, dk, cosine, chunk)
    case(f'keys cos {cosine:g}', k=keys, beta=1.0 if cosine else None, target_cosine=cosine)
  for period in (1, 6):
    q, k, v = repeated_tokens(rng, t, [(hk, dk), (hk, dk), (hv, dv)], period)
    case(f'repeat period {period}', q=q, k=_unit(k), v=v, repeat=repeat_share(np.concatenate([q, k], -1), period),
         period=period)
  if delta:
    for beta in (0.0, 1.0, 2.0):
      case(f'beta {beta:g}', k=shared_direction_keys(rng, t, hk, dk, 0.8, chunk), g='zero', beta=beta,
           beta_value=beta, target_cosine=0.8)
  for kind in ('zero', 'strong', 'mixed'):
    case(f'decay {kind}', k=shared_direction_keys(rng, t, hk, dk, 0.8, chunk), g=kind, target_cosine=0.8)
  case('documents in chunk', k=shared_direction_keys(rng, t, hk, dk, 0.8, chunk), g='zero',
       segment_ids=documents(t, chunk), target_cosine=0.8)
  return out


def attention_regimes(seed, t, hq, hkv, d, window=None, sinks=0, chunk=64):
  """One Regime per attention case under one static (window, sinks): Gaussian (the easy baseline), keys sharing
  a direction (cosine 0.95: near-flat rows), one token and a period of 6 repeated (exact ties), peaked rows
  (each query's chosen key at a scaled logit of 20 and of 50), sinks (with `sinks`: a third of the queries put
  logit 30 on a sink), and documents with one-token ones. Arrays: q, k, v, segment_ids, do."""
  rng = np.random.default_rng(seed)
  scale = d**-0.5
  out = []

  def case(name, q=None, k=None, v=None, segment_ids=None, **measured):
    q = rng.standard_normal((1, t, hq, d)) if q is None else q
    k = rng.standard_normal((1, t, hkv, d)) if k is None else k
    v = rng.standard_normal((1, t, hkv, d)) if v is None else v
    seg = np.zeros((1, t), np.int32) if segment_ids is None else segment_ids
    top_logit, sink_mass = softmax_profile(q, k, scale, window, sinks, seg)
    arrays = dict(q=q, k=k, v=v, segment_ids=seg, do=rng.standard_normal((1, t, hq, d)))
    out.append(Regime(name, arrays, dict(measured, top_logit=top_logit, sink_mass=sink_mass,
                                         cosine=chunk_cosine(k, chunk)), (window, sinks)))

  def peaked(logit, use_sinks):
    k = rng.standard_normal((1, t, hkv, d))
    q = peaked_queries(rng, np.repeat(k, hq // hkv, axis=2), scale, logit, window, sinks if use_sinks else 0)
    return q, k

  case('gaussian')
  case('keys cos 0.95', k=np.sqrt(d) * shared_direction_keys(rng, t, hkv, d, 0.95, chunk), target_cosine=0.95)
  for period in (1, 6):
    q, k, v = repeated_tokens(rng, t, [(hq, d), (hkv, d), (hkv, d)], period)
    case(f'repeat period {period}', q=q, k=k, v=v, repeat=repeat_share(k, period), period=period)
  for logit in (20, 50):
    q, k = peaked(logit, False)
    case(f'peaked logit {logit}', q=q, k=k, target_logit=logit)
  if sinks:
    q, k = peaked(30, True)
    case('sinks', q=q, k=k, target_logit=30)
  q, k = peaked(20, False)
  case('documents', q=q, k=k, segment_ids=documents(t, chunk), target_logit=0)
  return out


def conv_regimes(seed, t, c, width=4):
  """One Regime per conv case: Gaussian, long constant runs (a third of the row each) under weights summing to
  zero (a difference filter: the output cancels to 0 on a run), large constant runs with small ripples, and
  documents with one-token ones. Arrays: x [1, T, C], weight [W, C] (shared by the rows; the last row's is
  used), initial_state [1, W-1, C], segment_ids, do."""
  rng = np.random.default_rng(seed)
  out = []

  def case(name, x, weight=None, segment_ids=None, **measured):
    weight = rng.standard_normal((width, c)) if weight is None else weight
    seg = np.zeros((1, t), np.int32) if segment_ids is None else segment_ids
    arrays = dict(x=x, weight=weight[None], initial_state=rng.standard_normal((1, width - 1, c)), segment_ids=seg,
                  do=rng.standard_normal((1, t, c)))
    ripple = np.median(np.abs(np.diff(x, axis=1))) / np.median(np.abs(x))
    out.append(Regime(name, arrays, dict(measured, longest_run=longest_run(x), relative_ripple=float(ripple))))

  runs = np.repeat(rng.standard_normal((1, 3, c)), -(-t // 3), axis=1)[:, :t]
  difference = rng.standard_normal((width, c))
  difference -= difference.mean(0)
  case('gaussian', rng.standard_normal((1, t, c)))
  case('constant runs, zero-sum taps', runs, difference)
  case('large runs, small ripples', 1e3 * runs + 1e-2 * rng.standard_normal((1, t, c)))
  case('documents', rng.standard_normal((1, t, c)), segment_ids=documents(t, 64))
  return out
