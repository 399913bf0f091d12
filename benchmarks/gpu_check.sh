#!/usr/bin/env bash
# Everything servesim checks on a CUDA GPU, in one run of about 6 minutes:
#   1. the engine's reference tests on cuda (logits within 1e-4 of HF transformers, which
#      runs on the CPU in float32);
#   2. benchmarks/engine_speed.py on cuda (ours vs HF generate; batch-1 decode step time
#      against the weight-bytes / memory-bandwidth bound);
#   3. benchmarks/gpu_calibrate.sh (--quick grid, llama-3.1-8b shape, bfloat16).
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/gpu_check.sh
# Writes $OUT/tests.log, $OUT/speed.log, $OUT/calibration.tar.gz (profile, CSVs, report).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-reports}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/tests.log"

SERVESIM_TEST_DEVICE=cuda timeout 150 python -m pytest -q -p no:cacheprovider \
    tests/test_engine_reference.py 2>&1 | tee -a "$OUT/tests.log"

timeout 150 python benchmarks/engine_speed.py --device cuda --repeats 3 --bandwidth 4800 \
    2>&1 | tee "$OUT/speed.log"

OUT="$OUT/cal" TIMEOUT="${CAL_TIMEOUT:-300}" bash benchmarks/gpu_calibrate.sh
tar -czf "$OUT/calibration.tar.gz" -C "$OUT/cal" gpu-calibration && rm -rf "$OUT/cal"
