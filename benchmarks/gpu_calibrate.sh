#!/usr/bin/env bash
# Calibrate servesim's engine on one CUDA GPU for an 8B-shaped Llama (llama-3.1-8b shape,
# random weights: step cost does not depend on weight values) in bfloat16, in < 8 minutes.
#
# Usage (repository root, on the GPU machine):
#   bash benchmarks/gpu_calibrate.sh            # --quick grid (default; ~4-6 min)
#   FULL=1 bash benchmarks/gpu_calibrate.sh     # the full grid (more cells and repeats)
#   GPU=h200 bash benchmarks/gpu_calibrate.sh   # catalog name, if the CUDA name is not matched
#
# Needs torch with CUDA; installs servesim (`pip install -e .[engine]`) only when it is not
# importable already (PYTHONPATH=. does for an offline machine). TIMEOUT (s, default 470)
# bounds the calibration itself. Writes $OUT/gpu-calibration/ (or reports/gpu-calibration/): the profile YAML,
# its measurements and replay CSVs, the HTML/PNG report, and env.txt with versions.
# An interrupted run resumes from the CSV when started again with the same OUT.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST="${OUT:-reports}/gpu-calibration"
mkdir -p "$DEST"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
python -c "import simulator.cli, calibration" 2>/dev/null || pip install -q -e '.[engine]' >/dev/null

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  python -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  git rev-parse HEAD 2>/dev/null || true
} > "$DEST/env.txt"
cat "$DEST/env.txt"

NAME="${GPU:-}"
ARGS=(calibrate --model llama-3.1-8b --device cuda --dtype bfloat16
      --out "$DEST/gpu-llama-3.1-8b-bfloat16.yaml" --no-progress)
[ -z "${FULL:-}" ] && ARGS+=(--quick)
[ -n "$NAME" ] && ARGS+=(--device-name "$NAME")

# Stop before 8 minutes whatever happens; a rerun resumes from the CSV.
start=$(date +%s)
timeout "${TIMEOUT:-470}" python -m simulator.cli "${ARGS[@]}" 2>&1 | tee "$DEST/calibrate.log"
echo "calibration took $(( $(date +%s) - start )) s"
SERVESIM_PROFILES="$DEST" python -m simulator.cli profiles | tee -a "$DEST/calibrate.log"
