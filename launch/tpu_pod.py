#!/usr/bin/env python3
"""Cloud TPU pod lifecycle through gcloud: create, run on all workers, logs, stop, delete.

Every worker of a pod runs the same command (`--worker=all`); TPU VMs need no coordinator settings, since
jax.distributed detects the pod itself. `--queued` creates through queued resources (the usual way to get
capacity, and the only way for multislice: `--slices=N`, each slice a node `<name>-<i>`). `--dry-run` prints the
exact commands instead of running them.

  python launch/tpu_pod.py create --name=run1 --zone=us-east5-a --accelerator=v5p-64 --version=v2-alpha-tpuv5
  python launch/tpu_pod.py setup  --name=run1 --zone=us-east5-a --repo=https://github.com/me/hybrid_jax --bucket=B
  python launch/tpu_pod.py run    --name=run1 --zone=us-east5-a -- train --config=hybrid:arch=full,scale=s3 \
      --workdir=/mnt/B/full_s3
  python launch/tpu_pod.py logs   --name=run1 --zone=us-east5-a
  python launch/tpu_pod.py delete --name=run1 --zone=us-east5-a
  python launch/tpu_pod.py state  --name=run1 --zone=us-east5-a --queued   # ACTIVE, SUSPENDED, ... (queued only)

`python -m hybrid_jax sweep run --backend tpu` drives these actions for a whole sweep (re-queueing preempted
slices).
"""

import argparse
import shlex
import subprocess
import sys

import launcher_args  # launch/launcher_args.py (this folder is on sys.path when a launcher runs)

LOG = '~/hybrid_jax_run.log'


def _where(a) -> list[str]:
  return ([f'--project={a.project}'] if a.project else []) + [f'--zone={a.zone}']


def _ssh(a, command: str, worker='all', node=None) -> list[str]:
  return ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', node or a.name, *_where(a), f'--worker={worker}',
          f'--command={command}']


def _nodes(a) -> list[str]:
  """TPU VM names: the pod itself, or one node per slice of a multislice queued resource."""
  return [a.name] if a.slices == 1 else [f'{a.name}-{i}' for i in range(a.slices)]


def commands(a) -> list[list[str]]:
  """The gcloud command lines of action `a.action`."""
  if a.action == 'create':
    if a.queued or a.slices > 1:
      cmd = ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', a.name, *_where(a),
             f'--accelerator-type={a.accelerator}', f'--runtime-version={a.version}']
      cmd += [f'--node-count={a.slices}', f'--node-prefix={a.name}'] if a.slices > 1 else [f'--node-id={a.name}']
      return [cmd + (['--spot'] if a.spot else [])]
    return [['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', a.name, *_where(a),
             f'--accelerator-type={a.accelerator}', f'--version={a.version}'] + (['--spot'] if a.spot else [])]
  if a.action == 'setup':
    script = (f'git clone {shlex.quote(a.repo)} hybrid_jax || (cd hybrid_jax && git pull); cd hybrid_jax && '
              "python3 -m venv .venv && .venv/bin/pip install -q -e '.[tpu]'")
    if a.bucket:  # Run directories are local paths: every worker mounts the bucket at the same one.
      mount = shlex.quote(f'/mnt/{a.bucket}')
      script += (f' && sudo mkdir -p {mount} && sudo chown "$USER" {mount} && '
                 f'(mountpoint -q {mount} || gcsfuse --implicit-dirs {shlex.quote(a.bucket)} {mount})')
    return [_ssh(a, script, node=node) for node in _nodes(a)]
  if a.action == 'run':
    hybrid = ' '.join(shlex.quote(x) for x in a.command)
    # pipefail: the command's exit status (2 = a user error, 143 = stopped) comes back through ssh, not tee's.
    line = f'set -o pipefail; cd hybrid_jax && .venv/bin/python -m hybrid_jax {hybrid} 2>&1 | tee {LOG}'
    if a.detach or a.slices > 1:  # Slices must start together: each ssh returns at once.
      line = f'cd hybrid_jax && nohup .venv/bin/python -m hybrid_jax {hybrid} > {LOG} 2>&1 &'
    return [_ssh(a, line, node=node) for node in _nodes(a)]
  if a.action == 'logs':
    return [_ssh(a, f'tail -n 200 -f {LOG}', worker=a.worker)]
  if a.action == 'stop':  # SIGTERM: hybrid_jax writes a checkpoint and exits.
    return [_ssh(a, "pkill -TERM -f 'python -m hybrid_jax' || true", node=node) for node in _nodes(a)]
  if a.action == 'state':  # The queued resource's state: a preempted spot slice leaves ACTIVE.
    return [['gcloud', 'compute', 'tpus', 'queued-resources', 'describe', a.name, *_where(a),
             '--format=value(state.state)']]
  if a.action == 'delete':
    if a.queued or a.slices > 1:
      return [['gcloud', 'compute', 'tpus', 'queued-resources', 'delete', a.name, *_where(a), '--force', '--quiet']]
    return [['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', a.name, *_where(a), '--quiet']]
  raise ValueError(f'unknown action {a.action!r}')


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('action', choices=('create', 'setup', 'run', 'logs', 'stop', 'state', 'delete'))
  p.add_argument('--name', required=True, help='TPU VM (or queued resource) name')
  p.add_argument('--zone', required=True)
  p.add_argument('--project', default='', help="'' = gcloud's configured project")
  p.add_argument('--accelerator', default='v5p-8', help='e.g. v5p-64, v5litepod-256, v4-32')
  p.add_argument('--version', default='v2-alpha-tpuv5', help='TPU software (runtime) version')
  p.add_argument('--queued', action='store_true', help='create / delete through queued resources')
  p.add_argument('--slices', type=int, default=1, help='multislice: number of slices (implies --queued)')
  p.add_argument('--spot', action='store_true', help='spot (preemptible) capacity')
  p.add_argument('--repo', default='', help='setup: git URL of this project')
  p.add_argument('--bucket', default='', help='setup: mount this Cloud Storage bucket at /mnt/BUCKET on every '
                 'worker (gcsfuse), for --workdir=/mnt/BUCKET/RUN')
  p.add_argument('--worker', default='0', help="logs: which worker's log ('all' for every worker)")
  p.add_argument('--detach', action='store_true', help='run: start in the background (then use logs / stop)')
  p.add_argument('--dry-run', action='store_true', help='print the commands instead of running them')
  return p


def parse(argv):
  """The arguments of one launcher command line (`.command`: what follows `--`)."""
  return launcher_args.parse(parser(), argv)


def main(argv=None) -> int:
  p = parser()
  a = launcher_args.parse(p, argv)
  if a.action == 'run' and not a.command:
    p.error('run needs a hybrid_jax command after --, e.g. -- train --config=...')
  if a.action == 'setup' and not a.repo:
    p.error('setup needs --repo')
  for cmd in commands(a):
    print(shlex.join(cmd), flush=True)
    if not a.dry_run:
      code = subprocess.call(cmd)
      if code:
        return code
  return 0


if __name__ == '__main__':
  sys.exit(main())
