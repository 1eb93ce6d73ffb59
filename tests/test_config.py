"""Config files and validation: every study run builds, every bad value fails early with a clear message."""

import ml_collections
import pytest

from hybrid_jax.config import (BASE_CONFIG, CONFIG_DIR, ConfigError, apply_override, load_config_file, load_run,
                               resolve_path, resolve_spec, validate)
from tests.conftest import study_config

AVAILABLE = ['full', 'swa128', 'swa512', 'swa2048', 'swa128_nope', 'swa128_1to3', 'swa128_headwise',
             'lightning', 'mamba2', 'gdn']
SCALES = ['tiny', 's1', 's2', 's3', 's4', 's5']


@pytest.mark.parametrize('scale', SCALES)
@pytest.mark.parametrize('arch', AVAILABLE)
def test_every_study_run_validates(arch, scale):
  c = validate(study_config(arch, scale))
  assert c.model.arch == arch and c.model.scale == scale
  assert c.name == f'{arch}_{scale}'


def test_study_shapes():
  c = study_config('swa128', 's3')
  assert (c.model.d_model, c.model.num_layers, c.model.num_heads, c.model.num_kv_heads, c.model.head_dim,
          c.model.d_ff, c.model.vocab_size) == (640, 16, 10, 2, 64, 1600, 73_448)
  assert c.data.seq_len == 16_384
  assert tuple(c.model.cycle) == ('swa', 'full') and c.model.window == 128 and c.model.rope_full
  nope = study_config('swa128_nope', 's3')
  assert not nope.model.rope_full and nope.model.rope_swa
  assert tuple(study_config('swa128_1to3').model.cycle) == ('swa', 'swa', 'swa', 'full')
  assert study_config('swa2048').model.window == 2048


def test_the_main_job_and_study_scales_are_configured_as_benchmarks_md_records():
  """The tiny step of BENCHMARKS.md, "The main job on CPU": d_model 128, 4 layers, 4 heads / 2 KV heads of 32,
  SwiGLU 320, bytes (257), 755,072 parameters, float32, batch 8 x 512; the study scales compute in bfloat16 with
  remat save_dots."""
  from hybrid_jax.models import counting
  c = study_config('swa128_nope', 'tiny')
  m = c.model
  assert (m.d_model, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.d_ff, m.vocab_size) == (
      128, 4, 4, 2, 32, 320, 257)
  assert counting.param_counts(m)['total'] == 755_072 and m.dtype == 'float32'
  assert (c.train.batch_size, c.data.seq_len, c.train.steps) == (8, 512, 300)
  assert (c.train.lr, c.train.warmup_steps, c.train.eval_every, c.train.eval_batches) == (1.5e-3, 30, 100, 8)
  for scale in ('s1', 's2', 's3', 's4', 's5'):
    s = study_config('swa128', scale).model
    assert (s.dtype, s.remat, s.scan_layers) == ('bfloat16', 'save_dots', True), scale


@pytest.mark.parametrize('scale', ['tiny', 's3'])
@pytest.mark.parametrize('arch', ['lightning', 'mamba2', 'gdn'])
def test_recurrent_arches_validate_and_build(arch, scale):
  from flax import nnx
  from hybrid_jax.models.model import HybridLM
  c = validate(study_config(arch, scale))
  assert tuple(c.model.cycle) == (arch, 'full')
  model = nnx.eval_shape(lambda: HybridLM(c.model, rngs=nnx.Rngs(0)))  # Shapes only: no arrays allocated.
  mixers = [type(block.mixer).__name__ for block in model.cycles.blocks] if model.scan_layers else \
      [type(block.mixer).__name__ for block in model.tail]
  assert mixers[:2] == [{'lightning': 'Lightning', 'mamba2': 'Mamba2', 'gdn': 'GatedDeltaNet'}[arch], 'Attention']


def test_unknown_arch_and_scale_list_the_allowed_names():
  with pytest.raises(ConfigError, match=r"model.arch='swa64' is unknown; allowed: full, swa128"):
    study_config('swa64')
  with pytest.raises(ConfigError, match=r"model.scale='s9' is unknown; allowed: tiny, s1"):
    study_config('full', 's9')
  with pytest.raises(ConfigError, match="hybrid config: bad argument 'arch'"):
    load_config_file(resolve_spec('hybrid:arch'))


def test_packaged_configs_are_named_without_a_path_and_a_real_file_wins(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # No configs/ here, as for an installed package run from anywhere.
  for name in ('base', 'hybrid', 'mini', 'sweep'):
    assert resolve_path(name) == str(CONFIG_DIR / f'{name}.py')
    assert resolve_path(f'configs/{name}.py') == str(CONFIG_DIR / f'{name}.py')  # Older run strings' spelling.
  for other in ('nosuch', '_private', '__init__', 'hybrid.py', 'configs/nosuch.py', 'other/hybrid.py', ''):
    assert resolve_path(other) == other  # Left as given: its loader says it does not exist.
  assert resolve_spec('hybrid:arch=gdn,scale=s1') == f'{CONFIG_DIR / "hybrid.py"}:arch=gdn,scale=s1'
  spec, _, config = load_run('hybrid:arch=gdn,scale=s1 --config.seed=3')
  assert spec == 'hybrid:arch=gdn,scale=s1' and config.name == 'gdn_s1' and config.seed == 3  # The name is kept.
  with pytest.raises(ConfigError, match="config file 'nosuch' does not exist"):
    load_run('nosuch:arch=gdn')
  for path in ('hybrid', 'configs/hybrid.py'):  # A file at the given path always wins over the packaged one.
    (tmp_path / path).parent.mkdir(exist_ok=True)
    (tmp_path / path).write_text('def get_config(arg):\n  raise ValueError("the local file")\n')
    assert resolve_path(path) == path
    with pytest.raises(ConfigError, match='the local file'):
      load_run(f'{path}:arch=gdn')


def test_an_unknown_key_names_the_packaged_base_config():
  with pytest.raises(ConfigError) as error:
    apply_override(study_config(), 'model.windw', '64')
  assert f'keys are listed in {BASE_CONFIG})' in str(error.value) and BASE_CONFIG.is_file()


def test_missing_config_file():
  with pytest.raises(ConfigError, match='does not exist'):
    load_config_file('/nonexistent/config.py')


@pytest.mark.parametrize('key, value, message', [
    ('model.window', 0, r'config.model.window=0 is invalid: must be a positive integer'),
    ('model.window', -3, r'config.model.window=-3 is invalid'),
    ('model.num_heads', 5, r'config.model.num_heads=5 is invalid: must be a multiple of model.num_kv_heads=2'),
    ('data.seq_len', 0, r'config.data.seq_len=0 is invalid: must be a positive integer'),
    ('data.seq_len', -1, r'config.data.seq_len=-1 is invalid'),
    ('model.cycle', ('swa', 'conv'), r"unknown kind 'conv'; allowed kinds: full, swa, headwise, gdn, lightning, mamba2, mlp, moe \(a kind defined outside the package loads through config.model.mixer_modules\)"),
    ('model.cycle', (), r'must name at least one layer kind'),
    ('model.dtype', 'float8', r"config.model.dtype='float8' is invalid: allowed: float32, bfloat16"),
    ('model.remat', 'some', r"config.model.remat='some' is invalid: allowed: none, full, save_dots"),
    ('model.attention_implementation', 'flash', r"allowed: auto, xla, reference, cudnn"),
    ('train.grad_accum', 3, r'config.train.batch_size=8 is invalid: must be divisible by train.grad_accum=3'),
    ('train.schedule', 'linear', r"config.train.schedule='linear' is invalid: allowed: wsd, cosine, constant"),
    ('train.lr', 0.0, r'config.train.lr=0.0 is invalid: must be a positive finite number'),
    ('train.warmup_steps', 300, r'must be smaller than train.steps=300'),
    ('train.steps', 0, r'config.train.steps=0 is invalid'),
    ('data.source', 'web', r"config.data.source='web' is invalid: allowed: builtin, files, tfds"),
    ('data.eval_fraction', 1.0, r'config.data.eval_fraction=1.0 is invalid'),
    ('model.head_dim', 31, r'must be even when RoPE is used'),
    ('eval.position_buckets', 1000, r'must be <= data.seq_len=512'),
    ('eval.documents', 1, r'config.eval.documents=1 is invalid: must be 0 \(off\) or an integer >= 2'),
    ('train.loss_chunk', -1, r'config.train.loss_chunk=-1 is invalid: must be an integer >= 0'),
    ('model.residual_multiplier', 0.0, r'config.model.residual_multiplier=0.0 is invalid: must be a positive finite number'),
    ('model.logits_scaling', float('inf'), r'config.model.logits_scaling=inf is invalid'),
    ('train.lr', float('inf'), r'config.train.lr=inf is invalid: must be a finite number'),
    ('train.weight_decay', float('nan'), r'config.train.weight_decay=nan is invalid: must be a finite number'),
    ('model.attention_scale', -0.1, r'config.model.attention_scale=-0.1 is invalid: must be a finite number >= 0'),
])
def test_bad_values_name_key_value_and_allowed(key, value, message):
  c = study_config()
  section, name = key.split('.')
  c[section][name] = value
  with pytest.raises(ConfigError, match=message):
    validate(c)


def test_learned_sinks_need_the_xla_attention_path():
  c = study_config()
  c.model.attention_sinks = True
  validate(c)  # 'auto'
  c.model.attention_implementation = 'pallas_tpu'
  with pytest.raises(ConfigError, match=r"attention_implementation='pallas_tpu' is invalid: learned attention sinks"):
    validate(c)


def test_files_and_tfds_sources_need_their_keys():
  c = study_config()
  c.data.source = 'files'
  with pytest.raises(ConfigError, match='config.data.paths'):
    validate(c)
  c.data.source = 'tfds'
  with pytest.raises(ConfigError, match='config.data.tfds_name'):
    validate(c)


def test_headwise_split_must_leave_both_kinds():
  c = study_config('swa128_headwise')
  c.model.headwise_full_kv_heads = 2
  with pytest.raises(ConfigError, match=r'headwise_full_kv_heads=2 is invalid: must be between 1 and'):
    validate(c)


def test_missing_key_is_named():
  c = study_config()
  c.train = ml_collections.ConfigDict({k: v for k, v in c.train.items() if k != 'lr'})
  with pytest.raises(ConfigError, match='config.train.lr is missing'):
    validate(c)
