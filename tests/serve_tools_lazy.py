#!/usr/bin/env python3
"""tool_choice "auto" with its lazy grammar, end to end, against a `fitllm serve` of a model
whose weights are all zero (`fitllm synth --std 0 --vocab-from stories260K.gguf`): its logits
are all equal, so greedy decoding follows logit_bias and the presence penalty exactly. Biases
that rank the tokens of "<tool_call>" (each token once, the penalty then putting it behind the
next) make the model write that tag; from there the grammar (no bias can break it) must finish a
call to the tool by its schema, and stop. With tool_choice "none" the same biases give free text.
Streamed, the call's name and its arguments come piece by piece.
usage: serve_tools_lazy.py URL      exit 1 on a failure"""
import json, os, sys, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Client  # noqa: E402

URL = sys.argv[1]
client = Client(URL)
check, post = client.check, client.post

TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["cm", "mm"]}}, "required": ["unit"]}}}
MSGS = [{"role": "user", "content": "hi " * 70}]  # (the penalties' window of 64 tokens: user text only, and the turn's end)
PIECES = ["<", "t", "oo", "l", "_", "c", "all", ">"]  # "<tool_call>"

# the tokens whose text is each piece, none of them in the prompt's last 64 tokens
st, b = post("/apply-template", {"messages": MSGS, "tools": [TOOL]})
st2, tk = post("/tokenize", {"content": b.get("prompt", ""), "add_special": False})
window = set(tk.get("tokens", [])[-64:])
text = {}
for i in range(1024):
    s, d = post("/detokenize", {"tokens": [i]})
    if s != 200:
        break
    text.setdefault(d["content"], []).append(i)
ids = [next((i for i in reversed(text.get(p, [])) if i not in window), None) for p in PIECES]
check("setup: a token for each piece of <tool_call> outside the prompt's window", st == 200 and st2 == 200 and None not in ids)
if None in ids:
    sys.exit(1)
bias = {str(t): 20.0 - 0.1 * k for k, t in enumerate(ids)}
BASE = {"messages": MSGS, "tools": [TOOL], "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0,
        "presence_penalty": 2, "logit_bias": bias}

st, b = post("/v1/chat/completions", dict(BASE, tool_choice="none"))
free = b["choices"][0]["message"]["content"] if st == 200 else ""
check("tool_choice none: the biased free text starts with the tag and is no call",
      free.startswith("<tool_call>") and b["choices"][0]["finish_reason"] == "length" and '"name"' not in free)

st, b = post("/v1/chat/completions", BASE)
ch = b["choices"][0] if st == 200 else {}
calls = ch.get("message", {}).get("tool_calls") or []
args = json.loads(calls[0]["function"]["arguments"]) if len(calls) == 1 else None
check("auto: the tag triggers the grammar, which finishes one call by the schema and stops",
      len(calls) == 1 and calls[0]["function"]["name"] == "pick" and args in ({"unit": "cm"}, {"unit": "mm"})
      and ch["message"]["content"] is None and ch["finish_reason"] == "tool_calls"
      and b["usage"]["completion_tokens"] < 120)

# streamed: the role, then the call's id and name, then its arguments in pieces; no content
req = urllib.request.Request(URL + "/v1/chat/completions", data=json.dumps(dict(BASE, stream=True)).encode(),
                             headers={"Content-Type": "application/json"})
deltas, fin = [], None
with urllib.request.urlopen(req) as r:
    for line in r:
        line = line.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            c = json.loads(line[6:])["choices"][0]
            deltas.append(c["delta"])
            fin = c.get("finish_reason") or fin
tcs = [tc for d in deltas for tc in d.get("tool_calls", [])]
heads = [tc for tc in tcs if "id" in tc]
streamed = "".join(tc["function"].get("arguments", "") for tc in tcs)
pieces = sum(1 for tc in tcs if "id" not in tc and tc["function"].get("arguments"))
# (how many pieces depends on how far the engine runs ahead of the stream: the model is made big
# enough (~1 ms a token) that the stream sees the call grow; tests/test_tools.c reads calls a byte
# at a time)
check("auto, streamed: one header (id, name), the arguments in %d pieces after it adding up to the reply's, no content" % pieces,
      len(heads) == 1 and heads[0]["function"]["name"] == "pick" and heads[0]["id"].startswith("call_")
      and pieces >= 1 and args is not None and json.loads(streamed) == args
      and all(tc["index"] == 0 for tc in tcs) and not any(d.get("content") for d in deltas) and fin == "tool_calls")

# a request with its own constraint gets no tool grammar: the same free text as tool_choice none
# under a grammar that takes any text of these characters
st, b = post("/v1/chat/completions", dict(BASE, grammar='root ::= [<>a-z_]*'))
check("auto with its own grammar: no tool grammar (the free text)",
      st == 200 and b["choices"][0]["message"]["content"] == free and not b["choices"][0]["message"].get("tool_calls"))

print("serve_tools_lazy: %d failed" % client.fails)
sys.exit(1 if client.fails else 0)
