#!/usr/bin/env bash
# The GPU machine's one prepared check (issue #46), run through the device tool from the
# repository root:  bash workflows/benchmarks/gpu_check.sh
# Writes every figure to $OUT (or ./gpu_out) as JSON lines. Today it measures the baselines
# that #46's targets are stated against (gpu_probe.py); the backend seam's GPU tests and
# bench_gpu.py join it once the redesign (#43) has made the engine's seam.
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
BUDGET="${GPU_PROBE_BUDGET:-300}"
nvidia-smi | tee "$OUT/nvidia-smi.txt" | head -15
PYTHONUNBUFFERED=1 timeout $((BUDGET + 120)) python3 workflows/benchmarks/gpu_probe.py \
    --out "$OUT/gpu_probe.jsonl" --budget "$BUDGET" ${GPU_PROBE_ONLY:+--only "$GPU_PROBE_ONLY"} 2>&1 | tee "$OUT/gpu_probe.log"
echo "gpu_check: exit ${PIPESTATUS[0]}"
