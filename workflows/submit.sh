#!/usr/bin/env bash
# Run the pipeline on an existing Dask cluster instead of the embedded LocalCluster.
#
#   workflows/submit.sh tcp://SCHEDULER:8786 CONFIG [key=value ...]
#
# Start a cluster (on any machines that share the run directory's filesystem,
# or with run_dir / stores on an fsspec URL they can all reach), e.g.:
#   dask scheduler --port 8786 &                                  # prints the address
#   dask worker tcp://SCHEDULER:8786 --nthreads 1 --memory-limit 4GiB &   # one per core
# then submit. The client (this script) only coordinates: tiles are computed and
# written to Zarr by the workers. An address that does not answer within
# cluster.connect_timeout seconds exits with code 6.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 tcp://SCHEDULER:8786 CONFIG [key=value ...]" >&2
  exit 2
fi
scheduler=$1 config=$2
shift 2
KRR=${KRR:-krr}
"$KRR" run "$config" "$@" --scheduler "$scheduler"
