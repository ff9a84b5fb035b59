#!/usr/bin/env bash
# `fitllm plan`: JSON output, --fit answers re-checked by planning again, --table, exit codes.
# usage: cli_plan.sh FITLLM SHARED_DIR
set -uo pipefail
BIN="$1"; SHARED="$2"
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
fail=0
err() { echo "FAIL: $*" >&2; fail=1; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
js() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }

# Llama 3 8B, 8K, f16: 1 GiB of KV, ~16 GB of weights
"$BIN" plan --preset llama3-8b -c 8192 --json >"$TMP/p.json" || err "plan --preset"
[ "$(js "$TMP/p.json" "d['devices'][0]['bytes']['kv']")" = 1073741824 ] || err "KV at 8K is not 1 GiB"
[ "$(js "$TMP/p.json" "16.0e9 < d['weights_total'] < 16.1e9")" = True ] || err "weights not ~16 GB"

# --fit: the longest context in 20 GiB at batch 2, checked by planning it and one block more
"$BIN" plan --preset llama3-8b --batch 2 --fit 20G --json >"$TMP/f.json" || err "plan --fit"
ctx=$(js "$TMP/f.json" "d['fit']['ctx']")
"$BIN" plan --preset llama3-8b --batch 2 -c "$ctx" --json >"$TMP/a.json"
"$BIN" plan --preset llama3-8b --batch 2 -c $((ctx + 16)) --json >"$TMP/b.json"
[ "$(js "$TMP/a.json" "d['max_total'] <= 20 * 2**30")" = True ] || err "fitted ctx $ctx does not fit"
[ "$(js "$TMP/b.json" "d['max_total'] > 20 * 2**30")" = True ] || err "ctx $ctx + 16 fits too: not the maximum"

# nothing fits: exit 3 and the shortfall
"$BIN" plan --preset llama3-70b --fit 4G --maximize types >"$TMP/o" 2>"$TMP/e"; rc=$?
[ $rc -eq 3 ] || err "nothing-fits exit $rc, want 3"
grep -q "nothing fits in 4.00 GiB" "$TMP/e" && grep -q "more" "$TMP/e" || err "nothing-fits message: $(cat "$TMP/e")"

# --table: 8 presets x 3 weight types, 4 columns
"$BIN" plan --table --json >"$TMP/t.json" || err "plan --table"
[ "$(js "$TMP/t.json" "len(d)")" = 24 ] || err "table rows"
[ "$(js "$TMP/t.json" "[r for r in d if r['model']=='llama3-70b' and r['weights']=='f16'][0]['24 GB']['verdict']")" = no ] || err "70B f16 on 24 GB"
"$BIN" plan --table | grep -q "8 x 80 GB" || err "text table header"

# config.json and a GGUF header
cat >"$TMP/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
 "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048}
JSON
"$BIN" plan --config "$TMP/config.json" --json >"$TMP/c.json" || err "plan --config"
"$BIN" plan --preset tinyllama-1.1b --json >"$TMP/c2.json"
[ "$(js "$TMP/c.json" "d['max_total']")" = "$(js "$TMP/c2.json" "d['max_total']")" ] || err "config.json plan differs from the preset"
if [ -f "$SHARED/models/stories260K.gguf" ]; then
    "$BIN" plan -m "$SHARED/models/stories260K.gguf" --json >"$TMP/s.json" || err "plan -m"
    "$BIN" inspect --json "$SHARED/models/stories260K.gguf" >"$TMP/i.json"
    [ "$(js "$TMP/s.json" "d['weights_total']")" = "$(js "$TMP/i.json" "d['weights_bytes']['total']")" ] || err "GGUF plan weights != tensor bytes"
    [ "$(js "$TMP/s.json" "d['kv_bytes_per_token']")" = 640 ] || err "stories260K KV per token"
    # a draft model (its Q4_0): the device holds both models' weights and caches; the draft's own
    # figures are its plan alone
    M="$SHARED/models/stories260K.gguf" Q="$SHARED/models/stories260K-q4_0.gguf"
    "$BIN" plan -m "$M" --batch 8 -c 512 --json >"$TMP/t.json" && "$BIN" plan -m "$Q" --batch 8 -c 512 --json >"$TMP/q.json" &&
        "$BIN" plan -m "$M" --batch 8 -c 512 --model-draft "$Q" --json >"$TMP/d.json" || err "plan --model-draft"
    python3 - "$TMP" <<'PY' || err "plan --model-draft: the draft's bytes"
import json, sys
t, q, d = (json.load(open(f"{sys.argv[1]}/{n}.json")) for n in "tqd")
dev = lambda o: o["devices"][0]
dr = d["draft_model"]
# (the target is F32: no matmul workspace to share, so the draft's figures are its own plan's)
assert dr["bytes"] == dev(q)["bytes"] and dr["total"] == dev(q)["total"], (dr, dev(q))
assert dev(d)["total"] == dev(t)["total"] + dr["total"], (dev(d), dev(t))
assert all(dev(d)["bytes"][k] == dev(t)["bytes"][k] + dr["bytes"][k] for k in dr["bytes"]), (dev(d), dev(t), dr)
PY
    "$BIN" plan -m "$M" --model-draft "$SHARED/models/llama-2-tiny-random.gguf" >/dev/null 2>"$TMP/e"; [ $? -eq 1 ] || err "draft of another vocabulary: want exit 1"
    grep -q "vocabulary" "$TMP/e" || err "draft vocabulary message"
    "$BIN" plan -m "$M" --model-draft "$Q" --tp 2 >/dev/null 2>&1; [ $? -eq 2 ] || err "--model-draft with --tp: want exit 2"
fi
# training text output has the categories
"$BIN" plan --preset llama3-8b --train --weights bf16 --zero 2 --dp 4 | grep -q "optimizer" || err "training table"

# training plans fitllm's trainer cannot run (tp / pp / sp ranks, ZeRO-3) say so; those it runs do not
for a in "--tp 2" "--pp 2" "--sp 2" "--dp 2 --zero 3"; do
    "$BIN" plan --preset llama3-8b --train $a --json >"$TMP/t.json" || err "plan --train $a"
    [ "$(js "$TMP/t.json" "d['train_textbook']")" = True ] || err "plan --train $a: train_textbook"
    "$BIN" plan --preset llama3-8b --train $a | grep -q "^note: fitllm train runs one process or data parallel" || err "plan --train $a: no note"
done
for a in "" "--dp 2 --zero 1" "--dp 4 --zero 2"; do
    "$BIN" plan --preset llama3-8b --train $a --json >"$TMP/t.json" || err "plan --train $a"
    [ "$(js "$TMP/t.json" "d['train_textbook']")" = False ] || err "plan --train $a: not textbook"
    "$BIN" plan --preset llama3-8b --train $a | grep -q "^note:" && err "plan --train $a: a note"
done
"$BIN" plan --preset llama3-8b --tp 2 --json >"$TMP/t.json" && [ "$(js "$TMP/t.json" "'train_textbook' in d")" = False ] || err "serving plan: train_textbook"

# errors
"$BIN" plan >/dev/null 2>&1; [ $? -eq 2 ] || err "no source: want exit 2"
"$BIN" plan --preset x --config y >/dev/null 2>&1; [ $? -eq 2 ] || err "two sources: want exit 2"
"$BIN" plan --preset nope >/dev/null 2>"$TMP/e"; [ $? -eq 1 ] || err "unknown preset: want exit 1"
grep -q "llama3-8b" "$TMP/e" || err "unknown preset message lists the presets"
"$BIN" plan --preset llama3-8b --weights q9 >/dev/null 2>&1; [ $? -eq 2 ] || err "bad --weights: want exit 2"
"$BIN" plan --preset qwen2.5-7b --tp 8 >/dev/null 2>"$TMP/e"; [ $? -eq 1 ] || err "tp 8 on 28 heads: want exit 1"
grep -q "does not divide" "$TMP/e" || err "tp message"
"$BIN" plan --config /nonexistent.json >/dev/null 2>&1; [ $? -eq 1 ] || err "missing config: want exit 1"
exit $fail
