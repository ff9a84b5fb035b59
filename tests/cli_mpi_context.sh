#!/usr/bin/env bash
# fitllm bench context: single-process sweep (paged f16/fp8 KV == planner, flash/naive, plot) and
# the --sp sweep under mpirun: per-rank KV falls 4x with 4 ranks and the same per-rank KV budget
# reaches a 4x longer context.  Usage: cli_mpi_context.sh FITLLM_BIN SHARED_DIR
set -u
BIN=$1 SHARED=$2
M="$SHARED/models/stories260K.gguf"
[ -f "$M" ] || { echo "SKIP: $M not found"; exit 77; }
command -v jq >/dev/null || { echo "SKIP: jq not installed"; exit 77; }
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
out=$("$BIN" bench context -m "$M" --min-ctx 256 --max-ctx 512 --flash-max 512 --naive-max 256 --decode 4 -t 1 --json --plot "$T/ctx.svg") || { echo "bench context failed"; exit 1; }
for c in "paged f16" "paged fp8" "flash f16"; do
  r=$(echo "$out" | jq -r --arg c "$c" '.max_ctx_reached[$c]'); [ "$r" = 512 ] || { echo "$c reached $r, want 512"; exit 1; }
done
[ "$(echo "$out" | jq -r '.max_ctx_reached["naive f16"]')" = 256 ] || { echo "naive config range"; exit 1; }
# the paged KV is exactly the planner's KV; every row has a prefill time and category peaks
bad=$(echo "$out" | jq '[.results[] | select(.config | startswith("paged")) | select(.kv_bytes != .plan_kv_bytes)] | length')
[ "$bad" = 0 ] || { echo "paged KV != plan"; exit 1; }
echo "$out" | jq -e '[.results[] | select(.prefill_s > 0 and .peak_bytes.kv > 0)] | length == 7' >/dev/null || { echo "missing rows"; exit 1; }
[ -s "$T/ctx.svg" ] || command -v gnuplot >/dev/null || echo "note: no gnuplot, plot not drawn"
"$BIN" bench context --bogus >/dev/null 2>&1 && { echo "unknown option accepted"; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP (sp part): mpirun not installed"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
for np in 1 4; do
  timeout 120 mpirun -np $np --oversubscribe --bind-to none "$BIN" bench context -m "$M" --sp --min-ctx 256 --max-ctx 2048 \
    --kv-mem 400K --decode 4 --json > "$T/sp$np.json" 2>"$T/sp$np.err" || { echo "sp np=$np failed"; cat "$T/sp$np.err"; exit 1; }
done
r1=$(jq -r '.max_ctx_reached["sp flash f16"]' "$T/sp1.json"); r4=$(jq -r '.max_ctx_reached["sp flash f16"]' "$T/sp4.json")
k1=$(jq '.results[] | select(.ctx == 512) | .kv_bytes' "$T/sp1.json"); k4=$(jq '.results[] | select(.ctx == 512) | .kv_bytes' "$T/sp4.json")
echo "400K KV per rank: 1 rank reaches $r1 tokens, 4 ranks $r4; KV per rank at 512: $k1 vs $k4 bytes"
[ "$r4" = $((4 * r1)) ] || { echo "4 ranks should reach 4x the context"; exit 1; }
awk -v a="$k1" -v b="$k4" 'BEGIN { exit !(a / b > 3.8 && a / b <= 4.0) }' || { echo "per-rank KV did not fall ~4x"; exit 1; }
jq -e '[.results[] | (.kv_bytes - .plan_kv_bytes) / .plan_kv_bytes | fabs | select(. > 0.05)] | length == 0' "$T/sp4.json" >/dev/null \
  || { echo "sp KV per rank differs from the planner by > 5%"; exit 1; }
jq -e '[.results[] | .kv_peak_per_rank | length == 4] | all' "$T/sp4.json" >/dev/null || { echo "no per-rank peaks"; exit 1; }
exit 0
