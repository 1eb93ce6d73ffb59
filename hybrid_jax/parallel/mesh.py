"""The device mesh from `config.parallel`, and NamedShardings for params, optimizer state and batches.

Mesh axes are ('data', 'fsdp', 'expert', 'sequence', 'tensor'); a size of -1 takes the devices the others leave.
For multislice (several TPU slices joined by the data-center network) the `dcn_*` sizes give the across-slice
shape and the plain sizes the within-slice shape; the mesh is their product. The same code yields a (1, 1, 1, 1)
mesh on one CPU. The 'expert' axis is in the mesh only when it has more than one device: a run without expert
parallelism keeps the four axes it always had, so its recorded mesh, reports and shardings are unchanged (the
rules skip an axis the mesh lacks, as one of size 1).
"""

import dataclasses
import logging
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from hybrid_jax.errors import UserError
from hybrid_jax.kernels import platform
from hybrid_jax.parallel import rules as rules_lib

AXES = rules_lib.MESH_AXES
OPTIONAL_AXES = ('expert',)  # Left out of the mesh at one device (within and across slices).


class MeshError(UserError, ValueError):
  """The requested mesh shape does not fit the devices."""


def _resolve(sizes: dict, total: int, what: str) -> dict:
  free = [a for a in AXES if sizes[a] == -1]
  if len(free) > 1:
    raise MeshError(f'{what}: only one mesh axis may be -1, got {", ".join(free)}')
  fixed = math.prod(sizes[a] for a in AXES if sizes[a] != -1)
  if free:
    if total % fixed:
      raise MeshError(f'{what}: {total} devices cannot be split into {sizes} (the fixed axes multiply to {fixed})')
    sizes = {**sizes, free[0]: total // fixed}
  if math.prod(sizes.values()) != total:
    raise MeshError(f'{what}: mesh {sizes} needs {math.prod(sizes.values())} devices, but there are {total}')
  return sizes


def mesh_shape(parallel_cfg, num_devices: int, num_slices: int = 1) -> tuple[dict, dict]:
  """(within-slice sizes, across-slice sizes) as {'data': n, 'fsdp': n, 'sequence': n, 'tensor': n}, with -1
  resolved, and 'expert': n in both when the expert axis has more than one device."""
  p = parallel_cfg
  dcn = _resolve({a: int(p[f'dcn_{a}']) for a in AXES}, num_slices, 'config.parallel.dcn_*')
  if num_devices % num_slices:
    raise MeshError(f'{num_devices} devices do not split into {num_slices} equal slices')
  ici = _resolve({a: int(p[a]) for a in AXES}, num_devices // num_slices, 'config.parallel.{' + ','.join(AXES) + '}')
  unused = [a for a in OPTIONAL_AXES if ici[a] * dcn[a] == 1]
  return ({a: n for a, n in ici.items() if a not in unused}, {a: n for a, n in dcn.items() if a not in unused})


def _num_slices(devices) -> int:
  return len({getattr(d, 'slice_index', 0) for d in devices})


def make_mesh(parallel_cfg, devices=None) -> Mesh:
  """The ('data', 'fsdp', ['expert',] 'sequence', 'tensor') mesh over `devices` (default: all devices of all
  processes)."""
  devices = list(jax.devices() if devices is None else devices)
  slices = _num_slices(devices)
  ici, dcn = mesh_shape(parallel_cfg, len(devices), slices)
  axes = tuple(ici)
  auto = (AxisType.Auto,) * len(axes)  # Classic GSPMD: shardings come from jit's in/out shardings.
  if slices > 1:
    from jax.experimental import mesh_utils
    arr = mesh_utils.create_hybrid_device_mesh([ici[a] for a in axes], [dcn[a] for a in axes], devices)
    return Mesh(arr, axes, axis_types=auto)
  shape = [ici[a] * dcn[a] for a in axes]
  if devices == list(jax.devices()):
    return jax.make_mesh(shape, axes, axis_types=auto)
  return Mesh(_device_array(shape, devices), axes, axis_types=auto)


_FALLBACK_CAUSES_REPORTED = set()


def _device_array(shape, devices) -> np.ndarray:
  """`devices` arranged as `shape`: topology-aware (TPU torus neighbours on the inner axes, also for unattached
  AOT devices) when jax can, else in the given order, which is valid but may put mesh neighbours on distant chips.
  The fallback is said once per cause, since it decides how fast the collectives of a pod run."""
  from jax.experimental import mesh_utils
  try:
    try:
      return mesh_utils.create_device_mesh(shape, devices=devices)
    except NotImplementedError:  # An axis that is no product of whole torus axes (8 on 4x4x4): split one.
      return mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
  except Exception as e:  # pylint: disable=broad-except  (jax raises several types; each is reported below)
    cause = f'{type(e).__name__}: {e}'
    if cause not in _FALLBACK_CAUSES_REPORTED:
      _FALLBACK_CAUSES_REPORTED.add(cause)
      logging.warning('mesh: jax could not lay out %d %s devices as %s by topology (%s); using them in the order '
                      'given instead, which may put mesh neighbours on distant chips and slow the collectives',
                      len(devices), devices[0].platform if devices else '', shape, cause)
  return np.asarray(devices).reshape(shape)


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)


@dataclasses.dataclass(frozen=True)
class ParamLayout:
  name: str
  shape: tuple
  logical_axes: tuple
  layout: rules_lib.Layout


def param_layouts(model_def, rules: dict, mesh_shape_: dict) -> list[ParamLayout]:
  """The layout of every parameter, from the `logical_axes` metadata of the model's abstract state."""
  out = []
  leaves = jax.tree.leaves_with_path(model_def.abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  for path, var in leaves:
    name = _path_name(path)
    value = var.get_value()
    axes = var.get_metadata().get('logical_axes')
    if axes is None:  # Unannotated: replicated (correct, maybe wasteful); the report flags it.
      axes = ('unannotated',) * len(value.shape)
    out.append(ParamLayout(name, tuple(value.shape), tuple(axes),
                           rules_lib.layout(name, value.shape, axes, rules, mesh_shape_)))
  return out


@dataclasses.dataclass(frozen=True)
class TrainShardings:
  """Shardings of the train state {'step', 'params', 'opt_state'}, of a batch, and the replicated one; `rules`
  also lay out the activations while the step is traced (hybrid_jax.parallel.activations)."""
  mesh: Mesh
  state: dict
  batch: NamedSharding
  replicated: NamedSharding
  rules: dict = dataclasses.field(default_factory=dict)


def param_shardings(model_def, mesh: Mesh, rules: dict):
  """A pure dict (the params' structure) of NamedShardings."""
  by_name = {p.name: NamedSharding(mesh, p.layout.spec) for p in param_layouts(model_def, rules, dict(mesh.shape))}
  pure = nnx.to_pure_dict(model_def.abstract_state)
  return jax.tree_util.tree_map_with_path(lambda path, _: by_name[_path_name(path)], pure)


def _opt_state_shardings(abstract_opt_state, abstract_params, p_shardings, replicated, over_data: bool):
  """Optimizer leaves that mirror a parameter (Adam moments) take its sharding, also split over the 'data' axis
  when `over_data`; the rest are replicated."""
  params = {tuple(_path_name([k]) for k in path): (leaf.shape, s) for (path, leaf), s in zip(
      jax.tree.leaves_with_path(abstract_params), jax.tree.leaves(p_shardings))}

  def pick(path, leaf):
    keys = tuple(_path_name([k]) for k in path)
    for start in range(len(keys)):
      match = params.get(keys[start:])
      if match is not None and match[0] == leaf.shape:
        return _split_over_data(match[1], leaf.shape) if over_data else match[1]
    return replicated

  return jax.tree_util.tree_map_with_path(pick, abstract_opt_state)


def _split_over_data(sharding: NamedSharding, shape) -> NamedSharding:
  """`sharding` with its largest dimension that the 'data' axis divides (after its own split) also split over
  'data' (ZeRO-1: each data-parallel chip keeps and updates a part of the optimizer state); unchanged when the
  axis has one device, is already used, or divides no dimension."""
  mesh, ways = sharding.mesh, sharding.mesh.shape['data']
  spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
  axes = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in spec]
  if ways == 1 or any('data' in a for a in axes):
    return sharding
  fits = [d for d, n in enumerate(shape) if n % (ways * math.prod(mesh.shape[a] for a in axes[d])) == 0]
  if not fits:
    return sharding
  d = max(fits, key=lambda i: shape[i])
  axes[d] = ('data',) + axes[d]
  return NamedSharding(mesh, P(*(None if not a else a[0] if len(a) == 1 else a for a in axes)))


def train_shardings(model_def, tx, mesh: Mesh, rules: dict, shard_optimizer: bool = False) -> TrainShardings:
  """The train state's, batch's and replicated shardings; `shard_optimizer` (config.parallel.shard_optimizer)
  splits the Adam moments over the data-parallel chips too."""
  p_shardings = param_shardings(model_def, mesh, rules)
  replicated = NamedSharding(mesh, P())
  abstract_params = nnx.to_pure_dict(model_def.abstract_state)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  state = {'step': replicated, 'params': p_shardings,
           'opt_state': _opt_state_shardings(abstract_opt, abstract_params, p_shardings, replicated, shard_optimizer)}
  batch_axes = tuple(a for a in rules.get('batch', ()) if mesh.shape.get(a, 1) > 1)
  batch = NamedSharding(mesh, P(batch_axes or None))
  return TrainShardings(mesh, state, batch, replicated, rules)


def batch_shards(mesh: Mesh, rules: dict) -> int:
  """How many ways the batch dimension is split (train.batch_size must be a multiple)."""
  return math.prod(mesh.shape.get(a, 1) for a in rules.get('batch', ()))


def check_batch(train_cfg, mesh_shape_: dict, rules: dict) -> None:
  """MeshError, before anything compiles, when a micro-batch (train.batch_size / train.grad_accum rows) does not
  split evenly over the mesh axes the batch is sharded on; names both numbers and the fix."""
  axes = [a for a in rules.get('batch', ()) if mesh_shape_.get(a, 1) > 1]
  ways = math.prod(mesh_shape_[a] for a in axes)
  rows = train_cfg.batch_size // max(1, train_cfg.grad_accum)
  if rows % ways:
    split = ' x '.join(f'{a} {mesh_shape_[a]}' for a in axes)
    accum = f' / train.grad_accum={train_cfg.grad_accum}' if train_cfg.grad_accum > 1 else ''
    fits = ways * max(1, -(-rows // ways)) * max(1, train_cfg.grad_accum)
    raise MeshError(f'config.train.batch_size={train_cfg.batch_size}{accum} gives {rows} rows a step, which do not '
                    f'split over the {ways} batch shards of the mesh ({split}): use a batch of a multiple of '
                    f'{ways * max(1, train_cfg.grad_accum)} rows (e.g. {fits}) or fewer data-parallel ways '
                    '(config.parallel.data / fsdp / expert)')


def check_sequence(seq_len: int, mesh_shape_: dict, rules: dict) -> None:
  """MeshError, before anything compiles, when the mesh axes the sequence is split over (rule `seq`) do not divide
  data.seq_len; names both numbers."""
  axes = [a for a in rules.get('seq', ()) if mesh_shape_.get(a, 1) > 1]
  ways = math.prod(mesh_shape_[a] for a in axes)
  if seq_len % ways:
    split = ' x '.join(f'{a} {mesh_shape_[a]}' for a in axes)
    raise MeshError(f'config.data.seq_len={seq_len} does not split into the {ways} sequence shards of the mesh '
                    f'({split}): use a length that is a multiple of {ways} or fewer sequence ways '
                    '(config.parallel.sequence)')


def unsplit_warning(model_def, rules: dict, mesh_shape_: dict) -> str | None:
  """One line when a rule asks to split a parameter dimension the mesh does not divide (e.g. 2 KV heads over a
  tensor axis of 4): those tensors stay whole on every device of that axis, which is correct but costs memory and
  time, so the run goes on and says so once; None when every requested split happens."""
  notes, tensors, extra = {}, 0, 0
  devices = math.prod(mesh_shape_.values())
  for p in param_layouts(model_def, rules, mesh_shape_):
    asked = [note for note in p.layout.unsplit if '%' in note]  # Not the 'no rule' notes: nothing asked there.
    if asked:
      tensors += 1
      extra += math.prod(p.shape)
      for note in asked:
        notes.setdefault(note, 0)
        notes[note] += 1
  if not notes:
    return None
  listed = '; '.join(f'{note}: {count} tensor{"s" * (count > 1)}' for note, count in notes.items())
  return (f'{tensors} parameter tensors ({extra:,} elements) are not split where config.parallel.rules asks, '
          f'because the mesh {dict(mesh_shape_)} ({devices} devices) does not divide them: {listed}. They are '
          'kept whole on those devices (correct, but more memory per device); to split them, make the dimension a '
          'multiple of the mesh axes (e.g. model.num_heads / num_kv_heads) or use fewer tensor / fsdp ways '
          '(`python -m hybrid_jax shardings` lists every tensor)')


def sharding_report(model_def, rules: dict, mesh_shape_: dict) -> tuple[list[dict], str]:
  """(rows, text): every parameter's sharding and per-device size; flags tensors left (partly) replicated.

  A tensor is flagged when a rule asked for a split the shape does not allow, or when it is fully replicated on
  a multi-device mesh although one of its dimensions divides by an unused mesh axis (a rule could shard it).
  """
  rows, devices = [], math.prod(mesh_shape_.values())
  for p in param_layouts(model_def, rules, mesh_shape_):
    split = 1
    used = set()
    for entry in p.layout.spec:
      for a in (entry if isinstance(entry, tuple) else (entry,) if entry else ()):
        split *= mesh_shape_[a]
        used.add(a)
    flags = [f'not split: {u}' for u in p.layout.unsplit]
    if split == 1 and devices > 1:
      options = [f'{logical}->{a}' for dim, logical in zip(p.shape, p.logical_axes)
                 for a in AXES if logical and a not in used and mesh_shape_.get(a, 1) > 1
                 and dim % mesh_shape_[a] == 0]
      if options:
        flags.append('replicated; could shard ' + ', '.join(options[:3]))
    size = math.prod(p.shape)
    rows.append({'name': p.name, 'shape': list(p.shape), 'logical_axes': list(p.logical_axes),
                 'spec': str(p.layout.spec), 'per_device_fraction': 1 / split, 'elements': size, 'flags': flags})
  width = max(len(r['name']) for r in rows)
  lines = [f'mesh {mesh_shape_} ({devices} devices)', f'{"parameter":{width}s}  {"shape":18s} {"spec":40s} flags']
  for r in rows:
    lines.append(f'{r["name"]:{width}s}  {str(tuple(r["shape"])):18s} {r["spec"]:40s} {"; ".join(r["flags"])}')
  flagged = sum(bool(r['flags']) for r in rows)
  total = sum(r['elements'] for r in rows)
  per_device = sum(r['elements'] * r['per_device_fraction'] for r in rows)
  lines.append(f'{len(rows)} parameters, {flagged} flagged; {total:,} elements, {per_device:,.0f} per device')
  return rows, '\n'.join(lines)


def topology_devices(topology: str, num_slices: int = 1) -> list:
  """The (unattached) devices of a TPU topology such as 'v5p:4x4x4' (times `num_slices` slices joined over the
  data-center network), for ahead-of-time compilation from any host."""
  platform.quiet_offline_libtpu()
  try:
    from jax.experimental import topologies
    desc = topologies.get_topology_desc(topology_name=topology, platform='tpu', num_slices=num_slices)
  except Exception as e:  # No libtpu, or a name libtpu does not know.
    raise MeshError(f'cannot describe TPU topology {topology!r}: {type(e).__name__}: {e}. Targeting a TPU '
                    "topology needs libtpu (pip install -e '.[tpu]'); names look like 'v5p:4x4x4' or "
                    "'v5e:16x16'. Without libtpu, check a fake CPU mesh with --devices=N instead.") from e
  return list(desc.devices)
