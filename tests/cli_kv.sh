#!/bin/bash
# The paged KV cache behind `fitllm perplexity` / `fitllm run` on stories260K:
#  1. quality per KV type on a small slice (-c 128 --chunks 24): PPL vs f32 KV within stated
#     bounds, KL divergence vs f32 KV ordered by precision, bytes/token as predicted;
#     paged f16 vs the contiguous f16 path (llama.cpp-faithful) within 1e-5 relative;
#  2. streaming past the context (run --context-shift, StreamingLLM sinks + recent half):
#     no error, valid ids, mostly letters and spaces, the text's own perplexity stays low.
fitllm="$1"; shared="$2"
model="$shared/models/stories260K.gguf"
text="$shared/data/tinystories_val.txt"
[ -f "$model" ] && [ -f "$text" ] || exit 77
set -e
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

ppl() { "$fitllm" perplexity -m "$model" -f "$text" -c 128 --chunks 24 -t 1 --json "$@" 2>/dev/null; }
ppl --kv-type f32 --kl-base "$tmp/base.kl" >"$tmp/base.json" || fail "f32 base run"
for t in f32 f16 bf16 fp8_e4m3 fp8_e5m2 q8_0 q4_0; do
    ppl --kv-type $t --kl-base "$tmp/base.kl" >"$tmp/$t.json" || fail "perplexity --kv-type $t"
done
ppl --kv-layout contiguous --kv-type f16 >"$tmp/contig.json" || fail "contiguous f16"
ppl --kv-type fp8_e4m3 --block-size 32 >"$tmp/fp8_bs32.json" || fail "fp8 block 32"

python3 - "$tmp" <<'PY' || fail "quality check"
import json, sys, os
d = sys.argv[1]
r = {t: json.load(open(os.path.join(d, t + ".json"))) for t in
     ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0", "contig", "fp8_bs32"]}
base = r["f32"]["ppl"]
# stories260K: 5 layers, 4 kv heads x 8 dims = 32-element rows; per layer K+V bytes per token:
# f32 2*128, f16/bf16 2*64, fp8 2*(32 + 4 heads * 4 B scale / 16-token block), q8_0 2*34, q4_0 2*18
want_bytes = {"f32": 1280, "f16": 640, "bf16": 640, "fp8_e4m3": 330, "fp8_e5m2": 330, "q8_0": 340, "q4_0": 180}
# relative PPL bound vs f32 KV (measured on this slice: f16 3e-5, bf16 3e-4, q8_0 3e-3,
# e4m3 3.1%, e5m2 9.7%, q4_0 x3.6: its groups of 32 span all four 8-dim heads of a row)
bound = {"f32": 1e-12, "f16": 1e-3, "bf16": 1e-3, "q8_0": 1e-2, "fp8_e4m3": 0.06, "fp8_e5m2": 0.15, "q4_0": 5.0}
for t, b in bound.items():
    rel = abs(r[t]["ppl"] / base - 1)
    print(f"{t:9s} PPL {r[t]['ppl']:.4f} ({rel*100:+.3f}%)  KL {r[t]['kl']['mean']:.3g}  {r[t]['kv_bytes_per_token']} B/token")
    assert rel <= b, (t, rel, b)
    assert r[t]["kv_bytes_per_token"] == want_bytes[t], (t, r[t]["kv_bytes_per_token"])
    assert r[t]["kv_type"] == t and r[t]["kv_layout"] == "paged"
assert r["f32"]["kl"]["mean"] == 0 and r["f32"]["kl"]["same_top"] == 1
kl = [r[t]["kl"]["mean"] for t in ["f16", "bf16", "q8_0", "fp8_e4m3", "fp8_e5m2", "q4_0"]]
assert all(a < b for a, b in zip(kl, kl[1:])), kl
assert r["q4_0"]["ppl"] > base and r["fp8_e5m2"]["ppl"] > base
# the contiguous f16 path follows llama.cpp's arithmetic (softmax weights rounded to f16); the
# paged one keeps them in f32: measured 2.6e-5 apart on this slice
assert abs(r["contig"]["ppl"] / r["f16"]["ppl"] - 1) < 1e-4, (r["contig"]["ppl"], r["f16"]["ppl"])
assert r["contig"]["kv_layout"] == "contiguous" and r["contig"]["kv_bytes_per_token"] == 640
assert r["fp8_bs32"]["kv_bytes_per_token"] == 325  # scales amortised over 32 tokens
PY

# bad KV options fail with a message
! "$fitllm" perplexity -m "$model" -f "$text" -c 64 --chunks 1 --kv-type q5_k >/dev/null 2>"$tmp/e1" || fail "bad type accepted"
grep -q "not a KV type" "$tmp/e1" || fail "bad type message: $(cat "$tmp/e1")"
! "$fitllm" perplexity -m "$model" -f "$text" -c 64 --chunks 1 --kv-layout contiguous --kv-type q8_0 >/dev/null 2>"$tmp/e2" || fail "contiguous q8_0 accepted"
! "$fitllm" run -m "$model" -p "Hi" -n 4 --kv-layout ring >/dev/null 2>"$tmp/e3" || fail "bad layout accepted"
! "$fitllm" run -m "$model" -p "Hi" -n 4 --kv-layout contiguous --context-shift >/dev/null 2>"$tmp/e4" || fail "contiguous shift accepted"
grep -q "paged" "$tmp/e4" || fail "shift message: $(cat "$tmp/e4")"

# streaming past the context: 300 tokens through a 64-token cache
for args in "--temp 0" "--temp 0.8 --seed 3 --kv-type q8_0 --block-size 8" "--temp 0 --sink 0"; do
    "$fitllm" run -m "$model" -p "Once upon a time" -c 64 -n 300 --context-shift -t 1 --json $args >"$tmp/s.json" 2>"$tmp/s.err" \
        || fail "context shift ($args): $(cat "$tmp/s.err")"
    python3 - "$tmp/s.json" "$tmp/gen.txt" <<'PY' || fail "stream output ($args)"
import json, sys
d = json.load(open(sys.argv[1]))
toks, text = d["tokens"], d["text"]
assert len(toks) >= 250, len(toks)  # greedy runs on to 300; a sampled EOS may come a little earlier
assert all(0 <= t < 512 for t in toks)
assert d["kv"]["context_shifts"] >= 3 and d["kv"]["positions_dropped"] > 0, d["kv"]
ok = sum(c.isalpha() or c in " \n.,'\"!?" for c in text)
assert ok >= 0.95 * len(text), text
open(sys.argv[2], "w").write(text)
print(d["kv"], text[-120:].replace("\n", " "))
PY
    # the model finds its own long continuation likely (garbage after a bad shift scores high)
    "$fitllm" perplexity -m "$model" -f "$tmp/gen.txt" -c 64 -t 1 --json >"$tmp/gp.json" 2>/dev/null || fail "ppl of generated text"
    python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['ppl']; print('generated-text PPL', p); assert p < 8, p" "$tmp/gp.json" \
        || fail "generated text PPL ($args)"
done
echo "OK"
