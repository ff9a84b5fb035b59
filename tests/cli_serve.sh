#!/usr/bin/env bash
# End-to-end tests of `fitllm serve` over HTTP on loopback (curl + python3 for JSON checks).
# Usage: cli_serve.sh FITLLM_BIN SHARED_DIR     (exit 77 = skipped)
set -u
BIN=$1; SHARED=$2
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
TMP=$(mktemp -d); PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # a failure: the servers' logs (a crash or a sanitizer's report is in them), for CI's output
  if [ "${fails:-0}" != 0 ]; then for f in "$TMP"/*.log; do echo "--- $f (last 40 lines)"; tail -n 40 "$f"; done; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
. "$(cd "$(dirname "$0")" && pwd)/serve_lib.sh" # (ok, bad, check; this test runs several servers of its own)

# start_server NAME ARGS... -> sets URL_<NAME>, PID_<NAME>
start_server() {
  local name=$1; shift
  "$BIN" serve -m "$MODEL" --port 0 -t 1 "$@" 2>"$TMP/$name.log" &
  local pid=$!; PIDS+=("$pid"); eval "PID_$name=$pid"
  for _ in $(seq 1 100); do
    local url; url=$(sed -n 's/.*listening on \(https*:\/\/127.0.0.1:[0-9]*\).*/\1/p' "$TMP/$name.log")
    if [ -n "$url" ]; then eval "URL_$name=$url"; return 0; fi
    sleep 0.1
  done
  echo "server $name did not start:"; cat "$TMP/$name.log"; exit 1
}
# post URL PATH JSON [curl args...] -> body in $TMP/body, status in $TMP/status
post() { local u=$1 p=$2 d=$3; shift 3; curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$d" "$@" "$u$p" >"$TMP/status"; }
status() { cat "$TMP/status"; }
jq_() { python3 -c "import json,sys; d=json.load(open('$TMP/body')); print($1)"; }

start_server A -c 256 --max-seqs 8
U=$URL_A

check "health" '[ "$(curl -s $U/health)" = "{\"status\":\"ok\"}" ]'
curl -s "$U/v1/models" >"$TMP/body"; check "models lists the model" '[ "$(jq_ "d[\"data\"][0][\"object\"]")" = model ]'
MID=$(jq_ 'd["data"][0]["id"]')
# OpenAI's retrieve: GET /v1/models/{id} gives that entry; an unknown id 404 model_not_found
curl -s -o "$TMP/body2" -w '%{http_code}' "$U/v1/models/$MID" >"$TMP/status"
check "models/{id}: the list's entry" '[ "$(status)" = 200 ] && python3 -c "import json,sys; a=json.load(open(sys.argv[1]))[\"data\"][0]; b=json.load(open(sys.argv[2])); sys.exit(0 if a == b else 1)" "$TMP/body" "$TMP/body2"'
curl -s -o "$TMP/body" -w '%{http_code}' "$U/v1/models/no-such-model" >"$TMP/status"
check "models/{unknown}: 404 model_not_found" '[ "$(status)" = 404 ] && [ "$(jq_ "d[\"error\"][\"code\"]")" = model_not_found ]'

# greedy completion equals the reference greedy text (llama.cpp) for the same prompt
REF=$(python3 -c "
import json
for l in open('$SHARED/reference/stories260K.greedy.jsonl'):
    d=json.loads(l)
    if d['prompt']=='Once upon a time': print(json.dumps(d['greedy_text'])); break")
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}'
check "completion 200" '[ "$(status)" = 200 ]'
TEXT=$(jq_ 'json.dumps(d["choices"][0]["text"])')
check "greedy completion is a prefix of the reference" 'python3 -c "import sys,json; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); sys.exit(0 if len(a)>20 and b.startswith(a) else 1)" "$TEXT" "$REF"'
check "usage counts" '[ "$(jq_ "d[\"usage\"][\"prompt_tokens\"], d[\"usage\"][\"completion_tokens\"], d[\"choices\"][0][\"finish_reason\"]")" = "5 24 length" ]'

# HTTPS (--ssl-key-file / --ssl-cert-file), with a self-signed pair made here: the same
# greedy text over TLS, the certificate verified; plain HTTP to it fails; bad pairs are refused
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/key.pem" -out "$TMP/cert.pem" -days 2 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null
  start_server S -c 256 --ssl-key-file "$TMP/key.pem" --ssl-cert-file "$TMP/cert.pem"
  post "$URL_S" /v1/completions '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' --cacert "$TMP/cert.pem"
  check "HTTPS: $URL_S, a completion over TLS (certificate verified) with the text over HTTP" \
    '[ "${URL_S%%:*}" = https ] && [ "$(status)" = 200 ] && [ "$(jq_ "json.dumps(d[\"choices\"][0][\"text\"])")" = "$TEXT" ]'
  curl -s --max-time 5 -o /dev/null "http://${URL_S#https://}/health"; rc=$?
  check "HTTPS: plain HTTP to it gets no answer (curl $rc)" '[ $rc != 0 ]'
  kill -TERM "$PID_S"; wait "$PID_S"
  out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --ssl-key-file "$TMP/key.pem" 2>&1); rc=$?
  check "HTTPS: a key without a certificate -> exit 2 ($out)" '[ $rc = 2 ] && echo "$out" | grep -q "needs both"'
  out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --ssl-key-file "$TMP/cert.pem" --ssl-cert-file "$TMP/key.pem" 2>&1); rc=$?
  check "HTTPS: key and certificate swapped -> exit 1 ($out)" '[ $rc = 1 ] && echo "$out" | grep -q "holds no private key"'
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$TMP/key2.pem" -out "$TMP/cert2.pem" -days 2 -subj "/CN=x" 2>/dev/null
  out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --ssl-key-file "$TMP/key2.pem" --ssl-cert-file "$TMP/cert.pem" 2>&1); rc=$?
  check "HTTPS: a key that is not the certificate's -> exit 1 ($out)" '[ $rc = 1 ] && echo "$out" | grep -q "over HTTPS"'
  head -c 3000 "$MODEL" >"$TMP/notpem"
  out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --ssl-key-file "$TMP/notpem" --ssl-cert-file "$TMP/cert.pem" 2>&1); rc=$?
  check "HTTPS: a key that is no PEM file -> exit 1 ($out)" '[ $rc = 1 ] && echo "$out" | grep -q "not a PEM file"'
else
  echo "skip: HTTPS checks (openssl not installed)"
fi

# streaming gives the same text, chunk by chunk, then [DONE]
curl -sN -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0,"stream":true}' "$U/v1/completions" >"$TMP/sse"
STEXT=$(python3 -c "
import json
t=''; n=0
for l in open('$TMP/sse'):
    if l.startswith('data: ') and l.strip()!='data: [DONE]':
        d=json.loads(l[6:]); t+=d['choices'][0]['text']; n+=1
print(json.dumps(t))")
NCHUNK=$(grep -c '^data: {' "$TMP/sse")
check "stream text equals non-stream text" '[ "$STEXT" = "$TEXT" ]'
check "stream has several chunks and [DONE]" '[ "$NCHUNK" -gt 3 ] && tail -2 "$TMP/sse" | grep -q "data: \[DONE\]"'

# chat, plain and streamed
post "$U" /v1/chat/completions '{"messages":[{"role":"system","content":"Tell a story."},{"role":"user","content":"Once upon a time"}],"max_tokens":16,"temperature":0}'
check "chat 200 with assistant message" '[ "$(status)" = 200 ] && [ "$(jq_ "d[\"choices\"][0][\"message\"][\"role\"], d[\"object\"]")" = "assistant chat.completion" ]'
curl -sN -H 'Content-Type: application/json' -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true,"temperature":0}' "$U/v1/chat/completions" >"$TMP/sse2"
check "chat stream chunks" 'grep -q "chat.completion.chunk" "$TMP/sse2" && grep -q "\"role\":\"assistant\"" "$TMP/sse2" && grep -q "data: \[DONE\]" "$TMP/sse2"'

# logprobs / top_logprobs: values against llama.cpp's logits, both endpoints, streamed too
python3 "$(dirname "$0")/serve_logprobs.py" "$U" "$SHARED" >"$TMP/lp.txt" 2>&1; rc=$?
cat "$TMP/lp.txt"
check "logprobs (tests/serve_logprobs.py)" '[ $rc = 0 ]'

# tool calling: tools in the prompt, named / required / auto calls, streamed, refusals
# (tests/serve_tools.py; the tools' preamble needs more than 256 tokens of context)
start_server T -c 1024 --max-seqs 4 --responses-mem 24K
python3 "$(dirname "$0")/serve_tools.py" "$URL_T" >"$TMP/tools.txt" 2>&1; rc=$?
cat "$TMP/tools.txt"
check "tool calling (tests/serve_tools.py)" '[ $rc = 0 ]'
# OpenAI's Responses API against the chat completions of the same conversations, its store
# (tests/serve_responses.py; the store's limit checked at 24K)
python3 "$(dirname "$0")/serve_responses.py" "$URL_T" >"$TMP/responses.txt" 2>&1; rc=$?
cat "$TMP/responses.txt"
check "/v1/responses (tests/serve_responses.py)" '[ $rc = 0 ]'
# Anthropic's Messages API against the chat completions of the same conversations (tests/serve_messages.py)
python3 "$(dirname "$0")/serve_messages.py" "$URL_T" >"$TMP/messages.txt" 2>&1; rc=$?
cat "$TMP/messages.txt"
check "/v1/messages (tests/serve_messages.py)" '[ $rc = 0 ]'
# tool_choice "auto"'s lazy grammar end to end (tests/serve_tools_lazy.py): a model of zero
# weights, whose greedy output follows logit_bias, writes <tool_call>; the grammar finishes the call
"$BIN" synth --n-embd 512 --n-layer 4 --n-head 8 --n-ff 1536 --n-vocab 512 --std 0 --vocab-from "$MODEL" --type Q8_0 -t 1 \
  -o "$TMP/zero.gguf" >/dev/null 2>&1
MODEL_SAVED=$MODEL; MODEL=$TMP/zero.gguf
start_server Z -c 1024 --max-seqs 2
MODEL=$MODEL_SAVED
python3 "$(dirname "$0")/serve_tools_lazy.py" "$URL_Z" >"$TMP/tools_lazy.txt" 2>&1; rc=$?
cat "$TMP/tools_lazy.txt"
check "tool calling: auto's lazy grammar (tests/serve_tools_lazy.py)" '[ $rc = 0 ]'
kill -TERM "$PID_Z"; wait "$PID_Z"; rcz=$?
kill -TERM "$PID_T"; wait "$PID_T"; rc=$?
check "tool calling: the servers exit 0, no sanitizer report" '[ $rc = 0 ] && [ $rcz = 0 ] && ! grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$TMP/T.log" "$TMP/Z.log"'

# embeddings: POST /v1/embeddings on a server started with --embeddings (tests/serve_embeddings.py);
# refused without it
post "$U" /v1/embeddings '{"input":"Once upon a time"}'
check "/v1/embeddings without --embeddings -> 400 naming the flag" '[ "$(status)" = 400 ] && grep -q -- "--embeddings" "$TMP/body"'
out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --pooling last 2>&1); rc=$?
check "--pooling without --embeddings: refused at start" '[ $rc = 2 ] && echo "$out" | grep -q "needs --embeddings"'
start_server M -c 1024 --max-seqs 4 --embeddings
python3 "$(dirname "$0")/serve_embeddings.py" "$URL_M" >"$TMP/embd.txt" 2>&1; rc=$?
cat "$TMP/embd.txt"
check "embeddings (tests/serve_embeddings.py)" '[ $rc = 0 ]'
kill -TERM "$PID_M"; wait "$PID_M"; rc=$?
check "embeddings: the server exits 0, no sanitizer report" '[ $rc = 0 ] && ! grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$TMP/M.log"'

# /tokenize and /detokenize (vLLM's and llama.cpp's field names): llama.cpp's ids for the prompt
ref_field() { python3 -c "import json; print(json.dumps(json.loads(open('$SHARED/reference/stories260K.greedy.jsonl').readline())['$1']))"; }
RIDS=$(ref_field prompt_tokens); RTXT=$(ref_field prompt)
post "$U" /tokenize "{\"prompt\":$RTXT}"
check "tokenize gives llama.cpp's ids, count and context" '[ "$(status)" = 200 ] && [ "$(jq_ "json.dumps(d[\"tokens\"]), d[\"count\"], d[\"max_model_len\"]")" = "$RIDS $(python3 -c "print(len($RIDS))") 256" ]'
post "$U" /tokenize "{\"content\":$RTXT,\"add_special\":false}"
check "tokenize without special tokens drops BOS" '[ "$(jq_ "json.dumps(d[\"tokens\"])")" = "$(python3 -c "import json; print(json.dumps($RIDS[1:]))")" ]'
post "$U" /detokenize "{\"tokens\":$RIDS}"
check "detokenize gives the text back (with the SPM space, as llama.cpp)" '[ "$(jq_ "d[\"prompt\"] == \" \" + $RTXT and d[\"content\"] == d[\"prompt\"]")" = True ]'
CHATMSG='[{"role":"system","content":"Tell a story."},{"role":"user","content":"Once upon a time"}]'
post "$U" /tokenize "{\"messages\":$CHATMSG}"; NT=$(jq_ 'd["count"]')
post "$U" /v1/chat/completions "{\"messages\":$CHATMSG,\"max_tokens\":1}"
check "tokenize messages counts what a chat request's prompt has ($NT)" '[ "$NT" -gt 5 ] && [ "$(jq_ "d[\"usage\"][\"prompt_tokens\"]")" = "$NT" ]'
# llama.cpp's with_pieces: its README's example, 'á' on stories260K is two byte tokens
post "$U" /tokenize '{"content":"á","add_special":false,"with_pieces":true}'
check "tokenize with_pieces: llama.cpp's example (198 [195], 164 [161]), after the SPM space" '[ "$(jq_ "json.dumps(d[\"tokens\"][-2:])")" = '"'"'[{"id": 198, "piece": [195]}, {"id": 164, "piece": [161]}]'"'"' ] && [ "$(jq_ "d[\"tokens\"][0][\"piece\"]")" = " " ]'
post "$U" /tokenize '{"content":"a</s>","add_special":false,"parse_special":true}'; PS=$(jq_ 'd["tokens"][-1]')
check "tokenize parse_special: </s> is EOS (id 2)" '[ "$PS" = 2 ]'
# llama.cpp's /apply-template and /props
post "$U" /apply-template "{\"messages\":$CHATMSG}"; AT=$(jq_ 'd["prompt"]')
post "$U" /tokenize "{\"content\":$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$AT"),\"parse_special\":true}"
check "apply-template: the text a chat request's prompt is ($NT tokens again)" '[ -n "$AT" ] && [ "$(jq_ "d[\"count\"]")" = "$NT" ]'
# vLLM's continue_final_message / add_generation_prompt: the assistant's text left open, the
# output its continuation, as a completion of the same text continues it (greedy)
CONTMSG='[{"role":"user","content":"Tell me a story."},{"role":"assistant","content":"Once upon a time, there was a little"}]'
post "$U" /apply-template "{\"messages\":$CONTMSG,\"continue_final_message\":true,\"add_generation_prompt\":false}"; CT=$(jq_ 'json.dumps(d["prompt"])')
check "apply-template continue_final_message: ends in the assistant's text" '[ "$CT" = "\"User: Tell me a story.\\nAssistant: Once upon a time, there was a little\"" ]'
post "$U" /apply-template "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":false}"
check "apply-template add_generation_prompt false: no Assistant: after the turn" '[ "$(jq_ "json.dumps(d[\"prompt\"])")" = "\"User: hi\\n\"" ]'
post "$U" /v1/completions "{\"prompt\":$CT,\"max_tokens\":12,\"temperature\":0}"; CC=$(jq_ 'json.dumps(d["choices"][0]["text"])')
post "$U" /v1/chat/completions "{\"messages\":$CONTMSG,\"continue_final_message\":true,\"add_generation_prompt\":false,\"max_tokens\":12,\"temperature\":0}"
check "chat continue_final_message: the completion of the open text ($CC)" '[ "$(status)" = 200 ] && [ "$(jq_ "json.dumps(d[\"choices\"][0][\"message\"][\"content\"])")" = "$CC" ] && [ ${#CC} -gt 4 ]'
post "$U" /v1/chat/completions "{\"messages\":$CONTMSG,\"max_tokens\":12,\"temperature\":0}"
check "chat without it: a new turn (another reply)" '[ "$(status)" = 200 ] && [ "$(jq_ "json.dumps(d[\"choices\"][0][\"message\"][\"content\"])")" != "$CC" ]'
post "$U" /tokenize "{\"messages\":$CONTMSG,\"continue_final_message\":true,\"add_generation_prompt\":false}"; NC=$(jq_ 'd["count"]')
post "$U" /tokenize "{\"content\":$CT}"
check "tokenize messages continue_final_message: the open text's tokens ($NC)" '[ "$(jq_ "d[\"count\"]")" = "$NC" ]'
# vLLM's skip_special_tokens false: a generated special token keeps its text (</s> forced, EOS ignored)
post "$U" /v1/completions '{"prompt":"Once","max_tokens":3,"temperature":0,"ignore_eos":true,"logit_bias":{"2":100},"skip_special_tokens":false}'
check "skip_special_tokens false: </s> x 3 in the text" '[ "$(jq_ "d[\"choices\"][0][\"text\"]")" = "</s></s></s>" ]'
post "$U" /v1/completions '{"prompt":"Once","max_tokens":3,"temperature":0,"ignore_eos":true,"logit_bias":{"2":100}}'
check "skip_special_tokens (default true): no text for them" '[ "$(jq_ "repr(d[\"choices\"][0][\"text\"])")" = "'"''"'" ] && [ "$(jq_ "d[\"usage\"][\"completion_tokens\"]")" = 3 ]'
curl -s "$U/props" >"$TMP/body"
check "props: n_ctx, total_slots, /completion's defaults" '[ "$(jq_ "d[\"default_generation_settings\"][\"n_ctx\"], d[\"total_slots\"], d[\"default_generation_settings\"][\"params\"][\"temperature\"]")" = "256 8 0.8" ]'
for bad in '{"prompt":3}' '{}' '{"prompt":"a","add_special_tokens":"yes"}' '[1]' '{"messages":"x"}' '{"content":"a","with_pieces":1}'; do
  post "$U" /tokenize "$bad"; check "tokenize $bad -> 400" '[ "$(status)" = 400 ]'
done
for bad in '{"tokens":[1,512]}' '{"tokens":[-1]}' '{"tokens":"1 2"}' '{"tokens":[1.5]}' '{}'; do
  post "$U" /detokenize "$bad"; check "detokenize $bad -> 400" '[ "$(status)" = 400 ]'
done
check "GET /tokenize -> 405" '[ "$(curl -s -o /dev/null -w "%{http_code}" $U/tokenize)" = 405 ]'

# n > 1 and seeds
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0.9,"n":3,"seed":42}'
A1=$(jq_ '"|".join(c["text"] for c in d["choices"])'); NCH=$(jq_ 'len(d["choices"])')
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0.9,"n":3,"seed":42}'
A2=$(jq_ '"|".join(c["text"] for c in d["choices"])')
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"temperature":0.9,"n":3,"seed":7}'
A3=$(jq_ '"|".join(c["text"] for c in d["choices"])')
check "n=3 gives 3 choices" '[ "$NCH" = 3 ]'
check "same seed reproduces" '[ "$A1" = "$A2" ]'
check "other seed differs" '[ "$A1" != "$A3" ]'

# stop strings
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop":["Lily"]}'
check "stop string trims and finishes with stop" '[ "$(jq_ "\"Lily\" in d[\"choices\"][0][\"text\"], d[\"choices\"][0][\"finish_reason\"]")" = "False stop" ]'

# bad input -> 4xx with an OpenAI-style error body
errcase() { # name expected_status path data
  post "$U" "$3" "$4"; local st; st=$(status)
  if [ "$st" = "$2" ] && python3 -c "import json; d=json.load(open('$TMP/body')); assert isinstance(d['error']['message'], str) and d['error']['type']" 2>/dev/null; then ok "$1 -> $st"; else bad "$1 (got $st: $(head -c 200 "$TMP/body"))"; fi
}
errcase "malformed JSON" 400 /v1/completions '{"prompt": "x",'
errcase "not an object" 400 /v1/completions '[1,2]'
errcase "missing prompt" 400 /v1/completions '{"max_tokens":3}'
errcase "wrong type max_tokens" 400 /v1/completions '{"prompt":"a","max_tokens":"ten"}'
errcase "negative max_tokens" 400 /v1/completions '{"prompt":"a","max_tokens":-1}'
errcase "temperature out of range" 400 /v1/completions '{"prompt":"a","temperature":9}'
errcase "n too large" 400 /v1/completions '{"prompt":"a","n":100}'
errcase "max_tokens over the limit" 400 /v1/completions '{"prompt":"a","max_tokens":100000}'
errcase "unsupported field (functions)" 400 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"functions":[{"name":"f"}]}'
errcase "a tool without its function" 400 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}'
# llama.cpp's grammar / vLLM's guided_grammar (GBNF): sampled answers are sentences of it
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":1,"seed":5,"grammar":"root ::= (\"Yes\" | \"No\") \", \" [a-z]+ (\" \" [a-z]+){0,3} \".\""}'
check "grammar: a sentence of it, finished with stop ($(jq_ "d['choices'][0]['text']"))" 'python3 -c "import json,re,sys; c=json.load(open(sys.argv[1]))[\"choices\"][0]; assert re.fullmatch(r\"(Yes|No), [a-z]+( [a-z]+){0,3}[.]\", c[\"text\"]) and c[\"finish_reason\"] == \"stop\", c" "$TMP/body"'
ARITH='root ::= \"(\" e \")\" \".\"\ne ::= t (\"+\" t){1,2}\nt ::= [0-9]{1,2} | \"(\" e \")\"'
for seed in 1 2 3; do
  post "$U" /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"sum\"}],\"max_tokens\":60,\"temperature\":1,\"seed\":$seed,\"guided_grammar\":\"$ARITH\"}"
  check "guided_grammar (recursive), seed $seed: $(jq_ "d['choices'][0]['message']['content']")" 'python3 -c "import json,re,sys; c=json.load(open(sys.argv[1]))[\"choices\"][0]; t=c[\"message\"][\"content\"]; assert c[\"finish_reason\"] == \"length\" or (re.fullmatch(r\"[(][0-9+()]+[+][0-9+()]+[)][.]\", t) and isinstance(eval(t[:-1]), int)), c" "$TMP/body"'
done
# llama.cpp's lazy grammar: greedy text as without one up to the trigger, the grammar's after it
post "$U" /completion '{"prompt":"Once upon a time","n_predict":40,"temperature":0}'; FREE=$(jq_ 'd["content"]')
for trig in '{"type":1,"value":"Lily"}' '{"type":2,"value":"named (L)"}' '{"word":"Lily"}'; do
  post "$U" /completion "{\"prompt\":\"Once upon a time\",\"n_predict\":40,\"temperature\":0,\"grammar\":\"root ::= \\\"Lily and the red ball.\\\"\",\"grammar_lazy\":true,\"grammar_triggers\":[$trig]}"
  check "grammar_lazy, trigger $trig: free up to it, the grammar after" 'python3 -c "
import json, sys
d, free = json.load(open(sys.argv[1])), sys.argv[2]
k = free.index(\"Lily\")
assert k > 0 and d[\"content\"] == free[:k] + \"Lily and the red ball.\", (d[\"content\"], free)" "$TMP/body" "$FREE"'
done
post "$U" /completion '{"prompt":"Once","n_predict":8,"grammar":"root ::= \"x\"","grammar_lazy":true}'
check "grammar_lazy without triggers -> 400" '[ "$(status)" = 400 ]'
post "$U" /completion '{"prompt":"Once","n_predict":8,"grammar":"root ::= \"x\"","grammar_lazy":true,"grammar_triggers":[{"type":2,"value":"("}]}'
check "grammar_lazy, a bad pattern -> 400 naming it" '[ "$(status)" = 400 ] && grep -q "grammar trigger 0: pattern" "$TMP/body"'
# vLLM's structural_tag: free text to a trigger, then its structure (begin, a JSON value of the
# schema, end), then free text again; the same from each of its three places; refusals
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":120,"temperature":0}'; FREE=$(jq_ 'd["choices"][0]["text"]')
STAG='{"structures":[{"begin":"Lily","schema":{"type":"object","properties":{"age":{"type":"integer"}},"required":["age"]},"end":"!"}],"triggers":["Lily"]}'
STAG_TEXT=$(python3 -c 'import json,sys; print(json.dumps(json.dumps(json.loads(sys.argv[1]))))' "$STAG")
i=0
for field in "\"response_format\":$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["type"]="structural_tag"; print(json.dumps(d))' "$STAG")" \
             "\"structured_outputs\":{\"structural_tag\":$STAG_TEXT}" "\"structural_tag\":$STAG"; do
  post "$U" /v1/completions "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,$field}"
  cp "$TMP/body" "$TMP/stag$i.json"
  check "structural_tag ($(echo "$field" | cut -c1-30)...): free to Lily, {age} and ! after each, free between ($(jq_ "d['choices'][0]['text'][-60:]"))" 'python3 -c "
import json, re, sys
c, free = json.load(open(sys.argv[1]))[\"choices\"][0], sys.argv[2]
t, k = c[\"text\"], free.index(\"Lily\")
assert t[:k] == free[:k] and c[\"finish_reason\"] == \"length\", (t, free)
n, at = 0, t.find(\"Lily\")
while at >= 0:
    m = re.match(r\" ?([{][^{}]*[}]) ?!\", t[at + 4:])
    if not m:
        assert re.fullmatch(r\" ?([{][^{}]*)?\", t[at + 4:]), t  # (the last, cut)
        break
    assert type(json.loads(m.group(1))[\"age\"]) is int, t
    n, at = n + 1, t.find(\"Lily\", at + 4 + m.end())
assert n >= 2, t" "$TMP/body" "$FREE"'
  i=$((i + 1))
done
check "structural_tag: the same text from response_format, structured_outputs and the top-level field" 'python3 -c "
import json, sys
t = [json.load(open(f))[\"choices\"][0][\"text\"] for f in sys.argv[1:]]
assert t[0] == t[1] == t[2], t" "$TMP/stag0.json" "$TMP/stag1.json" "$TMP/stag2.json"'
for bad in '"structural_tag":{"structures":[{"begin":"Lily","schema":{},"end":"!"}]}' \
           '"structural_tag":{"structures":[{"begin":"Tom","schema":{},"end":"!"}],"triggers":["Lily"]}' \
           '"structural_tag":{"format":{"type":"triggered_tags"}}' '"structural_tag":"{nope"' \
           '"structural_tag":{"structures":[{"begin":"Lily","end":"!"}],"triggers":["Lily"]},"grammar":"root ::= \"x\""' \
           '"structural_tag":{"structures":[{"begin":"Lily","schema":false,"end":"!"}],"triggers":["Lily"]}'; do
  post "$U" /v1/completions "{\"prompt\":\"Once\",\"max_tokens\":8,$bad}"
  check "structural_tag refused ($(echo "$bad" | cut -c1-60)) -> 400: $(jq_ "d['error']['message'][:70]")" '[ "$(status)" = 400 ]'
done
# docs/grammars/json.gbnf: the answer, where it finishes, is one JSON object (Python's json reads it)
python3 - "$(dirname "$0")/../docs/grammars/json.gbnf" >"$TMP/gj.json" <<'PY'
import json, sys
print(json.dumps({"prompt": "Once upon a time", "max_tokens": 120, "temperature": 0.8, "seed": 4,
                  "grammar": open(sys.argv[1]).read(), "logit_bias": {"128": 5}}))  # (128: "}", likelier)
PY
curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/gj.json" "$U/v1/completions" >"$TMP/status"
check "grammar json.gbnf: one JSON object ($(jq_ "d['choices'][0]['text'][:60]"))" 'python3 -c "import json,sys; c=json.load(open(sys.argv[1]))[\"choices\"][0]; assert c[\"finish_reason\"] == \"stop\" and isinstance(json.loads(c[\"text\"]), dict), c" "$TMP/body"'
# greedy under a grammar: the server's answer is fitllm run --grammar's (a loop apart from the engine)
G1='root ::= [A-Z] [a-z]+ (" " [a-z]+){2,6} "."'
post "$U" /v1/completions "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"grammar\":$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$G1")}"
SG=$(jq_ "json.dumps(d['choices'][0]['text'])")
RG=$("$BIN" run -m "$SHARED/models/stories260K.gguf" -p "Once upon a time" -n 40 --temp 0 -t 1 --grammar "$G1" --json 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['text']))")
check "greedy under a grammar: the server's $SG is fitllm run's" '[ -n "$SG" ] && [ "$SG" = "$RG" ] && python3 -c "import json,re,sys; assert re.fullmatch(r\"[A-Z][a-z]+( [a-z]+){2,6}[.]\", json.loads(sys.argv[1]))" "$SG"'
errcase "grammar that does not compile" 400 /v1/completions '{"prompt":"a","grammar":"root ::= answer"}'
check "its error names the line, column and rule" 'grep -q "line 1, column 10: rule .answer. is used but not defined" "$TMP/body"'
errcase "grammar and guided_grammar both" 400 /v1/completions '{"prompt":"a","grammar":"root ::= \"a\"","guided_grammar":"root ::= \"a\""}'
errcase "grammar beside guided_regex" 400 /v1/completions '{"prompt":"a","grammar":"root ::= \"a\"","guided_regex":"a"}'
errcase "grammar not a string" 400 /v1/completions '{"prompt":"a","grammar":{"root":"a"}}'
# vLLM's allowed_token_ids: the tokens of " the." only (ids from /tokenize), sampled: each
# generated token (logprobs name them) is the text of one of them
post "$U" /tokenize '{"prompt":" the.","add_special":false}'
AIDS=$(jq_ "json.dumps(d['tokens'])")
post "$U" /v1/completions "{\"prompt\":\"Once\",\"max_tokens\":6,\"temperature\":1,\"seed\":3,\"logprobs\":0,\"allowed_token_ids\":$AIDS}"
cp "$TMP/body" "$TMP/allowed.json"
check "allowed_token_ids: 6 tokens, each one of $AIDS" 'python3 - "$U" "$AIDS" "$TMP/allowed.json" <<'"'"'PY'"'"'
import json, sys, urllib.request
u, ids, r = sys.argv[1], json.loads(sys.argv[2]), json.load(open(sys.argv[3]))
def detok(i):
    q = urllib.request.Request(u + "/detokenize", json.dumps({"tokens": [i]}).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(q))["prompt"]
pieces = {detok(i) for i in ids}
toks = r["choices"][0]["logprobs"]["tokens"]
assert r["usage"]["completion_tokens"] == 6 and len(toks) == 6 and all(t in pieces for t in toks), (pieces, toks)
PY'
# vLLM's include_stop_str_in_output: the same greedy answer, cut at "." before it or after it
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":["."]}'
CUT=$(jq_ "json.dumps(d['choices'][0]['text'])")
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":["."],"include_stop_str_in_output":true}'
check "include_stop_str_in_output: the text ends with its stop string ($CUT)" '[ "$(jq_ "json.dumps(d[\"choices\"][0][\"text\"])")" = "$(python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1]) + \".\"))" "$CUT")" ] && [ "$(jq_ "d[\"choices\"][0][\"finish_reason\"]")" = stop ]'
errcase "include_stop_str_in_output not a boolean" 400 /v1/completions '{"prompt":"a","include_stop_str_in_output":"yes"}'
# vLLM's bad_words: the greedy answer names Lily; with "Lily" banned (its tokens as they are and
# after a space) it names someone else, and with "girl" too it says neither
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0}'
check "bad_words: the answer without them names Lily" '[ "$(jq_ "\"Lily\" in d[\"choices\"][0][\"text\"] and \"girl\" in d[\"choices\"][0][\"text\"]")" = True ]'
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"bad_words":["Lily"]}'
check "bad_words [Lily]: $(jq_ "d['choices'][0]['text'][:50]")" '[ "$(jq_ "\"Lily\" not in d[\"choices\"][0][\"text\"] and \"girl\" in d[\"choices\"][0][\"text\"]")" = True ]'
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"bad_words":["Lily"," girl"]}'
check "bad_words [Lily, girl]: $(jq_ "d['choices'][0]['text'][:50]")" '[ "$(jq_ "\"Lily\" not in d[\"choices\"][0][\"text\"] and \" girl\" not in d[\"choices\"][0][\"text\"]")" = True ]'
errcase "bad_words not a list" 400 /v1/completions '{"prompt":"a","bad_words":"x"}'
errcase "bad_words with an empty word" 400 /v1/completions '{"prompt":"a","bad_words":[""]}'
errcase "bad_words with a word of spaces" 400 /v1/completions '{"prompt":"a","bad_words":["  "]}'
errcase "allowed_token_ids out of the vocabulary" 400 /v1/completions '{"prompt":"a","allowed_token_ids":[5,99999]}'
errcase "allowed_token_ids empty" 400 /v1/completions '{"prompt":"a","allowed_token_ids":[]}'
post "$U" /v1/completions '{"prompt":"a","max_tokens":2,"use_beam_search":false,"include_stop_str_in_output":false,"grammar":null}'
check "vLLM extras at their defaults pass" '[ "$(status)" = 200 ]'
errcase "empty prompt" 400 /v1/completions '{"prompt":""}'
errcase "bad role" 400 /v1/chat/completions '{"messages":[{"role":"wizard","content":"hi"}]}'
errcase "continue_final_message with the generation prompt" 400 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"a"}],"continue_final_message":true}'
errcase "continue_final_message after a user turn" 400 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true,"add_generation_prompt":false}'
errcase "add_generation_prompt not a boolean" 400 /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":1}'
errcase "continue_final_message on completions" 400 /v1/completions '{"prompt":"hi","continue_final_message":true}'
errcase "skip_special_tokens not a boolean" 400 /v1/completions '{"prompt":"hi","skip_special_tokens":"no"}'
errcase "messages not array" 400 /v1/chat/completions '{"messages":"hi"}'
LONG=$(python3 -c "print('Once upon a time, there was a little girl. '*40)")
errcase "prompt over the context" 400 /v1/completions "{\"prompt\":\"$LONG\"}"
check "context error code" '[ "$(jq_ "d[\"error\"][\"code\"]")" = context_length_exceeded ]'
printf '{"prompt":"bad \xff\xfe utf8"}' >"$TMP/bad.json"
curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/bad.json" "$U/v1/completions" >"$TMP/status"
check "invalid UTF-8 -> 400" '[ "$(status)" = 400 ] && grep -q UTF-8 "$TMP/body"'
head -c 2000000 /dev/zero | tr '\0' 'a' >"$TMP/big"
curl -s -o "$TMP/body" -w '%{http_code}' --data-binary @"$TMP/big" "$U/v1/completions" >"$TMP/status"
check "body too large -> 413" '[ "$(status)" = 413 ]'
check "unknown path -> 404" '[ "$(curl -s -o /dev/null -w "%{http_code}" $U/v1/nope)" = 404 ]'
check "wrong method -> 405" '[ "$(curl -s -o /dev/null -w "%{http_code}" $U/v1/completions)" = 405 ]'

# stream_options.include_usage adds a last chunk with usage
curl -sN -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":5,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' "$U/v1/completions" >"$TMP/sse3"
check "include_usage chunk" 'grep -q "\"completion_tokens\":5" "$TMP/sse3"'

# prefix-cache hits in usage.prompt_tokens_details.cached_tokens (whole blocks of 16, at least one
# token computed), cache_salt keeping tenants apart, truncate_prompt_tokens keeping the last k
cat >"$TMP/salt.py" <<'PY'
import json, sys, urllib.request
u = sys.argv[1]
def post(path, body):
    try:
        r = urllib.request.urlopen(urllib.request.Request(u + path, json.dumps(body).encode(), {"Content-Type": "application/json"}))
        return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
P = "The purple turtle sang a quiet song to the sleepy moon while the stars danced over the old red barn"
def gen(**kw):
    st, d = post("/v1/completions", dict(prompt=P, max_tokens=4, temperature=0, **kw))
    assert st == 200, d
    return d
a = gen(); n = a["usage"]["prompt_tokens"]; full = (n - 1) // 16 * 16
assert n > 32 and a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, a["usage"]
assert gen()["usage"]["prompt_tokens_details"]["cached_tokens"] == full
assert gen(cache_salt="alice")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
assert gen(cache_salt="alice")["usage"]["prompt_tokens_details"]["cached_tokens"] == full
assert gen(cache_salt="bob")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
st, c = post("/v1/chat/completions", dict(messages=[{"role": "user", "content": P}], max_tokens=2))
assert st == 200 and "cached_tokens" in c["usage"]["prompt_tokens_details"], c
ids = post("/tokenize", {"prompt": P})[1]["tokens"]
t = gen(truncate_prompt_tokens=5)
s, d = post("/v1/completions", dict(prompt=ids[-5:], max_tokens=4, temperature=0))
assert t["usage"]["prompt_tokens"] == 5 and t["choices"][0]["text"] == d["choices"][0]["text"], (t, d)
assert gen(truncate_prompt_tokens=-1)["usage"]["prompt_tokens"] == n and gen(truncate_prompt_tokens=1000)["usage"]["prompt_tokens"] == n
for bad in ({"truncate_prompt_tokens": 0}, {"truncate_prompt_tokens": -2}, {"cache_salt": ""}, {"cache_salt": 5}):
    st, d = post("/v1/completions", dict(prompt=P, max_tokens=1, **bad))
    assert st == 400 and d["error"]["message"], (bad, st, d)
print("cached", full, "of", n)
PY
python3 "$TMP/salt.py" "$URL_A" >"$TMP/salt.txt" 2>&1; rc=$?
cat "$TMP/salt.txt"
check "cached_tokens, cache_salt, truncate_prompt_tokens" '[ $rc = 0 ]'
post "$URL_A" /v1/completions '{"prompt":"a","max_tokens":2,"priority":1}'
check "FCFS server: priority -> 400 naming the policy" '[ "$(status)" = 400 ] && grep -q "scheduling-policy priority" "$TMP/body"'
kill -TERM "$PID_A"; wait "$PID_A"; rc=$?
check "SIGTERM -> exit 0" '[ $rc = 0 ]'
# cancellation on disconnect frees the blocks (seen through /metrics): a slower model and a
# long generation (ignore_eos) that the client abandons after 0.3 s
MODEL=$SHARED/models/synth256/synth256-F32.gguf
start_server C -c 1024
U=$URL_C
# n = 8 samples x 1000 tokens take well over a second even on a fast idle machine (one sample
# alone runs at ~2500 tokens/s here), so the client always leaves mid-generation
curl -sN --max-time 0.3 -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":1000,"n":8,"temperature":0.8,"ignore_eos":true,"stream":true}' "$U/v1/completions" >"$TMP/partial" 2>&1
got=$(grep -c '^data: {' "$TMP/partial")
freed=no
for _ in $(seq 1 50); do
  m=$(curl -s "$U/metrics")
  used=$(echo "$m" | sed -n 's/^fitllm_kv_blocks_used \(.*\)/\1/p'); canc=$(echo "$m" | sed -n 's/^fitllm_requests_total{outcome="cancelled"} \(.*\)/\1/p')
  if [ "$used" = 0 ] && [ "${canc:-0}" -ge 1 ]; then freed=yes; break; fi
  sleep 0.1
done
check "client disconnect (after $got of 8000 chunks) cancels and frees KV blocks" '[ $freed = yes ] && [ "$got" -lt 7200 ]'
m=$(curl -s "$U/metrics")
echo "$m" >"$TMP/metrics.txt"
cat >"$TMP/prom.py" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
vals = {}
for l in t.splitlines():
    if l.startswith("#"):
        assert re.fullmatch(r"# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+", l), l
        continue
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_]+="(?:[^"\\]|\\.)*"(?:,[a-zA-Z_]+="(?:[^"\\]|\\.)*")*\})? (\S+)', l)
    assert m, l
    float(m.group(3))
    vals[m.group(1) + (m.group(2) or "")] = float(m.group(3))
# vLLM's and llama-server's names say what fitllm's do (vLLM's labelled with the model's name)
vals.update({k.split("{")[0]: v for k, v in list(vals.items()) if k.startswith("vllm:") and k.count("{model_name=") and "le=" not in k})
assert vals['vllm:prompt_tokens_total'] == vals["fitllm_prompt_tokens_total"] == vals["llamacpp:prompt_tokens_total"]
assert vals['vllm:generation_tokens_total'] == vals["fitllm_generation_tokens_total"] == vals["llamacpp:tokens_predicted_total"]
assert vals['vllm:time_to_first_token_seconds_count'] == vals["fitllm_time_to_first_token_seconds_count"]
assert vals["llamacpp:n_decode_total"] == vals["fitllm_engine_steps_total"]
# choices by finish reason, vLLM's request_success_total as fitllm's: this server ran the one
# request above, its 8 choices cut by the client's leaving
for r in ("stop", "length", "abort", "error"):
    assert vals['vllm:request_success_total{model_name="%s",finished_reason="%s"}' % (sys.argv[2], r)] == vals['fitllm_choices_finished_total{reason="%s"}' % r], r
assert [vals['fitllm_choices_finished_total{reason="%s"}' % r] for r in ("stop", "length", "abort", "error")] == [0, 0, 8, 0]
PY
check "metrics: every line in the exposition format; vLLM's and llama-server's names agree with fitllm's" 'python3 "$TMP/prom.py" "$TMP/metrics.txt" "$(curl -s "$U/v1/models" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"data\"][0][\"id\"])")"'
check "metrics has histograms, KV and memory gauges" 'echo "$m" | grep -q "fitllm_time_to_first_token_seconds_bucket" && echo "$m" | grep -q "fitllm_kv_blocks_free" && echo "$m" | grep -q "fitllm_memory_bytes{category=\"kv\"}" && echo "$m" | grep -q fitllm_prefix_cache_hit_tokens_total'
kill -TERM "$PID_C"; wait "$PID_C"

# a random llama's tokens make arbitrary bytes: the responses stay well-formed UTF-8 (U+FFFD)
"$BIN" synth --n-embd 64 --n-layer 1 --n-head 2 --n-ff 128 --n-vocab 300 --type F32 -o "$TMP/tiny.gguf" >/dev/null
MODEL=$TMP/tiny.gguf
start_server D -c 256 --max-logprobs 3
curl -s -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":48,"temperature":1.0,"seed":7}' "$URL_D/v1/completions" >"$TMP/rnd.json"
curl -sN --max-time 60 -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":48,"temperature":1.0,"seed":7,"stream":true}' "$URL_D/v1/completions" >"$TMP/rnd.sse"
cat >"$TMP/rnd.py" <<'PY'
import json, sys
full = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))["choices"][0]["text"]  # strict UTF-8
ev = [json.loads(l[6:]) for l in open(sys.argv[2], "rb").read().decode("utf-8").splitlines() if l.startswith("data: {")]
assert ev[-1]["choices"][0]["finish_reason"] == "length", ev[-1]
assert "".join(e["choices"][0]["text"] for e in ev) == full
PY
check "random bytes -> valid UTF-8 JSON; the stream (split characters too) ends and equals the whole text" 'python3 "$TMP/rnd.py" "$TMP/rnd.json" "$TMP/rnd.sse"'
python3 "$(dirname "$0")/serve_logprobs.py" "$URL_D" --bytes >"$TMP/lpb.txt" 2>&1; rc=$?
cat "$TMP/lpb.txt"
check "logprobs of byte tokens (tests/serve_logprobs.py --bytes)" '[ $rc = 0 ]'
post "$URL_D" /v1/completions '{"prompt":"a","max_tokens":2,"logprobs":4}'
check "--max-logprobs 3: logprobs 4 -> 400 naming the limit" '[ "$(status)" = 400 ] && grep -q "0\.\.3" "$TMP/body"'
# this vocabulary has no "▁": each space is 3 byte tokens, more ids than the prompt has bytes;
# the text prompt must give what its ids (from `fitllm run --json`) give (the server had read
# past the ids it tokenized into a buffer of bytes + 8)
IDS=$("$BIN" run -m "$MODEL" -p "Once upon a time" -n 1 --temp 0 --json 2>/dev/null | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)['prompt_tokens']))")
post "$URL_D" /v1/completions '{"prompt":"Once upon a time","max_tokens":12,"temperature":0}'; TXT_A=$(cat "$TMP/body"); PT_A=$(jq_ 'd["usage"]["prompt_tokens"]')
post "$URL_D" /v1/completions "{\"prompt\":$IDS,\"max_tokens\":12,\"temperature\":0}"; TXT_B=$(cat "$TMP/body")
check "a prompt of more ids than bytes ($PT_A ids, 16 bytes) gives what its ids give" '[ "$PT_A" -gt 24 ] && [ "$(echo "$TXT_A" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"choices\"][0][\"text\"])")" = "$(echo "$TXT_B" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"choices\"][0][\"text\"])")" ]'
kill -TERM "$PID_D"; wait "$PID_D"
MODEL=$SHARED/models/stories260K.gguf

# auth and a full queue
start_server B -c 1024 --api-key sekrit --max-seqs 1 --max-queue 1 --max-logprobs -1
U=$URL_B
post "$U" /v1/completions '{"prompt":"a","max_tokens":2}'
check "no key -> 401" '[ "$(status)" = 401 ]'
post "$U" /v1/completions '{"prompt":"a","max_tokens":2}' -H 'Authorization: Bearer wrong'
check "wrong key -> 401" '[ "$(status)" = 401 ]'
post "$U" /v1/completions '{"prompt":"a","max_tokens":2}' -H 'Authorization: Bearer sekrit'
check "right key -> 200" '[ "$(status)" = 200 ]'
post "$U" /tokenize '{"prompt":"a"}'
check "tokenize without the key -> 401" '[ "$(status)" = 401 ]'
post "$U" /v1/messages '{"max_tokens":2,"messages":[{"role":"user","content":"a"}]}' -H 'x-api-key: wrong'
check "Anthropic's x-api-key, wrong -> 401, in Anthropic's error shape" '[ "$(status)" = 401 ] && [ "$(jq_ "d[\"type\"], d[\"error\"][\"type\"]")" = "error authentication_error" ]'
post "$U" /v1/messages '{"max_tokens":2,"messages":[{"role":"user","content":"a"}]}' -H 'x-api-key: sekrit'
check "Anthropic's x-api-key, right -> 200" '[ "$(status)" = 200 ] && [ "$(jq_ "d[\"type\"]")" = message ]'
post "$U" /v1/completions '{"prompt":"a","max_tokens":2,"logprobs":0}' -H 'Authorization: Bearer sekrit'
check "--max-logprobs -1: logprobs -> 400" '[ "$(status)" = 400 ] && grep -q "logprobs are off" "$TMP/body"'
CPIDS=()
for i in 1 2 3 4 5 6; do
  curl -s -o /dev/null -D "$TMP/h$i" -H 'Authorization: Bearer sekrit' -H 'Content-Type: application/json' \
    -d '{"prompt":"Once","max_tokens":1000,"temperature":0.8,"ignore_eos":true}' "$U/v1/completions" &
  CPIDS+=($!)
done
wait "${CPIDS[@]}"
check "full queue -> 503 with Retry-After" 'grep -l "503" $TMP/h* >/dev/null && grep -qi "Retry-After" $(grep -l " 503" $TMP/h* | head -1)'
kill -INT "$PID_B"; wait "$PID_B"; rc=$?
check "SIGINT -> exit 0" '[ $rc = 0 ]'

# --scheduling-policy priority with one sequence: a request of higher priority sent while a long
# one streams preempts it, finishes first, and the long one still finishes whole
start_server P -c 2048 --max-seqs 1 --scheduling-policy priority
cat >"$TMP/prio.py" <<'PY'
import json, sys, threading, time, urllib.request
u = sys.argv[1]
def req(body):
    return urllib.request.urlopen(urllib.request.Request(u + "/v1/completions", json.dumps(body).encode(),
                                                         {"Content-Type": "application/json"}), timeout=120)
t = {}; first = threading.Event(); n_low = [0]
def low():
    with req({"prompt": "Once", "max_tokens": 1800, "ignore_eos": True, "priority": 5, "stream": True,
              "stream_options": {"include_usage": True}}) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]": continue
            first.set()
            d = json.loads(line[6:])
            if d.get("usage"): n_low[0] = d["usage"]["completion_tokens"]
    t["low"] = time.monotonic()
th = threading.Thread(target=low); th.start()
assert first.wait(60), "the long request never streamed"
with req({"prompt": "Lily", "max_tokens": 8, "priority": -5}) as r:
    hi = json.load(r)
t["high"] = time.monotonic()
th.join()
m = urllib.request.urlopen(u + "/metrics").read().decode()
pre = [float(l.split()[-1]) for l in m.splitlines() if l.startswith("fitllm_preemptions_total")]
print("high done %.3f s before low; low generated %d; preemptions %s" % (t["low"] - t["high"], n_low[0], pre))
sys.exit(0 if t["high"] < t["low"] and n_low[0] == 1800 and hi["usage"]["completion_tokens"] == 8 and pre and pre[0] >= 1 else 1)
PY
python3 "$TMP/prio.py" "$URL_P" >"$TMP/prio.txt" 2>&1; rc=$?
cat "$TMP/prio.txt"
check "priority: the later, higher-priority request preempts the running one and finishes first" '[ $rc = 0 ]'
post "$URL_P" /v1/completions '{"prompt":"a","max_tokens":2,"priority":1.5}'
check "priority must be an integer" '[ "$(status)" = 400 ]'
kill -TERM "$PID_P"; wait "$PID_P"

# --guide-mem: the output constraints' budget, enforced.  A grammar alone larger than it -> 400;
# one whose token walk outgrows what is left -> finish "error" with the reason; JSON mode fits;
# /metrics shows the budget and the refusals
start_server G -c 256 --guide-mem 12K
U=$URL_G
errcase "--guide-mem 12K: a grammar of 1000 alternatives" 400 /v1/completions "{\"prompt\":\"a\",\"grammar\":\"root ::= $(python3 -c 'print(" | ".join(chr(92) + "\"w%d" % i + chr(92) + "\"" for i in range(1000)))')\"}"
check "  ... says it needs more than guide_mem" 'grep -q "needs more memory than guide_mem (12.00 KiB)" "$TMP/body"'
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":20,"grammar":"root ::= (\"Yes\" | \"No\") \", \" [a-z]+"}'
check "--guide-mem 12K: a grammar whose walk outgrows it ends with finish_reason error and why" '[ "$(status)" = 200 ] && [ "$(jq_ "d[\"choices\"][0][\"finish_reason\"]")" = error ] && jq_ "d[\"choices\"][0][\"error\"]" | grep -q "outgrew what is left of guide_mem (12.00 KiB)"'
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"response_format":{"type":"json_object"}}'
check "--guide-mem 12K: JSON mode fits" '[ "$(status)" = 200 ] && [ "$(jq_ "d[\"choices\"][0][\"finish_reason\"]")" != error ]'
m=$(curl -s "$U/metrics")
check "metrics: the guide budget and its refusals" 'echo "$m" | grep -q "fitllm_memory_budget_bytes{category=\"guide\"} 12288" && echo "$m" | grep -Eq "fitllm_memory_refused_total\{category=\"guide\"\} [1-9]" && echo "$m" | grep -q "fitllm_memory_bytes{category=\"guide\"} 0"'
kill -TERM "$PID_G"; wait "$PID_G"
# constraints off (--guide-mem 0): a grammar is refused, but tool_choice auto goes without its lazy
# grammar (the calls are read as they come), the same answer as tool_choice none
start_server G0 -c 1024 --guide-mem 0
U=$URL_G0
TB='"messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0,"tools":[{"type":"function","function":{"name":"f"}}]'
post "$U" /v1/chat/completions "{$TB,\"tool_choice\":\"none\"}"; NONE=$(jq_ 'd["choices"][0]["message"]["content"]')
post "$U" /v1/chat/completions "{$TB}"
check "--guide-mem 0: tool_choice auto still answers, without the calls' grammar" '[ "$(status)" = 200 ] && [ "$(jq_ "d[\"choices\"][0][\"message\"][\"content\"]")" = "$NONE" ]'
post "$U" /v1/chat/completions "{$TB,\"grammar\":\"root ::= \\\"x\\\"\"}"
check "--guide-mem 0: a grammar -> 400" '[ "$(status)" = 400 ]'
kill -TERM "$PID_G0"; wait "$PID_G0"

# --net-mem: the server's buffers, planned and enforced.  Requests fit; a body that can never be
# buffered -> 413 naming the budget; /metrics shows it; below 64 KiB is refused at start
start_server NM -c 256 --net-mem 96K
U=$URL_NM
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":8,"logprobs":5}'
check "--net-mem 96K: a request with logprobs fits" '[ "$(status)" = 200 ]'
BIG=$(python3 -c 'import json; print(json.dumps({"prompt": "Once upon a time " * 4000, "max_tokens": 2}))')
post "$U" /v1/completions "$BIG"
check "--net-mem 96K: a 68 KB body -> 413 naming the budget" '[ "$(status)" = 413 ] && grep -q "net-mem 98304" "$TMP/body"'
post "$U" /v1/completions '{"prompt":"Once upon a time","max_tokens":8}'
check "--net-mem 96K: the next request fits again" '[ "$(status)" = 200 ]'
check "--net-mem: /metrics shows the budget" 'curl -s "$U/metrics" | grep -q "fitllm_memory_budget_bytes{category=\"net\"} 98304"'
# libmicrohttpd's pool of each open connection (32 KiB) is charged to net: /metrics' own shows;
# three idle connections hold 96K, so a fourth finds no room (503), and after they close it does
python3 - "${U##*:}" <<'PY' >"$TMP/conn.txt" 2>&1
import socket, sys, time, urllib.error, urllib.request
port = int(sys.argv[1])
def get(path):
    try:
        r = urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10)
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
st, m = get("/metrics")
net = [int(l.split()[-1]) for l in m.splitlines() if l.startswith('fitllm_memory_bytes{category="net"}')][0]
print("net with one connection open:", net)
def until(want, seconds=10):  # (the server sees connections open and close a moment later: under load, longer)
    t = time.time() + seconds
    while True:
        st, b = get("/health")
        if st == want or time.time() > t:
            return st, b
        time.sleep(0.1)
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
st1, b1 = until(503)
for c in idle: c.close()
st2, _ = until(200)
print(st1, st2, b1)
sys.exit(0 if net >= 32768 and st1 == 503 and "net-mem" in b1 and st2 == 200 else 1)
PY
rc=$?; CONN=$(tail -1 "$TMP/conn.txt" | head -c 60)
check "--net-mem 96K: connections' pools in net; the fourth open connection 503, then 200 ($CONN)" '[ $rc = 0 ]'
kill -TERM "$PID_NM"; wait "$PID_NM"
out=$("$BIN" serve -m "$MODEL" --port 0 -t 1 --net-mem 1K 2>&1); rc=$?
check "--net-mem 1K: refused at start" '[ $rc = 2 ] && echo "$out" | grep -q "below 64 KiB"'

# random valid and invalid requests, clients leaving early, a KV pool small enough to preempt,
# priorities that reorder and preempt
# (tests/serve_stress.py): no 5xx, no crash, every block back at the end, exit 0 on SIGTERM
start_server E -c 256 --max-seqs 4 --kv-mem 2M --scheduling-policy priority --embeddings
PORT_E=${URL_E##*:}
python3 "$(dirname "$0")/serve_stress.py" "$PORT_E" "${FL_STRESS_REQUESTS:-300}" 7 > "$TMP/stress.txt" 2>&1; rc=$?
cat "$TMP/stress.txt"
check "stress: every answer a 200 or a 4xx with an error object, blocks freed" '[ $rc = 0 ]'
kill -TERM "$PID_E"; wait "$PID_E"; rc=$?
check "stress: the server exits 0 after it" '[ $rc = 0 ]'
check "stress: no sanitizer report" '! grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$TMP/E.log"'

echo "$passes passed, $fails failed"
[ $fails = 0 ]
