#!/usr/bin/env python3
"""GPU launch: one host with N GPUs (one process drives them all), or a SLURM job over several nodes.

On one host no coordinator is needed: a single process sees every GPU and the mesh spans them. On SLURM one
task per node runs; jax.distributed picks the coordinator and ranks up from SLURM's environment. `--dry-run`
prints the exact command (or the filled-in sbatch script) instead of running it.

  python launch/gpu.py local --gpus=8 -- train --config=hybrid:arch=full,scale=s2
  python launch/gpu.py slurm --nodes=4 --gpus_per_node=8 -- train --config=hybrid:arch=full,scale=s5
"""

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

import launcher_args  # launch/launcher_args.py (this folder is on sys.path when a launcher runs)

HERE = pathlib.Path(__file__).resolve().parent


def local_command(a) -> list[str]:
  devices = ','.join(str(i) for i in range(a.gpus))
  return ['env', f'CUDA_VISIBLE_DEVICES={devices}', 'XLA_PYTHON_CLIENT_MEM_FRACTION=0.9', a.python, '-m',
          'hybrid_jax', *a.command]


def slurm_script(a) -> str:
  return (HERE / 'slurm_template.sh').read_text().format(
      job_name=a.job_name, nodes=a.nodes, gpus_per_node=a.gpus_per_node, cpus_per_task=a.cpus_per_task,
      time=a.time, log_dir=a.log_dir, project_dir=HERE.parent,
      partition_line=f'#SBATCH --partition={a.partition}' if a.partition else '',
      command=' '.join(shlex.quote(x) for x in a.command))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('mode', choices=('local', 'slurm'))
  p.add_argument('--gpus', type=int, default=1, help='local: GPUs to use (0..N-1)')
  p.add_argument('--nodes', type=int, default=1, help='slurm: nodes')
  p.add_argument('--gpus_per_node', type=int, default=8, help='slurm: GPUs per node')
  p.add_argument('--cpus_per_task', type=int, default=16)
  p.add_argument('--job_name', default='hybrid_jax')
  p.add_argument('--partition', default='')
  p.add_argument('--time', default='24:00:00')
  p.add_argument('--log_dir', default='runs/slurm')
  p.add_argument('--python', default=sys.executable)
  p.add_argument('--dry-run', action='store_true', help='print instead of running')
  a = launcher_args.parse(p, argv, ['train'])
  if a.mode == 'local':
    cmd = local_command(a)
    print(shlex.join(cmd[1:]), flush=True)
    return 0 if a.dry_run else subprocess.call(cmd)
  script = slurm_script(a)
  if a.dry_run:
    print(script, end='')
    print('# submit with: sbatch <this script>')
    return 0
  os.makedirs(a.log_dir, exist_ok=True)
  with tempfile.NamedTemporaryFile('w', suffix='.sbatch', delete=False) as f:
    f.write(script)
  print(f'sbatch {f.name}', flush=True)
  return subprocess.call(['sbatch', f.name])


if __name__ == '__main__':
  sys.exit(main())
