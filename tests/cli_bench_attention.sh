#!/usr/bin/env bash
# Smoke test of `fitllm bench attention` and `fitllm bench packing`: the JSON parses, flash's
# scratch stays flat in n while naive's grows as n^2, and packed varlen moves fewer bytes than
# the padded batch with identical outputs for the real tokens.
set -u
BIN=$1
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$BIN" bench attention --min-n 256 --max-n 1024 --head-dim 64 --json >"$TMP/a.json" 2>/dev/null || { echo "FAIL: bench attention"; exit 1; }
"$BIN" bench packing --lengths 37,120,8,200 --json >"$TMP/p.json" 2>/dev/null || { echo "FAIL: bench packing"; exit 1; }
python3 - "$TMP/a.json" "$TMP/p.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1]))["results"]
a = [r for r in a if r["head_dim"] == 64]
by_n = {r["n"]: r for r in a}
ns = sorted(by_n)
assert len(ns) >= 3, ns
f0, f1 = by_n[ns[0]]["flash_scratch_peak_bytes"], by_n[ns[-1]]["flash_scratch_peak_bytes"]
n0, n1 = by_n[ns[0]]["naive_scratch_peak_bytes"], by_n[ns[-1]]["naive_scratch_peak_bytes"]
grow = (ns[-1] / ns[0]) ** 2
assert f1 == f0, ("flash scratch not flat", f0, f1)
assert n1 > 0.8 * grow * n0, ("naive scratch does not grow as n^2", n0, n1, grow)
p = json.load(open(sys.argv[2]))
assert p["packed"]["qkvo_bytes"] < p["padded"]["qkvo_bytes"], p
assert p["max_abs_diff_real_tokens"] == 0, p
print("ok - flash scratch flat at %d B for n=%d..%d; naive %d -> %d B; packed/padded bytes %.2fx" %
      (f0, ns[0], ns[-1], n0, n1, p["bytes_ratio"]))
PY
