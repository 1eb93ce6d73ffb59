"""compile-check: the fit verdict against a memory limit, the verified fix, the roofline estimate, multislice."""

import json
import math
import os
import subprocess
import sys

import jax
import pytest

from hybrid_jax.config import validate
from hybrid_jax.compile_check import attention_work, estimate as estimate_lib, fit as compile_check
from hybrid_jax.models import flops
from hybrid_jax.parallel import chips
from hybrid_jax.train import state as state_lib, step as step_lib
from hybrid_jax.commands import compile_check as compile_check_command, config_flags
from tests.conftest import ROOT, study_config, with_libtpu


def tiny(batch=8, seq_len=128):
  c = study_config('swa128')
  c.model.update(dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64, d_ff=128, window=32,
                      vocab_size=256))
  c.data.seq_len = seq_len
  c.train.update(dict(batch_size=batch, warmup_steps=1, steps=4))
  return validate(c)


CPU = compile_check.Target('cpu x 1', tuple(jax.devices('cpu')[:1]))


@pytest.mark.e2e
def test_a_step_over_the_limit_is_fixed_by_a_change_that_is_compiled_and_fits():
  """On CPU (no chip table, so no estimates) the recommendation is the first candidate, in the order of least
  change, that was compiled and fits; every candidate before it was compiled and did not fit, or saves less memory
  than one that did not."""
  config = tiny()
  whole = compile_check.compile_step(config, CPU)['per_device_bytes']['peak']
  one_row = tiny()
  one_row.train.grad_accum = 8
  smallest = compile_check.compile_step(one_row, CPU)['per_device_bytes']['peak']
  assert smallest < whole  # Activations of one sequence instead of eight.
  limit = (smallest + whole) / 2
  row = compile_check.check(config, CPU, memory_limit=limit)
  assert row['fits'] is False and row['per_device_bytes']['peak'] == whole
  fix, tried = row['fix'], row['fix']['tried']
  assert fix['per_device_bytes']['peak'] <= limit
  chosen = next(i for i, t in enumerate(tried) if t['overrides'] == fix['overrides'])
  assert tried[chosen]['fits'] and tried[chosen]['peak_bytes'] <= limit
  assert all(t['fits'] is False or 'saves less' in t.get('skipped', '') for t in tried[:chosen])
  accum = fix['overrides'].get('train.grad_accum')
  if accum:
    assert f'train.grad_accum={accum} (micro-batch {8 // accum} per chip)' in fix['change']


@pytest.mark.e2e
def test_nothing_fits_a_limit_below_the_parameters():
  row = compile_check.check(tiny(), CPU, memory_limit=1000)
  assert row['fits'] is False and 'change' not in row['fix'] and row['fix']['tried']
  assert all(t.get('fits') is False or 'skipped' in t for t in row['fix']['tried'])


def test_the_cli_prints_the_fix_as_flags_that_set_it(monkeypatch, capsys):
  """The fix search and the advice without compiling: a stand-in compiler lets a step fit from 4 accumulation
  steps up, so the least change is remat 'minimal' with grad_accum=4 (the cheap changes come with accumulation),
  and the printed flags load into a config that has it."""
  def compile_step(config, target, memory_limit=None):
    accum = int(config.train.grad_accum)
    return {'arch': config.model.arch, 'scale': config.model.scale, 'seq_len': config.data.seq_len, 'target': target.name,
            'chips': 1, 'mesh': {'data': 1, 'fsdp': 1, 'sequence': 1, 'tensor': 1}, 'per_chip_batch': 8,
            'grad_accum': accum, 'compile_s': 0.0, 'fits': accum >= 4, 'per_device_bytes': {'peak': 2**30 // accum}}
  monkeypatch.setattr(compile_check, 'compile_step', compile_step)
  argv = ['--config=hybrid:arch=swa128,scale=tiny', '--devices=1',
          '--config.train.batch_size=8', '--config.data.seq_len=64']
  assert compile_check_command.main(argv) == 3
  advice = capsys.readouterr().err.split('; fits with ')[1].strip()
  assert advice == ('model.remat=minimal, train.grad_accum=4 (micro-batch 2 per chip): add --config.model.remat=minimal '
                    '--config.train.grad_accum=4')
  fixed = config_flags.load_config(argv[0].split('=', 1)[1], argv[2:] + advice.split(': add ')[1].split())
  assert fixed.train.grad_accum == 4 and fixed.model.remat == 'minimal' and compile_step(fixed, CPU)['fits']


def test_each_attention_layers_computed_work_is_reported(monkeypatch, capsys):
  """Per attention layer kind and window: splash's block and the pairs it computes per visible pair, from its block
  tables (S1 swa128 at 16K: 128-blocks at 2x on the windowed layers, 512-blocks on the full ones); head-wise layers
  report both groups, layers with learned sinks XLA's attention; the command prints it after its table."""
  work = attention_work.layers(study_config('swa128', 's1').model, 16384)
  assert [(e['kind'], e['window'], e['layers'], e['kernel'], e['block']) for e in work] == [
      ('swa', 128, [0, 2, 4, 6, 8], 'splash', 128), ('full', None, [1, 3, 5, 7, 9], 'splash', 512)]
  assert work[0]['computed_per_visible'] == pytest.approx(2.0, abs=1e-4) and work[0]['visible_pairs'] == 128 * 129 // 2 + (16384 - 128) * 128
  assert work[1]['computed_per_visible'] == pytest.approx(32 * 33 // 2 * 512**2 / (16384 * 16385 / 2))
  headwise = attention_work.layers(study_config('swa128_headwise', 's1').model, 16384)
  assert [(e['window'], len(e['layers']), e['block']) for e in headwise] == [(128, 10, 128), (None, 10, 512)]
  sinks = study_config('swa128', 's1')
  sinks.model.attention_sinks = True
  assert {e['kernel'] for e in attention_work.layers(sinks.model, 16384)} == {'xla'}

  def compile_step(config, target, memory_limit=None):
    return {'arch': config.model.arch, 'scale': config.model.scale, 'seq_len': config.data.seq_len,
            'target': target.name, 'chips': 1, 'mesh': {'data': 1}, 'per_chip_batch': 8, 'grad_accum': 1,
            'compile_s': 0.0, 'fits': True, 'per_device_bytes': {'peak': 1},
            'attention_work': attention_work.layers(config.model, config.data.seq_len)}
  monkeypatch.setattr(compile_check, 'compile_step', compile_step)
  assert compile_check_command.main(['--config=hybrid:arch=swa128,scale=tiny', '--devices=1',
                                     '--config.data.seq_len=1024']) == 0
  assert capsys.readouterr().out.splitlines()[-1] == (
      'attention work on TPU, swa128 tiny T=1024 (splash computes each listed block whole): swa w128 (2 layers): '
      'block 128, 2.00x the visible pairs; full (2 layers): block 512, 1.50x the visible pairs')

def _full_attention(remat, loss_chunk=0):
  """Two full-attention blocks small enough to count by hand: d 64, 4 query and 2 KV heads of 16, MLP 128,
  vocabulary 256, 8 sequences of 128 tokens on one chip."""
  c = study_config('full')
  c.model.update(dict(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, d_ff=128, vocab_size=256,
                      remat=remat))
  c.data.seq_len = 128
  c.train.update(dict(batch_size=8, warmup_steps=1, steps=4, loss_chunk=loss_chunk))
  return validate(c)


STAND_IN = chips.Chip('stand-in', 1.0, 1e12, 1e15, 'test', 1e9)  # 1 TFLOP/s; memory traffic cheap; 1 GB/s ICI.


def _estimate(config, xla_bytes=0.0, param_bytes=0, mesh=None):
  mesh = mesh or {'data': 1, 'fsdp': 1, 'sequence': 1, 'tensor': 1}
  return estimate_lib.step_estimate(config, STAND_IN, chips=math.prod(mesh.values()), mesh_shape=mesh,
                                    param_bytes=param_bytes, xla_bytes=xla_bytes)


def test_the_estimate_of_full_remat_exceeds_no_recompute_by_the_recomputed_flops():
  """Per sequence of 128 tokens and per block, counted by hand: projections 2 x 128 x (2 x 64 x 64 + 2 x 64 x 32)
  = 3,145,728; attention 4 x 64 x 128 x 129 / 2 = 2,113,536; the MLP's gate and up 2 x 128 x 2 x 64 x 128 =
  4,194,304 (its down projection is never run again). Full remat runs both blocks' mixer and MLP input again:
  2 x 9,453,568 x 8 sequences = 151,257,088 FLOPs, at 1 TFLOP/s."""
  none, full = _estimate(_full_attention('none')), _estimate(_full_attention('full'))
  assert none['recomputed_flops_per_chip'] == 0 and full['recomputed_flops_per_chip'] == 151_257_088
  assert full['step_s'] - none['step_s'] == pytest.approx(151_257_088 / 1e12)
  assert full['model_flops_per_chip'] == none['model_flops_per_chip']  # Model FLOPs (MFU's) do not change.
  # save_dots and minimal keep the projections' outputs: only the attention kernels run again (2 x 2,113,536 x 8).
  for policy in ('save_dots', 'minimal'):
    assert _estimate(_full_attention(policy))['recomputed_flops_per_chip'] == 33_816_576
  # recompute_mlp runs the attention kernels and the MLP's gate and up again: 2 x 6,307,840 x 8.
  assert _estimate(_full_attention('recompute_mlp'))['recomputed_flops_per_chip'] == 100_925_440
  # A chunked loss recomputes each chunk's logits: the LM head, 2 x 128 x 64 x 256 x 8 = 33,554,432.
  assert _estimate(_full_attention('none', loss_chunk=64))['recomputed_flops_per_chip'] == 33_554_432


def test_the_matmuls_the_recompute_model_counts_are_those_xla_runs_again():
  """The compiled gradient of the two blocks (XLA attention on the host) has, per block, 2 more matmuls under
  'recompute_mlp' than under 'save_dots' (gate, up) and 6 more under 'full' (q, k, v, out, gate, up: never the
  down projection), as flops.RECOMPUTED_PARTS says; 'save_dots' has 2 more than no remat (the attention core)."""
  def dots(remat):
    config = _full_attention(remat)
    config.model.scan_layers = False
    model_def, params = state_lib.init_model(config.model, 0)
    tokens = jax.numpy.zeros((8, 128), jax.numpy.int32)
    loss = lambda p: step_lib.sequence_nll(model_def.bind(p), tokens, tokens)[0].mean()
    return jax.jit(jax.grad(loss)).lower(params).compile().as_text().count(' dot(')
  counts = {remat: dots(remat) for remat in ('none', 'save_dots', 'recompute_mlp', 'full')}
  assert counts['save_dots'] - counts['none'] == 2 * 2
  assert counts['recompute_mlp'] - counts['save_dots'] == 2 * 2
  assert counts['full'] - counts['save_dots'] == 2 * 6
  parts = flops.RECOMPUTED_PARTS
  assert set(parts['recompute_mlp']) - set(parts['save_dots']) == {'mlp_in'}
  assert set(parts['full']) - set(parts['save_dots']) == {'projections', 'mlp_in'}


def test_collectives_and_accumulation_are_priced():
  """Ring collectives of 1,000 parameter bytes: an all-reduce over 4 data-parallel chips sends 2 x 3/4 of them;
  FSDP over 4 chips reduce-scatters once (3/4) and gathers for every micro-batch's forward and backward
  (2 x 2 x 3/4 with 2 accumulation steps). Each byte sent is also received, through the bidirectional link."""
  config = _full_attention('none')
  dp = _estimate(config, param_bytes=1000, mesh={'data': 4, 'fsdp': 1, 'sequence': 1, 'tensor': 1})
  assert dp['collective_bytes_per_chip'] == {'gradient_reduction': 1500, 'fsdp_gathers': 0, 'sequence_exchanges': 0}
  assert dp['collective_s'] == pytest.approx(2 * 1500 / 1e9)
  config.train.grad_accum = 2
  fsdp = _estimate(config, param_bytes=1000, mesh={'data': 1, 'fsdp': 4, 'sequence': 1, 'tensor': 1})
  assert fsdp['collective_bytes_per_chip'] == {'gradient_reduction': 750, 'fsdp_gathers': 3000,
                                               'sequence_exchanges': 0}
  # XLA counts the accumulation loop's body once: its bytes count once per micro-batch.
  assert _estimate(config, xla_bytes=3e15)['memory_s'] == pytest.approx(2 * 3e15 / 1e15)


def test_the_sequence_axis_is_priced_by_what_each_mixer_exchanges():
  """Four chips, the data ways moved to the sequence axis: the parameters are replicated over both, so the gradient
  all-reduce is data x sequence's (2 x 3/4 of 1,000 bytes). Two full-attention layers (float32, 8 query and 2 KV
  heads of 16, 8 rows of 128 tokens) send q, k, v and o through all-to-alls forward and back, (s - 1)/s of each:
  with s = 2, 4 rows of 64 tokens per chip, 2 x (2 x 8 + 2 x 2) x 4 x 64 x 16 x 4 bytes / 2 per layer; with
  s = 4, 8 rows of 32 tokens, and the 2 KV heads expanded to the 8 query heads (4 does not divide 2):
  2 x (2 x 8 + 2 x 8) x 8 x 32 x 16 x 4 x 3/4. Nothing without the split."""
  config = _full_attention('none')
  config.model.num_heads = 8
  sent = lambda **mesh: _estimate(config, param_bytes=1000, mesh={'data': 1, 'fsdp': 1, 'sequence': 1, 'tensor': 1,
                                                                  **mesh})['collective_bytes_per_chip']
  assert sent(data=4)['sequence_exchanges'] == 0
  two, four = sent(data=2, sequence=2), sent(sequence=4)
  assert two['sequence_exchanges'] == 2 * (2 * 20 * 4 * 64 * 16 * 4 / 2) == 655_360
  assert four['sequence_exchanges'] == 2 * (2 * 32 * 8 * 32 * 16 * 4 * 3 / 4) == 1_572_864
  assert two['gradient_reduction'] == four['gradient_reduction'] == sent(data=4)['gradient_reduction'] == 1500
  est = _estimate(config, param_bytes=1000, mesh={'data': 1, 'fsdp': 1, 'sequence': 4, 'tensor': 1})
  assert est['collective_s'] == pytest.approx(2 * (1500 + 1_572_864) / 1e9)


def test_each_kind_exchanges_its_halo_or_states_and_an_unknown_kind_nothing(monkeypatch):
  """One layer of each kind, 8 rows of 128 tokens over 2 sequence shards, float32: a window of 32 sends the 31 keys
  and values before the shard (2 KV heads of 16), padded to the 64-token shard's granularity, forward and back; a
  scan all-gathers its shard's final state [H, K, V] and transition (the delta rule's K x K, a scalar decay's 1)
  per row, and reduce-scatters it back; an MLP layer exchanges nothing, nor does a kind registered outside the
  estimate's table (not counted)."""
  from hybrid_jax.models.mixers import registry
  monkeypatch.setitem(registry._kinds(), 'mystery', registry.MixerKind(  # pylint: disable=protected-access
      'mystery', build=None, params=lambda cfg, spec=None: 0, flops=lambda cfg, spec, t: {}))
  expected = {'swa': 2 * 2 * 8 * 64 * 2 * 16 * 4, 'gdn': 2 * 8 * 3 * (16 * 32 + 16 * 16) * 4,
              'lightning': 2 * 8 * 3 * (16 * 32 + 1) * 4, 'mamba2': 2 * 8 * 5 * (64 * 16 + 1) * 4, 'mlp': 0,
              'mystery': 0}
  config = _full_attention('none')
  config.model.update(dict(window=32, num_layers=1))
  for kind, sent in expected.items():
    config.model.cycle = (kind,)
    mesh = {'data': 1, 'fsdp': 1, 'sequence': 2, 'tensor': 1}
    assert estimate_lib.sequence_exchange_bytes(config.model, 128, 8, mesh) == sent, kind
    assert estimate_lib.sequence_exchange_bytes(config.model, 128, 8, {**mesh, 'sequence': 1}) == 0


def test_a_sequence_split_is_offered_where_rows_cannot_be_split_further():
  """Moving data ways to the sequence axis gives each chip s times the rows, each 1/s long: the same tokens, so it
  saves memory only with the accumulation that makes a micro-batch one row of T/s tokens. Eight rows on 64 chips
  (fewer rows than chips): only splits are offered, the fewest ways that give every chip a row first, then more
  ways with accumulation to one row. Two rows per chip: offered after every accumulation (which reaches one row)
  and before any recompute. Six rows per chip (accumulation by powers of two stops at three rows), one data way,
  or a length the ways do not divide: not offered."""
  config = tiny(batch=8, seq_len=1024)
  offered = compile_check.candidates(config, per_chip=8 / 64, data_ways=64)
  assert offered and all('parallel.sequence' in o for o in offered)
  assert offered[0] == {'parallel.sequence': 8}
  assert {'parallel.sequence': 64, 'train.grad_accum': 8, 'parallel.shard_optimizer': True,
          'model.remat': 'minimal'} not in offered  # No data ways left to shard the optimizer over.
  assert {'model.remat': 'minimal', 'parallel.sequence': 64, 'train.grad_accum': 8} in offered
  assert {'model.remat': 'minimal', 'parallel.sequence': 16, 'train.grad_accum': 2,
          'parallel.shard_optimizer': True} in offered
  config.parallel.data = 64
  assert compile_check.candidates(config, per_chip=8 / 64, data_ways=64)[0] == {'parallel.data': 8,
                                                                               'parallel.sequence': 8}
  config = tiny(batch=8, seq_len=1024)
  offered = compile_check.candidates(config, per_chip=2, data_ways=4)
  recomputed = [i for i, o in enumerate(offered) if o.get('model.remat') in ('recompute_mlp', 'full')]
  splits = [i for i, o in enumerate(offered) if 'parallel.sequence' in o and i not in recomputed]
  accumulated = [i for i, o in enumerate(offered) if 'train.grad_accum' in o and 'parallel.sequence' not in o
                 and i not in recomputed]
  assert offered[splits[0]] == {'parallel.sequence': 2, 'train.grad_accum': 4}
  assert max(accumulated) < min(splits) and max(splits) < min(recomputed)
  assert {'parallel.sequence': 4, 'train.grad_accum': 8, 'model.remat': 'full'} in offered  # The widest split.
  assert not any('parallel.sequence' in o for o in compile_check.candidates(config, per_chip=6, data_ways=4))
  assert not any('parallel.sequence' in o for o in compile_check.candidates(config, per_chip=2, data_ways=1))
  config.data.seq_len = 1023
  assert not any('parallel.sequence' in o for o in compile_check.candidates(config, per_chip=2, data_ways=4))


def test_a_sequence_split_rules_out_what_it_saves_at_least():
  """A split with more accumulation steps keeps fewer tokens per micro-batch than accumulation of whole rows, and a
  wider split than a narrower one; it does not rule out the sharded optimizer of a change that splits fewer ways
  (its moments are then divided over fewer data-parallel chips), and a split never counts for accumulation alone
  with more steps."""
  split = {'parallel.sequence': 2, 'train.grad_accum': 4}
  assert compile_check._dominates(split, {'train.grad_accum': 2})
  assert compile_check._dominates({'parallel.sequence': 4, 'train.grad_accum': 8}, split)
  assert not compile_check._dominates(split, {'parallel.sequence': 4, 'train.grad_accum': 8})
  assert not compile_check._dominates({'train.grad_accum': 2}, split)
  cheap = {'parallel.shard_optimizer': True, 'model.remat': 'minimal'}
  assert not compile_check._dominates({**cheap, **split}, {**cheap, 'train.grad_accum': 2})


@pytest.mark.e2e
def test_fewer_rows_than_chips_is_fixed_by_splitting_each_row(tmp_path):
  """Two rows on four fake CPU devices: the batch does not split over the four data-parallel chips, so the step has
  no layout (a row that does not fit, not a crash), and the fix is each row over two chips (the data ways the
  other two leave); the table's mesh column names the four axes, the JSON row the fix's mesh."""
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--devices=4', '--memory_budget_gib=1',
          '--config=hybrid:arch=swa128,scale=tiny', '--config.model.num_layers=2',
          '--config.model.d_model=64', '--config.data.seq_len=64', '--config.train.batch_size=2',
          f'--json={tmp_path}/rows.json']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 3, out.stderr[-3000:]
  [row] = json.loads((tmp_path / 'rows.json').read_text())
  assert row['fits'] is False and 'do not split over the 4 batch shards' in row['error']
  assert row['mesh'] == {'data': 4, 'fsdp': 1, 'sequence': 1, 'tensor': 1}
  assert row['fix']['overrides'] == {'parallel.sequence': 2}
  assert row['fix']['mesh'] == {'data': 2, 'fsdp': 1, 'sequence': 2, 'tensor': 1}
  assert 'mesh (data/fsdp/sequence/tensor)' in out.stdout and '| 4/1/1/1 | 0.5 | no |' in out.stdout
  assert '**sequence=2**' in out.stdout
  assert out.stderr.strip().endswith('fits with parallel.sequence=2 (each row split over 2 chips, 32 tokens on '
                                     'each): add --config.parallel.sequence=2')


def test_a_length_the_sequence_ways_do_not_divide_is_one_line(tmp_path):
  """parallel.sequence=-1 takes the devices the other axes leave, so validation cannot check data.seq_len against
  it: compile-check does, once the mesh is known, in one line."""
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--devices=2', '--memory_budget_gib=1',
          '--config=hybrid:arch=swa128,scale=tiny', '--config.data.seq_len=65',
          '--config.parallel.data=1', '--config.parallel.sequence=-1']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert out.returncode == 2
  assert out.stderr.strip() == ('error: config.data.seq_len=65 does not split into the 2 sequence shards of the mesh '
                                '(sequence 2): use a length that is a multiple of 2 or fewer sequence ways '
                                '(config.parallel.sequence)')


class _StandInTarget(compile_check.Target):
  @property
  def chip(self):
    return STAND_IN


def test_the_recommendation_is_the_fastest_fix_that_fits_not_the_first(monkeypatch):
  """Stand-in compiles: remat 'minimal' fits but is slow (2 s), accumulation fits at 1 s, full remat fits at 4 s.
  'minimal' comes first in the order of least change; the recommendation is accumulation, and the table shows the
  others with their estimates."""
  def compile_step(config, target, memory_limit=None):
    remat, accum = config.model.remat, int(config.train.grad_accum)
    step_s = 1.0 + (remat == 'minimal') + 3.0 * (remat == 'full')
    return {'fits': remat != 'none' or accum >= 2, 'per_device_bytes': {'peak': 10**9},
            'estimate': {'step_s': step_s}}
  monkeypatch.setattr(compile_check, 'compile_step', compile_step)
  config = tiny()
  assert config.model.remat == 'none'
  fix = compile_check.recommend(config, _StandInTarget('stand-in', CPU.devices))
  first = next(t for t in fix['tried'] if t.get('fits'))
  assert first['overrides'] == {'model.remat': 'minimal'} and first['estimate']['step_s'] == 2.0
  assert fix['overrides'] == {'train.grad_accum': 2} and fix['estimate']['step_s'] == 1.0
  cell = compile_check.fix_cell(fix)
  assert cell.startswith('**grad_accum=2** (others: remat=minimal: fits 1.0 GB, 2.000 s;')


def test_fsdp_with_accumulation_is_offered_before_any_full_recompute():
  """Where the sharded optimizer with accumulation is just over the limit (S5 at 32K on v6e:4x8), FSDP shards the
  parameters too; with accumulation it may fit without recomputing the forward, so it is a candidate and comes
  before every remat='full' one."""
  config = tiny()
  config.model.remat = 'save_dots'
  offered = compile_check.candidates(config, per_chip=2, data_ways=4)
  fsdp_accum = {'parallel.data': 1, 'parallel.fsdp': -1, 'train.grad_accum': 2}
  assert fsdp_accum in offered
  first_full = min(i for i, o in enumerate(offered) if o.get('model.remat') == 'full')
  assert offered.index(fsdp_accum) < first_full
  assert fsdp_accum not in compile_check.candidates(config, per_chip=2, data_ways=1)  # One data-parallel chip.


def test_recompute_mlp_is_offered_after_every_change_without_recompute_and_before_full():
  """A save_dots step (S5's default) gets remat 'recompute_mlp' with the sharded optimizer and with FSDP, alone and
  with the most accumulation, after every change that recomputes nothing and before any full remat; a step already
  at 'full' gets neither."""
  config = tiny()
  config.model.remat = 'save_dots'
  offered = compile_check.candidates(config, per_chip=2, data_ways=4)
  recompute = [i for i, o in enumerate(offered) if o.get('model.remat') == 'recompute_mlp']
  full = [i for i, o in enumerate(offered) if o.get('model.remat') == 'full']
  without = [i for i, o in enumerate(offered) if 'model.remat' not in o]
  assert recompute and full and max(without) < min(recompute) and max(recompute) < min(full)
  assert {'parallel.data': 1, 'parallel.fsdp': -1, 'train.grad_accum': 2, 'model.remat': 'recompute_mlp'} in offered
  assert {'parallel.shard_optimizer': True, 'model.remat': 'recompute_mlp'} in offered
  config.model.remat = 'full'
  assert not any('model.remat' in o for o in compile_check.candidates(config, per_chip=2, data_ways=4))


def test_a_remat_policy_that_did_not_fit_rules_out_those_that_save_less():
  """A change with 'recompute_mlp' saves at least what the same change with 'minimal' saves, and 'full' at least
  what 'recompute_mlp' saves; 'minimal' and 'save_dots' keep the same bytes, so neither rules out the other."""
  shard = {'parallel.shard_optimizer': True, 'train.grad_accum': 2}
  with_remat = lambda policy: {**shard, 'model.remat': policy}
  assert compile_check._dominates(with_remat('recompute_mlp'), with_remat('minimal'))
  assert compile_check._dominates(with_remat('full'), with_remat('recompute_mlp'))
  assert not compile_check._dominates(with_remat('minimal'), with_remat('recompute_mlp'))
  assert not compile_check._dominates(with_remat('save_dots'), with_remat('minimal'))
  assert not compile_check._dominates(shard, with_remat('recompute_mlp'))


def test_the_recommendation_prefers_recomputing_the_mlp_to_recomputing_everything(monkeypatch):
  """Stand-in compiles of a save_dots step: nothing fits without recompute, 'recompute_mlp' fits at 1.5 s and
  'full' at 2 s; the recommendation is 'recompute_mlp', with 'full' among the changes tried."""
  def compile_step(config, target, memory_limit=None):
    remat = config.model.remat
    return {'fits': remat in ('recompute_mlp', 'full'), 'per_device_bytes': {'peak': 10**9},
            'estimate': {'step_s': {'recompute_mlp': 1.5, 'full': 2.0}.get(remat, 1.0)}}
  monkeypatch.setattr(compile_check, 'compile_step', compile_step)
  config = tiny()
  config.model.remat = 'save_dots'
  fix = compile_check.recommend(config, _StandInTarget('stand-in', CPU.devices))
  assert fix['overrides'].get('model.remat') == 'recompute_mlp' and fix['estimate']['step_s'] == 1.5
  assert any(t['overrides'].get('model.remat') == 'full' for t in fix['tried'])


@pytest.fixture(scope='module')
def tpu():
  return with_libtpu(lambda: compile_check.tpu_target('v5e:2x2'))


def test_tpu_row_fits_and_its_estimate_is_the_roofline(tpu):
  config = tiny()
  config.parallel.fsdp = 2
  config.model.remat = 'save_dots'
  row = compile_check.check(config, tpu)
  spec = chips.chip('TPU v5 lite')
  assert row['device_kind'] == 'TPU v5 lite' and row['hbm_bytes'] == spec.hbm_bytes and row['fits'] is True
  assert row['mesh'] == {'data': 2, 'fsdp': 2, 'sequence': 1, 'tensor': 1} and row['per_chip_batch'] == 2
  est = row['estimate']
  # save_dots recomputes the attention kernels' forward: 4 x 4 heads x 64 x the visible pairs, per block and sequence.
  pairs = {'swa': flops.visible_pairs(128, 32), 'full': flops.visible_pairs(128, None)}
  recomputed = sum(4 * 4 * 64 * pairs[kind] for kind in ('swa', 'full')) * 8 / 4
  assert est['recomputed_flops_per_chip'] == recomputed
  compute = (row['model_flops_per_chip'] + recomputed) / (spec.peak_bf16_tflops * 1e12)
  memory = row['xla_bytes_accessed_per_chip'] / spec.hbm_bytes_per_s
  params = sum(x.size * 4 for x in jax.tree.leaves(jax.eval_shape(lambda: state_lib.init_params(config.model, 0))))
  # Gradients all-reduced over 2 data-parallel chips (2 x 1/2 of them) after a reduce-scatter over 2 FSDP chips
  # (1/2), and gathered for the forward and the backward (2 x 1/2); sent and received at v5e's 400 GB/s.
  sent = params / 2 + params / 2 + 2 * params / 2
  assert est['collective_s'] == pytest.approx(2 * sent / 400e9)
  assert est['step_s'] == pytest.approx(max(compute, memory) + 2 * sent / 400e9)
  assert est['bound'] == ('compute' if compute >= memory else 'memory')
  assert est['tokens_per_s'] == pytest.approx(8 * 128 / est['step_s'])


def test_multislice_compiles_with_data_parallelism_across_slices(tmp_path):
  """Two v5e:2x2 slices: the DCN axis becomes data parallelism when the config sets no across-slice shape."""
  pytest.importorskip('libtpu')
  args = [sys.executable, '-m', 'hybrid_jax', 'compile-check', '--topology=v5e:2x2', '--num_slices=2',
          '--config=hybrid:arch=gdn,scale=tiny', '--config.model.num_layers=2',
          '--config.model.d_model=64', '--config.data.seq_len=128', f'--json={tmp_path}/rows.json']
  out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  [row] = json.loads((tmp_path / 'rows.json').read_text())
  assert row['chips'] == 8 and row['target'] == 'v5e:2x2 x 2 slices' and row['fits'] is True
  assert row['mesh'] == {'data': 8, 'fsdp': 1, 'sequence': 1, 'tensor': 1}
  assert 'libtpu' not in out.stderr.lower() and 'TPU_' not in out.stderr  # Quiet on a host without TPUs.


def test_no_import_arrow_runs_up_to_the_tool():
  """compile-check builds and compiles the train step, so it sits above train/ and models/: neither they, nor
  parallel/ (which models/ imports), may import it, and parallel/ imports neither train/ nor models/."""
  import ast
  below = {'parallel': ('compile_check', 'train', 'models'), 'models': ('compile_check', 'train'),
           'train': ('compile_check',), 'kernels': ('compile_check', 'train', 'models')}
  found = []
  for package, forbidden in below.items():
    for path in sorted((ROOT / 'hybrid_jax' / package).rglob('*.py')):
      for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
        found += [f'{path.relative_to(ROOT)} imports {n}' for n in names
                  if any(n == f'hybrid_jax.{f}' or n.startswith(f'hybrid_jax.{f}.') for f in forbidden)]
  assert not found
