"""Multi-host start-up: `jax.distributed.initialize` from the config or the environment, a same-config check,
and globally consistent batches from per-process data.

Every failure mode that would otherwise hang a pod (a process that never starts, a wrong coordinator port, a
process that runs another config) becomes an error naming the process and the setting to check.
"""

import hashlib
import json
import logging
import os

import jax
import numpy as np

# Set by launch/local_multiprocess.py and usable by any launcher: coordinator host:port, process count and id.
ENV_COORDINATOR = 'HYBRID_JAX_COORDINATOR'
ENV_NUM_PROCESSES = 'HYBRID_JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'HYBRID_JAX_PROCESS_ID'


class DistributedError(RuntimeError):
  """Processes of one job could not start together or disagree about the job."""


def _cluster_in_environment() -> str | None:
  """Which multi-process environment this process runs in, if any."""
  if os.environ.get(ENV_COORDINATOR):
    return 'hybrid_jax launcher'
  if int(os.environ.get('SLURM_NTASKS', '1') or 1) > 1:
    return 'SLURM'
  if len([h for h in os.environ.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1:
    return 'TPU pod'
  return None


def _settings(dist_cfg) -> dict:
  """coordinator_address / num_processes / process_id from the config, else from our launcher's variables.

  Left unset (None), jax detects them itself on SLURM and on TPU VMs.
  """
  address = dist_cfg.coordinator_address or os.environ.get(ENV_COORDINATOR) or None
  count = int(dist_cfg.num_processes) or int(os.environ.get(ENV_NUM_PROCESSES, 0)) or None
  pid = int(dist_cfg.process_id)
  if pid < 0:
    pid = int(os.environ[ENV_PROCESS_ID]) if os.environ.get(ENV_PROCESS_ID) else None
  return {'coordinator_address': address, 'num_processes': count, 'process_id': pid}


def initialize(dist_cfg) -> bool:
  """Joins the multi-process job when configured or detected; True if this is a multi-process run."""
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  mode = dist_cfg.initialize
  cluster = _cluster_in_environment()
  if mode == 'never' or (mode == 'auto' and cluster is None and not dist_cfg.coordinator_address):
    return False
  if dist_cfg.cpu_collectives != 'none':
    jax.config.update('jax_cpu_collectives_implementation', dist_cfg.cpu_collectives)
  settings = _settings(dist_cfg)
  logging.info('joining the %s job: %s', cluster or 'configured', settings)
  try:
    jax.distributed.initialize(**settings, initialization_timeout=int(dist_cfg.initialization_timeout_s),
                               heartbeat_timeout_seconds=int(dist_cfg.heartbeat_timeout_s))
  except Exception as e:  # The runtime raises XlaRuntimeError / RuntimeError / ValueError with terse texts.
    raise DistributedError(
        f'process {settings["process_id"]} could not join the job at coordinator '
        f'{settings["coordinator_address"] or "(auto-detected)"} with {settings["num_processes"] or "(auto)"} '
        f'processes within config.parallel.distributed.initialization_timeout_s='
        f'{dist_cfg.initialization_timeout_s}: {type(e).__name__}: {e}. Check that every process started, that '
        f'they all name the same coordinator host:port, and that the port is open between hosts.') from e
  return jax.process_count() > 1


def config_hash(config) -> str:
  """A short hash of the whole config (sorted JSON), equal on every process of a correct launch.

  parallel.distributed.process_id is left out: it is the one key that legitimately differs per process.
  """
  data = json.loads(config.to_json_best_effort())
  data.get('parallel', {}).get('distributed', {}).pop('process_id', None)
  text = json.dumps(data, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _kv_client():
  from jax._src import distributed as jax_distributed  # The coordination service's key-value store.
  return jax_distributed.global_state.client


def check_same_config(config, timeout_s: int, *, tag: str = 'config') -> None:
  """Fails on every process when any process runs a different config, or names a process that never reports."""
  if jax.process_count() == 1:
    return
  client = _kv_client()
  mine, me = config_hash(config), jax.process_index()
  client.key_value_set(f'hybrid_jax/{tag}/{me}', mine)
  hashes = {}
  for pid in range(jax.process_count()):
    try:
      hashes[pid] = client.blocking_key_value_get(f'hybrid_jax/{tag}/{pid}', int(timeout_s * 1000))
    except Exception as e:
      raise DistributedError(f'process {pid} did not report its config within '
                             f'config.parallel.distributed.barrier_timeout_s={timeout_s} s (it may have crashed or '
                             f'never started): {type(e).__name__}: {e}') from e
  differing = {pid: h for pid, h in hashes.items() if h != mine}
  if differing:
    raise DistributedError(f'processes run different configs: process {me} has config hash {mine}, but '
                           + ', '.join(f'process {p} has {h}' for p, h in differing.items())
                           + '. Launch every process with the same config file and overrides.')


def batch_readers(sharding, global_shape) -> tuple[int, int]:
  """(this process's reader index, readers) of a global batch laid out by `sharding`: each process reads the
  contiguous block of rows its devices hold, and processes that hold the same rows (a mesh axis that does not
  split the batch, such as 'sequence' or 'tensor', spanning hosts) read the same ones. Pure data parallelism over
  one device per process or more gives (process_index, process_count)."""
  held = {}
  for device, index in sharding.devices_indices_map(tuple(global_shape)).items():
    start, stop, _ = index[0].indices(global_shape[0])
    held.setdefault(device.process_index, set()).update(range(start, stop))
  blocks = {p: (min(rows), max(rows) + 1) for p, rows in held.items()}
  distinct = sorted(set(blocks.values()))
  sizes = {stop - start for start, stop in distinct}
  if (any(len(rows) != blocks[p][1] - blocks[p][0] for p, rows in held.items()) or len(sizes) != 1
      or sum(sizes) * len(distinct) != global_shape[0]):
    raise DistributedError(f'the batch layout {sharding.spec} gives the processes rows {sorted(blocks.items())} of '
                           f'{global_shape[0]}: each process must hold one equal, contiguous block (put the mesh axes '
                           'that split the batch outermost)')
  return distinct.index(blocks[jax.process_index()]), len(distinct)


def global_batch(local_batch: dict, sharding, batch_size: int) -> dict:
  """One global array of `batch_size` rows per field from this process's rows (its `batch_readers` block)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v), (batch_size,) + np.shape(v)[1:])
          for k, v in local_batch.items()}


def host_array(x) -> np.ndarray:
  """The whole of a (possibly multi-process) jax array on this host, or a NumPy array as it is."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def replicated_batch(batch: dict, sharding) -> dict:
  """Global arrays from a batch every process holds in full (held-out batches)."""
  return {k: jax.make_array_from_callback(np.shape(v), sharding, lambda idx, v=v: np.asarray(v)[idx])
          for k, v in batch.items()}


def _live_processes(wait_s: float = 2.0):
  """Ids of the processes the coordinator still hears from, or None if it does not answer within wait_s."""
  import threading
  found = {}

  def ask():
    try:
      found['live'] = sorted(int(k) for k in _kv_client().get_live_nodes(list(range(jax.process_count()))))
    except Exception:  # The service may already be failing; the message then does without the names.
      pass

  thread = threading.Thread(target=ask, daemon=True)
  thread.start()
  thread.join(wait_s)
  return found.get('live')


def peer_failure(error: Exception, step: int) -> DistributedError:
  """The error to raise when a cross-process computation fails: names the processes that are gone, if known."""
  live = _live_processes()
  missing = sorted(set(range(jax.process_count())) - set(live)) if live is not None else None
  who = (f'process(es) {", ".join(map(str, missing))} stopped responding' if missing else
         'another process most likely died or was stopped')
  return DistributedError(
      f'process {jax.process_index()} of {jax.process_count()}: a collective or barrier at step {step} failed: '
      f'{who}. '
      f'See that process\'s log; rerunning the same command resumes from the last checkpoint. '
      f'({type(error).__name__}: {str(error)[:300]})')


def lead_decides(tag: str, decide, errors: tuple, timeout_s: int) -> None:
  """Runs `decide()` on process 0 only; when it raises, every process raises the same (an error of `errors` by
  its class, anything else as DistributedError) with its message, so all processes stop alike."""
  if jax.process_count() == 1:
    decide()
    return
  client, key = _kv_client(), f'hybrid_jax/lead_decides/{tag}'
  if jax.process_index() == 0:
    try:
      decide()
    except BaseException as e:
      client.key_value_set(key, json.dumps({'error': type(e).__name__, 'message': str(e)}))
      raise
    client.key_value_set(key, json.dumps({}))
    return
  try:
    outcome = json.loads(client.blocking_key_value_get(key, int(timeout_s * 1000)))
  except Exception as e:
    raise DistributedError(f'process 0 did not report {tag} within config.parallel.distributed.barrier_timeout_s='
                           f'{timeout_s} s (it may have crashed): {type(e).__name__}: {e}') from e
  if 'error' in outcome:
    error = {cls.__name__: cls for cls in errors}.get(outcome['error'], DistributedError)
    raise error(outcome['message'] if error is not DistributedError else
                f'process 0 failed at {tag}: {outcome["error"]}: {outcome["message"]}')
