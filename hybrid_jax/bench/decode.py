"""Decode speed and decode-state memory against context length (`python -m hybrid_jax bench decode`).

For each arch the one-token step runs at position L with a state sized for L tokens: time per token and state bytes
should stay flat in L for SWA and recurrent layers and grow for full attention. The state's contents do not affect
the cost, so no prefill is needed (which keeps long contexts cheap to measure on a CPU).
"""

import json
import statistics
import time

import jax
import jax.numpy as jnp

from hybrid_jax.config import CONFIG_DIR, load_config_file
from hybrid_jax.train import state as state_lib


def measure(arch, scale, context, steps, pure=False):
  """One row; `pure` makes every layer the arch's efficient kind (e.g. all SWA), isolating its cost."""
  cfg = load_config_file(f'{CONFIG_DIR / "hybrid.py"}:arch={arch},scale={scale}').model
  if pure:
    cfg.cycle = (tuple(cfg.cycle)[0],)
  model_def, params = state_lib.init_model(cfg, 0)
  state = model_def.bind(params).init_decode_state(1, context + steps)
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  step = jax.jit(lambda p, t, pos, s: model_def.bind(p).step(t, pos, s), donate_argnums=3)
  token = jnp.zeros((1,), jnp.int32)
  tic = time.perf_counter()
  logits, state = step(params, token, jnp.int32(context), state)
  logits.block_until_ready()
  compile_s = time.perf_counter() - tic
  times = []
  for i in range(1, steps):
    tic = time.perf_counter()
    logits, state = step(params, token, jnp.int32(context + i), state)
    logits.block_until_ready()
    times.append(time.perf_counter() - tic)
  return {'arch': arch, 'layers': ','.join(cfg.cycle), 'scale': scale, 'context': context, 'ms_per_token': 1e3 * statistics.median(times),
          'state_mib': state_bytes / 2**20, 'compile_s': compile_s}


def run(args) -> int:
  """One row per arch of `args.arches` (its pure form too) and context (the flags of `bench decode`)."""
  rows = [measure(arch, args.scale, int(ctx), args.steps, pure)
          for arch in args.arches.split(',') for pure in (False, True) for ctx in args.contexts
          if not (pure and arch == 'full')]
  print(f'decode bench: {jax.devices()[0].device_kind}, jax {jax.__version__}, scale {args.scale}, batch 1')
  print('| arch | layer cycle | context | ms / token | decode state MiB |')
  print('| --- | --- | --- | --- | --- |')
  for r in rows:
    print(f"| {r['arch']} | {r['layers']} | {r['context']} | {r['ms_per_token']:.2f} | {r['state_mib']:.2f} |")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(rows, f, indent=1)
  return 0
