#!/usr/bin/env python3
"""Tool calling and reasoning against a running `fitllm serve` of stories260K (its chat turns are
the plain User:/Assistant: transcript, its tool calls <tool_call> tags): tools shown in the
prompt, a named function and "required" constrain the output to calls whose arguments follow the
tools' schemas, "auto" reads tagged calls out of the output (one forced by a regex here); an
output's <think>...</think> goes to reasoning_content; streamed and not, and the refusals.
usage: serve_tools.py URL      exit 1 on a failure"""
import json, os, re, sys, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Client  # noqa: E402

URL = sys.argv[1]
client = Client(URL)
check, post = client.check, client.post


def stream(body):
    body = dict(body, stream=True)
    req = urllib.request.Request(URL + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string", "maxLength": 12},
                                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                 "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
BASE = {"messages": MSGS, "max_tokens": 200, "temperature": 0}


def weather_ok(args):
    a = json.loads(args)
    return (isinstance(a, dict) and set(a) == {"city", "days"} and isinstance(a["city"], str) and len(a["city"]) <= 12
            and type(a["days"]) is int and 1 <= a["days"] <= 7)


def call_ok(c):
    return c["type"] == "function" and re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) is not None


# the prompt shows the tools; a conversation with a call and its result renders
st, b = post("/apply-template", {"messages": MSGS + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                          "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"days\":1}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "tools": [WEATHER]})
p = b.get("prompt", "")
check("apply-template: the tools in <tools>, the call tagged, the result in <tool_response>",
      st == 200 and "<tools>\n" + json.dumps(WEATHER, separators=(",", ":")) + "\n</tools>" in p
      and "Assistant: <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":1}}\n</tool_call>" in p
      and "User: <tool_response>\nsunny\n</tool_response>" in p and p.endswith("Assistant:"))

# a named function: the output is its arguments, by its schema
named = dict(BASE, tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "get_weather"}})
st, b = post("/v1/chat/completions", named)
ch = b["choices"][0] if st == 200 else {}
m = ch.get("message", {})
calls = m.get("tool_calls") or []
check("named: one get_weather call, its arguments by the schema, content null, finish stop",
      st == 200 and len(calls) == 1 and call_ok(calls[0]) and calls[0]["function"]["name"] == "get_weather"
      and weather_ok(calls[0]["function"]["arguments"]) and m.get("content", "x") is None and ch["finish_reason"] == "stop")
named_args = calls[0]["function"]["arguments"] if calls else None
chunks = stream(named)
deltas = [c["choices"][0] for c in chunks if c["choices"]]
sc = [t for d in deltas for t in d["delta"].get("tool_calls", [])]
# (as vLLM: the call's id, type and name first, then its arguments as they are generated)
if not check("named, streamed: no content; the call's arguments in pieces that add up to the reply's, finish stop",
             not any(d["delta"].get("content") for d in deltas) and len(sc) > 3 and all(t["index"] == 0 for t in sc)
             and call_ok(sc[0]) and sc[0]["function"]["name"] == "get_weather"
             and not any("id" in t or "name" in t["function"] for t in sc[1:])
             and "".join(t["function"]["arguments"] for t in sc) == named_args and deltas[-1]["finish_reason"] == "stop"):
    print("  the reply's arguments %r; streamed: %d pieces %r, finish %r, content %r" % (
        named_args, len(sc), "".join(t["function"].get("arguments", "") for t in sc),
        deltas[-1]["finish_reason"] if deltas else None, [d["delta"].get("content") for d in deltas if d["delta"].get("content")]))
st, b = post("/v1/chat/completions", dict(named, n=2, temperature=1.0, seed=3))
check("named, n=2: each choice a call by the schema",
      st == 200 and all(len(c["message"]["tool_calls"]) == 1 and weather_ok(c["message"]["tool_calls"][0]["function"]["arguments"])
                        for c in b["choices"]))

# required: calls by the tools' schemas (one tool: the schema compiler; several: a grammar)
st, b = post("/v1/chat/completions", dict(BASE, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False))
ch = b["choices"][0] if st == 200 else {}
calls = ch.get("message", {}).get("tool_calls") or []
check("required, one tool: one call by its schema, finish tool_calls",
      st == 200 and len(calls) == 1 and call_ok(calls[0]) and calls[0]["function"]["name"] == "get_weather"
      and weather_ok(calls[0]["function"]["arguments"]) and ch["finish_reason"] == "tool_calls")
st, b = post("/v1/chat/completions", dict(BASE, tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False))
ch = b["choices"][0] if st == 200 else {}
calls = ch.get("message", {}).get("tool_calls") or []


def two_ok(c):
    a = json.loads(c["function"]["arguments"])
    if c["function"]["name"] == "add":
        return set(a) == {"a", "b"} and type(a["a"]) is int and type(a["b"]) is int
    return c["function"]["name"] == "get_weather" and set(a) <= {"city", "days"} and "city" in a


check("required, two tools: one call, a tool's name and its arguments' shape, finish tool_calls",
      st == 200 and len(calls) == 1 and call_ok(calls[0]) and two_ok(calls[0]) and ch["finish_reason"] == "tool_calls")


def streamed_calls(body):
    """The calls of a streamed reply put together by index: (calls, pieces per call, deltas)"""
    deltas = [c["choices"][0] for c in stream(body) if c["choices"]]
    got, pieces = {}, {}
    for d in deltas:
        for t in d["delta"].get("tool_calls", []):
            g = got.setdefault(t["index"], {"function": {"arguments": ""}})
            if "id" in t:
                g.update(id=t["id"], type=t["type"])
                g["function"]["name"] = t["function"]["name"]
            g["function"]["arguments"] += t["function"].get("arguments", "")
            pieces[t["index"]] = pieces.get(t["index"], 0) + 1
    return [got[k] for k in sorted(got)], pieces, deltas


# required, streamed (as vLLM): each call's id, type and name first, then its arguments as they
# are generated; put together, the reply's calls (the arguments the same JSON value)
# (ids are per request: the same form; one tool's schema lets the model write "parameters" first, as
# stories260K does here, and a call that does not name itself first comes whole at the end; the
# grammar of several tools puts the name first)
for ntools, tools in ((1, [WEATHER]), (2, [WEATHER, ADD])):
    body = dict(BASE, tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0)
    st, b = post("/v1/chat/completions", body)
    want = b["choices"][0]["message"].get("tool_calls") or [] if st == 200 else []
    got, pieces, deltas = streamed_calls(body)
    check("required, %d tool(s), streamed: the reply's call (%s pieces)%s" % (ntools, pieces, ", the name first, the arguments as they come" if ntools > 1 else ""),
          len(want) == 1 and len(got) == 1 and call_ok(got[0]) and got[0]["function"]["name"] == want[0]["function"]["name"]
          and json.loads(got[0]["function"]["arguments"]) == json.loads(want[0]["function"]["arguments"])
          and (ntools == 1 or pieces[0] > 2) and not any(d["delta"].get("content") for d in deltas)
          and deltas[-1]["finish_reason"] == "tool_calls" and deltas[0]["delta"].get("role") == "assistant")

# auto: a tagged call in the output (forced by a regex) is read out; the text before it is content
forced = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
auto = dict(BASE, tools=[WEATHER, ADD], structured_outputs={"regex": "Sure[.]\n" + re.escape(forced)})
st, b = post("/v1/chat/completions", auto)
ch = b["choices"][0] if st == 200 else {}
m = ch.get("message", {})
calls = m.get("tool_calls") or []
check("auto: the call read out of the text, the rest content, finish tool_calls",
      st == 200 and m.get("content") == "Sure." and len(calls) == 1 and call_ok(calls[0])
      and calls[0]["function"] == {"name": "add", "arguments": "{\"a\":1,\"b\":2}"} and ch["finish_reason"] == "tool_calls")
chunks = stream(auto)
deltas = [c["choices"][0] for c in chunks if c["choices"]]
content = "".join(d["delta"].get("content") or "" for d in deltas)
sc = [t for d in deltas for t in d["delta"].get("tool_calls", [])]
check("auto, streamed: the content up to the call, no tag in it, then the call, finish tool_calls",
      content == "Sure.\n" and len(sc) == 1 and sc[0]["function"] == {"name": "add", "arguments": "{\"a\":1,\"b\":2}"}
      and deltas[-1]["finish_reason"] == "tool_calls" and deltas[0]["delta"].get("role") == "assistant")
# auto where the model makes no call: the same text as tool_choice none (the same prompt)
st, b = post("/v1/chat/completions", dict(BASE, max_tokens=30, tools=[WEATHER]))
st2, b2 = post("/v1/chat/completions", dict(BASE, max_tokens=30, tools=[WEATHER], tool_choice="none"))
check("auto without a call: the text as content, as with tool_choice none",
      st == 200 and st2 == 200 and "tool_calls" not in b["choices"][0]["message"]
      and b["choices"][0]["message"]["content"] == b2["choices"][0]["message"]["content"] != ""
      and b["choices"][0]["finish_reason"] == "length")
chunks = stream(dict(BASE, max_tokens=30, tools=[WEATHER]))
content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
check("auto without a call, streamed: the same content", content == b2["choices"][0]["message"]["content"])

# reasoning (the server's default --reasoning-format deepseek): an output that opens with <think>
# has its thinking in reasoning_content (forced here by a regex), streamed apart from the answer
THINK = dict(BASE, structured_outputs={"regex": "<think>\nLet me see[.] Lily[.]\n</think>\n\nThe answer is yes[.]"})
st, b = post("/v1/chat/completions", THINK)
m = b["choices"][0]["message"] if st == 200 else {}
check("reasoning: <think>...</think> as reasoning_content, the rest as content",
      m.get("reasoning_content") == "Let me see. Lily." and m.get("content") == "The answer is yes.")
deltas = [c["choices"][0]["delta"] for c in stream(THINK) if c["choices"]]
rs = [d.get("reasoning_content") for d in deltas if d.get("reasoning_content")]
cs = [d.get("content") for d in deltas if d.get("content")]
first_c = min([k for k, d in enumerate(deltas) if d.get("content")] or [0])
check("reasoning, streamed: the pieces add up to the reply's, all of the reasoning before the answer",
      "".join(rs) == "Let me see. Lily." and "".join(cs) == "The answer is yes."
      and all(not d.get("reasoning_content") for d in deltas[first_c:]))
st, b = post("/v1/chat/completions", dict(THINK, reasoning_format="none"))
check("reasoning_format none: all of it is content",
      st == 200 and b["choices"][0]["message"]["content"].startswith("<think>\nLet me see.")
      and "reasoning_content" not in b["choices"][0]["message"])
st, b = post("/v1/chat/completions", dict(BASE, max_tokens=12, structured_outputs={"regex": "<think>\n[a-z ]+"}))
m = b["choices"][0]["message"] if st == 200 else {}
check("reasoning cut by max_tokens before </think>: all reasoning, content null",
      m.get("content", "x") is None and len(m.get("reasoning_content", "")) > 0 and b["choices"][0]["finish_reason"] == "length")
st, b = post("/v1/chat/completions", dict(BASE, tools=[WEATHER, ADD], structured_outputs={
    "regex": "<think>\nMaybe <tool_call> here[.]\n</think>\nSure[.]\n" + re.escape(forced)}))
m = b["choices"][0]["message"] if st == 200 else {}
check("reasoning and a call: the reasoning (a tag in it is not a call), the content, the call",
      m.get("reasoning_content") == "Maybe <tool_call> here." and m.get("content") == "Sure."
      and [c["function"]["name"] for c in m.get("tool_calls", [])] == ["add"] and b["choices"][0]["finish_reason"] == "tool_calls")

# refusals
for name, path, body, code in [
        ("tools on /v1/completions", "/v1/completions", {"prompt": "a", "tools": [ADD]}, 400),
        ("tool_choice required without tools", "/v1/chat/completions", dict(BASE, tool_choice="required"), 400),
        ("a named function not in tools", "/v1/chat/completions",
         dict(BASE, tools=[ADD], tool_choice={"type": "function", "function": {"name": "get_weather"}}), 400),
        ("required with response_format", "/v1/chat/completions",
         dict(BASE, tools=[ADD], tool_choice="required", response_format={"type": "json_object"}), 400),
        ("a tool call without a name in messages", "/v1/chat/completions",
         dict(BASE, messages=MSGS + [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]), 400),
        ("legacy functions", "/v1/chat/completions", dict(BASE, functions=[ADD["function"]]), 400),
        ("reasoning_format other than none / deepseek / auto", "/v1/chat/completions", dict(BASE, reasoning_format="raw"), 400)]:
    st, b = post(path, body)
    check("refused: " + name, st == code and "message" in b.get("error", {}))

print("serve_tools: %d failed" % client.fails)
sys.exit(1 if client.fails else 0)
