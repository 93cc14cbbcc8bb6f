#!/usr/bin/env bash
# End-to-end fit -> predict with the krr CLI (no algorithm code here).
#
#   workflows/fit_predict.sh CONFIG NEW_POINTS OUTPUT [key=value ...]
#
# 1. `krr run` fits (or resumes) the run the config describes, evaluates it on
#    the held-out split, and writes the model artifact to
#    RUN_DIR/results/<key>/model/model (one per configuration; `krr status` lists them).
# 2. `krr predict` batch-predicts NEW_POINTS (.npy, Zarr, Parquet, CSV) into
#    OUTPUT (a Zarr store: resumable; or .npy / .csv).
# Rerunning the script is cheap: complete stages and prediction blocks are skipped.
#
# Example (the demo, predicting its own test rows again):
#   workflows/fit_predict.sh conf/demo.yaml runs/demo/ingest/data.zarr/X_test preds.zarr
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 CONFIG NEW_POINTS OUTPUT [key=value ...]" >&2
  exit 2
fi
config=$1 input=$2 output=$3
shift 3
KRR=${KRR:-krr}
run_dir=${RUN_DIR:-runs/$(basename "${config%.*}")}

"$KRR" run "$config" "$@" --run-dir "$run_dir"
"$KRR" status "$run_dir"
# --overwrite: a rerun replaces the predictions this script wrote (never a file it did not)
"$KRR" predict "$run_dir" "$input" "$output" --overwrite  # the run directory's latest model
