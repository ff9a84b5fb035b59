#!/bin/bash
# fitllm bench kv: JSON output, waste < 4% with 16-token blocks, >= 2x the sequences of a
# contiguous max-len reservation in the same bytes, pool invariants intact.
set -u
BIN=$1
out=$("$BIN" bench kv --json --n-layer 4 --kv-mem 512M --block-size 16) || { echo "bench kv failed"; exit 1; }
get() { echo "$out" | awk -v k="\"$1\":" '$1 == k { gsub(/,/, "", $2); print $2; exit }'; }
waste=$(get waste); ratio=$(get concurrency_vs_contiguous); ok=$(get invariants_ok)
echo "waste=$waste ratio=$ratio invariants_ok=$ok"
[ "$ok" = "true" ] || { echo "invariants broken"; exit 1; }
awk -v w="$waste" 'BEGIN { exit !(w >= 0 && w < 0.04) }' || { echo "waste $waste >= 4%"; exit 1; }
awk -v r="$ratio" 'BEGIN { exit !(r >= 2.0) }' || { echo "concurrency ratio $ratio < 2"; exit 1; }
"$BIN" bench kv --bogus >/dev/null 2>&1 && { echo "unknown option accepted"; exit 1; }
"$BIN" bench kv --help | grep -q -- "--kv-mem" || { echo "--help misses --kv-mem"; exit 1; }
a=$("$BIN" bench kv --attn --ctx 100 --n-head 8 --n-head-kv 2 --head-dim 64 --kv-type q4_0 --json) || { echo "bench kv --attn failed"; exit 1; }
echo "$a" | grep -q '"prefill_gflops"' || { echo "bench kv --attn: no JSON"; exit 1; }
exit 0
