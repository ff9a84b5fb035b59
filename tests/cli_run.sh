#!/bin/bash
# fitllm run / perplexity end to end on stories260K: greedy text and ids equal llama.cpp's,
# --json fields, bad inputs fail with a message, perplexity on a slice equals llama.cpp's.
fitllm="$1"; shared="$2"
model="$shared/models/stories260K.gguf"
[ -f "$model" ] || exit 77
set -e
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# greedy text: the reference continuation of "Once upon a time" (first line of the jsonl)
ref="$shared/reference/stories260K.greedy.jsonl"
"$fitllm" run -m "$model" -p "Once upon a time" -n 30 --temp 0 -t 1 >"$tmp/out.txt" 2>"$tmp/err.txt"
grep -q ", there was a little girl named Lily. She loved to play outside in the park." "$tmp/out.txt" || fail "greedy text: $(cat "$tmp/out.txt")"
grep -q "decode" "$tmp/err.txt" || fail "no speed line on stderr"
grep -q "mapped" "$tmp/err.txt" || fail "no memory report on stderr"

# --json: prompt ids with BOS, generated ids equal to the reference, text, timings, memory
"$fitllm" run -m "$model" -p "Once upon a time" -n 50 --temp 0 -t 1 --json >"$tmp/out.json"
python3 - "$tmp/out.json" "$ref" <<'PY' || fail "json check"
import json, sys
o = json.load(open(sys.argv[1])); r = json.loads(open(sys.argv[2]).readline())
assert o["prompt_tokens"] == r["prompt_tokens"], (o["prompt_tokens"], r["prompt_tokens"])
assert o["tokens"] == r["greedy_tokens"][:50], o["tokens"]
assert r["greedy_text"].startswith(o["text"]), o["text"]
assert o["timings"]["prefill_tok_s"] > 0 and o["timings"]["decode_tok_s"] > 0
assert o["memory"]["current"]["kv"] > 0 and o["memory"]["peak"]["mapped"] > 0
PY

# --grammar / --grammar-file: the output is a sentence, and the run ends where nothing can follow
"$fitllm" run -m "$model" -p "Once upon a time" -n 60 --temp 1 --seed 3 -t 1 --json \
    --grammar 'root ::= ("Yes" | "No") ", " [a-z]+ (" " [a-z]+){0,3} "."' >"$tmp/g.json" || fail "--grammar"
python3 - "$tmp/g.json" <<'PY' || fail "--grammar: $(cat "$tmp/g.json" | head -c 300)"
import json, re, sys
o = json.load(open(sys.argv[1]))
assert re.fullmatch(r"(Yes|No), [a-z]+( [a-z]+){0,3}[.]", o["text"]) and len(o["tokens"]) < 60, o["text"]
PY
printf 'root ::= "(" e ")"\ne ::= t ("+" t){1,2}\nt ::= [0-9]{1,2} | "(" e ")"\n' >"$tmp/arith.gbnf"
"$fitllm" run -m "$model" -p "Sum" -n 60 --temp 1 --seed 1 -t 1 --json --grammar-file "$tmp/arith.gbnf" >"$tmp/g2.json" || fail "--grammar-file"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['text']; assert t.startswith('(') and '+' in t and isinstance(eval(t), int), t" "$tmp/g2.json" ||
    fail "--grammar-file: $(head -c 300 "$tmp/g2.json")"
# a character the vocabulary spells only in byte tokens: produced byte by byte (three tokens)
"$fitllm" run -m "$model" -p "Once" -n 20 --temp 1 --seed 2 -t 1 --json --grammar 'root ::= "龘" [a-z]{1,3} "."' >"$tmp/g3.json" || fail "--grammar (bytes)"
python3 -c "import json,re,sys; o=json.load(open(sys.argv[1])); assert re.fullmatch('龘[a-z]{1,3}[.]', o['text']) and o['tokens'][:3] == [3 + 0xE9, 3 + 0xBE, 3 + 0x98], o" "$tmp/g3.json" ||
    fail "--grammar (bytes): $(head -c 300 "$tmp/g3.json")"
err=$("$fitllm" run -m "$model" -p "x" --grammar 'root ::= "a" |' --grammar-file "$tmp/arith.gbnf" 2>&1) && fail "two grammars accepted"
echo "$err" | grep -q "not both" || fail "two grammars: $err"
err=$("$fitllm" run -m "$model" -p "x" --grammar 'root ::= root "a"' 2>&1) && fail "a left-recursive grammar accepted"
echo "$err" | grep -q "left-recursive" || fail "left recursion: $err"

# --no-mmap: the file read into memory gives the same ids, charged to mapped as before
"$fitllm" run -m "$model" -p "Once upon a time" -n 50 --temp 0 -t 1 --json --no-mmap >"$tmp/nommap.json"
python3 - "$tmp/nommap.json" "$tmp/out.json" <<'PY' || fail "--no-mmap"
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
assert a["tokens"] == b["tokens"], a["tokens"]
assert a["memory"]["peak"]["mapped"] == b["memory"]["peak"]["mapped"] > 0
PY

# a random llama (fitllm synth, its vocabulary without byte tokens): a prompt with more ids than
# bytes, and --json stays valid UTF-8 whatever bytes the random tokens make
"$fitllm" synth --n-embd 64 --n-layer 1 --n-head 2 --n-ff 128 --n-vocab 300 --type F32 -o "$tmp/tiny.gguf" >/dev/null
"$fitllm" run -m "$tmp/tiny.gguf" -p "Once upon a time" -n 24 -t 1 --json >"$tmp/tiny.json" || fail "run on a synth model"
python3 - "$tmp/tiny.json" <<'PY' || fail "synth --json"
import json, sys
raw = open(sys.argv[1], "rb").read()
o = json.loads(raw.decode("utf-8"))  # strict: raises on ill-formed bytes
assert len(o["prompt_tokens"]) > len("Once upon a time"), o["prompt_tokens"]
assert len(o["tokens"]) == 24
PY

# quantized files: with llama.cpp's integer arithmetic (FL_MATMUL_LLAMA=1) q8_0, q5_0 and q4_0
# give llama-simple's 64 greedy tokens of "Once upon a time" (models/stories260K-quants.reference.json);
# the default fast path does too for q4_0 and q5_0 (q5_0 keeps f32 activations there), q4_0 with
# its matrices repacked (the default on AVX2) and as in the file (--no-repack)
for spec in q8_0:1 q5_0:1 q4_0:1 q4_0:0 q5_0:0 q4_0:0:--no-repack; do
    q=${spec%%:*}; rest=${spec#*:}; mode=${rest%%:*}; flag=${rest#"$mode"}; flag=${flag#:}
    FL_MATMUL_LLAMA=$mode "$fitllm" run -m "$shared/models/stories260K-$q.gguf" -p "Once upon a time" -n 64 --temp 0 -t 2 \
        --json $flag >"$tmp/q.json"
    python3 - "$tmp/q.json" "$shared/models/stories260K-quants.reference.json" "stories260K-$q.gguf" <<'PY' || fail "$q greedy (FL_MATMUL_LLAMA=$mode)"
import json, sys
o = json.load(open(sys.argv[1]))
want = [v for v in json.load(open(sys.argv[2]))["variants"] if v["file"] == sys.argv[3]][0]["llama_simple_greedy_64"]
got = "<s> Once upon a time" + o["text"]
assert want.startswith(got) and len(got) >= len(want) - 1, (got, want)
PY
done

# sampling: the same seed gives the same tokens, another seed (almost surely) others
"$fitllm" run -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 5 --json -t 1 >"$tmp/s1.json"
"$fitllm" run -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 5 --json -t 1 >"$tmp/s2.json"
"$fitllm" run -m "$model" -p "Once upon a time" -n 40 --temp 1 --seed 6 --json -t 1 >"$tmp/s3.json"
python3 - "$tmp" <<'PY' || fail "seeded sampling"
import json, sys
a, b, c = (json.load(open(f"{sys.argv[1]}/s{i}.json"))["tokens"] for i in (1, 2, 3))
assert a == b and a != c, (a, b, c)
PY

# --spec-ngram: n-gram drafts change nothing (ids and logprobs bit for bit, greedy with q4_0
# weights and an f16 cache, seeded with a penalty and a grammar), drafts are kept and counted
p="Once upon a time, there was a little girl named Lily. She"
# (and the same with a draft model, k = d: stories260K's Q4_0 drafting for it, every token drafted)
for k in 0 4 d; do
    x=; [ $k = 4 ] && x="--spec-ngram $k"
    [ $k = d ] && x="--model-draft $shared/models/stories260K-q4_0.gguf --draft-p-min 0"
    "$fitllm" run -m "$model" -p "$p" -n 150 --temp 0 -t 2 --weights q4_0 --kv-type f16 --json --logprobs 3 $x >"$tmp/g$k.json"
    "$fitllm" run -m "$model" -p "$p" -n 120 --temp 0.8 --seed 9 --repeat-penalty 1.1 -t 1 --json $x >"$tmp/r$k.json"
    "$fitllm" run -m "$model" -p "$p" -n 60 --temp 0 -t 1 --grammar 'root ::= ("Lily" | " and" | " the" | " cat" | " ran" | "." | " ")+' --json $x >"$tmp/m$k.json"
done
"$fitllm" run -m "$model" -p "$p" -n 150 --temp 0 -t 1 --spec-ngram 4 >/dev/null 2>"$tmp/spec.err"
python3 - "$tmp" <<'PY' || fail "--spec-ngram: outputs differ or no drafts kept"
import json, sys
for f in ("g", "r", "m"):
    for k in ("4", "d"):
        a, b = (json.load(open(f"{sys.argv[1]}/{f}{x}.json")) for x in ("0", k))
        assert a["tokens"] == b["tokens"] and a.get("logprobs") == b.get("logprobs"), (f, k)
        assert "spec" not in a and 0 <= b["spec"]["accepted_tokens"] <= b["spec"]["draft_tokens"], (f, k, b.get("spec"))
for k in ("4", "d"):
    g = json.load(open(f"{sys.argv[1]}/g{k}.json"))
    assert g["spec"]["accepted_tokens"] > 0 and len(g["tokens"]) == 150, (k, g["spec"])
PY
grep -q "speculative decoding: [1-9][0-9]* of [0-9]* draft tokens kept" "$tmp/spec.err" || fail "--spec-ngram: no line on stderr"
# the draft model's p_min (default 0.75) ends drafts at unsure tokens: fewer drafted, a larger share kept
for pm in 0 0.75; do
    "$fitllm" run -m "$model" -p "$p" -n 150 --temp 0 -t 1 --model-draft "$shared/models/stories260K-q4_0.gguf" --draft-p-min $pm --json >"$tmp/pm$pm.json"
done
python3 - "$tmp" <<'PY' || fail "--draft-p-min: no effect"
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/pm{x}.json")) for x in ("0", "0.75"))
assert a["tokens"] == b["tokens"], "tokens"
sa, sb = a["spec"], b["spec"]
assert sb["draft_tokens"] < sa["draft_tokens"] and sb["accepted_tokens"] * sa["draft_tokens"] > sa["accepted_tokens"] * sb["draft_tokens"], (sa, sb)
PY

# bad inputs: non-zero exit and a message
expect_fail() { # what, then the command
    local what="$1"; shift
    if "$@" >"$tmp/o" 2>"$tmp/e"; then fail "$what accepted"; fi
    [ -s "$tmp/e" ] || fail "$what: no message"
    echo "$what -> $(head -c 200 "$tmp/e")"
}
expect_fail "empty prompt" "$fitllm" run -m "$model" -p ""
expect_fail "missing model" "$fitllm" run -m "$tmp/none.gguf" -p "hi"
printf 'Once upon \xff\xfe a time' >"$tmp/bad.txt"
expect_fail "invalid UTF-8" "$fitllm" run -m "$model" -f "$tmp/bad.txt"
grep -qi "utf" "$tmp/e" || fail "invalid UTF-8 message does not say so"
expect_fail "prompt over the context" "$fitllm" run -m "$model" -p "Once upon a time there was a girl" -c 4
grep -q "context" "$tmp/e" || fail "context message"
expect_fail "unknown option" "$fitllm" run -m "$model" -p "x" --bogus
expect_fail "--spec-ngram with the contiguous cache" "$fitllm" run -m "$model" -p "x" --spec-ngram 4 --kv-layout contiguous
grep -q "paged KV cache" "$tmp/e" || fail "--spec-ngram contiguous message"
expect_fail "--spec-ngram with --context-shift" "$fitllm" run -m "$model" -p "x" --spec-ngram 4 --context-shift
expect_fail "--spec-ngram 17" "$fitllm" run -m "$model" -p "x" --spec-ngram 17
expect_fail "--model-draft of another vocabulary" "$fitllm" run -m "$model" -p "x" --model-draft "$shared/models/llama-2-tiny-random.gguf"
grep -q "vocabulary" "$tmp/e" || fail "--model-draft vocabulary message"
expect_fail "--model-draft with --spec-ngram" "$fitllm" run -m "$model" -p "x" --model-draft "$model" --spec-ngram 3
expect_fail "--model-draft with the contiguous cache" "$fitllm" run -m "$model" -p "x" --model-draft "$model" --kv-layout contiguous
printf 'GGUF' >"$tmp/trunc.gguf"
expect_fail "truncated model" "$fitllm" run -m "$tmp/trunc.gguf" -p "hi"

# perplexity on a slice: llama.cpp -c 128 --chunks 32 gives 3.6197 +/- 0.14055 (models/stories260K.reference.json)
"$fitllm" perplexity -m "$model" -f "$shared/data/tinystories_val.txt" -c 128 --chunks 32 -t 1 >"$tmp/ppl.txt" 2>/dev/null
cat "$tmp/ppl.txt"
grep -q "PPL = 3.619[6-8] +/- 0.140[5-6]" "$tmp/ppl.txt" || fail "perplexity slice"
# KL base: save, then compare the same model with itself (KL 0, same top 1)
"$fitllm" perplexity -m "$model" -f "$shared/data/tinystories_val.txt" -c 64 --chunks 2 -t 1 --kl-base "$tmp/kl.bin" >/dev/null 2>&1
"$fitllm" perplexity -m "$shared/models/stories260K-f16.gguf" -f "$shared/data/tinystories_val.txt" -c 64 --chunks 2 -t 1 \
    --kl-base "$tmp/kl.bin" --json >"$tmp/kl.json" 2>/dev/null
python3 - "$tmp/kl.json" <<'PY' || fail "kl"
import json, sys
o = json.load(open(sys.argv[1])); k = o["kl"]
print(k)
assert 0 <= k["mean"] < 1e-3 and k["max"] < 1e-2 and k["same_top"] > 0.95
PY
# a base with a NaN where a log-probability should be is refused (it printed a NaN mean beside
# a p99 and max of 0)
python3 -c "
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read()); struct.pack_into('<f', b, 16 + 4 * 7, float('nan'))
open(sys.argv[2], 'wb').write(b)" "$tmp/kl.bin" "$tmp/kln.bin"
rc=0; "$fitllm" perplexity -m "$model" -f "$shared/data/tinystories_val.txt" -c 64 --chunks 2 -t 1 --kl-base "$tmp/kln.bin" >/dev/null 2>"$tmp/kln.err" || rc=$?
[ $rc -eq 1 ] && grep -q "not a log-probability" "$tmp/kln.err" || { cat "$tmp/kln.err"; fail "a NaN in the KL base must be refused"; }

# bench model: llama-bench-style pp/tg on the paged cache (default) and the contiguous one
for layout in paged contiguous; do
    "$fitllm" bench model -m "$model" -p 64 -n 8 -t 1 --stream-mib 16 --kv-layout $layout --json >"$tmp/bm.json" ||
        fail "bench model ($layout)"
    python3 - "$tmp/bm.json" "$layout" <<'PY' || fail "bench model json ($layout)"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["kv_layout"] == sys.argv[2], o
assert o["n_prompt"] == 64 and o["n_gen"] == 8 and o["pp_tok_s"] > 0 and o["tg_tok_s"] > 0, o
assert o["mem_bandwidth_gbs"] > 0 and o["int8_peak_gops"] >= 0 and o["weight_bytes_per_token"] > 0, o
# decode in 8 rounds (at most), each against the bandwidth read on either side of it
r = o["tg_pct_bandwidth_rounds"]
assert len(r) == 8 and all(x > 0 for x in r), o
assert sorted(r)[3] <= o["tg_pct_bandwidth_paired"] <= sorted(r)[4], o
PY
done
# -r: the prefill timed N times; q8_0 weights take the AMX-BF16 tiles for 64 tokens where the CPU
# has them, and then the same prefill with them off (the int8 tiles) is reported beside it, each
# with the kernel it ran on
"$fitllm" bench model -m "$shared/models/stories260K-q8_0.gguf" -p 64 -n 4 -t 2 -r 2 --stream-mib 16 --json >"$tmp/bm.json" ||
    fail "bench model -r 2"
python3 - "$tmp/bm.json" <<'PY' || fail "bench model -r json"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["repetitions"] == 2 and o["pp_tok_s"] > 0, o
assert isinstance(o["amx_bf16_prefill"], bool), o
assert (o.get("pp_int8_tiles_tok_s", 0) > 0) == o["amx_bf16_prefill"], o
assert (o["pp_kernel"] == "amx-bf16") == o["amx_bf16_prefill"], o
assert o.get("pp_int8_tiles_kernel", "r8-vnni") in ("r8-vnni", "r8-amx", "amx-int8"), o
# each prefill against the int8 peak read on either side of it, and the median of those ratios
r = o["pp_pct_int8_peak_rounds"]
assert len(r) == 2 and all(x > 0 for x in r) == (o["int8_peak_gops"] > 0), o
assert abs(o["pp_pct_int8_peak_paired"] - (r[0] + r[1]) / 2) < 1e-9, o
assert ("pp_int8_tiles_pct_int8_peak_paired" in o) == o["amx_bf16_prefill"], o
PY
# FL_AMX_BF16=0 holds through the benchmark: no bf16 prefill, on any CPU
FL_AMX_BF16=0 "$fitllm" bench model -m "$shared/models/stories260K-q8_0.gguf" -p 64 -n 2 -t 2 --stream-mib 16 --json >"$tmp/bm8.json" ||
    fail "bench model FL_AMX_BF16=0"
python3 - "$tmp/bm8.json" <<'PY' || fail "bench model FL_AMX_BF16=0 json"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["pp_kernel"] != "amx-bf16" and not o["amx_bf16_prefill"], o
PY
# "repack": the matrices were rewritten at load (R8 groups, or R16 on AVX-512 without AMX), which
# wq_type (the first layer's q projection as loaded) shows; --no-repack keeps the file's type
for spec in "$shared/models/synth256/synth256-Q4_K_M.gguf:q4_K" "$shared/models/stories260K-q8_0.gguf:q8_0"; do
    for flag in "" --no-repack; do
        "$fitllm" bench model -m "${spec%:*}" -p 8 -n 2 -t 1 --stream-mib 16 --json $flag >"$tmp/bmr.json" ||
            fail "bench model $flag (${spec%:*})"
        python3 - "$tmp/bmr.json" "${spec##*:}" "$flag" <<'PY' || fail "bench model repack json $flag (${spec%:*})"
import json, sys
o, base, flag = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
t = o["wq_type"]
if flag:
    assert not o["repack"] and t == base, o
else:
    assert t in (base, base + "_r8", base + "_r16") and o["repack"] == (t != base), o
PY
    done
done
"$fitllm" bench model -m "$model" -r 0 >/dev/null 2>&1 && fail "bench model -r 0 accepted"
# --stream-mib out of 1..1048576 (0, negative, a size no machine has) is refused with a message,
# not taken as a calibration silently skipped (it had printed a bandwidth of -1 GB/s)
for sm in 0 -1 99999999; do
    rc=0; "$fitllm" bench model -m "$model" -p 8 -n 2 --stream-mib $sm >/dev/null 2>"$tmp/sm.err" || rc=$?
    [ $rc -eq 2 ] && grep -q -- "--stream-mib 1 to 1048576" "$tmp/sm.err" || { cat "$tmp/sm.err"; fail "bench model --stream-mib $sm: want exit 2 and the range"; }
    rc=0; "$fitllm" bench matmul --types Q4_0 --stream-mib $sm >/dev/null 2>"$tmp/sm.err" || rc=$?
    [ $rc -eq 2 ] && grep -q -- "--stream-mib 1 to 1048576" "$tmp/sm.err" || { cat "$tmp/sm.err"; fail "bench matmul --stream-mib $sm: want exit 2 and the range"; }
done
# bench matmul's buffers for -p 1048576 (133.5 GiB at the 32000 x 2048 shape with --stream-mib 16) against the machine's
# memory: refused up front with both sizes, not killed part way (where the machine has less)
if [ "$(awk '/^MemTotal/ {print $2}' /proc/meminfo)" -lt $((130 << 20)) ]; then
    rc=0; "$fitllm" bench matmul --types Q4_0 -p 1048576 --stream-mib 16 >/dev/null 2>"$tmp/mm.err" || rc=$?
    [ $rc -eq 2 ] && grep -q "needs up to 133.5 GiB of buffers, more than this machine's" "$tmp/mm.err" || { cat "$tmp/mm.err"; fail "bench matmul -p 1048576: rc $rc"; }
fi
# -p 0 / -n 0 skip that test (llama-bench's convention); both 0 is an error
"$fitllm" bench model -m "$model" -p 0 -n 4 -t 1 --stream-mib 16 --json >"$tmp/bm0.json" || fail "bench model -p 0"
"$fitllm" bench model -m "$model" -p 8 -n 0 -t 1 --stream-mib 16 --json >"$tmp/bm1.json" || fail "bench model -n 0"
python3 - "$tmp/bm0.json" "$tmp/bm1.json" <<'PY' || fail "bench model -p 0 / -n 0 json"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["n_prompt"] == 0 and "pp_tok_s" not in a and "pp_pct_int8_peak_rounds" not in a and a["n_gen"] == 4 and a["tg_tok_s"] > 0, a
assert len(a["tg_pct_bandwidth_rounds"]) == 4 and "tg_pct_bandwidth_rounds" not in b, a  # a round per token
assert b["n_gen"] == 0 and "tg_tok_s" not in b and b["n_prompt"] == 8 and b["pp_tok_s"] > 0, b
PY
"$fitllm" bench model -m "$model" -p 0 -n 4 -t 1 --stream-mib 16 | grep -q '^tg4 ' || fail "bench model -p 0 text: no tg line"
"$fitllm" bench model -m "$model" -p 0 -n 4 -t 1 --stream-mib 16 | grep -q '^pp' && fail "bench model -p 0 text: a pp line"
"$fitllm" bench model -m "$model" -p 0 -n 0 >/dev/null 2>&1 && fail "bench model -p 0 -n 0 accepted"

# more threads than the CPUs this process may use: said once on stderr, the output unchanged;
# as many threads as CPUs: nothing said
cpus=$(nproc)
"$fitllm" run -m "$model" -p "Once upon a time" -n 12 --temp 0 -t $((cpus + 3)) >"$tmp/t.out" 2>"$tmp/t.err" || fail "run -t cpus+3"
[ "$(grep -c "threads asked for, but this process may run on $cpus CPU" "$tmp/t.err")" = 1 ] || { cat "$tmp/t.err"; fail "-t $((cpus + 3)) on $cpus CPUs: want one warning"; }
"$fitllm" run -m "$model" -p "Once upon a time" -n 12 --temp 0 -t "$cpus" >"$tmp/t1.out" 2>"$tmp/t1.err" || fail "run -t cpus"
grep -q "threads asked for" "$tmp/t1.err" && fail "-t $cpus on $cpus CPUs warned"
cmp -s "$tmp/t.out" "$tmp/t1.out" || fail "-t $((cpus + 3)) changed the text"

# run --logprobs: with the contiguous f16 cache (llama.cpp's rounding) the first generated token's
# logprob and its 5 alternatives equal log-softmax of llama.cpp's logits (4 prompts, to 1e-3)
python3 - "$fitllm" "$shared" <<'PY' || fail "run --logprobs against llama.cpp's logits"
import json, math, subprocess, sys
fitllm, shared = sys.argv[1], sys.argv[2]
greedy = [json.loads(l) for l in open(shared + "/reference/stories260K.greedy.jsonl")]
worst = 0.0
for d in (json.loads(l) for l in open(shared + "/reference/stories260K.logits.jsonl")):
    text = next(g["prompt"] for g in greedy if g["prompt_tokens"] == d["tokens"])
    out = json.loads(subprocess.run([fitllm, "run", "-m", shared + "/models/stories260K.gguf", "-p", text, "-n", "1", "--temp", "0",
                                     "--kv-layout", "contiguous", "--json", "--logprobs", "5"], capture_output=True, check=True).stdout)
    row = d["logits"][-1]
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    rec = out["logprobs"][0]
    assert out["prompt_tokens"] == d["tokens"] and rec["token"] == out["tokens"][0] == rec["top"][0][0], out
    for tok, lp in [(rec["token"], rec["logprob"])] + [tuple(p) for p in rec["top"]]:
        worst = max(worst, abs(lp - (row[tok] - lse)))
    assert [p[0] for p in rec["top"]] == sorted(range(len(row)), key=lambda i: (-row[i], i))[:5], rec
print("run --logprobs: max |diff| against llama.cpp %.2g" % worst)
assert worst < 1e-3, worst
PY
"$fitllm" run -m "$shared/models/stories260K.gguf" -p x --logprobs 3 >/dev/null 2>&1 && fail "--logprobs without --json accepted"
"$fitllm" run -m "$shared/models/stories260K.gguf" -p x --json --logprobs 21 >/dev/null 2>&1 && fail "--logprobs 21 accepted"

# bench matmul: the five TinyLlama shapes, their sum, and q,k,v fused against three calls; at 64
# tokens on a CPU with AMX-BF16 the GEMM is timed on both kinds of tile
"$fitllm" bench matmul -p 64 --types Q4_0 --stream-mib 1 --seconds 0.05 --json >"$tmp/mm.json" || fail "bench matmul"
python3 - "$tmp/mm.json" <<'PY' || fail "bench matmul json"
import json, sys
o = json.load(open(sys.argv[1]))
r = o["results"]
assert [x.get("N") for x in r[:5]] == [2048, 256, 5632, 2048, 32000], r
assert r[5]["shape"] == "all" and r[6]["shape"] == "qkv", r
assert all(x["gemv_gbs"] > 0 and x["gemm_gops"] > 0 for x in r[:6]), r
assert all(("gemm_int8_tiles_gops" in x) == o["amx_bf16_gemm"] for x in r[:6]), r
assert all(r[6][k] > 0 for k in ("gemv_us_3_calls", "gemv_us_fused", "gemm_us_3_calls", "gemm_us_fused")), r
assert not any("gemm_stream_gops" in x for x in r), r  # 64 tokens: no streamed GEMM
PY
# at 16 tokens (a batched decode step) the GEMM is timed over the copies too, its weights from memory
"$fitllm" bench matmul -p 16 --types Q8_0_R8 --stream-mib 4 --seconds 0.05 --json >"$tmp/mm16.json" || fail "bench matmul -p 16"
python3 - "$tmp/mm16.json" <<'PY' || fail "bench matmul -p 16 json"
import json, sys
o = json.load(open(sys.argv[1]))
r = o["results"]
assert all(x["gemm_stream_gops"] > 0 for x in r[:6]), r
assert all(abs(x["gemm_stream_pct_int8_peak"] - 100 * x["gemm_stream_gops"] / o["int8_peak_gops"]) < 1e-6 * x["gemm_stream_pct_int8_peak"] + 1e-9 for x in r[:6]), r
PY
# bench sgemm: the trainer's three f32 products on four TinyLlama shapes and their sum, against the fp32 peak
"$fitllm" bench sgemm -p 8 --seconds 0.01 --json >"$tmp/sg.json" || fail "bench sgemm"
python3 - "$tmp/sg.json" <<'PY' || fail "bench sgemm json"
import json, sys
o = json.load(open(sys.argv[1]))
r = o["results"]
assert o["tokens"] == 8 and o["fp32_peak_gflops"] > 0, o
assert [(x.get("out"), x.get("in")) for x in r[:4]] == [(2048, 2048), (5632, 2048), (2048, 5632), (32000, 2048)], r
assert r[4]["shape"] == "all" and len(r) == 5, r
for x in r:
    for f in ("forward", "dinp", "dw"):
        g, p = x[f + "_gflops"], x[f + "_pct_fp32_peak"]
        assert g > 0 and abs(p - 100 * g / o["fp32_peak_gflops"]) < 1e-6 * p + 1e-9, (f, x)
PY
for bad in "-p 0" "-t 0" "--seconds 0"; do
    rc=0; "$fitllm" bench sgemm $bad >/dev/null 2>"$tmp/sg.err" || rc=$?
    [ $rc -eq 2 ] && grep -q "bad -t, -p or --seconds" "$tmp/sg.err" || fail "bench sgemm $bad: rc $rc"
done
# bench optim: the optimizer step alone, its figures consistent with one another
"$fitllm" bench optim -n 100003 --steps 3 --json >"$tmp/op.json" || fail "bench optim"
python3 - "$tmp/op.json" <<'PY' || fail "bench optim json"
import json, sys
o = json.load(open(sys.argv[1]))
r = o["results"]
n = o["params"]
assert n == 100003 and [x["op"] for x in r] == ["adamw", "adamw8bit", "grad_norm"], o
for x, b in zip(r, (28 * n, 16 * n + 16 * ((n + 255) // 256), 4 * n)):
    t = x["s_per_step"]
    assert t > 0 and abs(x["ns_per_param"] - t * 1e9 / n) < 1e-6 * x["ns_per_param"], x
    assert abs(x["gb_per_s"] - b / t * 1e-9) < 1e-6 * x["gb_per_s"], x
PY
for bad in "-n 0" "-t 0" "--steps 0"; do
    rc=0; "$fitllm" bench optim $bad >/dev/null 2>"$tmp/op.err" || rc=$?
    [ $rc -eq 2 ] && grep -q "bad -t, -n or --steps" "$tmp/op.err" || fail "bench optim $bad: rc $rc"
done
echo ok
