#!/usr/bin/env bash
# The GPU machine's one prepared check (issue #46), run through the device tool from the
# repository root:  bash workflows/benchmarks/gpu_check.sh
# 1. installs what the GPU image lacks (Dask, Zarr, pydantic, array-api-*: wheels for
#    CPython 3.12 that workflows/benchmarks/gpu_wheels.sh downloads into ./.whl; wheels for
#    CPython 3.12 in ./.whl, carried by the device tool) into /tmp/site, with --no-deps,
#    so the image's numpy, CuPy and PyTorch stay as they are;
# 2. runs the backend seam's tests: the GPU files and the CPU backend files, on CuPy;
# 3. runs bench_gpu.py (each figure beside its baseline of the same run).
# Writes every figure to $OUT (or ./gpu_out): nvidia-smi.txt, gpu_tests.log, bench_gpu.jsonl,
# bench_gpu.log. GPU_BENCH_BUDGET (seconds, default 330) bounds the benchmark,
# GPU_TESTS_TIMEOUT (default 150) the tests (GPU_RUN_TESTS=0 skips them); GPU_BENCH_ONLY picks
# sections; GPU_BENCH_ARGS passes more arguments (e.g. --pcg-n 200000).
set -uo pipefail
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="$PWD:/tmp/site"
fi
export PYTHONUNBUFFERED=1
nvidia-smi | tee "$OUT/nvidia-smi.txt" | head -12
python3 -c "import pipeline, cupy, dask, zarr; print('imports ok', cupy.__version__, dask.__version__, zarr.__version__)"
GPU_TESTS="tests/engine/test_device_gpu.py tests/linalg/test_nystrom_device.py tests/linalg/test_cholesky_device_gpu.py tests/models/test_estimator_gpu.py"
CPU_SEAM="tests/engine/test_device_backend.py tests/linalg/test_cholesky_device.py tests/engine/test_backend.py"
files=""; for f in $GPU_TESTS $CPU_SEAM; do [ -f "$f" ] && files="$files $f"; done
[ "${GPU_RUN_TESTS:-1}" = 0 ] && files=""
[ -n "$files" ] && timeout "${GPU_TESTS_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -n 0 -o addopts="" \
    --timeout 120 -rs $files 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
echo "gpu tests: exit ${PIPESTATUS[0]}"
timeout $(( ${GPU_BENCH_BUDGET:-330} + 90 )) python3 workflows/benchmarks/bench_gpu.py \
    --out "$OUT/bench_gpu.jsonl" --budget "${GPU_BENCH_BUDGET:-330}" \
    ${GPU_BENCH_ONLY:+--only "$GPU_BENCH_ONLY"} ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_gpu.log" | grep -v '^{"section": "pcg", "step": "iter' | tail -40
echo "gpu_check: exit ${PIPESTATUS[0]}"
