#!/usr/bin/env bash
# The official `openai` npm client (v6, Node 20) against `fitllm serve` on stories260K:
# one chat completion (plain and with logprobs), one streamed completion, and the Responses API
# (create, stream, retrieve, previous_response_id, delete).  Usage: cli_openai.sh FITLLM_BIN SHARED_DIR
set -u
BIN=$1; SHARED=$2
MODEL=$SHARED/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: node/npm not installed"; exit 77; }
CLIENT_DIR=$(cd "$(dirname "$BIN")" && pwd)/openai-client
if [ ! -d "$CLIENT_DIR/node_modules/openai" ]; then
  mkdir -p "$CLIENT_DIR"
  npm install --prefix "$CLIENT_DIR" --no-audit --no-fund --loglevel=error openai@6.49.0 >/dev/null 2>&1 \
    || { echo "FAIL: npm install openai@6.49.0 failed"; exit 1; }
fi
TMP=$(mktemp -d)
"$BIN" serve -m "$MODEL" --port 0 -t 1 -c 256 --api-key test-key 2>"$TMP/log" &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do
  PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/log"); [ -n "$PORT" ] && break; sleep 0.1
done
[ -n "$PORT" ] || { cat "$TMP/log"; exit 1; }
cat >"$TMP/client.mjs" <<JS
import OpenAI from "$CLIENT_DIR/node_modules/openai/index.mjs";
const client = new OpenAI({ baseURL: "http://127.0.0.1:$PORT/v1", apiKey: "test-key" });
let fails = 0, passes = 0;
function check(name, cond) { if (cond) { passes++; console.log("ok   - " + name); } else { fails++; console.log("FAIL - " + name); } }
const models = await client.models.list();
check("models.list", models.data.length === 1);
const chat = await client.chat.completions.create({
  model: models.data[0].id, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 16, temperature: 0 });
check("chat completion has content", typeof chat.choices[0].message.content === "string" && chat.choices[0].message.content.length > 0);
check("chat usage", chat.usage.completion_tokens === 16 && chat.usage.prompt_tokens > 0);
const lpc = await client.chat.completions.create({
  model: models.data[0].id, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 8, temperature: 0,
  logprobs: true, top_logprobs: 3 });
const recs = lpc.choices[0].logprobs.content;
check("chat logprobs: a record per token, 3 alternatives each, the text spelled out",
  recs.length === 8 && recs.every(r => r.top_logprobs.length === 3 && r.logprob <= 0 && r.logprob === r.top_logprobs[0].logprob)
  && recs.map(r => r.token).join("") === lpc.choices[0].message.content);
const stream = await client.completions.create({
  model: models.data[0].id, prompt: "Once upon a time", max_tokens: 24, temperature: 0, stream: true });
let text = "", chunks = 0, finish = null;
for await (const part of stream) { text += part.choices[0].text; chunks++; if (part.choices[0].finish_reason) finish = part.choices[0].finish_reason; }
const full = await client.completions.create({ model: models.data[0].id, prompt: "Once upon a time", max_tokens: 24, temperature: 0 });
check("streamed completion in several chunks", chunks > 3);
check("streamed text equals the non-streamed text", text === full.choices[0].text && text.length > 20);
check("finish_reason length", finish === "length");
try { await client.completions.create({ model: "x", prompt: "", max_tokens: 3 }); check("empty prompt rejected", false); }
catch (e) { check("empty prompt rejected with 400", e.status === 400); }
// the Responses API (client.responses): output_text (the SDK's own helper), a stream of typed
// events, retrieve, a conversation by previous_response_id, delete
const resp = await client.responses.create({ model: models.data[0].id, input: "Once upon a time", max_output_tokens: 16, temperature: 0 });
const same = await client.chat.completions.create({
  model: models.data[0].id, messages: [{ role: "user", content: "Once upon a time" }], max_tokens: 16, temperature: 0 });
check("responses.create: output_text is the chat completion's text",
  resp.object === "response" && resp.output_text === same.choices[0].message.content && resp.usage.output_tokens === 16);
const rstream = await client.responses.create({ model: models.data[0].id, input: "Once upon a time", max_output_tokens: 16, temperature: 0, stream: true });
let rtext = "", types = [], final = null;
for await (const ev of rstream) {
  types.push(ev.type);
  if (ev.type === "response.output_text.delta") rtext += ev.delta;
  if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
}
check("responses stream: typed events, the deltas add up to output_text",
  types[0] === "response.created" && final !== null && rtext === resp.output_text && final.output[0].content[0].text === rtext);
const got = await client.responses.retrieve(resp.id);
check("responses.retrieve", got.id === resp.id && got.output[0].content[0].text === resp.output_text);
const next = await client.responses.create({ model: models.data[0].id, previous_response_id: resp.id, input: "And then?", max_output_tokens: 8, temperature: 0 });
check("responses: previous_response_id", next.previous_response_id === resp.id && next.usage.input_tokens > resp.usage.input_tokens + resp.usage.output_tokens);
await client.responses.delete(resp.id);
try { await client.responses.retrieve(resp.id); check("deleted response gone", false); }
catch (e) { check("deleted response: 404", e.status === 404); }
console.log(passes + " passed, " + fails + " failed");
process.exit(fails ? 1 : 0);
JS
node "$TMP/client.mjs"
