"""The load a recall document puts on a recurrent state: its records per recurrent key dimension.

Why: a recurrent layer retrieves a value by reading its state with the query's key, and a state whose keys are K
wide holds at most K keys that do not interfere, however the keys are chosen (K orthogonal directions). A document
of R records (its queried pairs and its distractors, hybrid_jax.data.recall) asks the state to hold R of them, so
R / K is the load: below 1 every record can have a direction of its own, above 1 they must share.

What a key dimension is, per kind (the directions a layer can write a key along and read back with a matching
query):
- GDN and Lightning: each head has its own key projection and its own state, so the layer has num_heads x key_dim.
  (One head holds key_dim; a head's load is the layer's times num_heads.)
- Mamba-2: B (its key) and C (its query) are shared by every head of a B/C group, whose heads differ only in their
  value channels and decay, so heads add value room, not key directions: num_groups x state_dim.
- Attention kinds (full, sliding, head-wise) and MLP layers keep no fixed-size state, so they have no load.
"""

from hybrid_jax.data import recall as recall_data
from hybrid_jax.models import pattern


def key_dimensions(model_cfg, kind: str) -> int | None:
  """The recurrent key dimensions of one layer of `kind` (module doc); None for a kind without a recurrent state."""
  if kind == 'mamba2':
    return int(model_cfg.mamba2.num_groups) * int(model_cfg.mamba2.state_dim)
  if kind in ('gdn', 'lightning'):
    section = model_cfg[kind]
    return int(section.num_heads) * int(section.key_dim)
  return None


def recall_load(data_cfg, model_cfg) -> dict:
  """{kind: load} for each recurrent kind among the model's layers, from a data config with recall fields:
  'key_dims'; 'records' and 'load' [fewest, most] over the training documents (pairs_min..pairs pairs plus the
  distractors); 'mean_load' over the training mixture (pairs drawn uniformly); 'held_out_records' and
  'held_out_load' of the held-out documents (eval_pairs, or pairs). Text documents hold no records and are left out.
  Empty when the model has no recurrent layer."""
  s = recall_data.Settings(int(data_cfg.seq_len), *recall_data.check_fields(data_cfg.recall))
  fewest, most = s.pairs_of('train')
  held_out = s.pairs_of('eval')[0] + s.distractors
  records = [fewest + s.distractors, most + s.distractors]
  out = {}
  for i in range(int(model_cfg.num_layers)):
    kind = pattern.layer_spec(model_cfg, i).kind
    dims = key_dimensions(model_cfg, kind)
    if dims is None or kind in out:
      continue
    out[kind] = {'key_dims': dims, 'records': records, 'load': [r / dims for r in records],
                 'mean_load': (sum(records) / 2) / dims, 'held_out_records': held_out,
                 'held_out_load': held_out / dims}
  return out


def describe(loads: dict) -> str:
  """'gdn: 9 records over 6 key dimensions, load 0.50 to 1.50 (mean 1.00; held out 1.50)' per kind, or ''."""
  parts = []
  for kind, x in loads.items():
    low, high = x['load']
    span = f'{high:.2f}' if low == high else f'{low:.2f} to {high:.2f} (mean {x["mean_load"]:.2f})'
    records = '-'.join(map(str, sorted(set(x['records']))))
    parts.append(f"{kind}: {records} records over {x['key_dims']} key dimensions, load {span}; held-out documents "
                 f"{x['held_out_load']:.2f}")
  return '; '.join(parts)
