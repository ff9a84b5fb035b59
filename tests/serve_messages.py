#!/usr/bin/env python3
"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) against a running `fitllm
serve` of stories260K: each reply is checked against the chat completion of the same conversation
(greedy), streamed and not: system prompts, stop sequences, tool use and tool results, thinking,
token counting, and the refusals in Anthropic's error shape.
usage: serve_messages.py URL      exit 1 on a failure"""
import json, os, re, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Client  # noqa: E402

URL = sys.argv[1]
client = Client(URL)
check, post = client.check, client.post


def stream(body):
    return client.events("/v1/messages", body)


chat = client.chat


def text_of(m):
    return "".join(b["text"] for b in m["content"] if b["type"] == "text")


def same_usage(m, c):
    u = m["usage"]
    return (u["input_tokens"] + u["cache_read_input_tokens"] == c["usage"]["prompt_tokens"] and u["input_tokens"] >= 0
            and u["output_tokens"] == c["usage"]["completion_tokens"] and u["cache_creation_input_tokens"] == 0)


Q = "Tell me about Lily."
USER = [{"role": "user", "content": Q}]

st, m = post("/v1/messages", {"model": "any", "max_tokens": 24, "messages": USER, "temperature": 0})
c = chat(USER, max_tokens=24)
check("a message: the chat completion's text and usage, stop_reason max_tokens",
      st == 200 and m["type"] == "message" and m["role"] == "assistant" and re.fullmatch(r"msg_[0-9a-f]{32}", m["id"]) is not None
      and text_of(m) == c["choices"][0]["message"]["content"] and same_usage(m, c)
      and m["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[c["choices"][0]["finish_reason"]] and m["stop_sequence"] is None)

# system: a string or text blocks
for sysv in ["You tell stories.", [{"type": "text", "text": "You tell"}, {"type": "text", "text": "stories.", "cache_control": {"type": "ephemeral"}}]]:
    st, m = post("/v1/messages", {"max_tokens": 24, "system": sysv, "messages": USER, "temperature": 0})
    c = chat([{"role": "system", "content": "You tell stories." if isinstance(sysv, str) else "You tell\nstories."}] + USER, max_tokens=24)
    check("system as %s: the chat completion with that system message" % type(sysv).__name__,
          st == 200 and text_of(m) == c["choices"][0]["message"]["content"] and same_usage(m, c))

# content blocks, and an earlier assistant turn
conv = [{"role": "user", "content": [{"type": "text", "text": Q}]}, {"role": "assistant", "content": [{"type": "text", "text": "Lily is a girl."}]},
        {"role": "user", "content": "What did she do?"}]
st, m = post("/v1/messages", {"max_tokens": 24, "messages": conv, "temperature": 0})
c = chat([{"role": "user", "content": Q}, {"role": "assistant", "content": "Lily is a girl."}, {"role": "user", "content": "What did she do?"}], max_tokens=24)
check("content blocks and an assistant turn: the chat completion's", st == 200 and text_of(m) == c["choices"][0]["message"]["content"] and same_usage(m, c))

# stop sequences
st, m0 = post("/v1/messages", {"max_tokens": 40, "messages": USER, "temperature": 0})
words = re.findall(r"[a-z]{3,}", text_of(m0))
stop = words[1] if len(words) > 1 else "the"
st, m = post("/v1/messages", {"max_tokens": 40, "messages": USER, "temperature": 0, "stop_sequences": [stop, "zzz"]})
check("stop_sequences: stop_reason stop_sequence, the sequence named (%r), the text before it" % stop,
      st == 200 and m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == stop and text_of(m0).startswith(text_of(m))
      and stop not in text_of(m))

# streamed
body = {"max_tokens": 24, "messages": USER, "temperature": 0}
ev = stream(body)
names = [n for n, _ in ev]
st, m = post("/v1/messages", body)
deltas = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta")
check("stream: message_start, a text block (start, deltas, stop), message_delta, message_stop",
      names[0] == "message_start" and names[1] == "content_block_start" and names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
      and set(names[2:-3]) == {"content_block_delta"} and all(n == d["type"] for n, d in ev)
      and ev[0][1]["message"]["content"] == [] and ev[0][1]["message"]["usage"]["input_tokens"] + ev[0][1]["message"]["usage"]["cache_read_input_tokens"] > 0)
st, m2 = post("/v1/messages", body)
check("the prefix cache's tokens are cache_read_input_tokens (%d of %d again)" % (m2["usage"]["cache_read_input_tokens"], m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"]),
      m2["usage"]["cache_read_input_tokens"] > 0 and m2["usage"]["input_tokens"] + m2["usage"]["cache_read_input_tokens"] == m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"])
check("stream: the deltas add up to the text; stop_reason and usage in message_delta",
      deltas == text_of(m) and ev[-2][1]["delta"]["stop_reason"] == m["stop_reason"] and ev[-2][1]["usage"]["output_tokens"] == m["usage"]["output_tokens"])

# tools: tool_choice any -> a tool_use block; its result as the next turn
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                            "required": ["city", "days"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
body = {"max_tokens": 120, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "temperature": 0}
st, m = post("/v1/messages", body)
c = chat(ASK, tools=[CHAT_WEATHER], tool_choice="required", parallel_tool_calls=False, max_tokens=120)
uses = [b for b in m.get("content", []) if b["type"] == "tool_use"]
cc = c["choices"][0]["message"].get("tool_calls") or []
check("tool_choice any: a tool_use block (input an object), the chat completion's call, stop_reason tool_use",
      st == 200 and len(uses) == 1 and uses[0]["name"] == "get_weather" and re.fullmatch(r"toolu_[0-9a-f]{24}", uses[0]["id"]) is not None
      and len(cc) == 1 and uses[0]["input"] == json.loads(cc[0]["function"]["arguments"]) and m["stop_reason"] == "tool_use")
ev = stream(body)
starts = [d for n, d in ev if n == "content_block_start"]
pj = "".join(d["delta"]["partial_json"] for n, d in ev if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
check("tool_use streamed: the block started with its id and name, input_json_delta pieces adding up to the input",
      len(starts) == 1 and starts[0]["content_block"]["type"] == "tool_use" and starts[0]["content_block"]["name"] == "get_weather"
      and starts[0]["content_block"]["input"] == {} and uses and json.loads(pj) == uses[0]["input"] and ev[-2][1]["delta"]["stop_reason"] == "tool_use")
tool_named = dict(body, tool_choice={"type": "tool", "name": "get_weather"})
st, mn = post("/v1/messages", tool_named)
check("tool_choice tool: that tool's call", st == 200 and [b["name"] for b in mn["content"] if b["type"] == "tool_use"] == ["get_weather"])
if uses:
    turn = ASK + [{"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, uses[0]]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0]["id"], "content": [{"type": "text", "text": "sunny, 21 C"}]},
                                               {"type": "text", "text": "And tomorrow?"}]}]
    st, m = post("/v1/messages", {"max_tokens": 16, "messages": turn, "tools": [WEATHER], "temperature": 0})
    c = chat(ASK + [{"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": uses[0]["id"], "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps(uses[0]["input"], separators=(",", ":"))}}]},
                    {"role": "tool", "tool_call_id": uses[0]["id"], "content": "sunny, 21 C"}, {"role": "user", "content": "And tomorrow?"}],
             tools=[CHAT_WEATHER], max_tokens=16)
    check("tool_result: the conversation with the call, its result and the text after, as chat renders it",
          st == 200 and same_usage(m, c) and text_of(m) == (c["choices"][0]["message"]["content"] or ""))
    st, n = post("/v1/messages/count_tokens", {"messages": turn, "tools": [WEATHER]})
    check("count_tokens: the prompt's tokens, tools shown (%s)" % n.get("input_tokens"), st == 200 and n == {"input_tokens": c["usage"]["prompt_tokens"]})

# thinking: <think>...</think> as a thinking block before the text
THINK = {"regex": "<think>\nLet me see[.] Lily[.]\n</think>\n\nThe answer is yes[.]"}
st, m = post("/v1/messages", {"max_tokens": 60, "messages": USER, "temperature": 0, "structured_outputs": THINK})
check("thinking: a thinking block (signature empty), then the text",
      st == 200 and [b["type"] for b in m["content"]] == ["thinking", "text"] and m["content"][0]["thinking"] == "Let me see. Lily."
      and m["content"][0]["signature"] == "" and text_of(m) == "The answer is yes." and m["stop_reason"] == "end_turn")
ev = stream({"max_tokens": 60, "messages": USER, "temperature": 0, "structured_outputs": THINK})
td = "".join(d["delta"]["thinking"] for n, d in ev if n == "content_block_delta" and d["delta"]["type"] == "thinking_delta")
idx = [d["index"] for n, d in ev if n == "content_block_start"]
check("thinking streamed: thinking_delta in block 0, the text in block 1", td == "Let me see. Lily." and idx == [0, 1])
st, m = post("/v1/messages", {"max_tokens": 24, "temperature": 0, "messages": [
    {"role": "user", "content": Q}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "x"}, {"type": "text", "text": "Lily is a girl."}]},
    {"role": "user", "content": "What did she do?"}]})
c2 = chat([{"role": "user", "content": Q}, {"role": "assistant", "content": "Lily is a girl."}, {"role": "user", "content": "What did she do?"}], max_tokens=24)
check("an earlier turn's thinking block is left out of the prompt", st == 200 and same_usage(m, c2))

# refusals, in Anthropic's error shape
for name, b in [("no max_tokens", {"messages": USER}), ("no messages", {"max_tokens": 4}), ("a bad role", {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}),
                ("an image block", {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                ("a server tool", {"max_tokens": 4, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                ("a bad tool_choice", {"max_tokens": 4, "messages": USER, "tool_choice": {"type": "maybe"}}),
                ("a tool_use without input", {"max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]}),
                ("max_tokens 0", {"max_tokens": 0, "messages": USER}), ("max_tokens 2.5", {"max_tokens": 2.5, "messages": USER})]:
    st, e = post("/v1/messages", b)
    check("refused: %s -> %d, Anthropic's error shape" % (name, st),
          st == 400 and e.get("type") == "error" and e["error"]["type"] == "invalid_request_error" and isinstance(e["error"]["message"], str))
st, m = post("/v1/messages", {"max_tokens": 100000, "messages": USER, "temperature": 0})
check("max_tokens past the server's limit: as many as it gives", st == 200 and m["type"] == "message")

sys.exit(1 if client.fails else 0)
