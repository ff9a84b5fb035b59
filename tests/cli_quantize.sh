#!/bin/bash
# fitllm quantize / synth: files load back, sizes and file_type match llama.cpp's outputs.
F=$1; S=$2
[ -f "$S/models/synth256/synth256-F32.gguf" ] || exit 77
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
set -e
for t in Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q6_K; do
  "$F" quantize -q "$S/models/synth256/synth256-F32.gguf" "$T/$t.gguf" $t --pure >/dev/null
  a=$(stat -c %s "$T/$t.gguf"); b=$(stat -c %s "$S/models/synth256/synth256-$t.gguf")
  [ "$a" = "$b" ] || { echo "$t: size $a != llama.cpp's $b"; exit 1; }
done
"$F" quantize -q "$S/models/synth256/synth256-F32.gguf" "$T/m.gguf" Q4_K_M >/dev/null
"$F" inspect --kv "$T/m.gguf" | grep -q 'general.file_type *15' || { echo "Q4_K_M file_type"; exit 1; }
"$F" inspect "$T/m.gguf" | grep -q 'output.weight *q6_K' || { echo "Q4_K_M output not q6_K"; exit 1; }
"$F" inspect "$T/Q4_0.gguf" | grep -q 'blk.0.attn_q.weight *q4_0' || { echo "Q4_0 tensor type"; exit 1; }
set +e
"$F" quantize "$S/models/synth256/synth256-F32.gguf" "$T/x.gguf" Q9_9 2>/dev/null; [ $? = 2 ] || { echo "bad type accepted"; exit 1; }
"$F" quantize --help | grep -q -- --pure || { echo "help"; exit 1; }
# OUT naming IN (directly, through a symlink or another spelling) is refused, and IN survives
cp "$S/models/synth256/synth256-F32.gguf" "$T/in.gguf"; ln -s in.gguf "$T/link.gguf"
h=$(sha256sum < "$T/in.gguf")
for o in "$T/in.gguf" "$T/link.gguf" "$T/../$(basename "$T")/in.gguf"; do
  "$F" quantize -q "$T/in.gguf" "$o" Q4_0 2>"$T/err.txt"; rc=$?
  [ $rc = 2 ] && grep -q "is the input model" "$T/err.txt" || { echo "quantize onto its input ($o): rc $rc"; cat "$T/err.txt"; exit 1; }
done
[ "$(sha256sum < "$T/in.gguf")" = "$h" ] || { echo "the input changed"; exit 1; }
set -e
"$F" synth --n-embd 64 --n-layer 1 --n-head 2 --n-ff 128 --n-vocab 300 --type Q4_0 -o "$T/s.gguf" >/dev/null
"$F" inspect "$T/s.gguf" | grep -q 'ffn_down.weight *q4_0 *128 x 64' || { echo "synth shapes"; exit 1; }
"$F" inspect "$T/s.gguf" | grep -q 'tokenizer: *llama, 300 tokens' || { echo "synth vocab"; exit 1; }
echo ok
