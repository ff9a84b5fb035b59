#!/usr/bin/env bash
# Run the MPI-aware test programs under mpirun with 2 and 4 ranks (oversubscribed on 2 cores).
# Usage: cli_mpi.sh FITLLM_BIN SHARED_DIR
set -u
BIN=$1
DIR=$(dirname "$BIN")
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# oversubscribed ranks must not busy-wait on each other
export OMPI_MCA_mpi_yield_when_idle=1
fails=0
for np in 2 4; do
  for t in "$DIR"/test_dist "$DIR"/test_tp "$DIR"/test_sp "$DIR"/test_pp "$DIR"/test_zero; do
    [ -x "$t" ] || continue
    if timeout 120 mpirun -np $np --oversubscribe --bind-to none "$t" >"$DIR/mpi_$(basename "$t")_$np.log" 2>&1; then
      echo "ok   - $(basename "$t") with $np ranks"
    else
      echo "FAIL - $(basename "$t") with $np ranks"; tail -20 "$DIR/mpi_$(basename "$t")_$np.log"; fails=$((fails+1))
    fi
  done
done
[ $fails = 0 ]
