#!/usr/bin/env bash
# llama.cpp's /infill: a model without fill-in-the-middle tokens answers 501; a model with
# StarCoder's vocabulary (fitllm synth --vocab-from, random weights) answers as /completion does
# for the prompt llama.cpp lays out (tests/serve_infill.py), prefix first and with --spm-infill.
# Usage: cli_infill.sh FITLLM_BIN SHARED_DIR     (exit 77 = skipped)
set -u
BIN=$1; SHARED=$2
MODEL=$SHARED/models/stories260K.gguf VOCAB=$SHARED/vocab/ggml-vocab-starcoder.gguf
[ -f "$MODEL" ] && [ -f "$VOCAB" ] || { echo "SKIP: shared models not found"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
. "$HERE/serve_lib.sh"
trap 'srv_stop; rm -rf "$TMP"' EXIT

srv_start "$MODEL" -c 256
code=$(curl -s -o "$TMP/body" -w '%{http_code}' -d '{"input_prefix":"a","input_suffix":"b"}' "$URL/infill")
check "infill on a model without FIM tokens: 501, said why" '[ "$code" = 501 ] && grep -q "not supported by this model" "$TMP/body"'
code=$(curl -s -o "$TMP/body" -w '%{http_code}' -d '{"prompt":"a","input_prefix":"x"}' "$URL/completion")
check "/completion still refuses input_prefix (400)" '[ "$code" = 400 ]'
srv_stop

"$BIN" synth --n-embd 64 --n-layer 2 --n-head 4 --n-ff 128 --n-ctx 4096 --type F32 --vocab-from "$VOCAB" -o "$TMP/code.gguf" >/dev/null 2>&1
check "synth: a model with StarCoder's vocabulary" '[ -s "$TMP/code.gguf" ]'
srv_start "$TMP/code.gguf" -c 4096 --kv-mem 8M
python3 "$HERE/serve_infill.py" "$URL" 4096 0; check "infill: prefix first (serve_infill.py)" '[ $? -eq 0 ]'
srv_stop
srv_start "$TMP/code.gguf" -c 4096 --kv-mem 8M --spm-infill
python3 "$HERE/serve_infill.py" "$URL" 4096 1; check "infill --spm-infill: suffix first (serve_infill.py)" '[ $? -eq 0 ]'
srv_stop

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
