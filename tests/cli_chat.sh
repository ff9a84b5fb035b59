#!/usr/bin/env bash
# `fitllm chat`: its replies are what /v1/chat/completions answers for the same conversation
# (greedy), earlier turns come from the prefix cache, /clear, dropping old turns to fit the
# context, a turn longer than the context, continued lines, bad options.
# Usage: cli_chat.sh FITLLM_BIN SHARED_DIR     (exit 77 = skipped)
set -u
BIN=$1; SHARED=$2
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
TMP=$(mktemp -d)
. "$(cd "$(dirname "$0")" && pwd)/serve_lib.sh"
trap 'srv_stop; rm -rf "$TMP"' EXIT
start_server() { srv_start "$MODEL" -c 512 "$@"; } # (stories260K, -c 512)

SYS="You are a storyteller. You tell short stories to children who like cats and dogs."
U1="Hello, who are you?"
U2="Tell me a story about a cat."
U3="And one about a dog."
printf '%s\n%s\n%s\n' "$U1" "$U2" "$U3" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" --json >"$TMP/out" 2>"$TMP/err"
check "chat --json: exit 0" '[ $? -eq 0 ]'
check "chat --json: an object per turn" '[ "$(wc -l <"$TMP/out")" -eq 3 ] && [ "$(python3 -c "import json,sys; print([json.loads(l)[\"turn\"] for l in open(sys.argv[1])])" "$TMP/out")" = "[1, 2, 3]" ]'
check "chat: the stats count 3 turns" 'grep -q "^3 turns" "$TMP/err"'
# turn k's prompt holds turn k-1's whole prompt, so its full blocks (16 tokens) come from the cache
check "chat: a turn takes the earlier turns' full blocks from the prefix cache" 'python3 -c "
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if t[0][\"cached_tokens\"] == 0 and all(t[k][\"cached_tokens\"] >= t[k - 1][\"prompt_tokens\"] // 16 * 16 > 0 for k in (1, 2)) else 1)" "$TMP/out"'
check "chat: the memory report follows (no server buffers: nothing in net)" 'grep -q "^  total" "$TMP/err" && ! grep -q "^  net" "$TMP/err"'
# streamed (not --json), the same replies, each followed by a newline
printf '%s\n%s\n%s\n' "$U1" "$U2" "$U3" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" >"$TMP/stream" 2>/dev/null
check "chat: the streamed text is the replies, each and a newline" 'python3 -c "
import json, sys
t = [json.loads(l)[\"reply\"] for l in open(sys.argv[1])]
sys.exit(0 if open(sys.argv[2]).read() == \"\".join(r + \"\\n\" for r in t) else 1)" "$TMP/out" "$TMP/stream"'

# speculative decoding (n-gram drafts) changes no reply, greedy or seeded
printf '%s\n%s\n%s\n' "$U1" "$U2" "$U3" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" --json --spec-ngram 4 >"$TMP/outs" 2>"$TMP/errs"
check "chat --spec-ngram 4: the same replies, drafts kept" 'python3 -c "
import json, re, sys
a = [json.loads(l)[\"reply\"] for l in open(sys.argv[1])]; b = [json.loads(l)[\"reply\"] for l in open(sys.argv[2])]
m = re.search(r\"speculative decoding: (\\d+) of (\\d+) draft tokens kept\", open(sys.argv[3]).read())
sys.exit(0 if a == b and m and 0 < int(m.group(1)) <= int(m.group(2)) else 1)" "$TMP/out" "$TMP/outs" "$TMP/errs"'
for k in 0 4; do
  printf '%s\n%s\n' "$U1" "$U2" | "$BIN" chat -m "$MODEL" -t 1 --temp 0.9 --seed 11 -n 32 -c 512 --json --spec-ngram $k >"$TMP/seed$k" 2>/dev/null
done
check "chat --spec-ngram 4: seeded sampling gives the same replies" 'python3 -c "
import json, sys
a = [json.loads(l)[\"reply\"] for l in open(sys.argv[1])]; b = [json.loads(l)[\"reply\"] for l in open(sys.argv[2])]
sys.exit(0 if a == b and len(a) == 2 and all(a) else 1)" "$TMP/seed0" "$TMP/seed4"'
# a draft model (its Q4_0 quantization) in place of n-grams: the same replies, most drafts kept
printf '%s\n%s\n%s\n' "$U1" "$U2" "$U3" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" --json --model-draft "$SHARED/models/stories260K-q4_0.gguf" >"$TMP/outd" 2>"$TMP/errd"
check "chat --model-draft: the same replies, most drafts kept" 'python3 -c "
import json, re, sys
a = [json.loads(l)[\"reply\"] for l in open(sys.argv[1])]; b = [json.loads(l)[\"reply\"] for l in open(sys.argv[2])]
m = re.search(r\"speculative decoding: (\\d+) of (\\d+) draft tokens kept\", open(sys.argv[3]).read())
sys.exit(0 if a == b and m and int(m.group(2)) / 2 < int(m.group(1)) <= int(m.group(2)) else 1)" "$TMP/out" "$TMP/outd" "$TMP/errd"'
"$BIN" chat -m "$MODEL" --model-draft "$SHARED/models/llama-2-tiny-random.gguf" </dev/null >/dev/null 2>"$TMP/errv"
check "chat --model-draft with another vocabulary: refused, said why (exit 1)" '[ $? -eq 1 ] && grep -q "vocabulary" "$TMP/errv"'
"$BIN" chat -m "$MODEL" --model-draft "$MODEL" --spec-ngram 3 </dev/null >/dev/null 2>&1; check "chat --model-draft with --spec-ngram refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" chat -m "$MODEL" --model-draft "$MODEL" --draft-p-min 1.5 </dev/null >/dev/null 2>&1; check "chat --draft-p-min 1.5 refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" chat -m "$MODEL" --draft-max 3 </dev/null >/dev/null 2>&1; check "chat --draft-max without --model-draft refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" plan -m "$MODEL" --verify -t 1 --batch 4 --prefill 64 -c 256 --max-logprobs -1 --model-draft "$SHARED/models/stories260K-q4_0.gguf" >"$TMP/pv" 2>&1
check "plan --verify --model-draft: the draft model's bytes planned (every category within 5%)" '[ $? -eq 0 ] && grep -q "^act .*+0.00%" "$TMP/pv"'
"$BIN" chat -m "$MODEL" --spec-ngram 17 </dev/null >/dev/null 2>&1; check "chat --spec-ngram 17 refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" serve -m "$MODEL" --spec-ngram-min 2 </dev/null >/dev/null 2>&1; check "serve --spec-ngram-min without --spec-ngram refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" serve -m "$MODEL" --spec-disable-by-batch-size 4 </dev/null >/dev/null 2>&1; check "serve --spec-disable-by-batch-size without --spec-ngram refused (exit 2)" '[ $? -eq 2 ]'

# the server answers the same conversation with the same replies (the plain template: a reply
# ends where the model writes the next "User:", the stop the chat sets), here with drafts
start_server --spec-ngram 3
python3 - "$URL" "$SYS" "$U1" "$U2" "$U3" "$TMP/out" <<'EOF'
import json, sys, urllib.request
url, sys_p, users, out = sys.argv[1], sys.argv[2], sys.argv[3:6], sys.argv[6]
replies = [json.loads(l)["reply"] for l in open(out)]
msgs = [{"role": "system", "content": sys_p}]
bad = 0
for k, u in enumerate(users):
    msgs.append({"role": "user", "content": u})
    body = {"messages": msgs, "max_tokens": 24, "temperature": 0, "stop": ["\nUser:"]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    got = json.load(urllib.request.urlopen(req))["choices"][0]["message"]["content"]
    if got != replies[k]:
        print("turn %d: chat %r, server %r" % (k + 1, replies[k], got)); bad += 1
    msgs.append({"role": "assistant", "content": replies[k]})
sys.exit(1 if bad else 0)
EOF
check "chat: each reply is the server's for the same conversation" '[ $? -eq 0 ]'
curl -s "$URL/metrics" >"$TMP/metrics"
check "serve --spec-ngram: /metrics counts the drafts (vLLM's names)" 'python3 -c "
import re, sys
t = open(sys.argv[1]).read()
d = re.search(r\"^vllm:spec_decode_num_draft_tokens_total\\{[^}]*\\} (\\d+)\", t, re.M); a = re.search(r\"^vllm:spec_decode_num_accepted_tokens_total\\{[^}]*\\} (\\d+)\", t, re.M)
sys.exit(0 if d and a and int(d.group(1)) >= int(a.group(1)) > 0 else 1)" "$TMP/metrics"'
# llama.cpp's per-request speculative.n_max / n_min / p_min: no drafts at n_max 0, drafts of
# exactly 2 tokens at n_max = n_min = 2; the same text either way
python3 - "$URL" <<'EOF'
import json, re, sys, urllib.request, urllib.error
url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req))
    except urllib.error.HTTPError as e:
        return {"status": e.code}
def drafts():
    t = urllib.request.urlopen(url + "/metrics").read().decode()
    g = lambda n: int(re.search(r"^vllm:spec_decode_num_%s_total\{[^}]*\} (\d+)" % n, t, re.M).group(1))
    return g("drafts"), g("draft_tokens")
base = {"prompt": "Once upon a time, there was a little girl named Lily. She", "n_predict": 64, "temperature": 0}
d0, t0 = drafts(); plain = post(base)["content"]
d1, t1 = drafts(); none = post(dict(base, **{"speculative.n_max": 0}))["content"]
d2, t2 = drafts(); two = post(dict(base, **{"speculative.n_max": 2, "speculative.n_min": 2}))["content"]
d3, t3 = drafts()
bad = post(dict(base, **{"speculative.p_min": 2}))
ok = plain == none == two and d1 > d0 and (d2, t2) == (d1, t1) and d3 > d2 and t3 - t2 == 2 * (d3 - d2) and bad == {"status": 400}
print((plain, none, two, (d0, t0), (d1, t1), (d2, t2), (d3, t3), bad)) if not ok else None
sys.exit(0 if ok else 1)
EOF
check "serve --spec-ngram: speculative.n_max 0 drafts nothing, n_max = n_min = 2 drafts 2 at a time, the same text" '[ $? -eq 0 ]'

# --chat-template-file (llama.cpp's): a template whose markers are Llama 3's renders as Llama 3 in
# the server and in the chat alike; their replies agree
printf '{%% for m in messages %%}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{%% endfor %%}' >"$TMP/l3.jinja"
srv_stop
start_server --chat-template-file "$TMP/l3.jinja"
curl -s -d '{"messages":[{"role":"user","content":"hi"}]}' "$URL/apply-template" >"$TMP/at"
check "serve --chat-template-file: rendered as Llama 3" '[ "$(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[\"prompt\"]))" "$TMP/at")" = "\"<|start_header_id|>user<|end_header_id|>\\n\\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n\"" ]'
curl -s "$URL/props" >"$TMP/props"
check "serve --chat-template-file: /props shows the file's text" 'python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"chat_template\"] == open(sys.argv[2]).read() else 1)" "$TMP/props" "$TMP/l3.jinja"'
printf '%s\n%s\n' "$U1" "$U2" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" --json --chat-template-file "$TMP/l3.jinja" >"$TMP/out7" 2>/dev/null
python3 - "$URL" "$SYS" "$U1" "$U2" "$TMP/out7" <<'EOF2'
import json, sys, urllib.request
url, sys_p, users, out = sys.argv[1], sys.argv[2], sys.argv[3:5], sys.argv[5]
turns = [json.loads(l) for l in open(out)]
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))
msgs = [{"role": "system", "content": sys_p}]
bad = 0
for k, u in enumerate(users):
    msgs.append({"role": "user", "content": u})
    n = post("/tokenize", {"messages": msgs})["count"]
    got = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0})["choices"][0]["message"]["content"]
    if n != turns[k]["prompt_tokens"] or got != turns[k]["reply"]:
        print("turn %d: chat %d tokens %r, server %d tokens %r" % (k + 1, turns[k]["prompt_tokens"], turns[k]["reply"], n, got)); bad += 1
    msgs.append({"role": "assistant", "content": turns[k]["reply"]})
sys.exit(1 if bad else 0)
EOF2
check "chat --chat-template-file: the server's prompt tokens and replies" '[ $? -eq 0 ]'
"$BIN" chat -m "$MODEL" --chat-template nonesuch </dev/null >/dev/null 2>"$TMP/err8"; check "chat --chat-template nonesuch refused (exit 2)" '[ $? -eq 2 ] && grep -q "unknown chat template" "$TMP/err8"'
"$BIN" serve -m "$MODEL" --chat-template chatml --chat-template-file "$TMP/l3.jinja" </dev/null >/dev/null 2>&1; check "serve: both template options refused (exit 2)" '[ $? -eq 2 ]'

# /clear starts over: the first question again gets the first reply
printf '%s\n/clear\n%s\n/exit\nnot read\n' "$U1" "$U1" | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 24 -c 512 --system "$SYS" --json >"$TMP/out2" 2>"$TMP/err2"
check "chat: /clear starts over, /exit ends" 'python3 -c "
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = json.loads(open(sys.argv[2]).readline())
sys.exit(0 if len(a) == 2 and a[0][\"reply\"] == a[1][\"reply\"] == b[\"reply\"] and a[0][\"prompt_tokens\"] == a[1][\"prompt_tokens\"] else 1)" "$TMP/out2" "$TMP/out"'


# a line ending in a backslash goes on; the last line needs no newline
printf 'one\\\ntwo\nthree' | "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 8 >"$TMP/out3" 2>"$TMP/err3"
check "chat: continued lines are one turn, the last line without a newline another" 'grep -q "^2 turns" "$TMP/err3"'

# a small context: the oldest turns are dropped, every turn still answered
for i in $(seq 1 8); do echo "Tell me about the cat number $i and the dog."; done |
  "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 16 -c 96 --system "Be brief." --json >"$TMP/out4" 2>"$TMP/err4"
check "chat: a small context drops old turns (in pairs), answers all 8 within it" '[ $? -eq 0 ] && grep -q "old messages dropped to fit the context" "$TMP/err4" && python3 -c "
import json, sys
t = [json.loads(l) for l in open(sys.argv[1])]
d = sum(x[\"dropped_messages\"] for x in t)
sys.exit(0 if len(t) == 8 and d > 0 and d % 2 == 0 and all(x[\"prompt_tokens\"] + x[\"reply_tokens\"] <= 96 and x[\"reply_tokens\"] > 0 for x in t) else 1)" "$TMP/out4"'

# a turn longer than the context is left out; the next one is answered
{ python3 -c "print(' '.join(['word'] * 200))"; echo "Hello"; } |
  "$BIN" chat -m "$MODEL" -t 1 --temp 0 -n 8 -c 64 >"$TMP/out5" 2>"$TMP/err5"
check "chat: a turn longer than the context is left out, the next answered" '[ $? -eq 0 ] && grep -q "it is left out" "$TMP/err5" && grep -q "^1 turns" "$TMP/err5"'

"$BIN" chat -m "$MODEL" -n 0 </dev/null >/dev/null 2>&1; check "chat: -n 0 refused (exit 2)" '[ $? -eq 2 ]'
"$BIN" chat </dev/null >/dev/null 2>&1; check "chat: no model (exit 2)" '[ $? -eq 2 ]'
"$BIN" chat -m "$TMP/missing.gguf" </dev/null >/dev/null 2>"$TMP/err6"; check "chat: a missing model is an error (exit 1)" '[ $? -eq 1 ] && grep -q "fitllm chat:" "$TMP/err6"'

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
