#!/usr/bin/env bash
# The mini-study's GPU preset on the GPU machine (one H200): `python -m hybrid_jax study --preset gpu-small`, every
# arch of the study (ten runs, one seed), not yet measured there, writing the same report as the CPU preset.
#
# Prepare once on the development machine (.whl/ is git-ignored; the device lacks these packages, and numpy must
# not be replaced there):
#   mkdir -p .whl && cp ../shared/wheels/device/*.whl .whl/
#   pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
#     matplotlib tensorboardX tqdm sentencepiece && rm -f .whl/numpy-*.whl
# Then, through the device tool:
#   run(command="bash scripts/device/study_gpu.sh", carry=[".whl"], timeout_s=600)
# Outputs under $OUT: env.txt, study.txt (log + findings and verdicts), report.json, report.png. The study is
# time-boxed to 420 s (8 minutes of device time with the set-up); ten runs may not all finish in one box: a run cut
# short resumes from its checkpoints, and finished runs are only read, when the command is repeated on a warm
# machine (the report is written once every run has finished).
set -uo pipefail
out="${OUT:-/tmp/study_out}"
source scripts/device/prepare.sh "$out" "prepare .whl/ as the header of this script says, and carry it"
timeout 420 python3 -m hybrid_jax study --preset gpu-small --out /tmp/study_gpu_small > "$out/study.txt" 2>&1
status=$?
cp /tmp/study_gpu_small/report.json /tmp/study_gpu_small/report.png "$out/" 2>/dev/null
cat "$out/env.txt"
tail -n 40 "$out/study.txt"
echo "study exit $status (124: timed out)"
exit $status
