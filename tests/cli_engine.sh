#!/bin/bash
# CLI checks for the engine: `fitllm demo` (random model, no data needed) and
# `fitllm bench serve` (paged vs static) on stories260K.  Args: FITLLM_BINARY SHARED_DIR
set -u
bin="$1"
shared="$2"
out=$("$bin" demo -n 8 --max-tokens 8 -t 1 2>&1) || { echo "demo failed: $out"; exit 1; }
echo "$out" | grep -q "RANDOM weights" || { echo "demo does not say the weights are random"; exit 1; }
echo "$out" | grep -Eq "throughput: [1-9][0-9]* tokens" || { echo "demo: no throughput line: $out"; exit 1; }
echo "$out" | grep -q "kv " || { echo "demo: no memory report"; exit 1; }
"$bin" demo --bogus >/dev/null 2>&1 && { echo "demo accepted an unknown option"; exit 1; }
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || { echo "SKIP: $model not found"; exit 77; }
json=$("$bin" bench serve -m "$model" --requests 8 --prompt-len 8:16 --gen-len 8 --kv-mem 256K -t 1 \
       --baseline static --json 2>&1) || { echo "bench serve failed: $json"; exit 1; }
echo "$json" | grep -q '"paged":{' || { echo "no paged result: $json"; exit 1; }
echo "$json" | grep -q '"static":{' || { echo "no static result: $json"; exit 1; }
echo "$json" | grep -q '"output_tokens":64' || { echo "expected 64 output tokens: $json"; exit 1; }
# decode-step figures: the matrices one token multiplies (stories260K: 5 layers of q, o 64x64, k, v
# 64x32, gate, up, down 64x172, and the 64x512 output head), and their ops over the decode steps
python3 - "$json" <<'PY' || { echo "bench serve: decode figures wrong: $json"; exit 1; }
import json, sys
d = json.loads(sys.argv[1])
assert d["matmul_params"] == 5 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172) + 64 * 512, d["matmul_params"]
assert d["int8_peak_gops"] > 0
for e in ("paged", "static"):
    o = d[e]
    assert o["decode_steps"] > 0 and 0 < o["decode_tokens_per_step"] <= 8 and o["decode_tok_s"] > 0, o
    assert abs(o["decode_gops"] - o["decode_tok_s"] * 2 * d["matmul_params"] / 1e9) <= 1e-9 * o["decode_gops"] + 1e-12, o
    assert abs(o["decode_pct_int8_peak"] - 100 * o["decode_gops"] / d["int8_peak_gops"]) < 1e-6, o
PY
# --paired-peak: every decode step's rate over the peak measured around it (the same ops as
# decode_gops, a step at a time), the median between the 10th and 90th percentiles
json=$("$bin" bench serve -m "$model" --requests 8 --prompt-len 8 --gen-len 8 --kv-mem 256K -t 1 --paired-peak --json 2>&1) ||
    { echo "bench serve --paired-peak failed: $json"; exit 1; }
python3 - "$json" <<'PY' || { echo "bench serve --paired-peak: figures wrong: $json"; exit 1; }
import json, sys
o = json.loads(sys.argv[1])["paged"]
assert o["paired_steps"] == o["decode_steps"] > 0, o
assert 0 < o["decode_pct_int8_peak_paired_p10"] <= o["decode_pct_int8_peak_paired"] <= o["decode_pct_int8_peak_paired_p90"], o
PY
"$bin" bench serve -m "$model" --prompt-len 0 >/dev/null 2>&1 && { echo "bad --prompt-len accepted"; exit 1; }
# speculative decoding: the same tokens in fewer steps, drafts counted
json=$("$bin" bench serve -m "$model" --requests 8 --prompt-len 8:16 --gen-len 48 --kv-mem 256K -t 1 --spec-ngram 4 --json 2>&1) ||
    { echo "bench serve --spec-ngram failed: $json"; exit 1; }
json0=$("$bin" bench serve -m "$model" --requests 8 --prompt-len 8:16 --gen-len 48 --kv-mem 256K -t 1 --json 2>&1) ||
    { echo "bench serve failed: $json0"; exit 1; }
python3 - "$json" "$json0" <<'PY' || { echo "bench serve --spec-ngram: figures wrong: $json"; exit 1; }
import json, sys
o, z = json.loads(sys.argv[1])["paged"], json.loads(sys.argv[2])["paged"]
assert o["output_tokens"] == z["output_tokens"] == 8 * 48, (o, z)
assert o["spec_tokens"] == 4 and 0 < o["spec_accepted_tokens"] <= o["spec_draft_tokens"], o
assert abs(o["spec_acceptance_rate"] - o["spec_accepted_tokens"] / o["spec_draft_tokens"]) < 1e-9, o
assert o["steps"] < z["steps"] and "spec_tokens" not in z, (o["steps"], z["steps"])
PY
"$bin" bench serve -m "$model" --spec-ngram 2 --spec-ngram-min 3 --spec-ngram-max 2 >/dev/null 2>&1 && { echo "bad --spec-ngram-min/max accepted"; exit 1; }
# sampled requests (temperature with top-p, then top-k): every request still produces its tokens
for s in "--temp 1 --top-p 0.9" "--temp 0.8 --top-k 5"; do
    json=$("$bin" bench serve -m "$model" --requests 4 --prompt-len 8 --gen-len 8 --kv-mem 256K -t 1 $s --json 2>&1) ||
        { echo "bench serve $s failed: $json"; exit 1; }
    echo "$json" | grep -q '"output_tokens":32' || { echo "bench serve $s: expected 32 output tokens: $json"; exit 1; }
done
# --json-schema: an enum of three words; each request ends when its value is complete (a few
# tokens of the 24 allowed), so the output count is below 4 x 24; a schema the engine cannot
# follow is refused before the model loads, with the keyword named
tmpd=$(mktemp -d); trap 'rm -rf "$tmpd"' EXIT
echo '{"enum": ["yes", "no", "maybe"]}' >"$tmpd/s.json"
json=$("$bin" bench serve -m "$model" --requests 4 --prompt-len 8 --gen-len 24 --kv-mem 256K -t 1 --temp 1 \
       --json-schema "$tmpd/s.json" --json 2>&1) || { echo "bench serve --json-schema failed: $json"; exit 1; }
python3 - "$json" <<'PY' || { echo "bench serve --json-schema: $json"; exit 1; }
import json, sys
o = json.loads(sys.argv[1])["paged"]
assert o["json_schema"] is True and 4 <= o["output_tokens"] < 4 * 24, o
PY
echo '{"type": "string", "pattern": "a(?!b)"}' >"$tmpd/bad.json"
err=$("$bin" bench serve -m "$model" --requests 2 --json-schema "$tmpd/bad.json" 2>&1) && { echo "a bad schema was accepted"; exit 1; }
echo "$err" | grep -q "pattern at offset 1" || { echo "bench serve --json-schema: no reason given: $err"; exit 1; }
# --regex (rewritten as a grammar, and with --regex-pcre2 on PCRE2) and --grammar: every output
# constrained; the masks kept by state are found again (the four requests share the constraint),
# and with --guide-masks 0 none are kept.  All say the same, so all six runs sample the same outputs.
printf 'root ::= [a-z ]+ "."   # as the regex\n' >"$tmpd/g.gbnf"
outs=""
for kind in regex pcre2 grammar; do
  for gm in 256 0; do
    case $kind in
      regex) c=(--regex '[a-z ]+\.') ;;                 # (rewritten as a grammar)
      pcre2) c=(--regex '[a-z ]+\.' --regex-pcre2) ;;   # on PCRE2's matcher
      *) c=(--grammar "$tmpd/g.gbnf") ;;
    esac
    json=$("$bin" bench serve -m "$model" --requests 4 --prompt-len 8 --gen-len 24 --kv-mem 256K -t 1 --temp 1 \
           "${c[@]}" --guide-masks $gm --json 2>&1) || { echo "bench serve --$kind failed: $json"; exit 1; }
    n=$(python3 - "$json" $gm ${kind/pcre2/regex} <<'PY'
import json, sys
o = json.loads(sys.argv[1])["paged"]
assert o[sys.argv[3]] is True and o["output_tokens"] > 0, o
if sys.argv[2] == "0":
    assert o["guide_mask_hits"] == 0 and o["guide_mask_misses"] == 0, o
else:
    assert 0 < o["guide_mask_misses"] < o["guide_mask_hits"], o
print(o["output_tokens"])
PY
) || { echo "bench serve --$kind --guide-masks $gm: $json"; exit 1; }
    outs="$outs $n"
  done
done
[ "$(echo $outs | tr ' ' '\n' | sort -u | wc -l)" = 1 ] ||
    { echo "bench serve: output tokens, regex (as a grammar, on PCRE2) and grammar, masks kept / not: $outs"; exit 1; }
printf 'root ::= x\n' >"$tmpd/bad.gbnf"
err=$("$bin" bench serve -m "$model" --requests 2 --grammar "$tmpd/bad.gbnf" 2>&1) && { echo "a bad grammar was accepted"; exit 1; }
echo "$err" | grep -q "rule 'x' is used but not defined" || { echo "bench serve --grammar: no reason given: $err"; exit 1; }
"$bin" bench serve -m "$model" --regex 'a+' --guide-masks -1 >/dev/null 2>&1 && { echo "bad --guide-masks accepted"; exit 1; }
# logprobs on every generated token, and prompt scoring (prompts of 40 tokens through 4 logits
# rows a step): every record arrives
json=$("$bin" bench serve -m "$model" --requests 6 --prompt-len 40 --gen-len 8 --max-seqs 4 --kv-mem 256K -t 1 \
       --logprobs 5 --prompt-logprobs --json 2>&1) || { echo "bench serve --logprobs failed: $json"; exit 1; }
python3 - "$json" <<'PY' || { echo "bench serve --logprobs: records missing: $json"; exit 1; }
import json, sys
o = json.loads(sys.argv[1])["paged"]
assert o["logprobs"] == 5 and o["logprob_records"] == 48 and o["prompt_logprob_records"] == 6 * 39, o
assert o["steps"] >= 6 * 39 // 4, o  # at most 4 scored positions a step
PY
# a high-priority class of requests: with priority scheduling and 2 sequences at a time, all of
# them are admitted before any other, so their TTFT is lower; under FCFS the classes only report
for pol in fcfs priority; do
    json=$("$bin" bench serve -m "$model" --requests 24 --prompt-len 8:16 --gen-len 16:32 --max-seqs 2 --kv-mem 256K -t 1 \
           --high-priority 0.25 --scheduling-policy $pol --json 2>&1) || { echo "bench serve --scheduling-policy $pol failed: $json"; exit 1; }
    python3 - "$json" $pol <<'PY' || { echo "bench serve --high-priority ($pol): $json"; exit 1; }
import json, sys
d = json.loads(sys.argv[1]); o = d["paged"]; hi, lo = o["high_priority"], o["normal_priority"]
assert d["workload"]["scheduling_policy"] == sys.argv[2] and hi["requests"] == d["workload"]["high_priority_requests"] > 0, d
assert hi["requests"] + lo["requests"] == 24 and o["output_tokens"] > 0, o
if sys.argv[2] == "priority":
    assert hi["ttft_p99_ms"] < lo["ttft_p50_ms"], o
PY
done
# LoRA adapters over the base (a 2-step adapter from fitllm train): the requests alternate two
T=$(mktemp -d); trap 'rm -rf "$T" "$tmpd"' EXIT
head -c 20000 "$shared/data/tinystories_val.txt" > "$T/t.txt"
"$bin" train -m "$model" -f "$T/t.txt" -c 64 --batch 2 --steps 2 --lora 4 -t 1 -o "$T/a.gguf" >/dev/null 2>&1 || { echo "train --lora failed"; exit 1; }
json=$("$bin" bench serve -m "$model" --requests 6 --prompt-len 8:16 --gen-len 8 --kv-mem 256K -t 1 \
       --lora "$T/a.lora.gguf,$T/a.lora.gguf" --json 2>&1) || { echo "bench serve --lora failed: $json"; exit 1; }
python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['workload']['lora_adapters']==2 and d['paged']['output_tokens']==48, d" "$json" ||
    { echo "bench serve --lora: $json"; exit 1; }
"$bin" bench serve -m "$model" --lora "$T/missing.gguf" >/dev/null 2>&1 && { echo "a missing adapter accepted"; exit 1; }
"$bin" bench serve -m "$model" --scheduling-policy lifo >/dev/null 2>&1 && { echo "--scheduling-policy lifo accepted"; exit 1; }
"$bin" bench serve -m "$model" --high-priority 2 >/dev/null 2>&1 && { echo "--high-priority 2 accepted"; exit 1; }
"$bin" bench serve -m "$model" --logprobs 21 >/dev/null 2>&1 && { echo "--logprobs 21 accepted"; exit 1; }
"$bin" bench serve -m "$model" --temp -1 >/dev/null 2>&1 && { echo "negative --temp accepted"; exit 1; }
"$bin" bench serve -m "$model" --top-p 0 >/dev/null 2>&1 && { echo "--top-p 0 accepted"; exit 1; }
echo ok
