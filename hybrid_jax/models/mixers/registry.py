"""The mixer registry: everything the project knows about one layer kind of `model.cycle`, declared once.

Each mixer module ends with `registry.register(MixerKind(...))`: the word that names it in `model.cycle`, the layer
it builds, its parameter count, its forward FLOPs, its config section (fields, defaults, checks), its role in the
study, whether it is attention (which the analyses read attention weights from and ablate heads of), the per-layer
values only its layer reads, and what runs saved before one of its keys existed were trained with. Config
validation, the base config, parameter counting, FLOPs, compile-check and the analyses read this registry; nothing
else names a mixer kind. A mixer written outside the package registers the same way and is loaded by naming its
module in `model.mixer_modules` (docs/ARCHITECTURE.md, "Adding a mixer").

The built-in kinds are the modules of this package (hybrid_jax/models/mixers/*.py), imported the first time the
registry is read, so a new built-in mixer is one file here. This module imports nothing from the project but the
ground floor (errors, config_keys) at load time, so every layer can read it without an import circle.
"""

import dataclasses
import importlib
import pkgutil
import sys
from typing import Any, Callable, Mapping

from hybrid_jax import config_keys
from hybrid_jax.errors import ConfigError, invalid_config

# A layer's role in the study's analyses; 'pointwise' layers (an MLP alone) mix nothing across positions.
ROLES = ('full', 'efficient', 'headwise', 'pointwise')


@dataclasses.dataclass(frozen=True)
class Field:
  """One key of a mixer's config section: its default, its doc and its check, one of hybrid_jax.config_keys' key
  checks (`check(config, dotted_key)`, raising ConfigError in the project's one wording)."""
  default: Any
  doc: str
  check: Callable[[Mapping, str], Any]


def positive_int(default: int, doc: str) -> Field:
  return Field(default, doc, config_keys.positive_int)


def nonnegative_int(default: int, doc: str) -> Field:
  return Field(default, doc, lambda config, key: config_keys.number(config, key, integer=True, nonnegative=True))


def nonnegative(default: float, doc: str) -> Field:
  return Field(default, doc, config_keys.nonnegative)


def boolean(default: bool, doc: str) -> Field:
  return Field(default, doc, config_keys.boolean)


def choice(default: str, allowed, doc: str) -> Field:
  allowed = tuple(allowed)
  return Field(default, doc, lambda config, key: config_keys.choice(config, key, allowed))


def _no_check(model_cfg, used: bool):
  del model_cfg, used


@dataclasses.dataclass(frozen=True)
class MixerKind:
  """One layer kind.

  name: the word in `model.cycle`.
  build(model_cfg, spec, *, rngs) -> the layer, an nnx.Module with `__call__(x, positions)` and the decode
    protocol `init_state(batch, max_len)`, `prefill(x, positions, state)`, `step(x, position, state)`.
  params(model_cfg, spec) -> its parameter count (a test holds it equal to the built layer's).
  flops(model_cfg, spec, seq_len) -> its forward FLOPs over one sequence as {'projections', 'core', 'conv'}
    (hybrid_jax.models.flops: weight matmuls, the mixing itself, short convs; remat policies recompute by part).
  spec(model_cfg, index) -> the layer's hybrid_jax.models.pattern.LayerSpec (None: no window, no RoPE).
  layer_options(model_cfg, index) -> {name: value} of what only this kind's layer reads of layer `index` (a
    hashable value each), carried as the spec's `options` and read with `spec.option(name)`: LayerSpec has no
    field of any one kind.
  role: 'full' (full causal attention), 'headwise' (full and windowed heads), 'pointwise' (mixes nothing across
    positions: an MLP layer of its own) or 'efficient' (everything else): what the study's analyses group it as.
  attention: the layer is softmax attention (hybrid_jax.models.mixers.attention.Attention's interface: `qkv`,
    `attend`, `out`, `kv_groups`), so the analyses read its attention weights, restrict its window and ablate its
    heads. A layer that is not attention is restricted by running it on windows of the input (windowed state).
  section / fields: its config section `model.<section>` and that section's keys; the base config holds them with
    their defaults, and validation checks every one whether or not the cycle uses the kind.
  validate(model_cfg, used): checks that need more than one key (raise ConfigError; `used`: the cycle has it).
  matched_shape: the fields that size it against the attention layer it replaces (docs/MIXER_SHAPES.md).
  init_mismatch(source_model_cfg, model_cfg) -> why parameters taken from a run of `source_model_cfg` compute
    something else here although the shapes agree (e.g. constants that are not parameters), or None.
  history: {field: (before(saved), why)} for a field added after runs were trained whose default would change
    what such a run computes: `before` takes the run's saved config (config.json, a nested dict) and gives the
    value it was trained with, or None when the default means the same; `why` is logged when it is used. Loading
    a run reads every kind's (hybrid_jax.train.runs), so an old run of the kind loads as trained.
  """
  name: str
  build: Callable
  params: Callable
  flops: Callable
  spec: Callable | None = None
  layer_options: Callable | None = None
  role: str = 'efficient'
  attention: bool = False
  section: str = ''
  fields: Mapping[str, Field] = dataclasses.field(default_factory=dict)
  validate: Callable = _no_check
  matched_shape: tuple[str, ...] = ()
  init_mismatch: Callable | None = None
  history: Mapping[str, tuple[Callable, str]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not self.name.isidentifier():
      raise ValueError(f'mixer kind name {self.name!r} must be an identifier')
    if self.role not in ROLES:
      raise ValueError(f'mixer kind {self.name!r}: role {self.role!r} is not one of {", ".join(ROLES)}')
    if self.fields and not self.section:
      raise ValueError(f'mixer kind {self.name!r} has config fields but no section')
    if not set(self.matched_shape) <= set(self.fields):
      raise ValueError(f'mixer kind {self.name!r}: matched_shape names fields it does not have')
    if not set(self.history) <= set(self.fields):
      raise ValueError(f'mixer kind {self.name!r}: history names fields it does not have')


_KINDS: dict[str, MixerKind] = {}
_BUILTINS_LOADED = False
# Every registration, in order: (kind name, the module whose code called register). It outlives a cleared _KINDS.
_REGISTRATIONS: list[tuple[str, str]] = []
# The kinds each module named in model.mixer_modules registered when load_modules imported it (a later import of
# the same module is a no-op that registers nothing, and is not that module's fault).
_LOADED: dict[str, tuple[str, ...]] = {}


def _kinds() -> dict[str, MixerKind]:
  """The registered kinds, the package's own modules imported first (once): the built-in kinds in the order of
  their modules' names, then any other in the order it registered (whatever imported what first)."""
  global _BUILTINS_LOADED
  if not _BUILTINS_LOADED:
    _BUILTINS_LOADED = True
    package = __name__.rpartition('.')[0]
    modules = [f'{package}.{m.name}' for m in pkgutil.iter_modules(importlib.import_module(package).__path__)]
    for module in modules:
      importlib.import_module(module)
    rank = {module: i for i, module in enumerate(modules)}
    ordered = sorted(_KINDS.values(), key=lambda k: rank.get(k.build.__module__, len(rank)))  # Stable.
    _KINDS.clear()
    _KINDS.update((k.name, k) for k in ordered)
  return _KINDS


def _origin(kind: MixerKind) -> tuple[str, str]:
  return kind.build.__module__, kind.build.__qualname__  # The same module imported again registers again.


def register(kind: MixerKind) -> MixerKind:
  """Adds `kind` (the call at the end of a mixer's module); a second kind of the same name is a bug."""
  if kind.name in _KINDS and _origin(_KINDS[kind.name]) != _origin(kind):
    raise ValueError(f'mixer kind {kind.name!r} is registered twice ({_KINDS[kind.name].build} and {kind.build})')
  # Kinds may share a section only by sharing its fields (e.g. the attention kinds, one layer class).
  sections = {k.section for k in _KINDS.values() if k.section and k.name != kind.name and k.fields is not kind.fields}
  if kind.section and kind.section in sections:
    raise ValueError(f'mixer kind {kind.name!r}: config section model.{kind.section} is another kind\'s')
  _KINDS[kind.name] = kind
  _REGISTRATIONS.append((kind.name, sys._getframe(1).f_globals.get('__name__', '')))  # pylint: disable=protected-access
  return kind


def names() -> tuple[str, ...]:
  return tuple(_kinds())


def kinds() -> tuple[MixerKind, ...]:
  return tuple(_kinds().values())


def get(name: str) -> MixerKind:
  """The kind `name`; ValueError naming the known kinds otherwise (a validated config never gets here)."""
  known = _kinds()
  if name not in known:
    raise ValueError(f'unknown layer kind {name!r}; known kinds: {", ".join(known)}')
  return known[name]


def _within(name: str, module: str) -> bool:
  return name == module or name.startswith(module + '.')


def _registered_by(module: str) -> tuple[str, ...]:
  """The kinds the code of `module` (or of a module inside it) registered, or whose layer it defines: how a module
  that was imported before load_modules saw it (by its user, or a built-in one) is known to be a mixer module."""
  names_ = [name for name, caller in _REGISTRATIONS if _within(caller, module)]
  names_ += [k.name for k in _KINDS.values() if _within(k.build.__module__, module)]
  return tuple(dict.fromkeys(names_))


def load_modules(modules) -> None:
  """Imports the mixer modules a config names (`model.mixer_modules`), which register their kinds; one
  ConfigError naming the module otherwise: one that does not import, or that registers no mixer kind (a typo'd
  or wrong module would else train as if nothing were named).

  Whether a module registered a kind is seen when it is imported here for the first time (what registered while
  it was imported, its own imports included) and remembered, since configs are loaded many times in one process
  and a module already imported registers nothing again; a module imported before by other code counts the kinds
  its own code registered.
  """
  if isinstance(modules, str) or not isinstance(modules, (tuple, list)):
    raise invalid_config('model.mixer_modules', modules, 'must be a list of importable module names')
  if modules:
    _kinds()  # The built-in kinds first: a module importing one of them registers nothing of its own by it.
  for module in modules:
    if not isinstance(module, str) or not module:
      raise invalid_config('model.mixer_modules', tuple(modules), 'must be a list of importable module names')
    fresh, start = module not in sys.modules, len(_REGISTRATIONS)
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except  # The user's module: any failure is one line.
      raise ConfigError(f'config.model.mixer_modules: cannot import {module!r}: {type(e).__name__}: {e}') from None
    if fresh:
      _LOADED[module] = tuple(dict.fromkeys(name for name, _ in _REGISTRATIONS[start:]))
    if not (_LOADED.get(module) or _registered_by(module)):
      raise ConfigError(f'config.model.mixer_modules: {module!r} imports but registered no mixer kind (a mixer '
                        'module ends with hybrid_jax.models.mixers.registry.register(MixerKind(...)))')


def add_sections(model_cfg, config_dict) -> None:
  """Adds each registered kind's config section that `model_cfg` lacks, with its defaults (`config_dict`: the
  ml_collections.ConfigDict class, passed in so this module stays free of it)."""
  for kind in kinds():
    if kind.section and kind.section not in model_cfg:
      model_cfg[kind.section] = config_dict({name: f.default for name, f in kind.fields.items()})


def validate(model_cfg) -> None:
  """Checks `model.cycle` names registered kinds, and every kind's section (used or not: a bad value there is a
  typo waiting for the next --config.model.cycle) and cross-field rules."""
  known = _kinds()
  cycle = tuple(model_cfg.cycle)
  if not cycle:
    raise invalid_config('model.cycle', model_cfg.cycle, 'must name at least one layer kind')
  for name in cycle:
    if not isinstance(name, str) or name not in known:
      raise invalid_config('model.cycle', model_cfg.cycle, f'unknown kind {name!r}; allowed kinds: {", ".join(known)} '
                    '(a kind defined outside the package loads through config.model.mixer_modules)')
  config = {'model': model_cfg}  # What config_keys' dotted keys start from.
  for kind in known.values():
    for field_name, field in kind.fields.items():
      field.check(config, f'model.{kind.section}.{field_name}')
    kind.validate(model_cfg, kind.name in cycle)


def history() -> dict[str, tuple[Callable, str]]:
  """Every kind's history rules by dotted key (`model.<section>.<field>`): what a run saved before the key existed
  was trained with (MixerKind.history)."""
  return {f'model.{kind.section}.{field}': rule for kind in kinds() for field, rule in kind.history.items()}


def init_mismatch(source_model_cfg, model_cfg) -> str | None:
  """The first reason a kind of the source run's cycle gives why its parameters compute something else here."""
  for name in dict.fromkeys(source_model_cfg.cycle):
    kind = _kinds().get(name)
    if kind and kind.init_mismatch:
      reason = kind.init_mismatch(source_model_cfg, model_cfg)
      if reason:
        return reason
  return None
