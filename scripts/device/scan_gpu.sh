#!/usr/bin/env bash
# Scan kernels (linear_scan, gated_delta_rule) on the GPU machine (one H200), in one go: install the wheels its
# Python lacks, check parity of the compiled Pallas GPU kernels for every chunk size / head dim the code may be
# given (values and all gradients vs the float64 reference, docs/KERNELS.md tolerances), then time the anchor
# shapes of docs/BENCHMARKING.md (bf16, B=4, H=16, K=V=128, T = 8K first, then 2K and 32K) for pallas_gpu and xla,
# with fla's chunk_simple_gla / chunk_lightning_attn / chunk_gated_delta_rule in the same run, plus GEMM/copy
# ceilings.
#
# Prepare once on the development machine (.whl/ is git-ignored; about 12 MB):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl ../shared/wheels/bench/*.whl .whl/
#   python -m pip download einops --no-deps -d .whl        # fla-core's one pure-Python dependency
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/scan_gpu.sh", carry=[".whl"], timeout_s=420)
# Outputs under $OUT: env.txt, scan_parity.{txt,json}, scan_bench.{txt,json} (JSON is rewritten after every row,
# so a time-boxed phase still leaves its finished rows). Phases are time-boxed (parity 130 s, bench 200 s).
set -uo pipefail
out="${OUT:-/tmp/scan_out}"
source scripts/device/prepare.sh "$out" \
  "see the header of this script (the bench needs the device wheels, fla needs its own)"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # fla (torch) shares the GPU with JAX in the bench.
{
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  python3 -c 'import fla; print("fla", fla.__version__)'
} >> "$out/env.txt" 2>&1
timeout 130 python3 -m hybrid_jax bench scan --parity-only --json "$out/scan_parity.json" \
  > "$out/scan_parity.txt" 2>&1
parity=$?
timeout 200 python3 -m hybrid_jax bench scan --seq-lens 8192,2048,32768 --fla --repeats 10 --min-seconds 0.3 \
  --json "$out/scan_bench.json" > "$out/scan_bench.txt" 2>&1
bench=$?
cat "$out/env.txt"
grep -v '"ok": true' "$out/scan_parity.txt" | tail -n 20
tail -n 40 "$out/scan_bench.txt"
echo "parity exit $parity, bench exit $bench (124: timed out)"
exit $(( parity != 0 || bench != 0 ))
