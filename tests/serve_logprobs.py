#!/usr/bin/env python3
"""logprobs / top_logprobs, echo, logit_bias, response_format, min_tokens and stop_token_ids of
`fitllm serve` (OpenAI and vLLM shapes), checked against llama.cpp's logits.

Usage: serve_logprobs.py URL SHARED_DIR      (a server on stories260K)
       serve_logprobs.py URL --bytes         (a server on a random model with byte tokens)
Prints one line per check; exits 1 if any failed.
"""
import json
import math
import sys
import urllib.error
import urllib.request

URL = sys.argv[1]
fails = 0


def check(name, cond):
    global fails
    print(("ok   - " if cond else "FAIL - ") + name)
    if not cond:
        fails += 1


def post(path, body):
    req = urllib.request.Request(URL + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode("utf-8")  # strict: the reply must be well-formed UTF-8
            return r.status, raw
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")


def post_json(path, body):
    st, raw = post(path, body)
    return st, json.loads(raw)


def post_stream(path, body):
    st, raw = post(path, dict(body, stream=True))
    return [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: {")]


def close(a, b, tol):
    return a is not None and b is not None and abs(a - b) <= tol


def legacy_ok(lp, text):
    """the legacy shape is self-consistent: one entry per token, the sampled token in its
    top_logprobs, offsets the running character count of the token texts"""
    n = len(lp["tokens"])
    if not (n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])):
        return False
    off = 0
    for t, l, top, o in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]):
        if o != off or t not in top or top[t] != l or l > 1e-6:
            return False
        off += len(t)
    return "".join(lp["tokens"]).startswith(text) or text.startswith("".join(lp["tokens"]))


def main_stories(shared):
    # 1. the first generated token's distribution against llama.cpp's logits at the last prompt
    #    position (4 prompts): the sampled token's logprob and the top 5
    worst = 0.0
    for line in open(shared + "/reference/stories260K.logits.jsonl"):
        d = json.loads(line)
        logits = d["logits"][-1]
        m = max(logits)
        lse = m + math.log(sum(math.exp(x - m) for x in logits))
        ref = sorted((x - lse for x in logits), reverse=True)[:5]
        st, r = post_json("/v1/completions", {"prompt": d["tokens"], "max_tokens": 1, "logprobs": 5, "temperature": 0})
        lp = r["choices"][0]["logprobs"]
        got = sorted(lp["top_logprobs"][0].values(), reverse=True)
        check("prompt %s...: 200, one token, 5 alternatives" % d["tokens"][:4], st == 200 and len(lp["tokens"]) == 1 and len(got) == 5)
        worst = max([worst, abs(lp["token_logprobs"][0] - ref[0])] + [abs(a - b) for a, b in zip(got, ref)])
    # llama.cpp rounds each query and each softmax probability to f16 as well as K and V; the
    # paged attention keeps the first two in f32, which moves these logprobs by up to ~5e-3
    # (`fitllm run --kv-layout contiguous` follows llama.cpp's rounding and matches to ~1e-5)
    check("logprobs equal log-softmax of llama.cpp's logits (max |diff| %.2g)" % worst, worst < 1e-2)

    # 2. greedy: each token is its step's most likely one; the shape is consistent
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": 3}
    st, r = post_json("/v1/completions", body)
    c = r["choices"][0]
    lp = c["logprobs"]
    check("greedy: 24 tokens, 3-4 alternatives each", st == 200 and len(lp["tokens"]) == 24
          and all(3 <= len(t) <= 4 for t in lp["top_logprobs"]))
    check("greedy: the sampled token is the most likely", all(l == max(t.values()) for l, t in zip(lp["token_logprobs"], lp["top_logprobs"])))
    check("legacy shape consistent (tokens, offsets, text)", legacy_ok(lp, c["text"]) and "".join(lp["tokens"]) == c["text"])
    check("logprobs off by default", post_json("/v1/completions", {"prompt": "Once", "max_tokens": 2})[1]["choices"][0]["logprobs"] is None)
    st, r0 = post_json("/v1/completions", dict(body, logprobs=0))
    t0 = r0["choices"][0]["logprobs"]["top_logprobs"]
    check("logprobs 0: the sampled token alone", st == 200 and all(len(t) == 1 for t in t0)
          and r0["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"])

    # 3. streamed: the chunks carry the same records, each once
    ev = post_stream("/v1/completions", body)
    toks, lps, offs = [], [], []
    for e in ev:
        x = e["choices"][0]["logprobs"]
        if x:
            toks += x["tokens"]; lps += x["token_logprobs"]; offs += x["text_offset"]
    check("stream: the same tokens, logprobs and offsets", toks == lp["tokens"] and lps == lp["token_logprobs"] and offs == lp["text_offset"])
    check("stream: logprobs spread over several chunks", sum(1 for e in ev if e["choices"][0]["logprobs"]) > 3)

    # 4. sampled (temperature 1): the sampled token's logprob is of the raw distribution (as greedy)
    st, rs = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": 3, "logprobs": 5, "n": 2})
    ok = st == 200 and len(rs["choices"]) == 2
    for ch in rs["choices"]:
        x = ch["logprobs"]
        ok = ok and legacy_ok(x, ch["text"]) and len(x["tokens"]) == 16
        ok = ok and all(sum(math.exp(v) for k, v in t.items() if k != tk or len(t) == 5) <= 1 + 1e-4 for t, tk in zip(x["top_logprobs"], x["tokens"]))
    check("n=2 sampled: each choice has its own records, probabilities sum to <= 1", ok)
    first = rs["choices"][0]["logprobs"]["top_logprobs"][0]
    check("both samples share the first step's distribution", first == rs["choices"][1]["logprobs"]["top_logprobs"][0]
          and close(max(first.values()), lp["token_logprobs"][0], 1e-6))

    # 5. chat shape, plain and streamed
    cbody = {"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 12, "temperature": 0,
             "logprobs": True, "top_logprobs": 2}
    st, rc = post_json("/v1/chat/completions", cbody)
    ch = rc["choices"][0]
    content = ch["logprobs"]["content"]
    ok = st == 200 and len(content) == rc["usage"]["completion_tokens"] == 12
    for e in content:
        ok = ok and bytes(e["bytes"]).decode("utf-8") == e["token"] and len(e["top_logprobs"]) == 2
        ok = ok and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] and e["logprob"] == e["top_logprobs"][0]["logprob"]
    check("chat: content records with bytes and 2 alternatives, greedy = most likely", ok)
    check("chat: the tokens spell the message", "".join(e["token"] for e in content) == ch["message"]["content"])
    ev = post_stream("/v1/chat/completions", cbody)
    sc = [x for e in ev if e["choices"] and e["choices"][0].get("logprobs") for x in e["choices"][0]["logprobs"]["content"]]
    check("chat stream: the same records", sc == content)
    st, rn = post_json("/v1/chat/completions", dict(cbody, top_logprobs=None))
    check("chat logprobs without top_logprobs: no alternatives", st == 200 and all(e["top_logprobs"] == [] for e in rn["choices"][0]["logprobs"]["content"]))
    check("chat without logprobs: null", post_json("/v1/chat/completions", dict(cbody, logprobs=False, top_logprobs=None))[1]["choices"][0]["logprobs"] is None)

    # 6. echo: the prompt's tokens lead, scored against llama.cpp's logits at every position
    worst, npos = 0.0, 0
    for line in open(shared + "/reference/stories260K.logits.jsonl"):
        d = json.loads(line)
        st, r = post_json("/v1/completions", {"prompt": d["tokens"], "max_tokens": 0, "echo": True, "logprobs": 3})
        lp = r["choices"][0]["logprobs"]
        ok = st == 200 and len(lp["tokens"]) == len(d["tokens"]) and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ok = ok and r["usage"]["completion_tokens"] == 0 and r["choices"][0]["finish_reason"] == "length"
        check("echo, max_tokens 0: %d prompt tokens, the first without a logprob, nothing generated" % len(d["tokens"]), ok)
        for j in range(len(d["tokens"]) - 1):
            row = d["logits"][j]
            m = max(row)
            lse = m + math.log(sum(math.exp(x - m) for x in row))
            ref = sorted((x - lse for x in row), reverse=True)[:3]
            got = sorted(lp["top_logprobs"][j + 1].values(), reverse=True)[:3]
            worst = max([worst, abs(lp["token_logprobs"][j + 1] - (row[d["tokens"][j + 1]] - lse))] + [abs(a - b) for a, b in zip(got, ref)])
            npos += 1
    check("echo: %d prompt positions equal llama.cpp's log-softmax (max |diff| %.2g)" % (npos, worst), npos > 30 and worst < 1e-2)

    ebody = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "echo": True, "logprobs": 2}
    st, re_ = post_json("/v1/completions", ebody)
    ce = re_["choices"][0]
    check("echo: the text is the prompt then the completion", st == 200 and ce["text"] == "Once upon a time" + post_json(
        "/v1/completions", dict(ebody, echo=False))[1]["choices"][0]["text"])
    n_p = re_["usage"]["prompt_tokens"]
    check("echo: prompt + generated records", len(ce["logprobs"]["tokens"]) == n_p + 8 and ce["logprobs"]["token_logprobs"][n_p:]
          == post_json("/v1/completions", dict(ebody, echo=False))[1]["choices"][0]["logprobs"]["token_logprobs"])
    check("echo without logprobs: text only", post_json("/v1/completions", dict(ebody, logprobs=None))[1]["choices"][0]["logprobs"] is None)
    ev = post_stream("/v1/completions", ebody)
    stoks = [t for e in ev if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
    check("echo stream: the same text and records", "".join(e["choices"][0]["text"] for e in ev) == ce["text"] and stoks == ce["logprobs"]["tokens"])
    st, rn = post_json("/v1/completions", dict(ebody, n=2, temperature=1.0, seed=5))
    check("echo n=2: each choice leads with the prompt records", st == 200 and all(
        c["logprobs"]["tokens"][:n_p] == ce["logprobs"]["tokens"][:n_p] and c["text"].startswith("Once upon a time") for c in rn["choices"]))
    # a prompt of 3 KV blocks, twice: the second must not take its records from the prefix cache
    long_prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog."
    lb = {"prompt": long_prompt, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    a1 = post_json("/v1/completions", lb)[1]["choices"][0]["logprobs"]
    a2 = post_json("/v1/completions", lb)[1]["choices"][0]["logprobs"]
    check("echo: a cached prompt is scored again (%d tokens, same records)" % len(a1["tokens"]), len(a1["tokens"]) > 32 and a1 == a2)

    # 6b. vLLM's prompt_logprobs: per prompt token {id: {logprob, rank, decoded_token}}, the
    #     prompt token with its rank among the vocabulary, then the k most likely (ranks 1..k);
    #     checked against llama.cpp's logits (completions: per choice; chat: at the top)
    worst, npos, rank_ok = 0.0, 0, True
    for line in open(shared + "/reference/stories260K.logits.jsonl"):
        d = json.loads(line)
        st, r = post_json("/v1/completions", {"prompt": d["tokens"], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2})
        plp = r["choices"][0].get("prompt_logprobs") if st == 200 else None
        check("prompt_logprobs 2: %d entries, the first null, logprobs null" % len(d["tokens"]),
              plp is not None and len(plp) == len(d["tokens"]) and plp[0] is None and r["choices"][0]["logprobs"] is None)
        for j in range(len(d["tokens"]) - 1):
            row = d["logits"][j]
            m = max(row)
            lse = m + math.log(sum(math.exp(x - m) for x in row))
            tok = d["tokens"][j + 1]
            e = plp[j + 1]
            mine = e[str(tok)]
            rank = 1 + sum(1 for x in row if x > row[tok])
            top = sorted(range(len(row)), key=lambda v: -row[v])[:2]
            others = {int(k): v for k, v in e.items() if int(k) != tok}
            rank_ok = rank_ok and (mine["rank"] == rank or abs(row[top[0]] - row[tok]) < 1e-3) and set(e) <= {str(tok)} | {str(v) for v in top} \
                and all(v["rank"] == top.index(k) + 1 for k, v in others.items() if k in top) and isinstance(mine["decoded_token"], str)
            worst = max([worst, abs(mine["logprob"] - (row[tok] - lse))] + [abs(v["logprob"] - (row[k] - lse)) for k, v in others.items()])
            npos += 1
    check("prompt_logprobs: %d positions, logprobs as llama.cpp's log-softmax (max |diff| %.2g), ranks as its logits order" % (npos, worst),
          npos > 30 and worst < 1e-2 and rank_ok)
    pb = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
    st, ra = post_json("/v1/completions", dict(pb, prompt_logprobs=3, logprobs=1))
    st2, rb = post_json("/v1/completions", dict(pb, logprobs=1))
    check("prompt_logprobs 3 beside logprobs 1: the output's logprobs list 1 alternative, as without it",
          st == st2 == 200 and ra["choices"][0]["logprobs"] == rb["choices"][0]["logprobs"]
          and all(len(e) in (3, 4) for e in ra["choices"][0]["prompt_logprobs"][1:]))
    st, re2 = post_json("/v1/completions", dict(pb, prompt_logprobs=1, echo=True, logprobs=2))
    c = re2["choices"][0] if st == 200 else {}
    check("prompt_logprobs with echo: the prompt token's logprob is echo's",
          st == 200 and len(c["prompt_logprobs"]) == n_p and all(abs(list(e.values())[0]["logprob"] - lp) < 1e-6 for e, lp in zip(c["prompt_logprobs"][1:], c["logprobs"]["token_logprobs"][1:n_p])))
    st, rm = post_json("/v1/completions", {"prompt": ["Once upon a time", "The cat"], "n": 2, "max_tokens": 2, "temperature": 1.0, "seed": 2,
                                           "prompt_logprobs": 0})
    check("prompt_logprobs, two prompts x n=2: each choice its prompt's (0 alternatives: one entry each)",
          st == 200 and [len(c["prompt_logprobs"]) for c in rm["choices"]] == [n_p, n_p] + [rm["usage"]["prompt_tokens"] - n_p] * 2
          and rm["choices"][0]["prompt_logprobs"] == rm["choices"][1]["prompt_logprobs"]
          and all(len(e) == 1 for c in rm["choices"] for e in c["prompt_logprobs"][1:]))
    st, rc = post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 1})
    check("chat prompt_logprobs: at the top, one entry per prompt token",
          st == 200 and len(rc["prompt_logprobs"]) == rc["usage"]["prompt_tokens"] and rc["prompt_logprobs"][0] is None
          and "prompt_logprobs" not in rc["choices"][0])
    for name, body, needle in [("streamed", dict(pb, prompt_logprobs=1, stream=True), "not streamed"),
                               ("-1", dict(pb, prompt_logprobs=-1), "integer 0..20"),
                               ("a string", dict(pb, prompt_logprobs="1"), "integer 0..20"),
                               ("a boolean", dict(pb, prompt_logprobs=True), "integer 0..20"),
                               ("21", dict(pb, prompt_logprobs=21), "integer 0..20")]:
        st, r = post_json("/v1/completions", body)
        msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
        check("prompt_logprobs %s: 400 (%s)" % (name, msg), st == 400 and needle in msg)
    st, r = post_json("/v1/completions", dict(pb, prompt_logprobs=False))
    check("prompt_logprobs false: none", st == 200 and "prompt_logprobs" not in r["choices"][0])

    # lm-evaluation-harness's loglikelihood request: a batch of one tokenized prompt, one token
    ids = d["tokens"]
    st, r = post_json("/v1/completions", {"prompt": [ids], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1, "seed": 1234})
    x = r["choices"][0]["logprobs"] if st == 200 else {}
    check("[[ids]] with echo (lm-eval's request): prompt + 1 records, greedy flag readable",
          st == 200 and len(x["tokens"]) == len(ids) + 1 and all(t is None or len(t) >= 1 for t in x["top_logprobs"]))

    # 7. logit_bias, with the greedy token ids from llama.cpp's reference: banning the first one
    #    moves the choice to the second most likely; the logprobs stay the raw distribution's;
    #    +100 on a token forces it at every step
    g = json.loads(open(shared + "/reference/stories260K.greedy.jsonl").readline())
    st, r = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 1, "temperature": 0, "logprobs": 3})
    tops = sorted(r["choices"][0]["logprobs"]["top_logprobs"][0].items(), key=lambda kv: -kv[1])
    st, b = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 1, "temperature": 0, "logprobs": 3,
                                          "logit_bias": {str(g["greedy_tokens"][0]): -100}})
    bl = b["choices"][0]["logprobs"]
    check("logit_bias -100 on the greedy token: the second most likely is chosen",
          st == 200 and r["choices"][0]["logprobs"]["tokens"][0] == tops[0][0] and bl["tokens"][0] == tops[1][0])
    check("logit_bias: the logprobs are the raw distribution's",
          bl["top_logprobs"][0].get(tops[0][0]) == tops[0][1] and close(bl["token_logprobs"][0], tops[1][1], 1e-6))
    st, f = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 4, "temperature": 1.0, "seed": 1,
                                          "logprobs": 0, "logit_bias": {"300": 100}})
    ft = f["choices"][0]["logprobs"]["tokens"]
    check("logit_bias +100 forces one token at every step", st == 200 and len(ft) == 4 and len(set(ft)) == 1)

    # 8. response_format json_object: "}" (id 128 in this vocabulary, from /tokenize) made likely
    #    closes the object at once: a whole object, finish "stop"; without it, the 4 sampled
    #    answers are JSON that opens an object (this model rarely closes one in 48 tokens)
    st, t = post_json("/tokenize", {"prompt": "}", "add_special_tokens": False})
    close_id = t["tokens"][-1]
    for path, b in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON please"}]}),
                    ("/v1/completions", {"prompt": "Once upon a time"})]:
        st, r = post_json(path, dict(b, max_tokens=48, temperature=0, response_format={"type": "json_object"},
                                     logit_bias={str(close_id): 30}))
        c = r["choices"][0]
        text = c["message"]["content"] if "message" in c else c["text"]
        check("json_object%s: a whole object, finish stop (%r)" % (" on chat" if "message" in c else "", text[-40:]),
              st == 200 and c["finish_reason"] == "stop" and json.loads(text) == {})
    for seed in range(4):
        st, r = post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 48,
                                                   "temperature": 1.0, "seed": seed, "response_format": {"type": "json_object"}})
        c = r["choices"][0]
        text = c["message"]["content"]
        if c["finish_reason"] == "stop":
            ok = isinstance(json.loads(text), dict)
        else:
            ok = c["finish_reason"] == "length" and text.lstrip().startswith("{") and r["usage"]["completion_tokens"] == 48
        check("json_object sampled (seed %d): %s" % (seed, c["finish_reason"]), st == 200 and ok)
    check("response_format text: unconstrained", post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0,
          "response_format": {"type": "text"}})[1]["choices"][0]["text"] == post_json("/v1/completions", {
          "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})[1]["choices"][0]["text"])

    # 8b. JSON Schema: OpenAI's response_format json_schema, vLLM's guided_json, llama.cpp's
    #     json_schema and its json_object + schema.  Every output that stops is a value of the
    #     schema (checked here by hand); a cut one has the prefix a value starts with
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                               "ok": {"type": "boolean"}},
              "required": ["name", "age", "ok"], "additionalProperties": False}

    def person_ok(v):
        return (isinstance(v, dict) and set(v) == {"name", "age", "ok"} and isinstance(v["name"], str) and len(v["name"]) <= 8
                and type(v["age"]) is int and 0 <= v["age"] <= 120 and isinstance(v["ok"], bool))
    stops = 0
    for seed in range(6):
        st, r = post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "Who?"}], "max_tokens": 96,
                                                   "temperature": 1.0, "seed": seed,
                                                   "response_format": {"type": "json_schema",
                                                                       "json_schema": {"name": "person", "schema": person, "strict": True}}})
        c = r["choices"][0]
        text = c["message"]["content"]
        if c["finish_reason"] == "stop":
            ok = person_ok(json.loads(text))
            stops += 1
        else:
            ok = c["finish_reason"] == "length" and text.lstrip().startswith("{") and r["usage"]["completion_tokens"] == 96
        check("json_schema sampled (seed %d): %s %r" % (seed, c["finish_reason"], text[-60:]), st == 200 and ok)
    check("json_schema: some answers complete (%d of 6)" % stops, stops >= 2)
    # a string pattern: each finished value's string is one whole match (Python's re says)
    import re as pyre
    named = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?$"},
                                              "year": {"type": "string", "pattern": "19[5-9][0-9]|20[0-2][0-9]"},
                                              "when": {"type": "string", "format": "date"}},
             "required": ["name", "year", "when"], "additionalProperties": False}
    stops = 0
    for seed in range(4):
        st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 128, "temperature": 1.0, "seed": seed,
                                              "guided_json": named})
        c = r["choices"][0]
        ok = st == 200
        if ok and c["finish_reason"] == "stop":
            v = json.loads(c["text"])
            ok = (set(v) == {"name", "year", "when"} and pyre.fullmatch(named["properties"]["name"]["pattern"][1:-1], v["name"]) is not None
                  and pyre.fullmatch(named["properties"]["year"]["pattern"], v["year"]) is not None
                  and pyre.fullmatch(r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", v["when"]) is not None)
            stops += 1
        check("json_schema pattern (seed %d): %s %r" % (seed, c["finish_reason"], c["text"][-60:]), ok)
    check("json_schema pattern: some answers complete (%d of 4)" % stops, stops >= 2)
    for field in ["guided_json", "json_schema"]:
        got = set()
        for seed in range(3):
            st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": seed,
                                                  field: {"enum": ["yes", "no", "maybe"]}})
            got.add((st, r["choices"][0]["finish_reason"], r["choices"][0]["text"]))
        check("%s enum: each answer one of the three, finish stop (%s)" % (field, sorted(got)),
              all(st == 200 and fin == "stop" and json.loads(t) in ("yes", "no", "maybe") for st, fin, t in got))
    st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
                                          "response_format": {"type": "json_object", "schema": {"type": "array", "maxItems": 0}}})
    check("json_object with llama.cpp's schema: [] (%r)" % r["choices"][0]["text"],
          st == 200 and json.loads(r["choices"][0]["text"]) == [] and r["choices"][0]["finish_reason"] == "stop")
    # an error message that quotes a request's bytes which are not UTF-8 (here a response_format
    # type) keeps the body well-formed: the bad byte becomes U+FFFD
    req = urllib.request.Request(URL + "/v1/completions", b'{"prompt":"a","max_tokens":2,"response_format":{"type":"\xffjson"}}',
                                 {"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        st, raw = 200, b""
    except urllib.error.HTTPError as e:
        st, raw = e.code, e.read()
    try:
        msg = json.loads(raw.decode("utf-8"))["error"]["message"]
    except (UnicodeDecodeError, ValueError, KeyError):
        msg = None
    check("an error quoting bytes that are not UTF-8: 400, well-formed (%r)" % msg, st == 400 and msg is not None and "\ufffd" in msg)
    # vLLM's guided_choice: the answer is exactly one of the texts (plain text)
    got = set()
    for seed in range(4):
        st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": seed,
                                              "guided_choice": ["Lily", "Tom", "the big dog"]})
        got.add((st, r["choices"][0]["finish_reason"], r["choices"][0]["text"]))
    check("guided_choice: each answer one of the three (%s)" % sorted(got),
          all(st == 200 and fin == "stop" and t in ("Lily", "Tom", "the big dog") for st, fin, t in got))
    for name, body in [("guided_choice not a list", {"guided_choice": "Lily"}), ("guided_choice empty", {"guided_choice": []}),
                       ("guided_choice with json_object", {"guided_choice": ["a"], "response_format": {"type": "json_object"}}),
                       ("guided_choice twice the same", {"guided_choice": ["a", "a"]})]:
        st, r = post_json("/v1/completions", dict(body, prompt="a", max_tokens=4))
        check("%s: 400 (%s)" % (name, r.get("error", {}).get("message", "")), st == 400)
    # vLLM's guided_regex: the whole answer is one match (Python's re checks it: another engine)
    import re as pyre
    pat = r"(Lily|Tom) (is|was) [a-z]+( [a-z]+){0,3}\."
    got = []
    for seed in range(4):
        st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "seed": seed,
                                              "guided_regex": pat})
        got.append((st, r["choices"][0]["finish_reason"], r["choices"][0]["text"]))
    check("guided_regex: each answer a whole match (%s)" % got,
          all(st == 200 and fin == "stop" and pyre.fullmatch(pat, t) for st, fin, t in got))
    # the four requests share the pattern's states: most of their masks were found kept
    m = urllib.request.urlopen(URL + "/metrics", timeout=60).read().decode()
    gm = {k: float(v) for k, v in pyre.findall(r"^fitllm_guide_mask_(hits|misses)_total (\S+)$", m, pyre.M)}
    check("guided_regex: masks kept by state (%s)" % gm, gm.get("misses", 0) > 0 and gm.get("hits", 0) > gm.get("misses", 0))
    for name, body, needle in [("guided_regex not a string", {"guided_regex": 3}, "must be a string"),
                               ("guided_regex that does not compile", {"guided_regex": "a(b"}, "offset 3"),
                               ("guided_regex with a backreference", {"guided_regex": "(a)\\1"}, "backreferences"),
                               ("guided_regex with guided_choice", {"guided_regex": "a", "guided_choice": ["a"]}, "one output constraint")]:
        st, r = post_json("/v1/completions", dict(body, prompt="a", max_tokens=4))
        msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
        check("%s: 400 (%s)" % (name, msg), st == 400 and needle in msg)
    for name, body, needle in [
            ("an unsupported keyword", {"guided_json": {"type": "object", "properties": {"s": {"type": "array", "uniqueItems": True}}}},
             "#/properties/s"),
            ("a pattern with a lookahead", {"guided_json": {"type": "object", "properties": {"s": {"type": "string", "pattern": "a(?=b)"}}}},
             "pattern at offset 1: assertions"),
            ("two schemas", {"guided_json": {"enum": [1]}, "json_schema": {"enum": [2]}}, "one JSON Schema"),
            ("json_schema without a schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs"),
            ("a schema of a bare number", {"guided_json": {"type": "integer"}}, "bare number"),
            ("a schema that is not JSON", {"guided_json": "{\"type\":"}, "not valid JSON")]:
        st, r = post_json("/v1/completions", dict(body, prompt="a", max_tokens=4))
        msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
        check("json_schema refused, %s: 400 (%s)" % (name, msg), st == 400 and needle in msg)
    # vLLM's structured_outputs (v0.12 removed the guided_* fields): each member answers as its
    # guided_* field does, seed for seed
    grammar = 'root ::= ("Yes" | "No") ", " [a-z]+ "."'
    for so, old in [({"choice": ["Lily", "Tom", "the big dog"]}, {"guided_choice": ["Lily", "Tom", "the big dog"]}),
                    ({"regex": pat}, {"guided_regex": pat}),
                    ({"json": {"type": "object", "properties": {"name": {"enum": ["Lily", "Tom"]}}, "required": ["name"]}},
                     {"guided_json": {"type": "object", "properties": {"name": {"enum": ["Lily", "Tom"]}}, "required": ["name"]}}),
                    ({"json": "{\"enum\": [\"yes\", \"no\"]}"}, {"guided_json": {"enum": ["yes", "no"]}}),
                    ({"grammar": grammar, "disable_fallback": True}, {"guided_grammar": grammar}),
                    ({"json_object": True}, {"response_format": {"type": "json_object"}})]:
        got = []
        for body in (dict(structured_outputs=so), old):
            st, r = post_json("/v1/completions", dict(body, prompt="Once upon a time", max_tokens=24, temperature=1.0, seed=3))
            got.append((st, r["choices"][0]["finish_reason"], r["choices"][0]["text"]) if st == 200 else (st, r))
        check("structured_outputs %s answers as %s (%r)" % (list(so)[0], list(old)[0], got[0]), got[0] == got[1] and got[0][0] == 200)
    for name, body, needle in [
            ("not an object", {"structured_outputs": ["a"]}, "must be an object"),
            ("an unknown member", {"structured_outputs": {"choices": ["a"]}}, "unknown field 'choices'"),
            ("choice beside guided_choice", {"structured_outputs": {"choice": ["a"]}, "guided_choice": ["b"]}, "one list of choices"),
            ("json beside guided_json", {"structured_outputs": {"json": {"enum": [1]}}, "guided_json": {"enum": [2]}}, "one JSON Schema"),
            ("regex beside guided_regex", {"structured_outputs": {"regex": "a"}, "guided_regex": "b"}, "one pattern"),
            ("grammar beside grammar", {"structured_outputs": {"grammar": "root ::= \"a\""}, "grammar": "root ::= \"b\""}, "one grammar"),
            ("regex and choice", {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "one output constraint"),
            ("choice not a list", {"structured_outputs": {"choice": "a"}}, "'structured_outputs.choice' must be an array"),
            ("json_object not a boolean", {"structured_outputs": {"json_object": 1}}, "must be a boolean"),
            ("disable_any_whitespace", {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "not supported"),
            ("structural_tag without structures", {"structured_outputs": {"structural_tag": "{}"}}, "needs 'structures'"),
            ("whitespace_pattern", {"structured_outputs": {"json_object": True, "whitespace_pattern": " "}}, "not supported")]:
        st, r = post_json("/v1/completions", dict(body, prompt="a", max_tokens=4))
        msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else ""
        check("structured_outputs refused, %s: 400 (%s)" % (name, msg), st == 400 and needle in msg)

    # 9. min_tokens and stop_token_ids (vLLM's): EOS (id 2) made likely ends at once, unless
    #    min_tokens holds it back; a stop token id (llama.cpp's 6th greedy token) ends before it
    eos = {"prompt": g["prompt_tokens"], "max_tokens": 40, "temperature": 0, "logit_bias": {"2": 100}}
    st, r1 = post_json("/v1/completions", eos)
    st2, r2 = post_json("/v1/completions", dict(eos, min_tokens=12))
    check("EOS made likely: stop after 0 tokens; min_tokens 12: stop after 12",
          st == st2 == 200 and r1["usage"]["completion_tokens"] == 0 and r1["choices"][0]["finish_reason"] == "stop"
          and r2["usage"]["completion_tokens"] == 12 and r2["choices"][0]["finish_reason"] == "stop")
    sid = g["greedy_tokens"][5]
    first = g["greedy_tokens"].index(sid)
    st, r3 = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 40, "temperature": 0, "stop_token_ids": [sid]})
    check("stop_token_ids [%d]: %d tokens, finish stop" % (sid, first),
          st == 200 and r3["usage"]["completion_tokens"] == first and r3["choices"][0]["finish_reason"] == "stop")
    st, r4 = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 40, "temperature": 0, "stop_token_ids": [sid],
                                           "min_tokens": first + 1})
    check("stop_token_ids held back by min_tokens", st == 200 and r4["usage"]["completion_tokens"] > first)
    # vLLM's stop_reason: the stop token id or stop string that ended it, else null
    st, r5 = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["zzz", "little"]})
    check("stop_reason: token id %d, string 'little' (%r), null at length and EOS" % (sid, r5["choices"][0].get("stop_reason")),
          r3["choices"][0]["stop_reason"] == sid and r5["choices"][0]["stop_reason"] == "little"
          and r5["choices"][0]["finish_reason"] == "stop" and r1["choices"][0]["stop_reason"] is None
          and post_json("/v1/completions", {"prompt": "a", "max_tokens": 2})[1]["choices"][0]["stop_reason"] is None)

    # 10. a list of prompts (OpenAI's batch; lm-evaluation-harness with batch_size > 1): one choice
    #     per prompt and sample, index = prompt x n + sample, each the same as the prompt alone
    texts = ["Once upon a time", "Lily and Tom went to the park", "The little dog was sad because"]
    alone = [post_json("/v1/completions", {"prompt": t, "max_tokens": 10, "temperature": 0})[1] for t in texts]
    st, rb = post_json("/v1/completions", {"prompt": texts, "max_tokens": 10, "temperature": 0})
    check("3 prompts: 3 choices in order, each the prompt's own text, usage summed",
          st == 200 and [c["index"] for c in rb["choices"]] == [0, 1, 2]
          and [c["text"] for c in rb["choices"]] == [a["choices"][0]["text"] for a in alone]
          and rb["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
          and rb["usage"]["completion_tokens"] == 30)
    st, rn2 = post_json("/v1/completions", {"prompt": texts[:2], "max_tokens": 6, "temperature": 0, "n": 2})
    check("2 prompts x n 2: 4 choices, 0-1 the first prompt's, 2-3 the second's", st == 200 and len(rn2["choices"]) == 4
          and rn2["choices"][1]["text"] == alone[0]["choices"][0]["text"][:len(rn2["choices"][1]["text"])]
          and rn2["choices"][2]["text"] == rn2["choices"][3]["text"] != rn2["choices"][0]["text"])
    ev = post_stream("/v1/completions", {"prompt": texts, "max_tokens": 10, "temperature": 0})
    got = ["", "", ""]
    for e in ev:
        for c in e["choices"]:
            got[c["index"]] += c["text"]
    check("3 prompts streamed: each index's text as without streaming", got == [c["text"] for c in rb["choices"]])
    # lm-evaluation-harness's loglikelihood batch: token-id lists, echo, logprobs 1, max_tokens 1
    lines = [json.loads(l) for l in open(shared + "/reference/stories260K.logits.jsonl")]
    st, rl = post_json("/v1/completions", {"prompt": [d["tokens"] for d in lines], "max_tokens": 1, "temperature": 0,
                                           "echo": True, "logprobs": 1})
    one = [post_json("/v1/completions", {"prompt": d["tokens"], "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1})[1]
           for d in lines]
    check("4 token-id prompts with echo: each choice's records equal its prompt alone",
          st == 200 and len(rl["choices"]) == 4 and all(c["logprobs"] == o["choices"][0]["logprobs"] for c, o in zip(rl["choices"], one)))

    # 12. llama.cpp's own POST /completion: its request fields and reply shape
    nc = {"prompt": g["prompt_tokens"], "n_predict": 16, "temperature": 0, "return_tokens": True}
    st, r = post_json("/completion", nc)
    check("/completion greedy: llama.cpp's 16 reference tokens, content, stop_type limit",
          st == 200 and r["tokens"] == g["greedy_tokens"][:16] and r["stop"] is True and r["stop_type"] == "limit"
          and r["tokens_predicted"] == 16 and r["tokens_evaluated"] == len(g["prompt_tokens"])
          and r["content"] == post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 16, "temperature": 0})[1]["choices"][0]["text"])
    gs = post_json("/completion", {"prompt": "a", "n_predict": 1})[1]["generation_settings"]
    check("/completion: llama.cpp's sampling defaults (%s)" % gs,
          close(gs["temperature"], 0.8, 1e-6) and gs["top_k"] == 40 and close(gs["top_p"], 0.95, 1e-6) and close(gs["min_p"], 0.05, 1e-6))
    ev = [json.loads(l[6:]) for l in post("/completion", dict(nc, stream=True))[1].splitlines() if l.startswith("data: ")]
    check("/completion stream: chunks with stop false, the final one stop true; the same content and tokens; no [DONE]",
          len(ev) >= 2 and all(e["stop"] is False for e in ev[:-1]) and ev[-1]["stop"] is True and ev[-1]["stop_type"] == "limit"
          and "".join(e["content"] for e in ev) == r["content"] and sum((e["tokens"] for e in ev[:-1]), []) == r["tokens"])
    st, rw = post_json("/completion", {"prompt": "Once upon a time", "n_predict": 30, "temperature": 0, "stop": ["zzz", "little"]})
    check("/completion stop word: stop_type word, stopping_word, content before it (%r)" % rw.get("content"),
          rw["stop_type"] == "word" and rw["stopping_word"] == "little" and not rw["content"].endswith("little") and "little" not in rw["content"])
    st, r0 = post_json("/completion", {"prompt": "Once upon a time", "n_predict": 0})
    check("/completion n_predict 0: the prompt alone", st == 200 and r0["content"] == "" and r0["tokens_predicted"] == 0 and r0["tokens_evaluated"] == 5)
    st, rp = post_json("/completion", dict(nc, n_probs=3))
    st2, rl = post_json("/v1/completions", {"prompt": g["prompt_tokens"], "max_tokens": 16, "temperature": 0, "logprobs": 3})
    cp = rp.get("completion_probabilities", [])
    check("/completion n_probs 3: a record per token, its id, 3 alternatives, the logprobs of /v1/completions",
          len(cp) == 16 and all(len(x["top_logprobs"]) == 3 and x["id"] == t for x, t in zip(cp, g["greedy_tokens"]))
          and all(close(x["logprob"], y, 1e-6) for x, y in zip(cp, rl["choices"][0]["logprobs"]["token_logprobs"])))
    st, rb = post_json("/completion", dict(nc, n_predict=1, logit_bias=[[g["greedy_tokens"][0], False]]))
    check("/completion logit_bias [[id, false]]: never that token", st == 200 and rb["tokens"][0] != g["greedy_tokens"][0])
    st, rs = post_json("/completion", {"prompt": ["Once upon a time", "The cat"], "n_predict": 4, "temperature": 0})
    check("/completion with two prompts: a list of two replies", st == 200 and isinstance(rs, list) and [x["index"] for x in rs] == [0, 1])
    a = post_json("/completion", {"prompt": "Once upon a time", "n_predict": 12, "temperature": 1, "seed": 9})[1]["content"]
    b = post_json("/completion", {"prompt": "Once upon a time", "n_predict": 12, "temperature": 1, "seed": 9})[1]["content"]
    check("/completion seed: the same text twice", a == b and len(a) > 0)
    for name, body, needle in [("mirostat 2", {"mirostat": 2}, "not supported"), ("samplers", {"samplers": ["top_k"]}, "not supported"),
                               ("typical_p 0.5", {"typical_p": 0.5}, "not supported"), ("n_predict -2", {"n_predict": -2}, "n_predict"),
                               ("logit_bias by text", {"logit_bias": [["Hello", 1.0]]}, "token texts"),
                               ("cache_prompt not a boolean", {"cache_prompt": 1}, "boolean")]:
        st, rr = post_json("/completion", dict({"prompt": "a", "n_predict": 2}, **body))
        msg = rr.get("error", {}).get("message", "") if isinstance(rr, dict) else ""
        check("/completion refused, %s: 400 (%s)" % (name, msg), st == 400 and needle in msg)
    st, rr = post_json("/completion", {"prompt": "a", "n_predict": 2, "typical_p": 1, "mirostat": 0, "cache_prompt": False, "id_slot": -1})
    check("/completion: samplers at their off values, cache_prompt and id_slot pass", st == 200)

    # 11. bad values -> 400
    for name, path, b in [
        ("logprobs 21", "/v1/completions", {"prompt": "a", "logprobs": 21}),
        ("logprobs -1", "/v1/completions", {"prompt": "a", "logprobs": -1}),
        ("logprobs 1.5", "/v1/completions", {"prompt": "a", "logprobs": 1.5}),
        ("logprobs true on completions", "/v1/completions", {"prompt": "a", "logprobs": True}),
        ("chat logprobs 3", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "logprobs": 3}),
        ("chat top_logprobs without logprobs", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}),
        ("chat top_logprobs 30", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 30}),
        ("echo on chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "echo": True}),
        ("echo not a boolean", "/v1/completions", {"prompt": "a", "echo": "yes"}),
        ("max_tokens 0 without echo", "/v1/completions", {"prompt": "a", "max_tokens": 0}),
        ("17 prompts in one request", "/v1/completions", {"prompt": ["a"] * 17}),
        ("3 prompts x n 8 (24 choices)", "/v1/completions", {"prompt": ["a", "b", "c"], "n": 8, "max_tokens": 2}),
        ("a list mixing a prompt and a number", "/v1/completions", {"prompt": ["a", 5]}),
        ("min_tokens -1", "/v1/completions", {"prompt": "a", "min_tokens": -1}),
        ("stop_token_ids not an array", "/v1/completions", {"prompt": "a", "stop_token_ids": 5}),
        ("stop_token_ids out of the vocabulary", "/v1/completions", {"prompt": "a", "stop_token_ids": [512]}),
        ("17 stop_token_ids", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "stop_token_ids": list(range(3, 20))}),
        ("response_format json_schema", "/v1/completions", {"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {}}}),
        ("response_format a string", "/v1/completions", {"prompt": "a", "response_format": "json_object"}),
        ("response_format without a type", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "response_format": {}}),
        ("logit_bias not an object", "/v1/completions", {"prompt": "a", "logit_bias": [1, 2]}),
        ("logit_bias key not a token id", "/v1/completions", {"prompt": "a", "logit_bias": {"a1": 1}}),
        ("logit_bias key out of the vocabulary", "/v1/completions", {"prompt": "a", "logit_bias": {"512": 1}}),
        ("logit_bias key negative", "/v1/completions", {"prompt": "a", "logit_bias": {"-1": 1}}),
        ("logit_bias value 101", "/v1/completions", {"prompt": "a", "logit_bias": {"5": 101}}),
        ("logit_bias value a string", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"5": "1"}}),
        ("an empty batch", "/v1/completions", {"prompt": [[]]}),
    ]:
        st, raw = post(path, b)
        check("%s -> 400 with an error object" % name, st == 400 and isinstance(json.loads(raw)["error"]["message"], str))


def repair(raw):
    """the server's rule for ill-formed UTF-8: each byte that starts no well-formed character
    becomes U+FFFD (Python's 'replace' folds a cut sequence into one)"""
    out, i = [], 0
    while i < len(raw):
        for n in (1, 2, 3, 4):
            try:
                out.append(raw[i:i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                pass
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def main_bytes():
    # a random model whose tokens are often single bytes of UTF-8 characters: names of such
    # tokens are "bytes:\xNN", the chat shape's bytes are exact, the JSON stays well-formed
    st, r = post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 1.0, "seed": 7, "logprobs": 3})
    lp = r["choices"][0]["logprobs"]
    named = [t for t in lp["tokens"] if t.startswith("bytes:")]
    check("byte tokens named bytes:\\xNN (%d of 48)" % len(named), st == 200 and named and all(
        len(t) > 6 and all(len(p) == 2 for p in t[6:].split("\\x")[1:]) for t in named))
    check("each sampled token in its top_logprobs", all(t in top for t, top in zip(lp["tokens"], lp["top_logprobs"])))
    st, r = post_json("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 48, "temperature": 1.0,
                                               "seed": 7, "logprobs": True, "top_logprobs": 3})
    content = r["choices"][0]["logprobs"]["content"]
    raw = b"".join(bytes(e["bytes"]) for e in content)
    check("chat: the records' bytes make the message (as the server repairs it)",
          st == 200 and len(content) == r["usage"]["completion_tokens"]
          and repair(raw) == r["choices"][0]["message"]["content"])


if sys.argv[2] == "--bytes":
    main_bytes()
else:
    main_stories(sys.argv[2])
print("%s" % ("all passed" if fails == 0 else "%d failed" % fails))
sys.exit(1 if fails else 0)
