#!/usr/bin/env bash
# Scheduled batch job: refit on the latest training data, then batch-predict.
# Idempotent: rerunning it (same data) does no work again.
#
#   refit_and_predict.sh CONFIG TRAIN_X.npy TRAIN_Y.npy SCORE_X.npy OUT_DIR
#
# - The run directory is named by the content hash of the training files, so
#   new data gets a new run and a rerun on the same data finds every stage
#   complete (`krr run` skips them; a killed run resumes).
# - Predictions go to OUT_DIR/<train hash>-<score hash>.zarr; `krr predict` writes
#   row blocks with completion records, so a rerun computes only missing blocks.
# - OUT_DIR/latest.zarr points at the newest predictions, switched atomically.
# - A second copy started while one is running exits with code 5 (run locked).
#
# Cron (every night at 02:30; see krr-refit.timer for systemd):
#   30 2 * * *  cd /srv/krr && KRR=.venv/bin/krr bash workflows/scheduled/refit_and_predict.sh conf/files.yaml /data/train/X.npy /data/train/y.npy /data/score/X.npy /data/predictions >> /var/log/krr-refit.log 2>&1
set -euo pipefail
if [ $# -ne 5 ]; then
  echo "usage: $0 CONFIG TRAIN_X TRAIN_Y SCORE_X OUT_DIR" >&2
  exit 2
fi
config=$1 train_x=$2 train_y=$3 score_x=$4 out_dir=$5
KRR=${KRR:-krr}
RUNS=${RUNS:-runs/scheduled}
# extra config overrides for `krr run`, e.g. KRR_OVERRIDES="lambda=1e-4 block_size=2048"
read -r -a overrides <<< "${KRR_OVERRIDES:-}"

hash_of() { cat "$@" | sha256sum | cut -c1-16; }
train_hash=$(hash_of "$train_x" "$train_y")
score_hash=$(hash_of "$score_x")
run_dir="$RUNS/$train_hash"
echo "$(date -Is) refit: data $train_hash -> $run_dir"

"$KRR" run "$config" "data.source=npy" "data.path=$train_x" "data.y_path=$train_y" \
  ${overrides[@]+"${overrides[@]}"} --run-dir "$run_dir"

mkdir -p "$out_dir"
out="$out_dir/$train_hash-$score_hash.zarr"
# --overwrite: after a config change on the same data the store holds the previous
# model's predictions, which this script wrote; they are replaced (never a user's file)
"$KRR" predict "$run_dir" "$score_x" "$out" --overwrite  # the run directory's latest model

ln -sfn "$(basename "$out")" "$out_dir/.latest.tmp" && mv -T "$out_dir/.latest.tmp" "$out_dir/latest.zarr"
echo "$(date -Is) predictions: $out"
