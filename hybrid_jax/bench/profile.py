"""Where a compiled step's time goes, read from a profiler trace and the step's named scopes.

`jax.profiler` traces a few steady steps; every traced XLA operation carries the name of its instruction in the
compiled program (`hlo_op`), and that instruction's metadata carries the JAX named scopes it came from. The model
names its parts (`block_<kind>[_w<window>]/mixer|mlp`, `embed`, `final_norm`, `lm_head`; the step adds `loss`, `optimizer`
and `metrics`), so each operation's time lands on one part, backward and remat recompute included (their op names
keep the forward scope inside `transpose(jvp(...))`). What has no scope (the layer scan's parameter slicing,
gradient accumulation, copies) is 'other'. Loops and calls are containers, not work: their own events are skipped
so nothing is counted twice.

On an accelerator the device's own events are used (device work without an HLO name is the part 'unnamed': on
GPU, kernels run inside command buffers lose their names, so profile with
XLA_FLAGS=--xla_gpu_enable_command_buffer= when 'unnamed' is large); on CPU the host executes the operations, so
its events are. Operations may overlap (CPU thread pools, GPU streams), so shares are of the summed operation time,
which can differ from the wall-clock step.
"""

import collections
import glob
import gzip
import json
import os
import re

import jax

# Parts the model and the train step name with jax.named_scope, besides the blocks.
NAMED_PARTS = ('embed', 'final_norm', 'lm_head', 'loss', 'optimizer', 'metrics')
CONTAINER_OPCODES = frozenset({'while', 'conditional', 'call', 'async-start', 'async-done'})

_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$')
_OPCODE = re.compile(r'(?:^|[\s)}\]])(?P<opcode>[a-z][a-z0-9\-]*)\(')
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
_CALLS = re.compile(r'calls=%?(?P<callee>[\w.\-]+)')
_COMPUTATION = re.compile(r'^\s*(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$')
_BLOCK = re.compile(r'block_[a-z0-9]+(?:_w\d+)?')


def module_name(hlo_text: str) -> str:
  """The HLO module's name (what trace events give as `hlo_module`)."""
  match = re.search(r'^HloModule\s+([\w.\-]+)', hlo_text, re.M)
  if not match:
    raise ValueError('not an HLO module text: no "HloModule <name>" line')
  return match.group(1)


def _operands(rest: str, opcode_end: int) -> list[str]:
  """Operand names of an instruction: the %names inside the parentheses that follow its opcode."""
  depth, end = 0, len(rest)
  for i in range(opcode_end - 1, len(rest)):
    depth += {'(': 1, ')': -1}.get(rest[i], 0)
    if depth == 0:
      end = i
      break
  return re.findall(r'%([\w.\-]+)', rest[opcode_end:end])


def instruction_scopes(hlo_text: str) -> dict[str, tuple[str, str]]:
  """{instruction name: (opcode, op_name)} of a compiled HLO module's text.

  Compiler-made instructions may lack metadata. A fusion then takes the most common op_name inside its fused
  computation; any other untagged instruction takes the op_name of its first operand that has (or inherits) one,
  so e.g. a dot the compiler rewrote stays with the block whose values it multiplies.
  """
  instructions, operands, callee_of = {}, {}, {}
  in_computation = collections.defaultdict(list)
  computation = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and '=' not in line.split('{')[0]:
      computation = header.group('name')
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    rest, name = match.group('rest'), match.group('name')
    opcode = _OPCODE.search(rest)
    op_name = _OP_NAME.search(rest)
    instructions[name] = (opcode.group('opcode') if opcode else '', op_name.group('op_name') if op_name else '')
    operands[name] = _operands(rest, opcode.end()) if opcode else []
    if op_name and computation:
      in_computation[computation].append(op_name.group('op_name'))
    callee = _CALLS.search(rest)
    if callee:
      callee_of[name] = callee.group('callee')

  resolved = {}

  def resolve(name, seen):
    if name in resolved:
      return resolved[name]
    opcode, op_name = instructions.get(name, ('', ''))
    if not op_name and in_computation.get(callee_of.get(name)):
      op_name = collections.Counter(in_computation[callee_of[name]]).most_common(1)[0][0]
    if not op_name and opcode not in CONTAINER_OPCODES:
      seen.add(name)
      for operand in operands.get(name, ()):
        inherited = '' if operand in seen else resolve(operand, seen)
        if inherited:
          op_name = inherited
          break
    resolved[name] = op_name
    return op_name

  return {name: (opcode, resolve(name, set())) for name, (opcode, _) in instructions.items()}


def _unwrapped_scopes(op_name: str) -> list[str]:
  """'jit(step)/transpose(jvp(block_full))/mixer/dot' -> ['step', 'block_full', 'mixer', 'dot']: transforms wrap
  the name of the scope they were applied in, which is the part we want."""
  return [re.sub(r'^(?:[\w\-]+\()+', '', scope).rstrip(')') for scope in op_name.split('/')]


def part_of(op_name: str) -> str:
  """The step part an operation belongs to, from its op_name (named scopes joined by '/')."""
  scopes = _unwrapped_scopes(op_name)
  for i, scope in enumerate(scopes):
    if _BLOCK.fullmatch(scope):
      sub = scopes[i + 1] if i + 1 < len(scopes) and scopes[i + 1] in ('mixer', 'mlp') else 'residual'
      return f'{scope}/{sub}'
  for part in NAMED_PARTS:
    if part in scopes:
      return part
  return 'other'


def newest_trace(logdir: str) -> str:
  """The newest Chrome-format trace (perfetto_trace.json.gz) written under `logdir`."""
  paths = glob.glob(os.path.join(logdir, '**', 'perfetto_trace.json.gz'), recursive=True)
  if not paths:
    raise FileNotFoundError(f'no perfetto_trace.json.gz under {logdir} (was the trace started with '
                            'create_perfetto_trace=True?)')
  return max(paths, key=os.path.getmtime)


UNNAMED = '<device work without an HLO name>'


def op_durations(trace_path: str, module: str) -> dict[str, float]:
  """{hlo_op: summed microseconds} of the trace's operation events of `module`, device events preferred.

  Device work that carries no HLO name (kernels XLA launched inside a command buffer / CUDA graph, copies) is
  summed under UNNAMED rather than dropped, so a breakdown shows how much it could not attribute.
  """
  with gzip.open(trace_path, 'rt') as fh:
    data = json.load(fh)
  events = data['traceEvents'] if isinstance(data, dict) else data
  process_names = {e['pid']: e.get('args', {}).get('name', '') for e in events
                   if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  device_pids = {pid for pid, name in process_names.items() if name.startswith('/device:')}
  complete = [e for e in events if e.get('ph') == 'X']
  device = [e for e in complete if e['pid'] in device_pids]
  named = lambda e: (e.get('args') or {}).get('hlo_module') == module and 'hlo_op' in e['args']
  totals = collections.defaultdict(float)
  if device:
    for e in device:
      if named(e):
        totals[e['args']['hlo_op']] += float(e.get('dur', 0.0))
      elif 'hlo_module' not in (e.get('args') or {}):  # Other programs' work is not this step's.
        totals[UNNAMED] += float(e.get('dur', 0.0))
  else:  # CPU: the host threads execute the operations.
    for e in complete:
      if named(e):
        totals[e['args']['hlo_op']] += float(e.get('dur', 0.0))
  return dict(totals)


def attribute(durations: dict[str, float], scopes: dict[str, tuple[str, str]]) -> dict[str, float]:
  """{part: microseconds} from per-operation durations and the program's instruction scopes."""
  parts = collections.defaultdict(float)
  for op, us in durations.items():
    if op == UNNAMED:
      parts['unnamed'] += us
      continue
    opcode, op_name = scopes.get(op, ('', ''))
    if opcode in CONTAINER_OPCODES:
      continue
    parts[part_of(op_name)] += us
  return dict(parts)


def profile_compiled(compiled, args, steps: int, logdir: str, run=None) -> dict:
  """Profiles `steps` calls of `compiled` and attributes their operation time to the step's parts.

  `run(compiled, args) -> args` performs one call and blocks until it is done (the train step threads its state
  through it); by default `compiled(*args)` is called and its outputs waited on. Returns (`breakdown`'s result,
  args after the last call).
  """
  if run is None:
    def run(compiled, args):
      jax.block_until_ready(compiled(*args))
      return args
  jax.profiler.start_trace(logdir, create_perfetto_trace=True)
  try:
    for _ in range(steps):
      args = run(compiled, args)
  finally:
    jax.profiler.stop_trace()
  return breakdown(compiled.as_text(), newest_trace(logdir), steps), args


def breakdown(hlo_text: str, trace: str, steps: int) -> dict:
  """Operation time per step of each part, from a trace of `steps` runs of the program `hlo_text`.

  Returns {'method', 'steps', 'trace', 'op_ms_per_step', 'parts': [{'part', 'ms_per_step', 'share'}] largest
  first}.
  """
  durations = op_durations(trace, module_name(hlo_text))
  if not durations:
    raise RuntimeError(f'the trace {trace} holds no operation events of module {module_name(hlo_text)!r}')
  parts = attribute(durations, instruction_scopes(hlo_text))
  total_us = sum(parts.values())
  rows = [{'part': p, 'ms_per_step': us / 1e3 / steps, 'share': us / total_us}
          for p, us in sorted(parts.items(), key=lambda kv: -kv[1])]
  return {'method': 'profiler trace: operation time by named scope', 'steps': steps, 'trace': trace,
          'op_ms_per_step': total_us / 1e3 / steps, 'parts': rows}
