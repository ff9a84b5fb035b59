#!/bin/bash
# fitllm train end to end: a few fine-tuning steps with checkpoints, resume, export that loads
# back (inspect), QLoRA export, option errors.  Args: path-to-fitllm shared-dir.
set -u
F=$1
S=$2
[ -f "$S/models/stories260K.gguf" ] || exit 77
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
BIN=$F TMP=$T
. "$(cd "$(dirname "$0")" && pwd)/serve_lib.sh" # (srv_start, srv_stop)

# a small corpus: the first 60 stories
awk 'BEGIN{RS="\n\n"; ORS="\n\n"} NR<=60' "$S/data/tinystories_val.txt" > "$T/train.txt"

"$F" train --help | grep -q -- "--checkpoint-every" || fail "help lacks --checkpoint-every"
"$F" train -f "$T/train.txt" 2>/dev/null; [ $? -eq 2 ] || fail "missing -m/--init must exit 2"
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" --precision f8 2>/dev/null; [ $? -eq 2 ] || fail "bad precision must exit 2"
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" --weights nf4 2>/dev/null; [ $? -eq 2 ] || fail "nf4 without --lora must exit 2"
"$F" train -m "$S/models/stories260K.gguf" -f "$T/missing.txt" 2>/dev/null; [ $? -eq 1 ] || fail "missing file must exit 1"
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" --precision fp16 --loss-scale 0 2>/dev/null; [ $? -eq 2 ] || fail "--loss-scale 0 must exit 2"

# fp16 from a loss scale that overflows every step: each step is skipped, the scale halves, and
# every JSON line parses (the overflowed norm is null, not -nan)
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 3 --precision fp16 \
    --loss-scale 1e30 --json -t 1 > "$T/fp16.jsonl" 2> "$T/err_fp16.txt" || { cat "$T/err_fp16.txt"; fail "fp16 train"; }
python3 - "$T/fp16.jsonl" <<'PY' || fail "fp16 overflow steps"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
st = [e for e in ev if e["event"] == "step"]
assert [e["skipped"] for e in st] == [True] * 3, st
assert [e["grad_norm"] for e in st] == [None] * 3, st
assert [e["loss_scale"] for e in st] == [1e30, 5e29, 2.5e29], st
PY

# a vocabulary without "▁" (a random synth model's: each space is 3 byte tokens) gives more ids
# than the text has bytes: 2 documents of 26 + 8 x 3 and 32 + 12 x 3 ids, each with BOS and EOS
"$F" synth --n-embd 64 --n-layer 1 --n-head 2 --n-ff 128 --n-vocab 300 --type F32 -o "$T/tiny.gguf" >/dev/null || fail "synth"
printf 'Once upon a time there was a cat.\n\nThe cat sat on a mat and it was a good day.\n' > "$T/spaces.txt"
"$F" train -m "$T/tiny.gguf" -f "$T/spaces.txt" --val "$T/spaces.txt" -c 32 --batch 1 --steps 1 -t 1 -o "$T/tiny_out.gguf" \
    > /dev/null 2> "$T/err_sp.txt" || { cat "$T/err_sp.txt"; fail "train on more ids than bytes"; }
grep -q "train: 2 documents, 122 tokens" "$T/err_sp.txt" || { cat "$T/err_sp.txt"; fail "expected 2 documents, 122 tokens"; }

# 4 steps with a checkpoint every 2, JSON logs
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 4 --save-every 2 \
    --checkpoint-every 2 --optim adamw8bit --json -t 1 -o "$T/out.gguf" > "$T/log.jsonl" 2> "$T/err.txt" \
    || { cat "$T/err.txt"; fail "train"; }
[ "$(grep -c '"event":"step"' "$T/log.jsonl")" -eq 4 ] || fail "expected 4 step lines"
grep -q '"event":"done"' "$T/log.jsonl" || fail "no done line"
[ -f "$T/out.gguf.ckpt" ] || fail "no checkpoint"
"$F" inspect "$T/out.gguf" --json | grep -q '"n_layer":[[:space:]]*5' || fail "exported model does not inspect"
"$F" inspect "$T/out.gguf" --json | grep -q '"model":[[:space:]]*"llama"' || fail "tokenizer not copied"

# resume from the step-4 checkpoint to step 6
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 6 --save-every 2 \
    --checkpoint-every 2 --optim adamw8bit --json -t 1 --resume "$T/out.gguf.ckpt" -o "$T/out.gguf" > "$T/log2.jsonl" 2> "$T/err2.txt" \
    || { cat "$T/err2.txt"; fail "resume"; }
grep -q "resumed from" "$T/err2.txt" || fail "no resume message"
[ "$(grep -c '"event":"step"' "$T/log2.jsonl")" -eq 2 ] || fail "resume should run 2 steps"

# kill -9 during training: the last checkpoint is intact and resumes
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 100000 --save-every 2 \
    -t 1 -o "$T/k.gguf" > /dev/null 2>&1 &
PID=$!
for i in $(seq 1 600); do [ -f "$T/k.gguf.ckpt" ] && break; sleep 0.1; done
sleep 1
kill -9 $PID 2>/dev/null
wait $PID 2>/dev/null
[ -f "$T/k.gguf.ckpt" ] || fail "no checkpoint before the kill"
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 100000 --time-limit 0.1 \
    -t 1 --resume "$T/k.gguf.ckpt" > /dev/null 2> "$T/err5.txt" || { cat "$T/err5.txt"; fail "resume after kill -9"; }
grep -Eq "resumed from .* at step [0-9]*[02468]$" "$T/err5.txt" || fail "resume step should be a multiple of 2"

# QLoRA: adapters + merged export
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 2 --lora 4 --weights nf4 \
    --precision bf16 -t 1 -o "$T/q.gguf" 2> "$T/err3.txt" || { cat "$T/err3.txt"; fail "qlora"; }
[ -f "$T/q.lora.gguf" ] || fail "no adapter file"
"$F" inspect "$T/q.gguf" > /dev/null || fail "merged QLoRA export does not inspect"
# merging the saved adapters into the f32 base gives a loadable GGUF too
"$F" train -m "$S/models/stories260K.gguf" --merge-lora "$T/q.lora.gguf" -o "$T/m.gguf" 2> "$T/err4.txt" || { cat "$T/err4.txt"; fail "merge"; }
"$F" inspect "$T/m.gguf" > /dev/null || fail "merged adapter GGUF does not inspect"
"$F" train -m "$S/models/stories260K.gguf" --merge-lora "$S/models/stories260K.gguf" -o "$T/x.gguf" 2>/dev/null; [ $? -eq 1 ] || fail "non-adapter merge must fail"
# an adapter whose lora.alpha is infinite is refused (it would turn the merged weights to inf)
python3 - "$T/q.lora.gguf" "$T/inf.lora.gguf" <<'PY' || fail "patching lora.alpha"
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
i = b.index(b'lora.alpha') + len(b'lora.alpha')
assert struct.unpack_from('<I', b, i)[0] == 6  # f32
struct.pack_into('<f', b, i + 4, float('inf'))
open(sys.argv[2], 'wb').write(b)
PY
"$F" train -m "$S/models/stories260K.gguf" --merge-lora "$T/inf.lora.gguf" -o "$T/inf.gguf" 2> "$T/err6.txt"; rc=$?
[ $rc -eq 1 ] && grep -q "alpha inf" "$T/err6.txt" || { cat "$T/err6.txt"; fail "an infinite lora.alpha must be refused (rc $rc)"; }

# the adapter applied at run time (run / perplexity --lora) scores as the merged model does, and
# moves the base's perplexity; the infinite alpha is refused there too
"$F" train -m "$S/models/stories260K.gguf" -f "$T/train.txt" -c 64 --batch 2 --steps 6 --lr 3e-2 --lora 4 -t 1 \
    -o "$T/r.gguf" 2> "$T/err7.txt" || { cat "$T/err7.txt"; fail "lora for --lora"; }
ppl() { "$F" perplexity "$@" -f "$T/train.txt" -c 64 --chunks 4 -t 1 --json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['ppl'])"; }
p_base=$(ppl -m "$S/models/stories260K.gguf"); p_lora=$(ppl -m "$S/models/stories260K.gguf" --lora "$T/r.lora.gguf"); p_merged=$(ppl -m "$T/r.gguf")
python3 -c "import sys; b,l,m=map(float,sys.argv[1:]); sys.exit(0 if abs(l-m)<=1e-3*m and abs(l-b)>0.01*b else 1)" "$p_base" "$p_lora" "$p_merged" ||
    fail "perplexity --lora $p_lora, merged $p_merged, base $p_base"
# the engine with the adapter (what serve runs): its plan, the file, tables and buffers included,
# against what it allocates
"$F" plan -m "$S/models/stories260K.gguf" --verify --lora "$T/r.lora.gguf" -c 256 --max-logprobs -1 -t 1 > "$T/pv.txt" 2>&1 ||
    { cat "$T/pv.txt"; fail "plan --verify --lora"; }
# serve --lora-modules: a request naming the adapter gets it (what run --lora generates), the
# others the base model; /v1/models lists it
if command -v curl >/dev/null; then
  srv_start "$S/models/stories260K.gguf" -c 256 --lora-modules "tuned=$T/r.lora.gguf"
  gen() { curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
          -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0$1}"; }
  run_text() { "$F" run -m "$S/models/stories260K.gguf" "$@" -p "Once upon a time" -n 16 --temp 0 -t 1 -c 256 --json 2>/dev/null |
               python3 -c "import json,sys; print(json.load(sys.stdin)['text'])"; }
  s_tuned=$(gen ',"model":"tuned"'); s_base=$(gen ',"model":"other"')
  t_tuned=$(run_text --lora "$T/r.lora.gguf"); t_base=$(run_text)
  models=$(curl -s "$URL/v1/models")
  srv_stop
  python3 - "$s_tuned" "$s_base" "$t_tuned" "$t_base" "$models" <<'PY' || fail "serve --lora-modules: $s_tuned / $s_base / $t_tuned / $t_base / $models"
import json, sys
st, sb, tt, tb, ms = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
assert st["model"] == "tuned" and st["choices"][0]["text"] == tt, (st, tt)
assert sb["model"] != "tuned" and sb["choices"][0]["text"] == tb, (sb, tb)
assert tt != tb
assert [m["id"] for m in ms["data"]][1:] == ["tuned"] and ms["data"][1]["parent"] == ms["data"][0]["id"], ms
PY
  # serve --lora (llama.cpp's): every request gets the adapter unless its "lora" says otherwise;
  # GET/POST /lora-adapters list and set the scales; a request's scale is run --lora-scale's
  srv_start "$S/models/stories260K.gguf" -c 256 --lora "$T/r.lora.gguf"
  t_neg=$(run_text --lora "$T/r.lora.gguf" --lora-scale -1)
  l0=$(curl -s "$URL/lora-adapters")
  d_on=$(gen ''); d_none=$(gen ',"lora":[]'); d_neg=$(gen ',"lora":[{"id":0,"scale":-1}]')
  d_bad=$(gen ',"lora":[{"id":1,"scale":1}]')
  n_none=$(curl -s "$URL/completion" -d '{"prompt":"Once upon a time","n_predict":16,"temperature":0,"lora":[{"id":0,"scale":0}]}')
  set_off=$(curl -s "$URL/lora-adapters" -d '[{"id":0,"scale":0}]')
  set_bad=$(curl -s -o /dev/null -w '%{http_code}' "$URL/lora-adapters" -d '[{"id":3,"scale":1}]')
  l1=$(curl -s "$URL/lora-adapters"); d_off=$(gen '')
  srv_stop
  srv_start "$S/models/stories260K.gguf" -c 256 --lora "$T/r.lora.gguf" --lora-init-without-apply
  i_def=$(gen ''); i_on=$(gen ',"lora":[{"id":0,"scale":1}]')
  srv_stop
  python3 - "$T/r.lora.gguf" "$t_tuned" "$t_base" "$t_neg" "$l0" "$d_on" "$d_none" "$d_neg" "$d_bad" "$n_none" "$set_off" "$set_bad" "$l1" "$d_off" "$i_def" "$i_on" <<'PY' ||
import json, sys
path, tt, tb, th = sys.argv[1:5]
l0, d_on, d_none, d_neg, d_bad, n_none, set_off = (json.loads(x) for x in sys.argv[5:12])
set_bad, l1, d_off, i_def, i_on = sys.argv[12], json.loads(sys.argv[13]), json.loads(sys.argv[14]), json.loads(sys.argv[15]), json.loads(sys.argv[16])
text = lambda d: d["choices"][0]["text"]
assert l0 == [{"id": 0, "path": path, "scale": 1}], l0
assert text(d_on) == tt and text(d_none) == tb and text(d_neg) == th and th not in (tt, tb), (d_on, d_none, d_neg, th)
assert "invalid adapter id 1" in d_bad["error"]["message"], d_bad
assert n_none["content"] == tb, n_none
assert set_off == {"success": True} and set_bad == "400" and l1[0]["scale"] == 0 and text(d_off) == tb, (set_off, set_bad, l1, d_off)
assert text(i_def) == tb and text(i_on) == tt, (i_def, i_on)
PY
    fail "serve --lora: /lora-adapters and per-request scales"
  # run-time adapters (vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter; serve --lora-slots):
  # a loaded adapter answers as run --lora does, under its name; unloading frees its slot
  srv_start "$S/models/stories260K.gguf" -c 256 --lora-slots 1 --max-lora-rank 4
  post() { curl -s -w ' %{http_code}' "$URL/v1/$1" -H 'Content-Type: application/json' -d "$2"; }
  r_load=$(post load_lora_adapter "{\"lora_name\":\"tuned\",\"lora_path\":\"$T/r.lora.gguf\"}")
  r_full=$(post load_lora_adapter "{\"lora_name\":\"again\",\"lora_path\":\"$T/r.lora.gguf\"}")
  r_tuned=$(gen ',"model":"tuned"'); r_base=$(gen ''); r_models=$(curl -s "$URL/v1/models")
  r_unload=$(post unload_lora_adapter '{"lora_name":"tuned"}'); r_gone=$(post unload_lora_adapter '{"lora_name":"tuned"}')
  r_after=$(gen ',"model":"tuned"'); r_reload=$(post load_lora_adapter "{\"lora_name\":\"again\",\"lora_path\":\"$T/r.lora.gguf\"}")
  r_again=$(gen ',"model":"again"')
  srv_stop
  python3 - "$t_tuned" "$t_base" "$r_load" "$r_full" "$r_tuned" "$r_base" "$r_models" "$r_unload" "$r_gone" "$r_after" "$r_reload" "$r_again" <<'PY' ||
import json, sys
tt, tb, load, full, tuned, base, models, unload, gone, after, reload, again = sys.argv[1:]
text = lambda d: json.loads(d)["choices"][0]["text"]
assert load == "Success: LoRA adapter 'tuned' added successfully. 200", load
assert full.endswith(" 400") and "slot" in full, full
assert text(tuned) == tt and json.loads(tuned)["model"] == "tuned" and text(base) == tb, (tuned, base)
assert [m["id"] for m in json.loads(models)["data"]][1:] == ["tuned"], models
assert unload == "Success: LoRA adapter 'tuned' removed successfully. 200" and gone.endswith(" 404"), (unload, gone)
assert text(after) == tb and json.loads(after)["model"] != "tuned", after
assert reload.endswith(" 200") and text(again) == tt, (reload, again)
PY
    fail "serve --lora-slots: /v1/load_lora_adapter and /v1/unload_lora_adapter"
fi
# a slot too small for the adapter (rank 4 > 2) refuses it; the plan with slots holds as a bound
"$F" plan -m "$S/models/stories260K.gguf" --verify --lora "$T/r.lora.gguf" --lora-slots 2 --max-lora-rank 4 -c 256 --max-logprobs -1 -t 1 > "$T/pv.txt" 2>&1 ||
    { cat "$T/pv.txt"; fail "plan --verify --lora-slots"; }
grep -q "2 run-time adapter slots reserve" "$T/pv.txt" || { cat "$T/pv.txt"; fail "plan --verify --lora-slots: no note"; }
"$F" plan -m "$S/models/stories260K.gguf" --verify --lora "$T/r.lora.gguf" --lora-slots 1 --max-lora-rank 2 -c 256 --max-logprobs -1 -t 1 > "$T/pv.txt" 2>&1 &&
    fail "a rank-4 adapter loaded into a rank-2 slot"
grep -q "a slot takes" "$T/pv.txt" || { cat "$T/pv.txt"; fail "rank-2 slot: no reason given"; }
"$F" serve -m "$S/models/stories260K.gguf" --max-lora-rank 8 </dev/null >/dev/null 2>&1; [ $? -eq 2 ] || fail "serve --max-lora-rank without --lora-slots must exit 2"
"$F" run -m "$S/models/stories260K.gguf" --lora "$T/inf.lora.gguf" -p "Once" -n 2 -t 1 > /dev/null 2> "$T/err8.txt"; rc=$?
[ $rc -ne 0 ] && grep -q "alpha" "$T/err8.txt" || { cat "$T/err8.txt"; fail "run --lora with an infinite alpha must be refused (rc $rc)"; }
"$F" run -m "$S/models/stories260K.gguf" --lora "$S/models/stories260K.gguf" -p "Once" -n 2 -t 1 > /dev/null 2> "$T/err8.txt"; rc=$?
[ $rc -ne 0 ] && grep -q "not a LoRA adapter" "$T/err8.txt" || { cat "$T/err8.txt"; fail "run --lora MODEL must be refused (rc $rc)"; }

# bench train: the planner's prediction of every category equals the measured peak (all but
# the benchmark's own batch arrays, MISC: three int32 per token and the sequence offsets);
# weights, grads and both optimizers' states from the shape; checkpointing every layer keeps
# less; the plot is written.  Full training (2 threads), and QLoRA rank 4.
for extra in "-t 2" "-t 1 --lora 4 --nf4"; do
  "$F" bench train --layers 3 --embd 64 --ff 160 --heads 4 --kv-heads 2 --vocab 128 -c 48 --batch 2 --rounds 1 $extra \
      --svg "$T/bt.svg" --json > "$T/bt.json" 2> "$T/bt.err" || { cat "$T/bt.err"; fail "bench train $extra"; }
  python3 - "$T/bt.json" "$extra" <<'PY' || fail "bench train $extra: json"
import json, sys
d = json.load(open(sys.argv[1])); lora = "--lora" in sys.argv[2]
L, C, F, V, H, KVH, ctx, B = 3, 64, 160, 128, 4, 2, 48, 2
hd = C // H; Q, KV = H * hd, KVH * hd
mats = [(C, Q), (C, KV), (C, KV), (Q, C), (C, F), (C, F), (F, C)]  # (in, out) of the 7 matrices
P = 2 * V * C + C + L * (2 * C + sum(i * o for i, o in mats))
assert d["shape"]["n_params"] == P, (d["shape"]["n_params"], P)
assert d["optim"]["adamw_bytes"] == 8 * P and d["optim"]["adamw8bit_bytes"] == 2 * P + 8 * -(-P // 256), d["optim"]
mine = 3 * ctx * B * 4 + (B + 1) * 4  # the benchmark's tokens, targets, positions, offsets
trained = L * 4 * sum(i + o for i, o in mats) if lora else P  # adapters of rank 4, or everything
for c in d["configs"]:
    assert c["act_peak_bytes"] == c["plan_act_bytes"] and c["scratch_peak_bytes"] == c["plan_scratch_bytes"], c
    assert c["peak_total_bytes"] - c["plan_total_bytes"] == mine, (c, mine)
    assert c["grad_bytes"] == 4 * trained and c["optim_bytes"] == 8 * trained, c
    if not lora: assert c["weights_bytes"] == 4 * P, c
k = {c["ckpt_every"]: c for c in d["configs"]}
assert k[1]["act_peak_bytes"] < k[2]["act_peak_bytes"] < k[0]["act_peak_bytes"], k
assert abs(d["act_reduction_k1"] - k[0]["act_peak_bytes"] / k[1]["act_peak_bytes"]) < 2e-3, d["act_reduction_k1"]
PY
  grep -q "<svg" "$T/bt.svg" && grep -q "</svg>" "$T/bt.svg" || fail "bench train --svg: no plot"
done
"$F" bench train --nf4 --json > /dev/null 2>&1; [ $? -eq 2 ] || fail "bench train --nf4 without --lora must exit 2"
"$F" bench train --embd 64 --heads 3 --json > /dev/null 2>&1; [ $? -eq 2 ] || fail "bench train --heads 3 of --embd 64 must exit 2"

# no output may replace an input: the base (also through a symlink), the training text (via
# OUT.ckpt / OUT), the adapter being merged; each copy is left as it was
cp "$S/models/stories260K.gguf" "$T/base.gguf"; ln -s base.gguf "$T/base-link.gguf"
hb=$(sha256sum < "$T/base.gguf"); ht=$(sha256sum < "$T/train.txt"); ha=$(sha256sum < "$T/q.lora.gguf")
for args in "-m $T/base.gguf -f $T/train.txt -o $T/base.gguf" "-m $T/base.gguf -f $T/train.txt -o $T/base-link.gguf" \
            "-m $T/base.gguf -f $T/train.txt -o $T/train.txt" "-m $T/base.gguf --merge-lora $T/q.lora.gguf -o $T/q.lora.gguf" \
            "-m $T/base.gguf --merge-lora $T/q.lora.gguf -o $T/base.gguf"; do
  "$F" train $args --steps 1 -c 64 -t 1 2> "$T/err5.txt"; rc=$?
  [ $rc -eq 2 ] && grep -q "write the output elsewhere" "$T/err5.txt" || { cat "$T/err5.txt"; fail "train $args: rc $rc, not refused"; }
done
[ "$(sha256sum < "$T/base.gguf")" = "$hb" ] && [ "$(sha256sum < "$T/train.txt")" = "$ht" ] && [ "$(sha256sum < "$T/q.lora.gguf")" = "$ha" ] || fail "an input changed"
exit 0
