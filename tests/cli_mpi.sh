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
# the CLI: `mpirun -np N fitllm run --tp N` gives the one-process greedy tokens (stories260K)
MODEL=${2:-}/models/stories260K.gguf
if [ -f "$MODEL" ] && command -v python3 >/dev/null; then
  want=$("$BIN" run -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --json -t 1 | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'])")
  for np in 2 4; do
    got=$(timeout 120 mpirun -np $np --oversubscribe --bind-to none "$BIN" run --tp $np -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --json 2>"$DIR/mpi_run_$np.log" | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'])")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "ok   - fitllm run --tp $np equals one process"; else echo "FAIL - fitllm run --tp $np: $got vs $want"; fails=$((fails+1)); fi
  done
fi
[ $fails = 0 ]
