#!/bin/bash
# Corrupt models: every variant of stories260K.gguf that tests/corrupt_model.py writes (one
# metadata value, one tensor's shape / type / offset, or one tokenizer array element (a token
# type, a score, a byte of a token's text) patched, the file still a well-formed
# GGUF) either runs or is refused with a message (exit 1) by `fitllm run`, and every sixth by
# `fitllm inspect` and `fitllm train` (one step): never a crash or a sanitizer report; the same
# for resuming training from patched checkpoints.  Values that cannot be right are
# refused by name.  Args: path-to-fitllm shared-dir.
set -u
F=$1
S=$2
[ -f "$S/models/stories260K.gguf" ] || exit 77
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$(dirname "$0")/corrupt_model.py" "$S/models/stories260K.gguf" "$T/v" > "$T/list.txt" || fail "corrupt_model.py"
awk 'BEGIN{RS="\n\n"; ORS="\n\n"} NR<=20' "$S/data/tinystories_val.txt" > "$T/small.txt"
n=0; refused=0; i=0
while read -r f what; do
  "$F" run -m "$T/v/$f" -p "Once upon" -n 4 -t 1 --temp 0 > /dev/null 2> "$T/err.txt"; rc=$?
  if grep -qE "AddressSanitizer|LeakSanitizer|runtime error|Segmentation" "$T/err.txt" || { [ $rc -ne 0 ] && [ $rc -ne 1 ]; }; then
    cat "$T/err.txt"; fail "run on $f ($what): exit $rc"
  fi
  if [ $rc -eq 1 ]; then
    grep -q "^fitllm run: " "$T/err.txt" || { cat "$T/err.txt"; fail "run on $f ($what): refused without a message"; }
    refused=$((refused + 1))
  fi
  cp "$T/err.txt" "$T/err-$f.txt"
  if [ $((i % 6)) -eq 0 ]; then
    "$F" inspect "$T/v/$f" > /dev/null 2> "$T/err.txt"; rc=$?
    if grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$T/err.txt" || { [ $rc -ne 0 ] && [ $rc -ne 1 ]; }; then
      cat "$T/err.txt"; fail "inspect on $f ($what): exit $rc"
    fi
  fi
  if [ $((i % 6)) -eq 3 ]; then
    "$F" train -m "$T/v/$f" -f "$T/small.txt" --steps 1 -c 32 --batch 1 -t 1 > /dev/null 2> "$T/err.txt"; rc=$?
    if grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$T/err.txt" || { [ $rc -ne 0 ] && [ $rc -ne 1 ]; }; then
      cat "$T/err.txt"; fail "train on $f ($what): exit $rc"
    fi
  fi
  n=$((n + 1)); i=$((i + 1))
done < "$T/list.txt"
[ $n -gt 200 ] || fail "only $n variants"

# what must be refused, and how
expect() { # pattern-in-list message-in-stderr
  local f; f=$(grep -F -- "$1" "$T/list.txt" | head -1 | cut -d' ' -f1)
  [ -n "$f" ] || fail "no variant '$1'"
  grep -qF -- "$2" "$T/err-$f.txt" || { cat "$T/err-$f.txt"; fail "'$1' should say '$2'"; }
}
expect "layer_norm_rms_epsilon = nan" "must be finite and >= 0"
expect "layer_norm_rms_epsilon = -1.0" "must be finite and >= 0"
expect "llama.block_count = 4 (was 5)" "tensor blk.4.attn_q.weight is past the model's 4 layers"
expect "llama.rope.dimension_count = 0" "rope dimension 0 does not fit head_dim 8"
expect "blk.0.attn_q.weight ne[0] = 32 (was 64)" "has shape [32, 64, 1, 1], expected [64, 64]"
expect "tokenizer.ggml.bos_token_id = 1048576" "tokenizer.ggml.bos_token_id = 1048576 is not a token id (vocabulary of 512): ignored"
# the trainer's loader refuses the same
for what in "block_count = 4 (was 5)" "epsilon = inf" "epsilon = nan" "epsilon = -1.0" "rope.dimension_count = 0"; do
  v=$(grep -F -- "$what" "$T/list.txt" | head -1 | cut -d' ' -f1)
  "$F" train -m "$T/v/$v" -f "$T/small.txt" --steps 1 -c 32 --batch 1 -t 1 > /dev/null 2> "$T/err.txt"; rc=$?
  [ $rc -eq 1 ] && grep -qE "past the model's|must be finite|rope_dim" "$T/err.txt" || { cat "$T/err.txt"; fail "train on '$what': exit $rc"; }
done
# training checkpoints: every 16th variant of a real one (any key, any tensor's shape or type)
# is resumed from, or refused with a message
"$F" train -m "$S/models/stories260K.gguf" -f "$T/small.txt" -c 32 --batch 1 --steps 2 --save-every 1 --optim adamw8bit -t 1 \
    -o "$T/ck.gguf" > /dev/null 2> "$T/err.txt" || { cat "$T/err.txt"; fail "making a checkpoint"; }
python3 "$(dirname "$0")/corrupt_model.py" "$T/ck.gguf.ckpt" "$T/cv" --any --every 16 > "$T/clist.txt" || fail "corrupt_model.py --any"
nc=0
while read -r f what; do
  "$F" train -m "$S/models/stories260K.gguf" -f "$T/small.txt" -c 32 --batch 1 --steps 3 --optim adamw8bit -t 1 \
      --resume "$T/cv/$f" > /dev/null 2> "$T/err.txt"; rc=$?
  if grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$T/err.txt" || { [ $rc -ne 0 ] && [ $rc -ne 1 ]; }; then
    cat "$T/err.txt"; fail "resume from $f ($what): exit $rc"
  fi
  [ $rc -eq 1 ] && { grep -q "^fitllm train: " "$T/err.txt" || { cat "$T/err.txt"; fail "resume from $f ($what): refused without a message"; }; }
  nc=$((nc + 1))
done < "$T/clist.txt"
[ $nc -gt 50 ] || fail "only $nc checkpoint variants"
echo "cli_corrupt_model: $n model variants ($refused refused with a message) and $nc checkpoint variants, none crashed"
exit 0
