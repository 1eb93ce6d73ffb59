"""The planner's arithmetic on a hand-checked case, sweeps from a file, the launch list and clear errors."""

import json
import shlex

import pytest

from hybrid_jax import commands, config as config_lib
from hybrid_jax.compile_check import rows as compile_check_rows
from hybrid_jax.study import plan
from hybrid_jax.commands import plan as plan_command
from tests.conftest import ROOT

TINY = 'hybrid:arch=swa128_nope,scale=tiny'

# The tiny SWA-128 hybrid at T = 512 (d 128, 4 layers [swa, full] x 2, 4 heads / 2 KV heads of 32, SwiGLU 320,
# vocab 257), per token, forward:
#   attention projections: (128*4*32 + 2*128*2*32 + 4*32*128) = 49,152 weights -> 98,304 FLOPs
#   MLP: 3*128*320 = 122,880 weights -> 245,760 FLOPs
#   SWA core: pairs 128*129/2 + 384*128 = 57,408 per sequence; 4*4*32*57,408 / 512 = 57,408 per token
#   full core: pairs 512*513/2 = 131,328; 4*4*32*131,328 / 512 = 131,328 per token
#   LM head: 2*128*257 = 65,792
#   total 2*(98,304 + 245,760 + 57,408) + 2*(98,304 + 245,760 + 131,328) + 65,792 = 1,819,520
# Training: 3 x 1,819,520 = 5,458,560 FLOPs per token. Tokens: 300 steps x 8 x 512 = 1,228,800.
TINY_FLOPS_PER_TOKEN = 5_458_560
TINY_TOKENS = 1_228_800


def test_hand_checked_tiny_run():
  row = plan.plan_run(TINY, tflops=100.0, mfu=0.5)
  assert (row['steps'], row['batch_size'], row['seq_len']) == (300, 8, 512)
  assert row['tokens'] == TINY_TOKENS
  assert row['flops_per_token'] == TINY_FLOPS_PER_TOKEN
  assert row['training_flops'] == TINY_FLOPS_PER_TOKEN * TINY_TOKENS  # 6.707e12
  # 6,707,478,528,000 FLOPs at 100 TFLOP/s x 0.5 = 134.15 s = 0.037264 h.
  assert row['accelerator_hours'] == pytest.approx(6_707_478_528_000 / 50e12 / 3600)
  assert row['tokens_per_param'] == pytest.approx(TINY_TOKENS / row['non_embedding_params'])


def test_overrides_totals_and_launch_list(tmp_path):
  runs = [TINY, f'{TINY} --config.train.steps=600 --config.train.batch_size=4']
  p = plan.make_plan(runs, tflops=100.0, mfu=0.5)
  second = p['runs'][1]
  assert second['tokens'] == 600 * 4 * 512 == TINY_TOKENS  # Same tokens, twice the steps.
  assert p['total']['tokens'] == 2 * TINY_TOKENS and p['total']['steps'] == 900
  assert p['total']['training_flops'] == 2 * TINY_FLOPS_PER_TOKEN * TINY_TOKENS
  workdirs = [r['workdir'] for r in p['runs']]
  assert len(set(workdirs)) == 2 and all(w.startswith('runs/swa128_nope_tiny') for w in workdirs)
  lines = plan.launch_lines(p)
  assert shlex.split(lines[0]) == ['train', f'--config={TINY}', f'--workdir={workdirs[0]}']
  assert shlex.split(lines[1])[2:4] == ['--config.train.steps=600', '--config.train.batch_size=4']
  assert '| **total (2 runs)** |' in plan.table(p)


def test_sweep_file_and_cli(tmp_path, capsys):
  sweep = tmp_path / 'sweep.py'
  gdn = TINY.replace('swa128_nope', 'gdn')
  sweep.write_text(f"def runs(name):\n  assert name == 'mini'\n  return [{TINY!r}, {gdn!r}]\n")
  out = tmp_path / 'launch.txt'
  assert plan_command.main(['--sweep', f'{sweep}:mini', '--tflops', '100', '--mfu', '0.5', '--launch-list', str(out)]) == 0
  lines = out.read_text().splitlines()
  assert len(lines) == 2 and 'arch=gdn' in lines[1] and lines[1].endswith('--workdir=runs/gdn_tiny')
  assert '| swa128_nope_tiny | 512 | 8 | 300 |' in capsys.readouterr().out


def test_the_packaged_sweeps_by_name_from_any_directory(tmp_path, monkeypatch, capsys):
  """`--sweep sweep:NAME` is the packaged sweep file; its runs name the packaged configs, so they load wherever the
  package is installed; the packaged file by its path gives the same runs."""
  monkeypatch.chdir(tmp_path)
  for name in ('study', 'mini,preset=smoke,seeds=2'):
    runs = config_lib.load_sweep(f'sweep:{name}')
    assert runs == config_lib.load_sweep(f'{config_lib.CONFIG_DIR / "sweep.py"}:{name}')
    assert all(r.startswith('mini:' if name.startswith('mini') else 'hybrid:') for r in runs)
  out = tmp_path / 'launch.txt'
  assert plan_command.main(['--sweep', 'sweep:s5', '--launch-list', str(out)]) == 0
  lines = out.read_text().splitlines()
  assert len(lines) == 8
  assert lines[0] == 'train --config=hybrid:arch=full,scale=s5,tokens=1e+11 --workdir=runs/full_s5_1e+11tok'
  assert '| full_s5_1e+11tok |' in capsys.readouterr().out


def _plan_status(argv) -> int:
  """The exit status of `python -m hybrid_jax plan ARGV` through the command line's entry, in this process."""
  with pytest.raises(SystemExit) as exit_info:
    commands.main(['hybrid_jax', 'plan', *argv])
  return exit_info.value.code


@pytest.mark.parametrize('argv, message', [
    (['--runs', f'{TINY} --config.train.stepz=3'], 'stepz does not exist'),
    (['--runs', f'{TINY} --train.steps=3'], 'not a --config.KEY=VALUE'),
    (['--runs', f'{TINY} --config.train.steps=many'], 'train.steps'),
    (['--runs', TINY, TINY], 'identical'),
    (['--runs', TINY, '--mfu', '40'], 'mfu'),
    (['--sweep', 'configs/no_such_sweep.py:x'], 'does not exist'),
    (['--sweep', f'{ROOT}/configs/laziness.py:window=64'], "configs/laziness.py: bad argument 'window=64'"),
    (['--sweep', 'sweep:nosuch'], "sweep file 'sweep'"),
    (['--sweep', 'nosuch:main'], "sweep file 'nosuch' does not exist"),
    (['--runs', TINY, '--tflops', 'inf'], "argument --tflops: 'inf' is invalid"),
])
def test_bad_input_fails_clearly(argv, message, capsys):
  assert _plan_status(argv) == 2
  assert message in capsys.readouterr().err


def _fit_row(arch, target, *, fits=True, step_s=2.0, batch_size=16, chips=4, fix=None):
  return {'arch': arch, 'scale': 'tiny', 'seq_len': 512, 'target': target, 'chips': chips, 'fits': fits,
          'batch_size': batch_size, 'estimate': {'step_s': step_s, 'bound': 'compute'}, 'fix': fix}


def test_tpu_hours_from_compile_check_rows(tmp_path, capsys):
  fix = {'change': 'model.remat=full', 'estimate': {'step_s': 3.0, 'bound': 'compute'}}
  rows = [_fit_row('swa128_nope', 'v5p:2x2x1'), _fit_row('swa128_nope', 'v6e:2x4', step_s=99.0, chips=8),
          _fit_row('gdn', 'v5p:2x2x2', fits=False, step_s=1.0, chips=8, fix=fix)]  # Estimated, but too big.
  fit = tmp_path / 'fit.json'
  fit.write_text(json.dumps(rows))
  gdn, full = TINY.replace('swa128_nope', 'gdn'), TINY.replace('swa128_nope', 'full')
  p = plan.make_plan([TINY, gdn, full], tflops=100.0, mfu=0.5, fit_rows=compile_check_rows.load(fit, 'v5p'))
  swa, gdn_row, full_row = p['runs']
  # 300 steps x 2 s x (batch 8 / row batch 16) / mfu 0.5 = 600 s on 4 chips.
  assert (swa['tpu_target'], swa['tpu_change']) == ('v5p:2x2x1', None)
  assert swa['tpu_wall_hours'] == pytest.approx(600 / 3600) and swa['tpu_chip_hours'] == pytest.approx(2400 / 3600)
  # The study's setting did not fit: the fixed step's estimate, 300 x 3 s x 0.5 / 0.5 = 900 s on 8 chips.
  assert (gdn_row['tpu_target'], gdn_row['tpu_change']) == ('v5p:2x2x2', 'model.remat=full')
  assert gdn_row['tpu_chip_hours'] == pytest.approx(8 * 900 / 3600)
  assert full_row['tpu_target'] is None and full_row['tpu_chip_hours'] is None
  assert p['total']['tpu_chip_hours'] == pytest.approx((2400 + 7200) / 3600)
  assert plan_command.main(['--runs', TINY, gdn, '--fit', str(fit), '--chip', 'v6e', '--mfu', '0.5']) == 0
  out = capsys.readouterr().out
  assert '| v6e:2x4 | 8.25 | 66 |' in out and '| no compile-check row | - | - |' in out  # 300 x 99 x 0.5 / 0.5 s.


@pytest.mark.parametrize('content, chip, message', [
    (None, 'v5p', 'does not exist'), (b'\x7fELF\x02\x01\x01\xd0\xff', 'v5p', 'not JSON'), ('{', 'v5p', 'not JSON'), ('{"a": 1}', 'v5p', 'list of compile-check rows'),
    ('[{"target": "v5p:2x2x1", "arch": "gdn"}]', 'v5p', "item 0: missing key(s) 'scale', 'seq_len'"),
    (json.dumps([_fit_row('gdn', 'v6e:2x4')]), 'v5p', 'no rows for --chip v5p; it has v6e')])
def test_bad_fit_files_fail_clearly(tmp_path, capsys, content, chip, message):
  fit = tmp_path / 'fit.json'
  if content is not None:
    fit.write_bytes(content if isinstance(content, bytes) else content.encode())
  assert _plan_status(['--runs', TINY, '--fit', str(fit), '--chip', chip]) == 2
  assert message in capsys.readouterr().err
