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
# more ids than bytes + 16 (the buffer's first size): a random synth vocabulary has no "▁", so each of
# the 200 spaces (199 + the prefix) is 3 byte tokens: 200 x (3 + 1) ids for 399 bytes
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$fitllm" synth --n-embd 64 --n-layer 1 --n-head 2 --n-ff 128 --n-vocab 300 --type F32 -o "$tmp/tiny.gguf" >/dev/null
python3 -c "print(' '.join(['a'] * 200), end='')" > "$tmp/a200.txt"
"$fitllm" bench tokenize -m "$tmp/tiny.gguf" -f "$tmp/a200.txt" | grep -q '"bytes":399,"tokens":800,'
if "$fitllm" bench tokenize -f /nonexistent 2>/dev/null; then echo "missing -m accepted"; exit 1; fi
if "$fitllm" bench tokenize -m /nonexistent.gguf -f "$shared/data/tinystories_val.txt" 2>/dev/null; then echo "bad model accepted"; exit 1; fi
echo ok
