#!/usr/bin/env bash
# Load test of `fitllm serve` with wrk: C concurrent clients for D seconds of /v1/completions on
# loopback; prints requests/s, generated tokens/s, latency p50/p99, non-2xx count, and the
# tracked memory before, during (peak) and after the run (it must return to its idle level).
# Usage: scripts/loadtest.sh [MODEL] [CLIENTS=64] [SECONDS=60] [MAX_TOKENS=32]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-../shared/models/stories260K.gguf}; C=${2:-64}; D=${3:-60}; MT=${4:-32}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
TMP=$(mktemp -d)
build/fitllm serve -m "$MODEL" --port 0 -c 512 --max-seqs 64 --max-connections 128 2>"$TMP/log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/log"); [ -n "$PORT" ] && break; sleep 0.1; done
U=http://127.0.0.1:$PORT
metric() { curl -s "$U/metrics" | sed -n "s/^$1 \(.*\)/\1/p"; }
curl -s -o /dev/null -H 'Content-Type: application/json' -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":$MT}" "$U/v1/completions"
idle=$(metric 'fitllm_memory_bytes{category="total"}'); tok0=$(metric fitllm_generation_tokens_total)
cat >"$TMP/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park", "One day, a boy named Tim"}
local i = 0
request = function()
  i = i + 1
  return wrk.format(nil, "/v1/completions", nil, '{"prompt":"' .. prompts[(i % 4) + 1] .. '","max_tokens":$MT,"temperature":0.8}')
end
LUA
wrk -t2 -c"$C" -d"${D}s" --timeout 30s --latency -s "$TMP/post.lua" "$U" | tee "$TMP/wrk.txt"
sleep 1
after=$(metric 'fitllm_memory_bytes{category="total"}'); tok1=$(metric fitllm_generation_tokens_total)
peak=$(metric 'fitllm_memory_peak_bytes{category="total"}')
rps=$(sed -n 's/^Requests\/sec: *\(.*\)/\1/p' "$TMP/wrk.txt")
non2xx=$(sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$TMP/wrk.txt"); non2xx=${non2xx:-0}
errs=$(sed -n 's/.*Socket errors: \(.*\)/\1/p' "$TMP/wrk.txt")
p50=$(awk '$1=="50%"{print $2}' "$TMP/wrk.txt"); p99=$(awk '$1=="99%"{print $2}' "$TMP/wrk.txt")
python3 - <<PY
import json
print(json.dumps({"clients": $C, "seconds": $D, "max_tokens": $MT, "requests_per_s": float("$rps"),
  "tokens_per_s": ($tok1 - $tok0) / $D, "latency_p50": "$p50", "latency_p99": "$p99",
  "non_2xx": $non2xx, "socket_errors": "${errs:-none}", "memory_idle_bytes": $idle,
  "memory_after_bytes": $after, "memory_peak_bytes": $peak}, indent=1))
PY
[ "$non2xx" = 0 ] && [ -z "$errs" ] && [ "$after" -le $((idle + 65536)) ]
