"""Expert parallelism: an MoE layer's experts split over the mesh axes of the logical axis 'expert', each device
computing its own experts for the tokens of every device of its expert group.

The exchange is an all-gather of the tokens (and their routing) over the expert axis before the experts and a
reduce-scatter of the weighted outputs after them, not an all-to-all of the sorted assignments: it needs no
count exchange and no second sort, its shapes are static without a capacity, and each assignment is computed by
the one device that holds its expert, so dropless stays exact (docs/MOE.md, "Expert parallelism", compares the
bytes moved). Everything else of the layer (routing, statistics) stays with GSPMD; only the dispatch runs here,
per device, in a shard_map.
"""

import dataclasses

import jax
from jax.sharding import PartitionSpec as P

from hybrid_jax.parallel import activations
from hybrid_jax.parallel import rules as rules_lib


@dataclasses.dataclass(frozen=True)
class Split:
  """This device's share of the experts inside the shard_map: the expert dimension split over the mesh `axes`
  (major first); of those, `gathered` also split the tokens (tokens all-gathered, outputs reduce-scattered over
  them) and `summed` do not (the tokens are the same there: outputs summed)."""
  axes: tuple
  gathered: tuple
  summed: tuple

  def first(self, local: int):
    """Global id of this device's first expert, with `local` experts on each device."""
    return jax.lax.axis_index(self.axes) * local

  def tokens(self, x):
    """x [n, ...] of this device -> [g n, ...] of the g devices of its group, in the order `outputs` returns them."""
    return jax.lax.all_gather(x, self.gathered, axis=0, tiled=True) if self.gathered else x

  def outputs(self, y):
    """y [g n, ...], this device's experts' part of every group token's output -> [n, ...] of its own tokens,
    summed over every device's experts."""
    if self.gathered:
      y = jax.lax.psum_scatter(y, self.gathered, scatter_dimension=0, tiled=True)
    return jax.lax.psum(y, self.summed) if self.summed else y


def _names(entry) -> tuple:
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def local(fn, tokens, token_axes, weights, out_ranks):
  """`fn(*tokens, *weights, split=...)` per device (shard_map over the active sharded step's mesh), or with
  `split=None` outside one.

  `tokens`: arrays [*lead, c] whose lead dimensions have the logical axes `token_axes` (e.g. ('batch', 'seq')), each
  device taking its part as the activations' rules split them. `weights`: expert arrays [E, ...] (None passes
  through), split over the mesh axes of the rule 'expert' when they divide E; `split` then says where this device's
  experts are (None when every device holds all of them). `fn` returns arrays of this device's tokens, output i of
  rank len(lead) + out_ranks[i]."""
  active = activations.active_step()
  if active is None:
    return fn(*tokens, *weights, split=None)
  mesh, rules = active
  shape = dict(mesh.shape)
  lead = tuple(rules_lib.layout('MoE tokens', tokens[0].shape[:-1], token_axes, rules, shape).spec)
  present = [w for w in weights if w is not None]
  axes = _names(rules_lib.layout('experts', present[0].shape[:1], ('expert',), rules, shape).spec[0])
  split = None
  if axes:
    token_mesh_axes = {a for e in lead for a in _names(e)}
    split = Split(axes, tuple(a for a in axes if a in token_mesh_axes),
                  tuple(a for a in axes if a not in token_mesh_axes))

  def per_device(*args):  # shard_map passes the present weights only.
    given = iter(args[len(tokens):])
    return fn(*args[:len(tokens)], *(None if w is None else next(given) for w in weights), split=split)

  in_specs = (tuple(P(*lead, None) for _ in tokens)
              + tuple(P(axes or None, *(None,) * (w.ndim - 1)) for w in present))
  out_specs = tuple(P(*lead, *(None,) * r) for r in out_ranks)
  return jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)(*tokens, *present)
