#!/usr/bin/env python3
"""Runs one hybrid_jax command as N cooperating processes on this machine (CPU, gloo collectives).

Each process gets the coordinator address, the process count and its id through the HYBRID_JAX_* variables
that hybrid_jax.parallel.distributed reads, and its own fake CPU devices. This is the multi-host code path of a
pod, testable on a laptop. When one process fails, the others are given --grace seconds to fail on their own
(they should, with a clear error) and are then stopped; the exit code is the first failure's.

  python launch/local_multiprocess.py --num_processes=2 -- train --config=hybrid:arch=full,scale=tiny
"""

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

import launcher_args  # launch/launcher_args.py (this folder is on sys.path when a launcher runs)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def commands(args) -> list[tuple[dict, list[str]]]:
  """(environment additions, argv) of every process."""
  out = []
  for pid in range(args.num_processes):
    env = {'HYBRID_JAX_COORDINATOR': f'127.0.0.1:{args.port}', 'HYBRID_JAX_NUM_PROCESSES': str(args.num_processes),
           'HYBRID_JAX_PROCESS_ID': str(pid), 'JAX_PLATFORMS': 'cpu',
           'XLA_FLAGS': f'--xla_force_host_platform_device_count={args.devices_per_process}'}
    out.append((env, [args.python, '-m', 'hybrid_jax', *args.command]))
  return out


def _pump(prefix, stream, sink):
  for line in stream:
    sink.write(f'[{prefix}] {line}')
    sink.flush()


def run(args) -> int:
  procs = []
  for pid, (env, argv) in enumerate(commands(args)):
    p = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    threading.Thread(target=_pump, args=(f'process {pid}', p.stdout, sys.stdout), daemon=True).start()
    procs.append(p)
  failed_at, code = None, 0
  while any(p.poll() is None for p in procs):
    bad = [p.returncode for p in procs if p.returncode not in (None, 0)]
    if bad and failed_at is None:
      failed_at, code = time.time(), bad[0]
    if failed_at is not None and time.time() - failed_at > args.grace:
      for pid, p in enumerate(procs):
        if p.poll() is None:
          print(f'[launcher] process {pid} still running {args.grace:.0f} s after a failure; stopping it',
                file=sys.stderr)
          p.send_signal(signal.SIGKILL)
    time.sleep(0.2)
  codes = [p.wait() for p in procs]
  return code or next((c for c in codes if c), 0)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--num_processes', type=int, default=2)
  parser.add_argument('--devices_per_process', type=int, default=1, help='fake CPU devices in each process')
  parser.add_argument('--port', type=int, default=0, help='coordinator port (0 = a free one)')
  parser.add_argument('--grace', type=float, default=120.0, help='seconds the others get after one fails')
  parser.add_argument('--python', default=sys.executable)
  parser.add_argument('--dry-run', action='store_true', help='print the commands instead of running them')
  args = launcher_args.parse(parser, argv, ['train'])
  args.port = args.port or (12355 if args.dry_run else free_port())
  if args.dry_run:
    for env, argv in commands(args):
      print(' '.join([f'{k}={shlex.quote(v)}' for k, v in env.items()] + [shlex.quote(a) for a in argv]) + ' &')
    print('wait')
    return 0
  return run(args)


if __name__ == '__main__':
  sys.exit(main())
