#!/bin/bash
# fitllm bench tokenize: JSON with a round trip on the stories260K vocab; bad options fail.
fitllm="$1"; shared="$2"
[ -f "$shared/models/stories260K.gguf" ] || exit 77
set -e
out=$("$fitllm" bench tokenize -m "$shared/models/stories260K.gguf" -f "$shared/data/tinystories_val.txt")
echo "$out"
echo "$out" | grep -q '"roundtrip":true'
echo "$out" | grep -q '"kind":"llama"'
out=$("$fitllm" bench tokenize -m "$shared/vocab/ggml-vocab-gpt-2.gguf" -f "$shared/vocab/ggml-vocab-gpt-2.gguf.inp")
echo "$out" | grep -q '"roundtrip_pieces":true'
"$fitllm" bench tokenize --help | grep -q -- "--encoder"
if "$fitllm" bench tokenize -f /nonexistent 2>/dev/null; then echo "missing -m accepted"; exit 1; fi
if "$fitllm" bench tokenize -m /nonexistent.gguf -f "$shared/data/tinystories_val.txt" 2>/dev/null; then echo "bad model accepted"; exit 1; fi
echo ok
