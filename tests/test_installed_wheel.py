"""The package installed from a wheel: built from this checkout's sources, installed into a folder of its own and
run from an empty directory (no checkout in sight), it imports from the install, carries every file of the package
(the packaged configs and the eval data included), prints the packaged grid's parameter counts and trains the main
job's default config."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT, SMALL

# What the build reads besides the package itself (setup.cfg's long_description is README.md).
BUILD_FILES = ('setup.cfg', 'pyproject.toml', 'README.md')


def _run(args, cwd, pythonpath, timeout=600):
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  env.update(PYTHONPATH=str(pythonpath), JAX_PLATFORMS='cpu', PIP_DISABLE_PIP_VERSION_CHECK='1')
  out = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, f'{args}: exit status {out.returncode}\n{out.stdout}\n{out.stderr}'
  return out


def _package_files(root: pathlib.Path) -> set[str]:
  return {str(p.relative_to(root)) for p in (root / 'hybrid_jax').rglob('*')
          if p.is_file() and '__pycache__' not in p.parts and p.suffix != '.pyc'}


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """(site folder the wheel is installed in, the wheel, an empty working directory).

  The wheel is built offline (no build isolation, no index) from a copy of the sources: an in-tree build would leave
  build/ and *.egg-info in the checkout, and setuptools' build/lib would carry a file deleted since into the next
  wheel."""
  tmp = tmp_path_factory.mktemp('installed_wheel')
  source = tmp / 'source'
  shutil.copytree(ROOT / 'hybrid_jax', source / 'hybrid_jax', ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
  for name in BUILD_FILES:
    shutil.copy(ROOT / name, source / name)
  _run(['-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index', '-w', str(tmp / 'dist'), '.'],
       cwd=source, pythonpath='')
  (wheel,) = (tmp / 'dist').glob('hybrid_jax-*.whl')
  _run(['-m', 'pip', 'install', '--no-deps', '--no-index', '--target', str(tmp / 'site'), str(wheel)], cwd=tmp,
       pythonpath='')
  empty = tmp / 'empty'
  empty.mkdir()
  return tmp / 'site', wheel, empty


def test_the_wheel_carries_every_file_of_the_package_and_nothing_else(installed):
  _, wheel, _ = installed
  names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith('hybrid_jax-')}  # Less the dist-info.
  assert names == _package_files(ROOT)
  assert {'hybrid_jax/configs/base.py', 'hybrid_jax/configs/hybrid.py', 'hybrid_jax/configs/mini.py',
          'hybrid_jax/configs/sweep.py', 'hybrid_jax/eval/data/tasks.json'} <= names


def test_the_installed_package_runs_from_an_empty_directory(installed):
  site, _, empty = installed
  imported = _run(['-c', 'import hybrid_jax; print(hybrid_jax.__file__)'], cwd=empty, pythonpath=site)
  assert pathlib.Path(imported.stdout.strip()).resolve().is_relative_to(site.resolve()), imported.stdout

  # The packaged grid by name gives the counts the checkout's package gives, and an experiment file of the
  # checkout (configs/) runs on the installed package, with S1's exact non-embedding count.
  packaged = _run(['-m', 'hybrid_jax', 'params', '--config=hybrid:arch=gdn,scale=s1'], cwd=empty, pythonpath=site)
  checkout = _run(['-m', 'hybrid_jax', 'params', '--config=hybrid:arch=gdn,scale=s1'], cwd=ROOT, pythonpath=ROOT)
  assert json.loads(packaged.stdout) == json.loads(checkout.stdout)
  assert json.loads(packaged.stdout)['non_embedding'] > 0
  experiment = _run(['-m', 'hybrid_jax', 'params', f'--config={ROOT}/configs/nope_fix.py:scale=s1'], cwd=empty,
                    pythonpath=site)
  assert json.loads(experiment.stdout)['non_embedding'] == 14_999_424

  # The main job (`train` with its default config), made seconds-fast by the suite's small-run overrides.
  workdir = empty / 'run'
  settings = [f'--config.{section}.{key}={value}' for section, values in SMALL.items() for key, value in values.items()]
  _run(['-m', 'hybrid_jax', 'train', f'--workdir={workdir}', '--config.train.steps=4', *settings], cwd=empty,
       pythonpath=site)
  report = json.loads((workdir / 'report.json').read_text())
  assert report['steps'] == 4 and report['status'] == 'completed', report
  assert json.loads((workdir / 'config.json').read_text())['name'] == 'swa128_nope_tiny'  # The default config.
  assert sorted(p.name for p in empty.iterdir()) == ['run']  # Nothing else was written where it ran.
