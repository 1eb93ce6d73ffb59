#!/usr/bin/env bash
# One device call measures everything the GPU targets need, in at most BUDGET_S (default 450) seconds from its
# start (the wheels' install included, the machine's start not: under 8 minutes on one H100 or H200). Files under
# $OUT (8):
#   env.txt       date, GPU, versions (jax, flax, torch, triton, fla), and any module the programs miss
#   measure.log   every phase's output, in order
#   scans.json    first: GDN, then Mamba-2 and Lightning (scripts/device/kernels.py scans): pallas_gpu and xla
#                 beside fla (chunk_gated_delta_rule, chunk_simple_gla) in the same process, forward+backward, at the
#                 anchor shape (1 x 32K, K = V = 128; GDN at 16 and 32 heads) and the S4 and S1 layer shapes (2 x 16K,
#                 the scale presets' heads and widths), unmasked and on documents of T / 4; then the scans' parity
#   attention.json  attention at 16K and 32K, windows 128 and full, S4 and S1 heads (GQA, D 64) and 16 heads of
#                 128: cuDNN without documents, cuDNN (packed) and pallas_gpu on documents of T / 4; then the
#                 documents parity through the automatic choice (scripts/device/kernels.py attention)
#   moe.json      the S1 MoE twin's experts (64K tokens x d_model 384 x width 479, 8 experts, top 2, bf16): the
#                 grouped dispatch (ragged_dot) against every expert on every token, fwd and fwd+bwd (bench moe)
#   step.json     the S4 16K x 8 training step (scripts/device/steps.py, one process) for full, swa128_nope, gdn,
#                 swa128, mamba2 and lightning, each on documents (data.packing's default) and concatenated rows,
#                 under the flags training uses (XLA_FLAGS as given: command buffers alike for every run, no profile)
#   choices.json  the attention table (_GPU_BY_WINDOW) and the scans' GPU_MEASURED_CHOICE these numbers support
#   summary.md    every row's name beside its target and verdict (scripts/device/summary.py), printed last
# Every phase is time-boxed (its cap, or what is left of the budget); inside it no row starts after its deadline
# and every row is written the moment it is measured, so a phase cut short keeps what it measured and the next
# phase still runs.
#
# Prepare once on the development machine (.whl/ is git-ignored): the device lacks grain, TFDS, ml-collections
# (../shared/wheels/device), fla (../shared/wheels/bench: fla-core, for the same-run references) and tensorboardX
# (without it the step runs use stand-ins; `pip download --no-deps -d .whl tensorboardX` adds it):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl ../shared/wheels/bench/*.whl .whl/
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/measure.sh", carry=[".whl"], timeout_s=600)
# Wheels also install from ../shared/wheels/device and ../shared/wheels/bench where those folders exist.
# Validate end to end on any machine (CPU, interpret mode, tiny shapes, every cap tripled for a slow CPU):
#   DRY_RUN=1 OUT=/tmp/measure bash scripts/device/measure.sh
# STEP_RUNS picks the step runs, in order: ARCH (documents) or ARCH_concat. PHASES (default "scans attention moe
# steps") picks the phases and SCANS_S, ATTENTION_S, MOE_S, STEPS_S set their caps (150, 85, 25, 210), e.g.
# PHASES=scans SCANS_S=430 to give the scans a whole call.
set -uo pipefail
out="${OUT:-/tmp/measure_out}"
dry="${DRY_RUN:-0}"
step_runs="${STEP_RUNS:-full swa128_nope gdn full_concat swa128_nope_concat gdn_concat swa128 mamba2 lightning
swa128_concat mamba2_concat lightning_concat}"
step_runs=$(echo $step_runs)  # One line.
phases=" ${PHASES:-scans attention moe steps} "
cap_scans="${SCANS_S:-150}" cap_attention="${ATTENTION_S:-85}" cap_moe="${MOE_S:-25}" cap_steps="${STEPS_S:-210}"
slow=1
t0=$(date +%s)
mkdir -p "$out"
log="$out/measure.log"
: > "$log"
export PYTHONUNBUFFERED=1
py=python3
if [[ "$dry" == 1 ]]; then
  py="${PYTHON:-python3}"
  budget="${BUDGET_S:-1800}"
  slow=3
  export JAX_PLATFORMS=cpu
  dry_flag=(--dry-run)
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  "$py" -c 'import jax; print("dry run (CPU, interpret mode): jax", jax.__version__, jax.devices())' \
    > "$out/env.txt" 2>&1
else
  budget="${BUDGET_S:-450}"
  dry_flag=()
  wheels=()
  declare -A seen=()
  for wheel in .whl/*.whl ../shared/wheels/device/*.whl ../shared/wheels/bench/*.whl; do
    [[ -f "$wheel" && -z "${seen[${wheel##*/}]:-}" ]] || continue  # Each wheel once (pip refuses a repeat).
    seen[${wheel##*/}]=1
    wheels+=("$wheel")
  done
  if (( ${#wheels[@]} )); then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" >> "$log" 2>&1
  else
    echo "no wheels in .whl/ or ../shared/wheels: copy them as this script's header says, and carry .whl" >&2
  fi
  export PYTHONPATH="/tmp/site:$PWD"
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c 'import jax, jaxlib, flax; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax",
                flax.__version__, jax.devices())'
    python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla",
                fla.__version__)'
    python3 - <<'PY'
import importlib.util
missing = [m for m in ('grain', 'ml_collections', 'tensorflow_datasets', 'tensorboardX', 'einops', 'fla')
           if importlib.util.find_spec(m) is None]
print('missing modules:', ', '.join(missing) if missing else 'none')
PY
  } > "$out/env.txt" 2>&1
fi
cat "$out/env.txt"

# boxed CAP CMD...: runs CMD for at most min(CAP, what is left of the budget less 10 s for the summary) seconds,
# its output appended to measure.log and printed.
boxed() {
  local cap=$(( $1 * slow ))
  shift
  local left=$(( budget - 10 - ($(date +%s) - t0) ))
  local limit=$(( cap < left ? cap : left ))
  if (( limit < 20 )); then
    echo "== [$(( $(date +%s) - t0 )) s] skipped (${left} s of the budget left): $*" | tee -a "$log"
    return
  fi
  echo "== [$(( $(date +%s) - t0 )) s] (at most ${limit} s) $*" | tee -a "$log"
  timeout -k 5 "$limit" "$@" 2>&1 | grep --line-buffered -v '^W0000\|^I0000\|^WARNING: All log' | tee -a "$log"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$log"
}
# deadline CAP ROW_TIMEOUT: the seconds after which a phase of at most min(CAP, budget left) starts no row, so that
# its last row and its parity still end inside the box.
deadline() {
  local cap=$(( $1 * slow )) left=$(( budget - 10 - ($(date +%s) - t0) ))
  local box=$(( cap < left ? cap : left ))
  echo $(( box - $2 * slow / 2 > 10 ? box - $2 * slow / 2 : 10 ))
}

# Kernels: the scans first (torch and jax share the GPU: no preallocation), then attention.
if [[ "$phases" == *" scans "* ]]; then
  boxed "$cap_scans" env XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" scripts/device/kernels.py scans \
    "${dry_flag[@]}" --json "$out/scans.json" --timeout $(( 45 * slow )) --parity-budget $(( 25 * slow )) \
    --deadline "$(deadline "$cap_scans" 45)"
fi
if [[ "$phases" == *" attention "* ]]; then
  boxed "$cap_attention" env XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" scripts/device/kernels.py attention \
    "${dry_flag[@]}" --json "$out/attention.json" --timeout $(( 30 * slow )) --parity-budget $(( 15 * slow )) \
    --deadline "$(deadline "$cap_attention" 30)"
fi
# The MoE dispatch: one row (a tiny shape in the dry run).
if [[ "$phases" == *" moe "* ]]; then
  moe_shape=65536x384x479x8x2
  [[ "$dry" == 1 ]] && moe_shape=256x64x48x8x2
  boxed "$cap_moe" "$py" -m hybrid_jax bench moe --shapes "$moe_shape" --impls ragged_dot,dense \
    --min-seconds 0.2 --timeout $(( 10 * slow )) --json "$out/moe.json"
fi
# Training steps: one process, the whole GPU.
if [[ "$phases" == *" steps "* ]]; then
  [[ "$dry" == 1 ]] || export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
  boxed "$cap_steps" "$py" scripts/device/steps.py "${dry_flag[@]}" --json "$out/step.json" \
    --timeout $(( 60 * slow )) --deadline "$(deadline "$cap_steps" 40)" $step_runs
fi

"$py" scripts/device/summary.py "$out" "${dry_flag[@]}" --step-runs "$step_runs" 2>&1 | tee -a "$log"
echo "== [$(( $(date +%s) - t0 )) s] done; files: $(ls "$out" | tr '\n' ' ')"
