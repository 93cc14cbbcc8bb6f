#!/usr/bin/env bash
# Download, here, the wheels the GPU machine's image lacks (it has no network), into ./.whl
# (ignored: add "/.whl/" to .git/info/exclude), for workflows/benchmarks/gpu_check.sh;
# the device tool carries them with carry=[".whl"]. CPython 3.12, manylinux x86-64, no deps:
# the image's numpy, CuPy, PyTorch, pandas and scikit-learn stay as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for p in dask==2026.7.1 distributed==2026.7.1 zarr==3.1.6 numcodecs==0.16.6 google-crc32c==1.9.0 \
         donfig==0.8.1.post1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
         typing-inspection==0.4.5 typing_extensions==4.16.0 array-api-compat==1.16.0 \
         array-api-strict==2.6.1 tornado==6.6.1 tblib==3.2.2 zict==3.0.0 locket==1.0.0 partd==1.4.2; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $PLAT -d .whl "$p"
done
ls .whl | wc -l
