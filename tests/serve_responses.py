#!/usr/bin/env python3
"""OpenAI's Responses API (/v1/responses) against a running `fitllm serve` of stories260K started
with --responses-mem 24K: each response is checked against the chat completion of the same
conversation (greedy), streamed and not; previous_response_id, the store (GET, DELETE,
input_items, its limit), instructions, text.format, function calls, reasoning, logprobs, and the
refusals.
usage: serve_responses.py URL      exit 1 on a failure"""
import json, os, re, sys, urllib.error, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Client  # noqa: E402

URL = sys.argv[1]
client = Client(URL)
check, post = client.check, client.post


def call(method, path):
    req = urllib.request.Request(URL + path, method=method)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stream(body):
    return client.events("/v1/responses", body)


chat = client.chat


def text_of(resp):
    return "".join(p["text"] for it in resp["output"] if it["type"] == "message" for p in it["content"])


def strip_ids(x):
    if isinstance(x, dict):
        return {k: strip_ids(v) for k, v in x.items() if k not in ("id", "item_id", "sequence_number")}
    if isinstance(x, list):
        return [strip_ids(v) for v in x]
    return x


Q1, Q2 = "Tell me about Lily.", "What did she do next?"

# one turn: the chat completion's text, usage and finish
st, r1 = post("/v1/responses", {"input": Q1, "max_output_tokens": 24, "temperature": 0})
c1 = chat([{"role": "user", "content": Q1}], max_tokens=24)
check("a response: its text is the chat completion's, usage in the Responses' shape",
      st == 200 and r1["object"] == "response" and re.fullmatch(r"resp_[0-9a-f]{32}", r1["id"]) is not None
      and text_of(r1) == c1["choices"][0]["message"]["content"]
      and r1["usage"]["input_tokens"] == c1["usage"]["prompt_tokens"] and r1["usage"]["output_tokens"] == c1["usage"]["completion_tokens"]
      and r1["usage"]["total_tokens"] == r1["usage"]["input_tokens"] + r1["usage"]["output_tokens"]
      and r1["usage"]["output_tokens_details"]["reasoning_tokens"] == 0)
fin = c1["choices"][0]["finish_reason"]
check("status from the finish (%s): completed, or incomplete for max_output_tokens" % fin,
      (fin == "stop" and r1["status"] == "completed" and r1["incomplete_details"] is None)
      or (fin == "length" and r1["status"] == "incomplete" and r1["incomplete_details"] == {"reason": "max_output_tokens"}
          and r1["output"][-1]["status"] == "incomplete"))
check("the request's settings are repeated",
      r1["max_output_tokens"] == 24 and r1["temperature"] == 0 and r1["store"] is True and r1["tools"] == []
      and r1["tool_choice"] == "auto" and r1["text"] == {"format": {"type": "text"}} and r1["previous_response_id"] is None)
st, g = call("GET", "/v1/responses/" + r1["id"])
check("GET /v1/responses/{id}: the same object", st == 200 and g == r1)

# ill-formed bytes (byte tokens <0xFF>, id 258, forced): U+FFFD in the reply, and so in the store
st, rb = post("/v1/responses", {"input": Q1, "max_output_tokens": 2, "temperature": 0, "logit_bias": {"258": 100}})
st2, gb = call("GET", "/v1/responses/" + rb["id"])
check("ill-formed output bytes: U+FFFD in the reply, and the stored response is the same",
      st == 200 and text_of(rb) == "\ufffd\ufffd" and st2 == 200 and gb == rb)

# instructions: a system message, for this request only
st, ri = post("/v1/responses", {"input": Q1, "instructions": "You tell short stories.", "max_output_tokens": 24, "temperature": 0})
ci = chat([{"role": "system", "content": "You tell short stories."}, {"role": "user", "content": Q1}], max_tokens=24)
check("instructions: the chat completion with that system message",
      st == 200 and text_of(ri) == ci["choices"][0]["message"]["content"] and ri["instructions"] == "You tell short stories."
      and ri["usage"]["input_tokens"] == ci["usage"]["prompt_tokens"] and ri["usage"]["input_tokens"] > r1["usage"]["input_tokens"])

# previous_response_id: the conversation goes on (the earlier instructions are not carried)
st, r2 = post("/v1/responses", {"input": Q2, "previous_response_id": ri["id"], "max_output_tokens": 24, "temperature": 0})
c2 = chat([{"role": "user", "content": Q1}, {"role": "assistant", "content": text_of(ri)}, {"role": "user", "content": Q2}], max_tokens=24)
check("previous_response_id: the chat completion of the whole conversation, without the old instructions",
      st == 200 and text_of(r2) == c2["choices"][0]["message"]["content"] and r2["previous_response_id"] == ri["id"]
      and r2["usage"]["input_tokens"] == c2["usage"]["prompt_tokens"] and r2["instructions"] is None)
check("previous_response_id: the prefix cache serves the earlier turn (%d cached tokens)" % r2["usage"]["input_tokens_details"]["cached_tokens"],
      r2["usage"]["input_tokens_details"]["cached_tokens"] >= r1["usage"]["input_tokens"] // 2)

st, it = post("/v1/responses/input_tokens", {"input": Q2, "previous_response_id": ri["id"]})
check("input_tokens: the prompt's tokens, as the response counted them (%s)" % it,
      st == 200 and it == {"object": "response.input_tokens", "input_tokens": r2["usage"]["input_tokens"]})

# input as items, with an assistant turn given back by the client (stateless)
items = [{"role": "user", "content": Q1},
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text_of(ri)}]},
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": Q2}]}]
st, r3 = post("/v1/responses", {"input": items, "max_output_tokens": 24, "temperature": 0})
check("input items: the same conversation gives the same text", st == 200 and text_of(r3) == text_of(r2))
st, page = call("GET", "/v1/responses/%s/input_items" % r3["id"])
check("input_items: the three, newest first, each with an id",
      st == 200 and page["object"] == "list" and [x["role"] for x in page["data"]] == ["user", "assistant", "user"]
      and page["data"][0]["content"][0]["text"] == Q2 and all(x.get("id") for x in page["data"]) and page["has_more"] is False
      and page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][-1]["id"])
st, p1 = call("GET", "/v1/responses/%s/input_items?order=asc&limit=2" % r3["id"])
st2, p2 = call("GET", "/v1/responses/%s/input_items?order=asc&limit=2&after=%s" % (r3["id"], p1.get("last_id")))
check("input_items: pages (order=asc, limit, after)",
      st == 200 and st2 == 200 and p1["has_more"] is True and p2["has_more"] is False
      and [x["id"] for x in p1["data"] + p2["data"]] == [x["id"] for x in reversed(page["data"])])

# streamed: the events, in order, add up to the non-streamed response
ev = stream({"input": Q2, "previous_response_id": ri["id"], "max_output_tokens": 24, "temperature": 0})
names = [n for n, _ in ev]
check("stream: every event's name is its data's type, sequence numbers 0, 1, ...",
      all(n == d["type"] for n, d in ev) and [d["sequence_number"] for _, d in ev] == list(range(len(ev))))
last = ev[-1][1]["response"]
check("stream: created, in_progress, the message item (added, part added, deltas, done), then %s" % names[-1],
      names[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
      and names[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
      and names[-1] == {"completed": "response.completed", "incomplete": "response.incomplete"}[r2["status"]]
      and set(names[4:-4]) == {"response.output_text.delta"} and ev[0][1]["response"]["status"] == "in_progress")
deltas = "".join(d["delta"] for n, d in ev if n == "response.output_text.delta")
mid = ev[2][1]["item"]["id"]
check("stream: the deltas add up to the non-streamed text; one item id throughout",
      deltas == text_of(r2) and text_of(last) == deltas and all(d.get("item_id", mid) == mid for _, d in ev[2:-1])
      and last["output"][0]["id"] == mid)
check("stream: the last event's response is the non-streamed one (ids, time and cached tokens aside)",
      strip_ids(dict(last, created_at=0, usage=dict(last["usage"], input_tokens_details=0)))
      == strip_ids(dict(r2, created_at=0, usage=dict(r2["usage"], input_tokens_details=0))))
st, g = call("GET", "/v1/responses/" + last["id"])
check("stream: stored as its last event gives it", st == 200 and g == last)

# store false; DELETE
st, rn = post("/v1/responses", {"input": Q1, "max_output_tokens": 4, "store": False})
st2, _ = call("GET", "/v1/responses/" + rn["id"])
check("store false: answered, not kept (GET 404)", st == 200 and rn["store"] is False and st2 == 404)
st, d = call("DELETE", "/v1/responses/" + r1["id"])
st2, _ = call("GET", "/v1/responses/" + r1["id"])
st3, e3 = post("/v1/responses", {"input": Q2, "previous_response_id": r1["id"]})
check("DELETE: deleted, then GET and previous_response_id 404",
      st == 200 and d == {"id": r1["id"], "object": "response.deleted", "deleted": True} and st2 == 404 and st3 == 404
      and "not found" in e3["error"]["message"])

# text.format
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["name", "age"], "additionalProperties": False}
st, rj = post("/v1/responses", {"input": Q1, "max_output_tokens": 60, "temperature": 0,
                                "text": {"format": {"type": "json_schema", "name": "kid", "schema": SCHEMA, "strict": True}}})
cj = chat([{"role": "user", "content": Q1}], max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "kid", "schema": SCHEMA, "strict": True}})
v = json.loads(text_of(rj)) if st == 200 else None
check("text.format json_schema: the schema's JSON (%s), as chat's response_format gives it" % text_of(rj) if st == 200 else "text.format",
      st == 200 and set(v) == {"name", "age"} and type(v["age"]) is int and text_of(rj) == cj["choices"][0]["message"]["content"]
      and rj["text"]["format"]["type"] == "json_schema")

# function calls: tools in the flat form, tool_choice required; the call's output as the next input
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                          "required": ["city", "days"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
body = {"input": "What is the weather in Paris?", "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False,
        "max_output_tokens": 120, "temperature": 0}
st, rt = post("/v1/responses", body)
ct = chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=[CHAT_WEATHER], tool_choice="required",
          parallel_tool_calls=False, max_tokens=120)
fc = [it for it in rt.get("output", []) if it["type"] == "function_call"]
cc = ct["choices"][0]["message"].get("tool_calls") or []
check("tool_choice required: a function_call item, the chat completion's call",
      st == 200 and len(fc) == 1 and fc[0]["name"] == "get_weather" and fc[0]["status"] == "completed"
      and re.fullmatch(r"call_[0-9a-f]{24}", fc[0]["call_id"]) is not None and len(cc) == 1
      and json.loads(fc[0]["arguments"]) == json.loads(cc[0]["function"]["arguments"]) and rt["tools"] == [WEATHER])
ev = stream(body)
adds = [d for n, d in ev if n == "response.output_item.added"]
args = "".join(d["delta"] for n, d in ev if n == "response.function_call_arguments.delta")
done = [d for n, d in ev if n == "response.function_call_arguments.done"]
check("tool call streamed: the item added with its name, the arguments as deltas, done",
      len(adds) == 1 and adds[0]["item"]["type"] == "function_call" and adds[0]["item"]["name"] == "get_weather"
      and len(done) == 1 and done[0]["arguments"] == args and json.loads(args) == json.loads(fc[0]["arguments"] if fc else "null")
      and ev[-1][0] == "response.completed")
if fc:
    nxt = {"previous_response_id": rt["id"], "tools": [WEATHER], "max_output_tokens": 16, "temperature": 0,
           "input": [{"type": "function_call_output", "call_id": fc[0]["call_id"], "output": "sunny, 21 C"}]}
    st, ro = post("/v1/responses", nxt)
    co = chat([{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": fc[0]["call_id"], "type": "function",
                                                                     "function": {"name": "get_weather", "arguments": fc[0]["arguments"]}}]},
               {"role": "tool", "tool_call_id": fc[0]["call_id"], "content": "sunny, 21 C"}], tools=[CHAT_WEATHER], max_tokens=16)
    check("function_call_output: the conversation with the call and its result, as chat renders it",
          st == 200 and ro["usage"]["input_tokens"] == co["usage"]["prompt_tokens"] and text_of(ro) == (co["choices"][0]["message"]["content"] or ""))
    st, it = post("/v1/responses/input_tokens", dict(nxt, max_output_tokens=None))
    check("input_tokens with tools and a call's output: as the response counted them", st == 200 and it["input_tokens"] == ro["usage"]["input_tokens"])
    stateless = dict(nxt, previous_response_id=None, input=[{"role": "user", "content": "What is the weather in Paris?"},
                                                              {"type": "function_call", "call_id": fc[0]["call_id"], "name": "get_weather",
                                                               "arguments": fc[0]["arguments"]}] + nxt["input"])
    st, rs = post("/v1/responses", stateless)
    check("the same conversation sent whole (function_call and function_call_output items)", st == 200 and strip_ids(rs["output"]) == strip_ids(ro["output"]))

# reasoning: <think>...</think> becomes a reasoning item before the message
THINK = {"regex": "<think>\nLet me see[.] Lily[.]\n</think>\n\nThe answer is yes[.]"}
st, rr = post("/v1/responses", {"input": Q1, "max_output_tokens": 60, "temperature": 0, "structured_outputs": THINK})
kinds = [it["type"] for it in rr.get("output", [])]
check("reasoning: a reasoning item (its text), then the answer; reasoning_tokens counted (%s of %s)"
      % (rr.get("usage", {}).get("output_tokens_details"), rr.get("usage", {}).get("output_tokens")),
      st == 200 and kinds == ["reasoning", "message"] and rr["output"][0]["content"][0]["text"] == "Let me see. Lily."
      and text_of(rr) == "The answer is yes." and 0 < rr["usage"]["output_tokens_details"]["reasoning_tokens"] < rr["usage"]["output_tokens"])
ev = stream({"input": Q1, "max_output_tokens": 60, "temperature": 0, "structured_outputs": THINK})
rd = "".join(d["delta"] for n, d in ev if n == "response.reasoning_text.delta")
check("reasoning streamed: reasoning_text deltas, then the message's", rd == "Let me see. Lily." and strip_ids(ev[-1][1]["response"]["output"]) == strip_ids(rr["output"]))
cr = chat([{"role": "user", "content": Q1}], max_tokens=60, structured_outputs=THINK)
check("chat's usage counts the reasoning tokens too", cr["usage"].get("completion_tokens_details", {}).get("reasoning_tokens") == rr["usage"]["output_tokens_details"]["reasoning_tokens"])

# logprobs: top_logprobs, the chat completion's records
st, rl = post("/v1/responses", {"input": Q1, "max_output_tokens": 8, "temperature": 0, "top_logprobs": 2})
cl = chat([{"role": "user", "content": Q1}], max_tokens=8, logprobs=True, top_logprobs=2)
lp = rl["output"][0]["content"][0]["logprobs"] if st == 200 else []
check("top_logprobs: the output_text's logprobs, chat's records (%d)" % len(lp),
      st == 200 and len(lp) == 8 and lp == cl["choices"][0]["logprobs"]["content"] and all(len(x["top_logprobs"]) == 2 for x in lp))

# refusals
for name, b, code in [("no input", {"max_output_tokens": 4}, 400),
                      ("an image part", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400),
                      ("a built-in tool", {"input": "hi", "tools": [{"type": "web_search"}]}, 400),
                      ("background", {"input": "hi", "background": True}, 400),
                      ("truncation auto", {"input": "hi", "truncation": "auto"}, 400),
                      ("an unknown item type", {"input": [{"type": "computer_call"}]}, 400),
                      ("a function_call without arguments", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, 400),
                      ("an empty input", {"input": []}, 400),
                      ("a bad text.format", {"input": "hi", "text": {"format": {"type": "xml"}}}, 400),
                      ("max_output_tokens 0", {"input": "hi", "max_output_tokens": 0}, 400),
                      ("max_output_tokens 1e94", {"input": "hi", "max_output_tokens": 1e94}, 400),
                      ("tool_choice required without tools", {"input": "hi", "tool_choice": "required"}, 400),
                      ("an unknown previous_response_id", {"input": "hi", "previous_response_id": "resp_nope"}, 404)]:
    st, e = post("/v1/responses", b)
    check("refused: %s -> %d" % (name, st), st == code and isinstance(e["error"]["message"], str))
st, ra = post("/v1/responses", {"input": Q1, "tool_choice": "auto", "tools": [], "max_output_tokens": 24, "temperature": 0})
check("tool_choice auto without tools: taken, as OpenAI's", st == 200 and text_of(ra) == text_of(r1))
st, _ = call("GET", "/v1/responses/resp_nope")
st2, _ = call("PUT", "/v1/responses/" + r2["id"])
st3, _ = call("POST", "/v1/responses/%s/cancel" % r2["id"])
check("GET of an unknown id 404, PUT 405, cancel 400", (st, st2, st3) == (404, 405, 400))

# the store's limit (--responses-mem 24K): the least recently used go first
ids = []
for k in range(24):
    st, r = post("/v1/responses", {"input": "Story %d: %s" % (k, "x" * 300), "max_output_tokens": 2})
    ids.append(r.get("id"))
st, _ = call("GET", "/v1/responses/" + ids[0])
st2, _ = call("GET", "/v1/responses/" + ids[-1])
m = urllib.request.urlopen(URL + "/metrics").read().decode()
n = int(float(re.search(r"^fitllm_responses_stored (\S+)", m, re.M).group(1)))
nb = int(float(re.search(r"^fitllm_responses_stored_bytes (\S+)", m, re.M).group(1)))
check("store limit: the oldest gone, the newest kept; %d responses in %d bytes <= 24 KiB" % (n, nb),
      st == 404 and st2 == 200 and 0 < nb <= 24 << 10 and 1 < n < 24)

sys.exit(1 if client.fails else 0)
