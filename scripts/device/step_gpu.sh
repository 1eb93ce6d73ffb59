#!/usr/bin/env bash
# The training-step tuning matrix of issue 10 on the GPU machine (one H200), in one go: swa128_nope, gdn and full at
# S4 (then S3), 16K context, bf16, through `python -m hybrid_jax bench step`, varying remat (none / full /
# save_dots), layer scan, batch with gradient accumulation, the chunked LM head + loss and an XLA GPU flag. The
# first three runs also profile two steps for the breakdown by part (block kind x mixer/MLP, LM head, loss,
# optimizer). Runs go in priority order under a global deadline
# (DEADLINE_S, default 470 s of runs) so the whole call fits one 600 s device command; a run that would start with
# under 45 s left is skipped and listed as such.
#
# Prepare once on the development machine (.whl/ is git-ignored):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl .whl/
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/step_gpu.sh", carry=[".whl"], timeout_s=600)
# Check the command lines first on any machine (validates every config, compiles nothing):
#   DRY_RUN=1 bash scripts/device/step_gpu.sh
# Outputs under $OUT: env.txt, step_gpu.txt (each run's printed report), step_gpu.json (a list: one bench-step
# result per run, or {"name", "error", "log_tail"} for a run that failed, timed out or was skipped).
set -uo pipefail
out="${OUT:-/tmp/step_gpu_out}"
work=/tmp/step_gpu_runs
mkdir -p "$out" "$work"
dry="${DRY_RUN:-0}"
deadline=$(( $(date +%s) + ${DEADLINE_S:-470} ))
py=python3
if [[ "$dry" == 1 ]]; then
  py="${PYTHON:-python3}"
else
  source scripts/device/prepare.sh "$out" \
    "copy ../shared/wheels/device/*.whl into .whl/ and carry it (the bench CLI needs them)"
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95  # One process per run: let it use the whole GPU.
  cat "$out/env.txt"
fi

merge() {  # Collects every finished run (or its error) into $out/step_gpu.json, so a killed call keeps results.
  "$py" - "$work" "$out/step_gpu.json" <<'EOF'
import json, pathlib, sys
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for log in sorted(work.glob('*.log')):
  result = log.with_suffix('.json')
  if result.exists():
    rows.append(dict(json.loads(result.read_text()), run=log.stem))
  else:
    rows.append({'run': log.stem, 'error': 'no result (failed, timed out or skipped)',
                 'log_tail': log.read_text()[-1500:]})
dest.write_text(json.dumps(rows, indent=1))
EOF
}

n=0
bench() {  # bench NAME PER_RUN_TIMEOUT_S ARGS...: one `bench step` run, time-boxed by the global deadline.
  local name="$1" limit="$2"
  shift 2
  n=$((n + 1))
  local tag
  tag=$(printf '%02d_%s' "$n" "$name")
  if [[ "$dry" == 1 ]]; then
    echo "== $tag: $py -m hybrid_jax bench step $* --dry-run"
    local text
    if text=$("$py" -m hybrid_jax bench step "$@" --dry-run 2>&1); then
      echo "${text%%$'\n'*}"
    else
      echo "$text" | tail -n 5
      echo "DRY RUN FAILED: $tag"
    fi
    return
  fi
  local left=$(( deadline - $(date +%s) ))
  if (( left < 45 )); then
    echo "skipped: only ${left} s left before the deadline" > "$work/$tag.log"
    echo "== $tag skipped (${left} s left)" | tee -a "$out/step_gpu.txt"
    merge
    return
  fi
  (( limit > left )) && limit=$left
  echo "== $tag (timeout ${limit} s): bench step $*" | tee -a "$out/step_gpu.txt"
  timeout "$limit" python3 -m hybrid_jax bench step "$@" --json "$work/$tag.json" > "$work/$tag.log" 2>&1
  echo "exit $?" >> "$work/$tag.log"
  grep -v '^WARNING\|^I0000\|^W0000' "$work/$tag.log" | tail -n 25 | tee -a "$out/step_gpu.txt"
  merge
}

S4=(--seq_len 16384 --steps 5)
cfg() { echo "hybrid:arch=$1,scale=$2"; }

# 1-3: S4 baseline, batch 8, scanned layers, remat per block, LM head + loss in 2048-position chunks (the study
# default), with the profiled breakdown by part.
# Command buffers (CUDA graphs) are off in these runs: kernels inside them are traced without their HLO names, so
# the profile could not attribute them (the breakdown's 'unnamed' part); runs 4+ keep XLA's defaults.
for arch in full swa128_nope gdn; do
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
    bench "${arch}_s4_b8_remat-full" 150 --config "$(cfg $arch s4)" "${S4[@]}" --batch_size 8 --set model.remat=full
done
# 4-6: selective remat (keep matmul outputs): predicted faster than full remat by the recomputed forward (~25%).
for arch in full swa128_nope gdn; do
  bench "${arch}_s4_b8_save-dots" 100 --config "$(cfg $arch s4)" "${S4[@]}" --batch_size 8 \
    --set model.remat=save_dots --profile-steps 0
done
# 7-8: the Pallas GPU scan kernels in the whole step (GPU dispatch stays on the XLA chunked path until measured);
# and cuDNN's fused attention for every attention layer instead of the per-window dispatch table.
bench gdn_s4_b8_save-dots_pallas-scan 100 --config "$(cfg gdn s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=save_dots --set model.recurrent_implementation=pallas_gpu --profile-steps 0
bench full_s4_b8_save-dots_cudnn 100 --config "$(cfg full s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=save_dots --set model.attention_implementation=cudnn --profile-steps 0
# 9-11: S3, same settings as 4-6.
for arch in full swa128_nope gdn; do
  bench "${arch}_s3_b8_save-dots" 90 --config "$(cfg $arch s3)" "${S4[@]}" --batch_size 8 \
    --set model.remat=save_dots --profile-steps 0
done
# 12: no remat (memory permitting): the upper bound of step speed.
bench swa128_nope_s4_b8_remat-none 90 --config "$(cfg swa128_nope s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=none --profile-steps 0
# 13: batch 16 as 2 micro-batches of 8 (gradient accumulation): same per-token work, fewer optimizer updates.
bench full_s4_b16_accum2_save-dots 100 --config "$(cfg full s4)" "${S4[@]}" --batch_size 16 --grad_accum 2 \
  --set model.remat=save_dots --profile-steps 0
# 14: no layer scan: compile time against run 1 (scan keeps it flat in depth).
bench full_s4_b8_remat-full_noscan 120 --config "$(cfg full s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=full --set model.scan_layers=False --profile-steps 0
# 15: the whole-sequence loss (8 x 16K x 73K logits, 19 GB in bf16 plus float32 copies): predicted to need ~40 GB
# more memory than run 4 and to be slightly faster (no recomputed LM-head forward); it may run out of memory.
bench full_s4_b8_save-dots_loss-whole 100 --config "$(cfg full s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=save_dots --set train.loss_chunk=0 --profile-steps 0
# 16: cuBLAS instead of Triton for every matmul (XLA picks per shape by default).
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_triton_gemm=false" \
  bench full_s4_b8_save-dots_no-triton-gemm 100 --config "$(cfg full s4)" "${S4[@]}" --batch_size 8 \
  --set model.remat=save_dots --profile-steps 0

if [[ "$dry" != 1 ]]; then
  merge
  python3 - "$out/step_gpu.json" <<'EOF'
import json, sys
print('| run | compile s | step s | tokens/s | TFLOP/s | MFU | compiled peak GiB | device peak GiB |')
print('| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
for r in json.load(open(sys.argv[1])):
  if 'step' not in r:
    print(f"| {r['run']} | {r['error']} | | | | | | |")
    continue
  s, m = r['step'], r['step']['memory_bytes_per_device']
  dev = m['device_peak_in_use']
  print(f"| {r['run']} | {s['compile_s']:.1f} | {s['step_s_median']:.3f} | {s['tokens_per_s']:,.0f} | "
        f"{s['tflops_per_device']:.1f} | {100 * s.get('mfu', float('nan')):.1f}% | {m['compiled_peak'] / 2**30:.1f} | "
        f"{'' if dev is None else f'{dev / 2**30:.1f}'} |")
EOF
fi
