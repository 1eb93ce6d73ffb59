"""Profile attribution (hybrid_jax.bench.profile): HLO metadata parsing, scope names under transforms, and a real
trace of a program whose parts differ a thousandfold in work."""

import gzip
import json
import math
import re

import jax
import jax.numpy as jnp
import pytest

from hybrid_jax.bench import profile

HLO = '''HloModule jit_step, entry_computation_layout={(f32[8,8]{1,0})->f32[8,8]{1,0}}

%fused_computation.1 (param_0: f32[8,8]) -> f32[8,8] {
  %param_0 = f32[8,8]{1,0} parameter(0)
  ROOT %tanh.1 = f32[8,8]{1,0} tanh(%param_0), metadata={op_name="jit(step)/jvp(block_swa_w16)/mixer/tanh"}
}

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %p = (s32[], f32[8,8]{1,0}) parameter(0)
  ROOT %t = (s32[], f32[8,8]{1,0}) tuple(%p), metadata={op_name="jit(step)/while/body"}
}

ENTRY %main.9 (Arg_0.1: f32[8,8]) -> f32[8,8] {
  %Arg_0.1 = f32[8,8]{1,0} parameter(0)
  %fusion.1 = f32[8,8]{1,0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.1
  %dot.2 = f32[8,8]{1,0} dot(%fusion.1, %Arg_0.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %while.3 = (s32[], f32[8,8]{1,0}) while(%dot.2), condition=%cond, body=%body, metadata={op_name="jit(step)/while"}
  ROOT %add.4 = f32[8,8]{1,0} add(%dot.2, %dot.2), metadata={op_name="jit(step)/optimizer/add"}
}
'''


def test_instruction_scopes_fill_in_what_the_compiler_left_untagged():
  scopes = profile.instruction_scopes(HLO)
  assert profile.module_name(HLO) == 'jit_step'
  assert scopes['fusion.1'] == ('fusion', 'jit(step)/jvp(block_swa_w16)/mixer/tanh')  # From its computation.
  assert scopes['dot.2'] == ('dot', 'jit(step)/jvp(block_swa_w16)/mixer/tanh')  # From its first tagged operand.
  assert scopes['add.4'] == ('add', 'jit(step)/optimizer/add')
  assert scopes['while.3'][0] == 'while'
  durations = {'fusion.1': 10.0, 'dot.2': 5.0, 'while.3': 100.0, 'add.4': 1.0, 'unknown.7': 2.0}
  assert profile.attribute(durations, scopes) == {'block_swa_w16/mixer': 15.0, 'optimizer': 1.0, 'other': 2.0}


def test_gpu_style_traces_use_device_events_and_keep_unnamed_work(tmp_path):
  """A trace laid out as on a GPU: the device's kernels count, host-side launch events do not, and kernels without
  an HLO name (command buffers) are summed as 'unnamed' instead of vanishing; other programs' kernels are left out."""
  op = lambda pid, name, dur, **args: {'ph': 'X', 'pid': pid, 'tid': 1, 'name': name, 'ts': 0, 'dur': dur,
                                       'args': args}
  events = [{'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/device:GPU:0'}},
            {'ph': 'M', 'name': 'process_name', 'pid': 2, 'args': {'name': '/host:CPU'}},
            op(1, 'fusion_kernel', 30.0, hlo_module='jit_step', hlo_op='fusion.1'),
            op(1, 'fusion_kernel', 10.0, hlo_module='jit_step', hlo_op='fusion.1'),
            op(1, 'cutlass_gemm', 7.0),
            op(1, 'other_program_kernel', 99.0, hlo_module='jit_other', hlo_op='dot.9'),
            op(2, 'launch fusion.1', 500.0, hlo_module='jit_step', hlo_op='add.4')]
  path = tmp_path / 'perfetto_trace.json.gz'
  with gzip.open(path, 'wt') as fh:
    json.dump({'traceEvents': events}, fh)
  durations = profile.op_durations(str(path), 'jit_step')
  assert durations == {'fusion.1': 40.0, profile.UNNAMED: 7.0}  # jit_other's kernel is another program's.
  parts = profile.attribute(durations, profile.instruction_scopes(HLO))
  assert parts == {'block_swa_w16/mixer': 40.0, 'unnamed': 7.0}


@pytest.mark.parametrize('op_name, part', [
    ('jit(train_step)/transpose(jvp(block_full))/mixer/dot_general', 'block_full/mixer'),
    ('jit(train_step)/jvp()/while/body/remat(block_gdn)/mlp/mul', 'block_gdn/mlp'),
    ('jit(train_step)/jvp(block_swa_w128)/add', 'block_swa_w128/residual'),
    ('jit(train_step)/transpose(jvp(lm_head))/dot_general', 'lm_head'),
    ('jit(train_step)/jvp(loss)/exp', 'loss'),
    ('jit(train_step)/optimizer/mul', 'optimizer'),
    ('jit(train_step)/while/body/dynamic_slice', 'other'),
    ('', 'other'),
])
def test_part_of_reads_scopes_through_transforms(op_name, part):
  assert profile.part_of(op_name) == part


def _output_elements(hlo_text):
  """{instruction name: element count of its array result} read from the HLO text's shapes (tuples skipped)."""
  sizes = {}
  for name, dims in re.findall(r'^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*[a-z0-9]+\[([\d,]*)\]', hlo_text, re.M):
    sizes[name] = math.prod(int(d) for d in dims.split(',') if d)
  return sizes


def test_a_real_trace_attributes_every_operation_to_its_scope(tmp_path):
  """A real profiler trace of a 512^2 matmul chain in one scope and a 16^2 one in another. Which operations ran,
  and where each lands, is deterministic; their measured times are not (a shared machine stretches any of them),
  so time is not asserted. Weighting each traced operation by the size of its result instead of its duration, the
  heavy scope must hold ~1000x the light one's weight."""
  def program(x, y):
    with jax.named_scope('block_full'), jax.named_scope('mixer'):
      heavy = jnp.tanh(x @ x) @ x
    with jax.named_scope('block_swa_w8'), jax.named_scope('mlp'):
      light = jnp.tanh(y @ y)
    return jnp.sum(heavy) + jnp.sum(light)

  args = (jnp.ones((512, 512)) / 512, jnp.ones((16, 16)) / 16)
  compiled = jax.jit(jax.grad(program, argnums=(0, 1))).lower(*args).compile()
  result, _ = profile.profile_compiled(compiled, args, 2, str(tmp_path))
  assert result['trace'].startswith(str(tmp_path)) and result['steps'] == 2
  assert {'block_full/mixer', 'block_swa_w8/mlp'} <= {r['part'] for r in result['parts']}
  assert sum(r['share'] for r in result['parts']) == pytest.approx(1.0)
  assert sum(r['ms_per_step'] for r in result['parts']) == pytest.approx(result['op_ms_per_step'])

  hlo = compiled.as_text()
  traced = profile.op_durations(result['trace'], profile.module_name(hlo))
  sizes = _output_elements(hlo)
  entry = hlo[hlo.index('\nENTRY'):]
  work = {name for name, opcode in re.findall(r'%([\w.\-]+) = \S+ ([a-z\-]+)\(', entry)
          if opcode not in ('parameter', 'constant', 'tuple')}
  assert set(traced) == work  # Every operation the program runs is traced, and nothing else.
  scopes = profile.instruction_scopes(hlo)
  # Independent of the scope resolution: an operation tagged with a block's scope in the compiled program's own
  # metadata has that block's shape (x is 512x512, y is 16x16), and it must be attributed to that block.
  for op in traced:
    tagged = re.search(rf'%{re.escape(op)} = .*op_name="([^"]*)"', hlo)
    if tagged and 'block_full' in tagged.group(1):
      assert sizes[op] == 512 * 512 and profile.part_of(scopes[op][1]) == 'block_full/mixer', op
    if tagged and 'block_swa_w8' in tagged.group(1):
      assert sizes[op] == 16 * 16 and profile.part_of(scopes[op][1]) == 'block_swa_w8/mlp', op
  weights = profile.attribute({op: float(sizes[op]) for op in traced}, scopes)
  assert max(weights, key=weights.get) == 'block_full/mixer'
  assert weights['block_swa_w8/mlp'] * 500 < weights['block_full/mixer']
