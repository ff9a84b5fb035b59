#!/usr/bin/env bash
# `fitllm inspect` (text and --json) on every shared GGUF file; JSON shape and the stories260K
# values; a corrupt file gives exit 1 and a clear message.
# usage: cli_inspect.sh FITLLM SHARED_DIR
set -uo pipefail
BIN="$1"; SHARED="$2"
[ -f "$SHARED/models/stories260K.gguf" ] || { echo "SKIP: shared data not found at $SHARED"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
fail=0
err() { echo "FAIL: $*" >&2; fail=1; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

n=0
for f in "$SHARED"/models/*.gguf "$SHARED"/models/synth256/*.gguf "$SHARED"/vocab/*.gguf; do
    "$BIN" inspect "$f" >"$TMP/out.txt" 2>"$TMP/err.txt" || { err "inspect $f exited $?: $(cat "$TMP/err.txt")"; continue; }
    grep -q "^architecture:" "$TMP/out.txt" || err "inspect $f: no architecture line"
    "$BIN" inspect --json "$f" >"$TMP/out.json" 2>"$TMP/err.txt" || { err "inspect --json $f exited $?"; continue; }
    python3 - "$TMP/out.json" "$f" <<'PY' || err "inspect --json $f: bad JSON"
import json, os, sys
d = json.load(open(sys.argv[1]))
for k in ("architecture", "n_tensors", "tensors", "hparams", "weights_bytes", "kv_bytes_per_token"):
    assert k in d, k
assert d["n_tensors"] == len(d["tensors"])
assert d["weights_bytes"]["total"] == sum(t["bytes"] for t in d["tensors"])
# tensor bytes can never exceed the file
assert d["weights_bytes"]["total"] <= os.path.getsize(sys.argv[2])
h = d["hparams"]
assert d["kv_bytes_per_token"] == 2 * h["n_layer"] * h["n_head_kv"] * h["head_dim"] * 2
PY
    n=$((n + 1))
done
[ $n -ge 30 ] || err "only $n files inspected"

# stories260K: values from the model card (5 layers, 8 heads, 4 KV heads, dim 64, ff 172, vocab 512)
"$BIN" inspect --json -c 100 "$SHARED/models/stories260K.gguf" >"$TMP/s.json" || err "stories260K --json"
python3 - "$TMP/s.json" <<'PY' || err "stories260K JSON values"
import json, sys
d = json.load(open(sys.argv[1]))
h = d["hparams"]
assert d["architecture"] == "llama", d["architecture"]
assert d["n_tensors"] == 48, d["n_tensors"]
assert (h["n_layer"], h["n_head"], h["n_head_kv"], h["head_dim"], h["n_embd"], h["n_ff"], h["n_vocab"]) == (5, 8, 4, 8, 64, 172, 512), h
assert d["kv_bytes_per_token"] == 2 * 5 * 4 * 8 * 2 == 640, d["kv_bytes_per_token"]
assert d["ctx"] == 100 and d["kv_bytes"] == 64000, (d["ctx"], d["kv_bytes"])
# all-f32 model: embeddings + output + output norm + 5 x (q, k, v, o, 2 norms, 3 ffn)
per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 64 * 2 + 3 * 64 * 172
params = 2 * 64 * 512 + 64 + 5 * per_layer
assert d["n_params"] == params, (d["n_params"], params)
assert d["weights_bytes"] == {"f32": 4 * params, "total": 4 * params}, d["weights_bytes"]
t = {x["name"]: x for x in d["tensors"]}
assert t["blk.0.attn_k.weight"]["shape"] == [64, 32] and t["blk.0.attn_k.weight"]["type"] == "f32"
PY

# corrupt files: truncated, bad magic, empty, missing
head -c 5000 "$SHARED/models/stories260K.gguf" >"$TMP/trunc.gguf"
printf 'GGML\3\0\0\0' >"$TMP/magic.gguf"; head -c 100 /dev/zero >>"$TMP/magic.gguf"
: >"$TMP/empty.gguf"
for case in "trunc.gguf:truncated" "magic.gguf:bad magic" "empty.gguf:truncated" "missing.gguf:cannot open"; do
    f="$TMP/${case%%:*}"; want="${case#*:}"
    for json in "" --json; do
        "$BIN" inspect $json "$f" >"$TMP/out" 2>"$TMP/err"; rc=$?
        [ $rc -eq 1 ] || err "inspect $json ${case%%:*} exited $rc, want 1"
        grep -q "$want" "$TMP/err" || err "inspect ${case%%:*}: message '$(cat "$TMP/err")' lacks '$want'"
        grep -q "${case%%:*}" "$TMP/err" || err "inspect ${case%%:*}: message does not name the file"
        [ -s "$TMP/out" ] && err "inspect ${case%%:*} printed to stdout"
    done
done
# usage errors exit 2
"$BIN" inspect >/dev/null 2>&1; [ $? -eq 2 ] || err "inspect without MODEL should exit 2"
"$BIN" inspect a b >/dev/null 2>&1; [ $? -eq 2 ] || err "inspect with two MODELs should exit 2"
echo "cli_inspect: $n files inspected"
exit $fail
