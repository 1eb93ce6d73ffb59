"""The mini-study's arches and presets, and the train config of one run (the config `mini` builds the same).

Scaled down, windows keep their role rather than their size: at a 64-token context a 2048-token window would be
full attention, so each preset maps the study's small, middle and large windows (128 / 512 / 2048) onto its own
context, and its distance ranges onto those windows. The recurrent mixers (Lightning, Mamba-2, GDN) keep the study's
rule of matching the attention layer's parameter count: each preset gives their inner shapes (`mixers`), and a test
holds every preset's shapes within 5% of its attention layer.
"""

import copy
import dataclasses

from hybrid_jax.analysis import callbacks
from hybrid_jax.config import CONFIG_DIR, ConfigError, load_config_file, validate
from hybrid_jax.data import recall as recall_data
from hybrid_jax.models import moe_matching, pattern
from hybrid_jax.models.mixers import registry

# Study label -> (arch in the config `hybrid`, which window its sliding layers use: 'small' | 'middle' | 'large' |
# None for no sliding layer). The report lists arches in this order.
ARCHES = {'SWA-128': ('swa128', 'small'), 'SWA-512': ('swa512', 'middle'), 'SWA-2048': ('swa2048', 'large'),
          'SWA-128-NoPE': ('swa128_nope', 'small'), 'SWA-128-1:3': ('swa128_1to3', 'small'),
          'Head-wise': ('swa128_headwise', 'small'), 'Lightning': ('lightning', None), 'Mamba-2': ('mamba2', None),
          'GDN': ('gdn', None), 'Full': ('full', None)}
# The arches whose only difference is the sliding window, small to large: large-window laziness is a trend over them.
WINDOW_ARCHES = ('SWA-128', 'SWA-512', 'SWA-2048')
RECURRENT_ARCHES = ('Lightning', 'Mamba-2', 'GDN')
BUCKETS = ('inside the small window', 'between the windows', 'beyond the large window')
BEYOND_CONTEXT = 'beyond the training context'
EXTRAPOLATION_BUCKETS = BUCKETS + (BEYOND_CONTEXT,)


def at_factor(bucket: str, factor: int) -> str:
  """The name of an extrapolation bucket scored on documents of `factor` x the training length."""
  return f'{bucket} at {factor}x'


@dataclasses.dataclass(frozen=True)
class Preset:
  scale: str
  seq_len: int
  small_window: int
  middle_window: int
  large_window: int
  steps: int
  batch_size: int
  probe_every: int
  # Distance ranges of the recall task, one per bucket of BUCKETS: their upper ends are the small window, the
  # large window and at most seq_len, so the probe's buckets (0 and each upper end) are the report's.
  distance_ranges: tuple
  arches: tuple = tuple(ARCHES)  # The labels `study` runs by default (--arches picks others).
  seeds: int = 1  # Default of --seeds.
  parallel: int = 1  # Default of --parallel: runs trained at a time (one tiny model leaves CPU cores idle).
  recall: tuple = ()  # Other data.recall overrides (key, value).
  probe_samples: int = 4  # The probe scores 8 x this many held-out recall documents.
  eval_documents: int = 128  # Held-out recall documents scored at the end (each holds data.recall.pairs queries).
  model: tuple = ()  # Extra model overrides (key, value).
  mixers: tuple = ()  # Recurrent mixer shapes: (kind, ((field, value), ...)), matched to the attention layer.
  # model.moe overrides (key, value): every block MLP a mixture of experts, each expert as wide as makes the active
  # parameters the dense run's (hybrid_jax.models.moe_matching). Empty: dense MLPs.
  moe: tuple = ()
  train: tuple = ()  # Extra train overrides (key, value).
  lr: float = 3e-3
  eval_batches: int = 2
  # Long-range retrieval counts as formed at the first probe where recall beyond the large window (where only full
  # attention reaches) is at least this.
  formation_threshold: float = 0.5
  # A full layer's retrieval counts as formed at the first probe where ablating its full heads lowers recall beyond
  # the large window by at least this (the head-ablation score; chance recall is 0.1).
  ablation_threshold: float = 0.25
  # The gradient signal that trains the full layers' queries and keys is read at the probes up to this step
  # (before any arch forms its retrieval circuit), so arches are compared at the same point of training.
  signal_until: int = 1000
  # Train until formed, within a cap (`steps`): each run stops once recall beyond the large window reaches
  # formed_threshold at formed_probes probes in a row (train.stop_when_formed, hybrid_jax.analysis.formation).
  stop_when_formed: bool = False
  formed_threshold: float = 0.95
  formed_probes: int = 2
  # Probe every dense_probe_every steps up to step dense_probe_until, every probe_every after, so a formation step
  # is seen finely where the early formers form (0 and 0: probe_every throughout).
  dense_probe_every: int = 0
  dense_probe_until: int = 0
  # Recall beyond the training context is scored on documents of each of these multiples of the training length.
  extrapolation_factors: tuple = (2, 4)
  note: str = ''

  @property
  def formed_metric(self) -> str:
    """The probe's metric of recall beyond the large window (its last distance bucket), which stop_when_formed
    watches."""
    edges = callbacks.recall_edges(self.distance_ranges)
    return f'recall_accuracy_{edges[-2]}_{edges[-1]}'

  @property
  def edges(self) -> list[int]:
    """Distance-bucket edges of BUCKETS."""
    return [0, self.small_window, self.large_window, self.seq_len]

  @property
  def fine_edges(self) -> list[int]:
    """Finer buckets: powers of two and the windows."""
    powers = [2 ** k for k in range(1, 31) if 2 ** k < self.seq_len]
    return sorted({0, *powers, self.small_window, self.middle_window, self.large_window, self.seq_len})

  def extrapolation_length(self, factor: int) -> int:
    """Length of the documents that test recall beyond the training context at `factor` x the training length."""
    return factor * self.seq_len

  def extrapolation_edges(self, factor: int) -> list[int]:
    return self.edges + [self.extrapolation_length(factor)]

  @property
  def extrapolation_names(self) -> list[str]:
    """Every extrapolation bucket's name (at_factor), factor by factor, in EXTRAPOLATION_BUCKETS order."""
    return [at_factor(bucket, f) for f in self.extrapolation_factors for bucket in EXTRAPOLATION_BUCKETS]

  def window(self, role: str | None) -> int | None:
    """The preset's window for a role of ARCHES (None: the arch has no sliding layer)."""
    return {'small': self.small_window, 'middle': self.middle_window, 'large': self.large_window, None: None}[role]

  def extrapolation_ranges(self, longest: int, factor: int) -> tuple:
    """The training distance ranges plus one beyond the training context, up to `longest` (the longest distance a
    record fits at the extrapolation length) and at most half the training length short of that length (room for
    every pair): at 2x, distances up to 1.5x the training length; at 4x, up to 3.5x."""
    top = self.extrapolation_length(factor) - self.seq_len // 2
    return tuple(self.distance_ranges) + ((self.seq_len + 1, min(longest, top)),)


# The mini task: 4 key-value records per document, keys of one of 16 letters, one-digit values (chance 0.1), written
# `VALUEKEY` in '.' filler and asked `KEYVALUE` later; 10% of documents are text. Why one digit and several pairs
# (docs/notebook/mini_study.md, "Why the hybrids did not learn the 1-pair task"): with one multi-digit pair per
# document the full layers learn the shortcut "attend to the only digits there are", which cannot tell the first
# digit from the others (byte accuracy 0.1-0.3, exact match 0 after 3000 steps for every hybrid); several pairs
# force the key match, and a one-digit value needs no ordering circuit.
# Two distractor records (never asked) per document: without them every record is asked once, so "the value of the
# nearest record not asked yet" answers most queries with no key match, and Full (whose first layer sees every
# record) learned that rule and stayed at 0.58 between the windows; with them every arch, Full included, learns the
# key match (docs/notebook/mini_study.md, "CPU: the mini-study with distractors").
_TASK = (('pairs', 4), ('key_chars', 16), ('value_length', 1), ('filler', '.'), ('text_fraction', 0.1),
         ('distractors', 2))
# 8 heads of width 16, each with its own keys and values. Eight heads, not four: the recall circuit (a head that
# copies the value into its key's position, and a head that matches the query's key against it) forms in whichever
# head starts closest, so more heads make its formation less of a lottery. With four heads, 5 of 12 runs learned
# every bucket in 4,000 steps; with eight, the SWA-128 seed that had stayed at 0.38 reached 0.98 by step 1,750.
# Wider heads (d_model 128, head width 32) did not help.
_HEADS = (('num_heads', 8), ('num_kv_heads', 8), ('head_dim', 16))
# Two layers (one cycle: a sliding or full layer under a full one), d_model 64.
_SMALL_MODEL = (('d_model', 64), ('num_layers', 2), *_HEADS, ('d_ff', 160),
                ('dtype', 'float32'))  # float32: on a CPU, bfloat16 matmuls are emulated, ~1.8x slower.
# Recurrent shapes matched to the attention layer of 8 x 16-wide heads (32,768 parameters at d_model 64, 65,536 at
# 128): Lightning and GDN 4 heads of key width 16 and value width 32, Mamba-2 8 heads of 16 channels.
_MIXERS_64 = (('lightning', (('num_heads', 4), ('key_dim', 16), ('value_dim', 32))),
              ('mamba2', (('num_heads', 8), ('head_dim', 16), ('state_dim', 48))),
              ('gdn', (('num_heads', 4), ('key_dim', 16), ('value_dim', 32))))
_MIXERS_128 = (('lightning', (('num_heads', 4), ('key_dim', 16), ('value_dim', 32))),
               ('mamba2', (('num_heads', 8), ('head_dim', 16), ('state_dim', 64))),
               ('gdn', (('num_heads', 4), ('key_dim', 16), ('value_dim', 32))))
# The study's warmup-stable-decay schedule without weight decay: weight decay kept the late formers (Full, SWA-2048)
# at chance through 3,000 steps, and a decaying rate lifted a partly formed circuit that a constant one had left flat
# for 1,000 steps (Full at 0.68 rose to 0.88 in 1,000 decaying steps).
_OPTIMIZER = (('weight_decay', 0.0),)
# A one-cycle stack holds no sliding layer above a full one, so 1:3 (three sliding layers under one full layer)
# needs four layers: it is in the two-cycle presets only.
_ONE_CYCLE_ARCHES = tuple(label for label in ARCHES if label != 'SWA-128-1:3')
_MINI = dict(scale='tiny', seq_len=64, small_window=8, middle_window=16, large_window=32, steps=5000,
             batch_size=16, probe_every=250, distance_ranges=((3, 8), (12, 32), (36, 56)), recall=_TASK,
             mixers=_MIXERS_64, train=_OPTIMIZER, parallel=2)
# The load presets: does a recurrent layer stop retrieving once its documents hold more records than its state has
# key dimensions (hybrid_jax.study.load)? The mini task at a 128-byte context with 2-letter keys (256 keys, so the
# keys do not run out) and 1 to 7 queried pairs a document beside 2 distractors: 3 to 9 records, 9 in every held-out
# document. The most a 128-byte row holds: (2 x 7 + 2) x (3 + 1) = 64 = 128 / 2 (data.recall's room rule).
_LOAD_TASK = (('pairs', 7), ('pairs_min', 1), ('key_length', 2), ('key_chars', 16), ('value_length', 1),
              ('filler', '.'), ('text_fraction', 0.1), ('distractors', 2))
# The recurrent key space shrunk to 90, 21, 12, 6 and 3 dimensions, so the fullest document's load (9 records) is
# 0.1, 0.43, 0.75, 1.5 and 3: GDN and Lightning as 3 heads of key width 30, 7, 4, 2, 1 (3 heads: the one count
# that reaches every width), Mamba-2 as state_dim (its heads share B and C). Parameters held within 5% of the
# attention layer by widening the values: GDN's and Lightning's value_dim, Mamba-2's head_dim over its 8 heads.
# load: (GDN and Lightning key_dim, GDN value_dim, Lightning value_dim, Mamba-2 state_dim, Mamba-2 head_dim).
_LOAD_SHAPES = {'0.1': (30, 34, 37, 90, 13), '0.4': (7, 50, 52, 21, 19), '0.75': (4, 52, 54, 12, 19),
                '1.5': (2, 54, 55, 6, 20), '3': (1, 54, 56, 3, 20)}


def _load_mixers(key_dim, gdn_value, lightning_value, state_dim, head_dim) -> tuple:
  return (('lightning', (('num_heads', 3), ('key_dim', key_dim), ('value_dim', lightning_value))),
          ('mamba2', (('num_heads', 8), ('head_dim', head_dim), ('state_dim', state_dim))),
          ('gdn', (('num_heads', 3), ('key_dim', key_dim), ('value_dim', gdn_value))))


# mini's stack and schedule, trained until formed (at most 20,000 steps), on the load task. Windows 16 / 32 / 64 of
# 128 bytes, distances inside the small window, between the windows and beyond the large one. GDN and Mamba-2 are the
# subjects; SWA-128 (no recurrent state: its recall should not move with the load) and Lightning (a recurrent state
# at the same load without the delta rule's overwrite) are the controls. A cell (arch x load) is one command:
# `study --preset load-1.5 --arches gdn`.
_LOAD = dict(scale='tiny', seq_len=128, small_window=16, middle_window=32, large_window=64, steps=20000,
             batch_size=16, probe_every=250, distance_ranges=((4, 16), (20, 64), (72, 120)), recall=_LOAD_TASK,
             model=_SMALL_MODEL, train=_OPTIMIZER + (('warmup_steps', 500), ('checkpoint_every', 2500)),
             arches=('SWA-128', 'Lightning', 'Mamba-2', 'GDN'), stop_when_formed=True, dense_probe_every=50,
             dense_probe_until=2500, parallel=2)
PRESETS = {
    # Every arch of the one-cycle stack trained until its long-range retrieval has formed, within a cap of 20,000
    # steps: a run stops once recall beyond the large window is >= 0.95 at two probes in a row, so the verdicts
    # about converged models read formed runs, not slow formers cut off at a fixed budget. Warmup and checkpoints
    # as in mini-5k, so its run directories resume here (a run already formed stops without training). Probes
    # every 50 steps up to 2,500 (the earliest formations are near step 2,000), every 250 after. 16 rows a step (a
    # step of 32 rows costs more than twice as much). One seed of the nine arches: 26 minutes on 2 cores, every arch
    # formed (SWA-512 last, at step 11,250; BENCHMARKS.md, "The mini-study").
    'mini': Preset(**{**_MINI, 'steps': 20000,
                      'train': _OPTIMIZER + (('warmup_steps', 500), ('checkpoint_every', 2500))},
                   model=_SMALL_MODEL, arches=_ONE_CYCLE_ARCHES, stop_when_formed=True,
                   dense_probe_every=50, dense_probe_until=2500,
                   note='2 CPU cores, two runs at a time; until formed, at most 20,000 steps'),
    # The same runs at a fixed 5,000 steps, where Full and SWA-128-NoPE, the slowest formers, form in 2 of 5 seeds
    # each (the 5,000-step verdicts of BENCHMARKS.md, "The mini-study"). One seed of the nine arches: 23:52.
    'mini-5k': Preset(**_MINI, model=_SMALL_MODEL, arches=_ONE_CYCLE_ARCHES,
                      note='2 CPU cores, two runs at a time; 5,000 steps'),
    # Two cycles (sliding / full / sliding / full; 1:3 as three sliding layers under one full layer), so a sliding
    # layer above a full one can retrieve inside its window: the study's mechanism of laziness can act here.
    'mini-deep': Preset(**_MINI, model=_SMALL_MODEL + (('num_layers', 4),),
                        note='2 CPU cores, two runs at a time; four layers'),
    # The mini preset's task and heads at a 256-byte context, d_model 128, 4 layers (two cycles, so a
    # sliding layer sits above a full one), 8 records per document, every arch, one seed: sized by arithmetic from
    # the CPU runs for one H200 (not yet measured there; BENCHMARKS.md).
    # mini with every block MLP a mixture of 8 SwiGLU experts, 2 a token, at the dense runs' active parameters: do
    # the verdicts survive routing (the released hybrids are MoE)? The default balancing and z losses, as users
    # train them: without them the router may collapse onto one expert and the test would be of a dense model.
    'mini-moe': Preset(**{**_MINI, 'steps': 20000,
                          'train': _OPTIMIZER + (('warmup_steps', 500), ('checkpoint_every', 2500))},
                       model=_SMALL_MODEL, arches=_ONE_CYCLE_ARCHES, stop_when_formed=True,
                       dense_probe_every=50, dense_probe_until=2500,
                       moe=(('num_experts', 8), ('top_k', 2)),
                       note='2 CPU cores, two runs at a time; MoE block MLPs; until formed, at most 20,000 steps'),
    **{f'load-{load}': Preset(**_LOAD, mixers=_load_mixers(*shape), note=f'until formed, at most 20,000 steps; '
                                 f'fullest training document at load {load}')
       for load, shape in _LOAD_SHAPES.items()},
    # Trained on documents of up to 9 records over 6 recurrent key dimensions (load-1.5's shapes: loads 0.5 to 1.5)
    # with corpus text around the records, scored on documents of one pair (3 records: load 0.5): whether a state
    # trained overloaded still retrieves when the load is light. Held-out documents hold one query each, so the probe
    # and the final scores read 4x as many of them.
    'train-high': Preset(**{**_LOAD, 'recall': _LOAD_TASK + (('haystack', 'text'), ('eval_pairs', 1))},
                         mixers=_load_mixers(*_LOAD_SHAPES['1.5']), probe_samples=16, eval_documents=512,
                         note='until formed, at most 20,000 steps; trained at load up to 1.5 in corpus text, '
                         'scored on 1-pair documents'),
    'gpu-small': Preset(scale='tiny', seq_len=256, small_window=16, middle_window=48, large_window=128, steps=3000,
                        batch_size=64, probe_every=250, distance_ranges=((3, 16), (24, 128), (144, 248)), seeds=1,
                        recall=_TASK + (('pairs', 8),), train=_OPTIMIZER, note='one H200, ~7 minutes',
                        model=_HEADS, mixers=_MIXERS_128),
    # Seconds per run: exercises the machinery only (tests); its numbers mean nothing.
    'smoke': Preset(scale='tiny', seq_len=64, small_window=8, middle_window=16, large_window=32, steps=4,
                    batch_size=2, probe_every=2, distance_ranges=((3, 8), (12, 32), (36, 58)), probe_samples=1,
                    eval_documents=4, eval_batches=1, recall=(('pairs', 2),), signal_until=4,
                    arches=('SWA-128', 'SWA-2048', 'Head-wise', 'GDN', 'Full'),  # One of each kind of layer.
                    model=(('d_model', 32), ('num_layers', 2), ('num_heads', 2), ('num_kv_heads', 2),
                           ('head_dim', 16), ('d_ff', 64)),
                    mixers=(('lightning', (('num_heads', 1), ('key_dim', 16), ('value_dim', 16))),
                            ('mamba2', (('num_heads', 2), ('head_dim', 16), ('state_dim', 16))),
                            ('gdn', (('num_heads', 1), ('key_dim', 16), ('value_dim', 16)))),
                    note='machinery check only'),
}


# One line per preset for `study --help`.
DESCRIPTIONS = {
    'mini': 'every one-cycle arch, 64-byte rows; trains until retrieval forms, capped at 20,000 steps',
    'mini-5k': "mini's runs at a fixed 5,000 steps",
    'mini-deep': 'two cycles (a sliding layer above a full one), 5,000 steps',
    'mini-moe': "mini with MoE block MLPs (8 experts, top 2) at the dense runs' active parameters; until formed",
    **{f'load-{load}': f'GDN, Mamba-2 (controls: SWA-128, Lightning) at load {load} (records per recurrent key '
                       'dimension), 1-7 pairs; until formed' for load in _LOAD_SHAPES},
    'train-high': 'load-1.5 trained in corpus text (loads 0.5-1.5), scored on 1-pair documents; until formed',
    'gpu-small': '4 layers at d_model 128 and 256-byte rows, 3,000 steps (one H200)',
    'smoke': 'seconds a run: the machinery only (tests)'}


def label_of(name: str, what: str) -> str:
  """The study label `name` stands for (a label or an arch name, any case), for --arches and the config `mini` alike;
  ConfigError naming `what` (the flag or argument and its whole value) otherwise."""
  names = {label.lower(): label for label in ARCHES} | {arch: label for label, (arch, _) in ARCHES.items()}
  if name.strip().lower() not in names:
    raise ConfigError(f'{what} is invalid: {name.strip()!r} is not one of '
                      f'{", ".join(ARCHES)} (or {", ".join(a for a, _ in ARCHES.values())})')
  return names[name.strip().lower()]


def select_arches(spec: str | None, preset: Preset | None = None) -> list[str]:
  """Study labels named by `--arches` (labels or arch names, comma-separated, any case); the preset's when None."""
  if spec is None:
    return list(ARCHES if preset is None else preset.arches)
  chosen = {label_of(item, f'--arches={spec!r}') for item in spec.split(',')}
  return [label for label in ARCHES if label in chosen]  # The report's order.


def run_config(label: str, preset: Preset, seed: int = 0):
  """The validated train config of one arch of the preset (ConfigError for an arch the preset does not hold)."""
  arch, role = ARCHES[label]
  c = load_config_file(f'{CONFIG_DIR / "hybrid.py"}:arch={arch},scale={preset.scale}')
  c.name = f'mini_{arch}_seed{seed}'
  c.seed = seed
  c.data.update(dict(source='recall', tokenizer='byte', seq_len=preset.seq_len, long_short_ratio=0.0))
  c.data.recall.distance_ranges = preset.distance_ranges
  c.data.recall.update(dict(preset.recall))
  c.model.update(dict(preset.model))
  for kind, shape in preset.mixers:
    c.model[kind].update(dict(shape))
  if preset.moe:
    c.model.moe.update(dict(blocks='all', **dict(preset.moe)))
    c.model.moe.expert_d_ff = moe_matching.matched_expert_width(c.model)
  if role is not None:
    c.model.window = preset.window(role)
  if 'headwise' in tuple(c.model.cycle):  # The study's head-wise layers attend fully with half their KV groups.
    c.model.headwise_full_kv_heads = max(1, c.model.num_kv_heads // 2)
  c.train.update(dict(steps=preset.steps, batch_size=preset.batch_size, lr=preset.lr,
                      warmup_steps=max(1, preset.steps // 10), eval_every=0,
                      checkpoint_every=max(1, preset.steps // 2), log_every=max(1, min(10, preset.steps // 4)),
                      eval_batches=preset.eval_batches, retrieval_probe_every=preset.probe_every,
                      retrieval_probe_samples=preset.probe_samples, retrieval_probe_length=preset.seq_len,
                      retrieval_probe_dense_every=preset.dense_probe_every,
                      retrieval_probe_dense_until=preset.dense_probe_until,
                      stop_when_formed=preset.formed_metric if preset.stop_when_formed else '',
                      formed_threshold=preset.formed_threshold, formed_probes=preset.formed_probes, progress=False))
  c.train.update(dict(preset.train))
  c.eval.update(dict(batches=preset.eval_batches, documents=0))
  roles = {registry.get(pattern.layer_spec(c.model, i).kind).role for i in range(c.model.num_layers)}
  if not roles & {'full', 'headwise'}:  # Every verdict is about the full-attention layers.
    name = next((n for n, p in PRESETS.items() if p == preset), 'this preset')
    holding = [n for n, p in PRESETS.items() if label in p.arches]
    raise ConfigError(f'the mini-study preset {name!r} cannot hold {label}: its {c.model.num_layers}-layer stack '
                      f'of {"/".join(c.model.cycle)} has no full-attention layer; presets with it: '
                      f'{", ".join(holding)}')
  return validate(c)


def extrapolation_data(data_cfg, preset: Preset, factor: int):
  """The run's data config at `factor` x the training length, with a distance range beyond the training context."""
  data = copy.deepcopy(data_cfg)
  r = data.recall
  longest = preset.extrapolation_length(factor) - r.key_length - 2 * r.value_length - r.get('record_gap', 0) + 1
  data.seq_len = preset.extrapolation_length(factor)
  data.recall.distance_ranges = preset.extrapolation_ranges(longest, factor)
  data.recall.distance_weights = (1.0,) * len(data.recall.distance_ranges)
  recall_data.settings(data)  # Checked here, so an impossible preset fails before any training.
  return data
