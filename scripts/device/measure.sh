#!/usr/bin/env bash
# One device call measures everything the GPU targets need (docs/BENCHMARKING.md, "One device call"), in at most
# BUDGET_S (default 550) seconds of running, machine start excluded, as at most 8 files under $OUT:
#   env.txt          versions and device
#   attention.txt    attention parity (every block configuration the dispatcher can pick) and the bench:
#   attention.json   pallas_gpu vs cuDNN at 1 x 32K, windows 128, 512, 2048 and full, fwd and fwd+bwd ("bench");
#                    pallas_gpu on rows of documents of 512 tokens and of one 8K document each, against the same
#                    call unmasked, at 4 x 8K, windows 128 and full ("documents"); cuDNN and pallas_gpu, each
#                    unmasked and on rows of documents of 512 tokens (cuDNN's packed layout: 32 and 64 documents per
#                    row, the default bound), at 2 x 16K and 1 x 32K, windows 128 and full ("cudnn_documents"),
#                    after the parity of rows of documents through the automatic choice ("documents_parity")
#   scan.txt         scan parity and the bench: pallas_gpu vs xla vs fla at 4 x 8K, fwd and fwd+bwd, each also on
#   scan.json        documents of 512 tokens against itself unmasked (fla: its varlen form of the same documents)
#   step.txt         the S4 16K x 8 training step for full, swa128_nope and gdn with the profiled breakdown by
#   step.json        part, and gdn with the Pallas scans inside the step (concatenated rows, as the MFU targets
#                    were set; a run NAME_documents times NAME on rows of documents, data.packing's default)
#   summary.md       every measured ratio against its target (scripts/device/summary.py)
# Every phase is time-boxed (its cap, or what is left of the budget) and every program writes each row the moment
# it is measured, so a phase cut short keeps what it measured and the next phase still runs.
#
# Prepare once on the development machine (.whl/ is git-ignored):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl .whl/
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/measure.sh", carry=[".whl"], timeout_s=600)
# Validate end to end on any machine (CPU, interpret mode, tiny shapes, every cap tripled for a slow CPU):
#   DRY_RUN=1 OUT=/tmp/measure bash scripts/device/measure.sh
# STEP_RUNS (default "full swa128_nope gdn gdn_pallas_scan") picks the training-step runs, in order; ARCH_documents
# (e.g. gdn_documents) adds ARCH's step on rows of documents of 4096 tokens (bench step's default, seq_len // 4).
set -uo pipefail
out="${OUT:-/tmp/measure_out}"
dry="${DRY_RUN:-0}"
budget="${BUDGET_S:-550}"
step_runs="${STEP_RUNS:-full swa128_nope gdn gdn_pallas_scan}"
slow=1
t0=$(date +%s)
work=$(mktemp -d)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=python3
if [[ "$dry" == 1 ]]; then
  py="${PYTHON:-python3}"
  export JAX_PLATFORMS=cpu
  "$py" -c 'import jax; print("dry run (CPU, interpret mode): jax", jax.__version__, jax.devices())' \
    > "$out/env.txt" 2>&1
else
  source scripts/device/prepare.sh "$out" "copy ../shared/wheels/device/*.whl into .whl/ and carry it"
  python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla",
              fla.__version__)' >> "$out/env.txt" 2>&1
fi
cat "$out/env.txt"

# boxed LOG CAP CMD...: runs CMD for at most min(CAP, what is left of the budget) seconds, appending to LOG.
boxed() {
  local log="$1" cap=$(( $2 * slow ))
  shift 2
  local left=$(( budget - ($(date +%s) - t0) ))
  local limit=$(( cap < left ? cap : left ))
  if (( limit < 10 )); then
    echo "== [$(( $(date +%s) - t0 )) s] skipped (${left} s of the budget left): $*" | tee -a "$log"
    return
  fi
  echo "== [$(( $(date +%s) - t0 )) s] (at most ${limit} s) $*" | tee -a "$log"
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  echo "exit $?" | tee -a "$log"
}

# merge DEST NAME=FILE...: one JSON object {NAME: contents of FILE (null when missing or unreadable)}.
merge() {
  "$py" - "$@" <<'PY'
import json, sys
out = {}
for pair in sys.argv[2:]:
  name, path = pair.split('=', 1)
  try:
    out[name] = json.load(open(path))
  except (OSError, ValueError):
    out[name] = None
json.dump(out, open(sys.argv[1], 'w'), indent=1)
PY
}

if [[ "$dry" == 1 ]]; then
  attn_parity=(--smoke --budget 60)
  attn_documents_parity=(--smoke --budget 60)
  attn_bench=(--seq-lens 32 --windows 8,full --heads 2 --head-dim 16 --tokens 32 --impls pallas_gpu,xla --gemm 16)
  attn_documents=(--seq-lens 32 --windows 8,full --heads 2 --head-dim 16 --tokens 64 --impls pallas_gpu --gemm 16
                  --documents 12,32)
  attn_cudnn_documents=(--seq-lens 16,32 --windows 8,full --heads 2 --head-dim 16 --tokens 32 --impls xla --gemm 16
                        --documents 12)  # No cuDNN on CPU: XLA stands in (the documents phase runs pallas_gpu).
  scan_args=(--seq-lens 32 --batch 1 --heads 1 --head-dim 16 --chunk-size 16 --impls pallas_gpu,xla --gemm 16
             --kernels linear_scan --parity-budget 60 --documents 12)
  step_shape=(--seq_len 32 --batch_size 2 --steps 1 --set model.d_model=32 --set model.num_layers=2
              --set model.num_heads=4 --set model.head_dim=8 --set model.d_ff=64 --set model.window=16)
  scale=tiny
  profile=1
  slow=3
  budget="${BUDGET_S:-1650}"
  quick=(--repeats 1 --min-seconds 0 --timeout 40)
else
  attn_parity=(--budget 55)
  attn_documents_parity=(--budget 25)
  attn_bench=(--seq-lens 32768 --windows 128,512,2048,full --tokens 32768 --impls pallas_gpu,cudnn)
  attn_documents=(--seq-lens 8192 --windows 128,full --tokens 32768 --impls pallas_gpu --documents 512,8192)
  attn_cudnn_documents=(--seq-lens 16384,32768 --windows 128,full --tokens 32768 --impls cudnn,pallas_gpu
                        --documents 512)
  scan_args=(--seq-lens 8192 --batch 4 --heads 16 --head-dim 128 --chunk-size 64 --impls pallas_gpu,xla --fla
             --parity-budget 50 --documents 512)
  step_shape=(--seq_len 16384 --batch_size 8 --steps 3 --set model.remat=save_dots)
  scale=s4
  profile=2
  quick=(--repeats 3 --min-seconds 0.2 --timeout 40)
fi

boxed "$out/attention.txt" 60 "$py" scripts/device/attention_parity.py "${attn_parity[@]}" \
  --json "$work/attention_parity.json"
boxed "$out/attention.txt" 60 "$py" -m hybrid_jax bench attention "${attn_bench[@]}" "${quick[@]}" \
  --json "$work/attention_bench.json"
boxed "$out/attention.txt" 50 "$py" -m hybrid_jax bench attention "${attn_documents[@]}" "${quick[@]}" \
  --json "$work/attention_documents.json"
boxed "$out/attention.txt" 30 "$py" scripts/device/attention_parity.py --documents "${attn_documents_parity[@]}" \
  --json "$work/attention_documents_parity.json"
boxed "$out/attention.txt" 50 "$py" -m hybrid_jax bench attention "${attn_cudnn_documents[@]}" "${quick[@]}" \
  --json "$work/attention_cudnn_documents.json"
merge "$out/attention.json" parity="$work/attention_parity.json" bench="$work/attention_bench.json" \
  documents="$work/attention_documents.json" documents_parity="$work/attention_documents_parity.json" \
  cudnn_documents="$work/attention_cudnn_documents.json"

boxed "$out/scan.txt" 140 env XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" -m hybrid_jax bench scan --parity \
  "${scan_args[@]}" "${quick[@]}" --json "$out/scan.json"

# step RUN CAP ARGS...: one `bench step` run; step.json collects every run finished so far.
runs=()
step() {
  local name="$1" cap="$2"
  shift 2
  boxed "$out/step.txt" "$cap" "$py" -m hybrid_jax bench step "${step_shape[@]}" "$@" --json "$work/step_$name.json"
  runs+=("$name")
  "$py" - "$out/step.json" "$work" "${runs[@]}" <<'PY'
import json, sys
rows = []
for name in sys.argv[3:]:
  try:
    rows.append(dict(json.load(open(f'{sys.argv[2]}/step_{name}.json')), run=name))
  except (OSError, ValueError):
    rows.append({'run': name, 'error': 'no result (failed, timed out or skipped: see step.txt)'})
json.dump(rows, open(sys.argv[1], 'w'), indent=1)
PY
}
[[ "$dry" == 1 ]] || export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95  # One process per run: the whole GPU.
# The MFU runs time concatenated rows (data.packing=concat), as their targets were set; *_documents runs the
# config's own packing, documents.
for name in $step_runs; do
  case "$name" in
    full|swa128_nope|gdn)  # Command buffers off: kernels inside them are traced without their HLO names.
      XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
        step "$name" 55 --config "hybrid:arch=$name,scale=$scale" --profile-steps "$profile" \
        --trace-dir "$work/trace_$name" --set data.packing=concat;;
    gdn_pallas_scan)
      step "$name" 45 --config "hybrid:arch=gdn,scale=$scale" --profile-steps 0 \
        --set model.recurrent_implementation=pallas_gpu --set data.packing=concat;;
    full_documents|swa128_nope_documents|gdn_documents)
      step "$name" 45 --config "hybrid:arch=${name%_documents},scale=$scale" --profile-steps 0 \
        --set data.packing=documents;;
    *) echo "unknown step run $name; known: full swa128_nope gdn gdn_pallas_scan full_documents" \
         "swa128_nope_documents gdn_documents" >&2; exit 2;;
  esac
done

"$py" scripts/device/summary.py "$out"
echo "== [$(( $(date +%s) - t0 )) s] done; files: $(ls "$out" | tr '\n' ' ')"
rm -rf "$work"
