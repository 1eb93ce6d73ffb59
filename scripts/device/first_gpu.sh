#!/usr/bin/env bash
# The most informative 600 s of GPU time when only one device call is available (the H200 is lent for 15 minutes
# a session, start-up included): compiled-kernel parity first (attention, then the scans: correctness before
# speed), then the S4 / 16K / bf16 training steps of full, swa128_nope and gdn with the profiled breakdown (the
# first runs of step_gpu.sh, as many as fit). Each phase is time-boxed; everything finished is kept under $OUT.
#
# Prepare once on the development machine (.whl/ is git-ignored):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl .whl/
# Then, from the repository root, through the device tool:
#   run(command="bash scripts/device/first_gpu.sh", carry=[".whl"], timeout_s=600)
# Outputs under $OUT: env.txt, attention_parity.{txt,json}, scan_parity.{txt,json}, step_gpu.{txt,json}.
# The full programmes are attention_gpu.sh, scan_gpu.sh and step_gpu.sh (one device call each).
set -uo pipefail
out="${OUT:-/tmp/first_gpu_out}"
source scripts/device/prepare.sh "$out" "copy ../shared/wheels/device/*.whl into .whl/ and carry it"
cat "$out/env.txt"
timeout 110 python3 scripts/device/attention_parity.py --json "$out/attention_parity.json" \
  > "$out/attention_parity.txt" 2>&1
echo "attention parity exit $? (124: timed out)"
grep -v '"ok": true' "$out/attention_parity.txt" | tail -n 15
timeout 100 python3 -m hybrid_jax bench scan --parity-only --json "$out/scan_parity.json" \
  > "$out/scan_parity.txt" 2>&1
echo "scan parity exit $? (124: timed out)"
grep -v '"ok": true' "$out/scan_parity.txt" | tail -n 15
OUT="$out" DEADLINE_S=340 bash scripts/device/step_gpu.sh
