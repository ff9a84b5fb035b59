#!/bin/bash
# `fitllm plan --verify` (the engine-exact plan against the engine's measured peaks: exit 0 when
# every category is within 5%), `--mem` on demo / bench serve, and `run --weights`, on
# stories260K and the synthetic demo model.  Args: FITLLM_BINARY SHARED_DIR
set -u
bin="$1"
shared="$2"
fail() { echo "FAIL: $*"; exit 1; }
# demo with a total memory limit: the plan sizes the KV cache, the allocator enforces it
out=$("$bin" demo -n 4 --max-tokens 8 -t 1 --mem 40M --weights q8_0 2>&1) || fail "demo --mem: $out"
echo "$out" | grep -Eq "plan: predicted (39\.9[0-9]|40\.00) MiB" || fail "demo --mem: no plan line: $out"
out=$("$bin" demo -n 4 --max-tokens 8 -t 1 --mem 10M 2>&1) && fail "demo --mem 10M must fail"
echo "$out" | grep -q "the weights alone (.*) exceed the memory limit 10.00 MiB by" || fail "demo --mem 10M: $out"
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || { echo "no $model: skipping the rest"; exit 77; }
for args in "" "--weights q4_0 --kv-type q8_0 --batch 8 --prefill 32" "--weights nf4 --mem 4M -c 256" "--kv-block 32 --batch 2 --prefill 100" "--embeddings --batch 3 --mem 6M"; do
    out=$("$bin" plan -m "$model" --verify -t 1 -c 192 $args 2>&1) || fail "plan --verify $args: $out"
    echo "$out" | grep -Eq "^total +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB" || fail "plan --verify $args: no total row: $out"
done
out=$("$bin" plan -m "$model" --verify -t 1 -c 192 --embeddings --max-logprobs -1 2>&1) || fail "plan --verify --embeddings: $out"
echo "$out" | grep -q "then as many embedding requests" || fail "plan --verify --embeddings: no embedding phase: $out"
"$bin" plan --preset llama3-8b --verify >/dev/null 2>&1; [ $? -eq 2 ] || fail "--verify without -m: want exit 2"
out=$("$bin" run -m "$model" -p "Once upon a time" -n 8 --temp 0 -t 1 --weights q8_0 2>&1) || fail "run --weights: $out"
echo "$out" | grep -q "weights converted to q8_0 at load: .* bits per weight" || fail "run --weights: no conversion line: $out"
out=$("$bin" bench serve -m "$model" -n 4 --mem 8M --weights q4_0 -t 1 --json 2>&1) || fail "bench serve --mem: $out"
echo "$out" | grep -q '"mem_total":8388608' || fail "bench serve --mem: no mem_total: $out"
exit 0
