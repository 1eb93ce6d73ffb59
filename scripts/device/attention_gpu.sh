#!/usr/bin/env bash
# Attention kernels on the GPU machine (one H200), in one go: install the wheels its Python lacks, check parity of
# every block configuration the dispatcher may pick (values and gradients vs the float64 reference, compiled, not
# interpret mode), then run the benchmark at docs/BENCHMARKING.md's anchor shapes (pallas_gpu, cudnn, xla; ratios
# and GEMM ceiling in the same run).
#
# Prepare once on the development machine (.whl/ is git-ignored):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl .whl/
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/attention_gpu.sh", carry=[".whl"], timeout_s=600)
# Outputs under $OUT: env.txt, attention_parity.{txt,json}, attention_bench.{txt,json}. Phases are time-boxed
# (parity 240 s, bench 300 s) so the whole run fits one 600 s call; the bench prints each row as it finishes.
set -uo pipefail
out="${OUT:-/tmp/attention_out}"
source scripts/device/prepare.sh "$out" \
  "copy ../shared/wheels/device/*.whl into .whl/ and carry it (the bench CLI needs them)"
timeout 240 python3 scripts/device/attention_parity.py --json "$out/attention_parity.json" \
  > "$out/attention_parity.txt" 2>&1
parity=$?
timeout 300 python3 -m hybrid_jax bench attention --min-seconds 0.5 --json "$out/attention_bench.json" \
  > "$out/attention_bench.txt" 2>&1
bench=$?
cat "$out/env.txt"
grep -v '"ok": true' "$out/attention_parity.txt" | tail -n 30
tail -n 45 "$out/attention_bench.txt"
echo "parity exit $parity, bench exit $bench (124: timed out)"
exit $(( parity != 0 || bench != 0 ))
