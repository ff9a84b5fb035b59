#!/usr/bin/env python3
"""Random requests against a running `fitllm serve` (a fixed seed, so each run sends the same):
valid and invalid OpenAI bodies (wrong types, out-of-range numbers, unknown roles, token-id
prompts, stop strings, n > 1, streaming, logprobs, echo, logit_bias, priority, the adapter name "tuned",
JSON Schemas valid and not, tools and tool_choice valid and not, embeddings valid and not, /v1/responses valid and not,
chained and read back, /v1/messages valid and not), bodies cut or with a byte changed, and clients that
leave before or in the middle of the answer.  Every answer must be a 200 or a 4xx with an
OpenAI error object, never a 5xx (but /infill's 501 on a model without FIM tokens); a non-streamed 200 must parse as JSON; a streamed one (by
its Content-Type: a body with a byte changed may have lost its "stream") must end with [DONE]
when read to the end.  At the end the server must be healthy and hold no KV
blocks for running requests.
usage: serve_stress.py PORT N_REQUESTS SEED     prints the counts by status; exit 1 on a failure"""
import http.client, json, random, sys, time

PORT, N, SEED = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(SEED)
ODD = [None, True, False, 0, -1, 1, 2, 8, 1e308, -1e308, 1.5, 2 ** 63, -2 ** 63, 2 ** 31, "", "x", "\u0000",
       [], {}, [1], ["a"], [[]], {"a": 1}, "<s>", "</s>", "<|im_start|>", "\u00e9" * 300, "a" * 3000, 0.5, -0.5, 1e-320,
       "stop", ["\n", "the"], {"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}, {"5": -100}, {"3": 100, "7": 2.5}, {"99999": 1}, 20, 21, "tuned"]
SCHEMAS = [{"type": "object", "properties": {"a": {"type": "integer", "minimum": -3, "maximum": 50}, "b": {"enum": ["x", 1, None]},
                                            "c": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
            "required": ["a"], "additionalProperties": False},
           {"enum": ["yes", "no"]}, {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
           {"type": "object", "properties": {"n": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}}},
           {"type": "integer"}, {"type": "string", "pattern": "a"}, {"$ref": "#/nope"}, "{\"enum\":[true]}", "{", 7, True]
KEYS = ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "stop",
        "stream", "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "model", "user",
        "logprobs", "top_logprobs", "echo", "logit_bias", "response_format", "min_tokens", "stop_token_ids", "tools", "ignore_eos", "priority", "cache_salt", "truncate_prompt_tokens",
        "skip_special_tokens", "add_generation_prompt", "continue_final_message"]

def odd(depth=0):
    r = rng.random()
    if depth > 2 or r < 0.6:
        return rng.choice(ODD)
    if r < 0.8:
        return [odd(depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS + ["role", "content"]): odd(depth + 1) for _ in range(rng.randint(0, 3))}

def body():
    chat = rng.random() < 0.5
    d = {}
    if chat:
        d["messages"] = [{"role": rng.choice(["user", "user", "user", "system", "assistant", "developer", "tool", 3]),
                          "content": rng.choice(["Once upon a time", "hi", "Lily", odd(), [{"type": "text", "text": "Lily"}]])}
                         for _ in range(rng.randint(1 if rng.random() < 0.9 else 0, 3))]
    else:
        d["prompt"] = rng.choice(["Once upon a time", "The cat", odd(), [1, 2, 3],
                                  [rng.randint(-3, 600) for _ in range(rng.randint(0, 30))],
                                  ["Once upon a time", "The cat"], [[1, 2, 3], [1, 7]], ["a"] * rng.randint(1, 20)])
    for _ in range(rng.choice([0, 0, 0, 0, 1, 3])):
        d[rng.choice(KEYS)] = odd()
    d["max_tokens"] = odd() if rng.random() < 0.1 else rng.randint(1, 24)
    if rng.random() < 0.3:
        d["stream"] = True
    if chat and rng.random() < 0.15:  # vLLM's assistant prefill, valid or not (both true, a last turn not the assistant's)
        d["continue_final_message"] = rng.random() < 0.8
        d["add_generation_prompt"] = rng.choice([False, False, True, None, 1])
    if rng.random() < 0.1:
        d["skip_special_tokens"] = rng.choice([False, True, None, "no"])
    if rng.random() < 0.2:  # a server with --scheduling-policy priority reorders and preempts; FCFS answers 400
        d["priority"] = rng.randint(-3, 3)
    r = rng.random()
    if r < 0.1:  # a JSON Schema, valid or not, in each of the places the server reads one
        sch = rng.choice(SCHEMAS)
        where = rng.choice(["guided_json", "json_schema", "response_format"])
        d[where] = {"type": "json_schema", "json_schema": {"name": "s", "schema": sch}} if where == "response_format" else sch
    elif r < 0.14:  # vLLM's guided_choice, valid or not
        d["guided_choice"] = rng.choice([["Lily", "Tom"], ["a", "ab", "abc"], [], ["x", "x"], "Lily", [1], [" "]])
    elif r < 0.18:  # vLLM's guided_regex, valid or not (some no token can start, some slow to backtrack)
        d["guided_regex"] = rng.choice(["(Lily|Tom) [a-z]+", "[a-z ]{1,20}\\.", "\\d+", "a(b", "(a)\\1", "", "(a+)+b", "\u00e9+",
                                        "(?x) [A-Z] \\w* # word", "@@", 7, odd()])
    elif r < 0.22:  # GBNF grammar / guided_grammar, valid or not (left recursion, undefined rules, deep nesting)
        d[rng.choice(["grammar", "guided_grammar"])] = rng.choice([
            'root ::= ("Lily" | "Tom") " " [a-z]+ "."', 'root ::= "(" root ")" root | ""', 'root ::= [a-z ]{1,20} "."',
            'root ::= "{" ws ("\\"" [a-z]* "\\"" ws ":" ws [0-9]+ ws)? "}"\nws ::= [ \\n]*', 'root ::= root "a"', 'root ::= x',
            'root ::= "@"+', 'root ::= ("a"?)*', 'root ::= [\u00e9-\u00ff]+', "", 7, odd()])
        if rng.random() < 0.4:  # llama.cpp's lazy grammar: free until a trigger, valid or not
            d["grammar_lazy"] = rng.choice([True, True, False, odd()])
            d["grammar_triggers"] = rng.choice([
                [{"type": 1, "value": rng.choice(["Lily", " ", "a", "The"])}], [{"type": 2, "value": "(L|T)\\w*"}],
                [{"type": 3, "value": "[\\s\\S]*?(named)"}], [{"type": 0, "token": rng.randint(-1, 600)}], [{"word": "was"}],
                [{"type": 2, "value": "("}], [{"type": 9, "value": "x"}], [], [{"type": 1}] * 17, odd()])
    elif r < 0.26:  # vLLM's structured_outputs, valid or not
        d["structured_outputs"] = rng.choice([
            {"choice": ["Lily", "Tom"]}, {"regex": "(Lily|Tom) [a-z]+"}, {"json": rng.choice(SCHEMAS)}, {"json_object": True},
            {"grammar": 'root ::= [a-z ]{1,20} "."'}, {"json": "{\"type\":"}, {"choice": "a", "regex": 3}, {"nope": 1},
            {"json_object": True, "disable_any_whitespace": rng.choice([True, False])}, {"structural_tag": "x"}, [], odd()])
        if rng.random() < 0.5:  # vLLM's structural_tag, valid or not (Lily comes often: structures again and again)
            tag = {"structures": [{"begin": rng.choice(["Lily", "Tom", "Li"]), "schema": rng.choice(SCHEMAS + [True, False]),
                                   "end": rng.choice(["!", "", "</x>", odd()])}], "triggers": rng.choice([["Lily"], ["L", "T"], [], [""], odd()])}
            where = rng.choice(["structured_outputs", "structural_tag", "response_format"])
            d[where] = ({"structural_tag": rng.choice([tag, json.dumps(tag)])} if where == "structured_outputs" else
                        tag if where == "structural_tag" else dict(tag, type="structural_tag"))
    elif r < 0.32 and chat:  # tool calling, valid or not: tools, tool_choice, calls and results in the messages
        tool = {"type": "function", "function": {"name": "f", "parameters": rng.choice(SCHEMAS[:4] + [{"type": "object"}, odd()])}}
        d["tools"] = rng.choice([[tool], [tool, {"type": "function", "function": {"name": "g"}}], [], [{"type": "function"}],
                                 [tool, tool], [{"type": "function", "function": {"name": "a b"}}], odd()])
        if rng.random() < 0.7:
            d["tool_choice"] = rng.choice(["auto", "none", "required", {"type": "function", "function": {"name": "f"}},
                                           {"type": "function", "function": {"name": "zz"}}, odd()])
        if rng.random() < 0.3:
            d["parallel_tool_calls"] = rng.choice([True, False, odd()])
        if rng.random() < 0.3:
            d["messages"] += [{"role": "assistant", "content": rng.choice([None, "ok", odd()]),
                               "tool_calls": rng.choice([[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                                                         [{"function": {"name": "f", "arguments": {"x": 1}}}], [{}], odd()])},
                              {"role": "tool", "tool_call_id": "c", "content": rng.choice(["42", odd()])}]
    if chat and rng.random() < 0.1:  # reasoning: an output forced to think, the split asked or not, valid or not
        d["structured_outputs"] = {"regex": rng.choice(["<think>\n[a-z ]{0,12}\n</think>\n[A-Z][a-z ]{0,8}", "<think>[a-z]+", " *<thi"])}
        d["reasoning_format"] = rng.choice(["none", "deepseek", "auto", "raw", 3, None])
    if rng.random() < 0.05:  # vLLM's prompt_logprobs, valid or not (streamed: 400)
        d["prompt_logprobs"] = rng.choice([0, 1, 5, 20, 21, -1, True, "2", None])
    if rng.random() < 0.3:  # a server with --lora-modules tuned=FILE runs these through the adapter
        d["model"] = "tuned"
    raw = json.dumps(d).encode("utf-8", "surrogatepass")
    r = rng.random()
    altered = r < 0.1  # then whether it asks for a stream is the server's reading
    if r < 0.05:
        raw = raw[:rng.randrange(len(raw))]
    elif r < 0.1:
        i = rng.randrange(len(raw))
        raw = raw[:i] + bytes([rng.choice(b'"{}[]\\\x00\xff,:')]) + raw[i + 1:]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = rng.random()
    if r < 0.03:
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
    elif r < 0.06 and not chat:  # llama.cpp's /completion (or /infill: 501 without FIM tokens, 400 for bad fields)
        path = "/completion" if rng.random() < 0.8 else "/infill"
        if not altered:
            for k, v in [("n_predict", rng.choice([-1, 0, 3, 8, -2, "x"])), ("n_probs", rng.choice([0, 2, 25])),
                         ("return_tokens", rng.choice([True, False, 1])), ("repeat_last_n", rng.choice([0, -1, 16])),
                         ("logit_bias", rng.choice([[[5, False]], [[5, 1.5], [6, -2]], [["a", 1]], {"5": 2}, 3])),
                         ("mirostat", rng.choice([0, 2])), ("cache_prompt", rng.choice([True, None])),
                         ("input_prefix", rng.choice(["def f(", ["a", 5, "b"], 3, [-1], odd()])),
                         ("input_extra", rng.choice([[{"filename": "a.py", "text": "x = 1"}], [{"text": 5}], {"text": "x"}, [], odd()]))]:
                if rng.random() < 0.4:
                    d[k] = v
            raw = json.dumps(d).encode("utf-8", "surrogatepass")
    elif r < 0.09:  # the tokenizer endpoints, with the same bodies and some ids
        path = rng.choice(["/tokenize", "/detokenize", "/apply-template"])
        if rng.random() < 0.5:
            d = {"tokens": rng.choice([odd(), [rng.randint(-2, 600) for _ in range(rng.randint(0, 40))]]),
                 rng.choice(["add_special", "add_special_tokens", "content", "with_pieces", "parse_special"]): odd()}
            raw = json.dumps(d).encode("utf-8", "surrogatepass")
        return path, raw, False
    elif r < 0.13:  # embeddings (a server with --embeddings computes them; others answer 400), valid or not
        path = "/v1/embeddings"
        d = {"input": rng.choice(["Once upon a time", ["a", "The cat", "Lily"], [1, 403, 407], [[1, 2], [3]], "", [], odd(),
                                  ["x"] * rng.randint(1, 40), [rng.randint(-2, 600) for _ in range(rng.randint(0, 300))]])}
        for k, v in [("encoding_format", rng.choice(["float", "base64", "x", None])), ("normalize", odd()),
                     ("dimensions", rng.choice([64, 8, odd()])), ("truncate_prompt_tokens", rng.choice([-1, 2, 0, odd()]))]:
            if rng.random() < 0.3:
                d[k] = v
        return path, json.dumps(d).encode("utf-8", "surrogatepass"), False
    elif r < 0.31 and chat:  # OpenAI's Responses API, valid or not: the messages as input (or items), its fields, chained
        path = "/v1/responses"
        if not altered:
            d = responses_body(d)
            raw = json.dumps(d).encode("utf-8", "surrogatepass")
    elif r < 0.37 and chat:  # Anthropic's Messages API, valid or not: the messages as its blocks, its fields
        path = rng.choice(["/v1/messages"] * 4 + ["/v1/messages/count_tokens"])
        if not altered:
            d = messages_body(d)
            raw = json.dumps(d).encode("utf-8", "surrogatepass")
            if path.endswith("count_tokens"):
                d.pop("stream", None)  # (a count is never streamed)
    elif r < 0.38 and RESP_IDS:  # a stored response read, listed or deleted
        rid = rng.choice(RESP_IDS + ["resp_nope", "", "x/y"])
        return rng.choice([("GET", "/v1/responses/" + rid), ("DELETE", "/v1/responses/" + rid),
                           ("GET", "/v1/responses/%s/input_items?limit=%s&order=%s" % (rid, rng.choice(["2", "0", "x", "100"]), rng.choice(["asc", "desc", "up"])))]), b"", False
    return path, raw, d.get("stream") is True and not altered

def messages_body(d):
    """an Anthropic Messages request from chat body d: mostly valid, some blocks and fields refused or odd"""
    def pick(good, bad=()):
        r = rng.random()
        return odd() if r < 0.05 else rng.choice(bad) if r < 0.15 and bad else rng.choice(good)
    msgs = [{"role": m["role"], "content": m.get("content")} for m in d.get("messages", []) if isinstance(m, dict) and m.get("role") in ("user", "assistant")]
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}
    e = {"max_tokens": pick([rng.randint(1, 24)], [0, 10 ** 6]),
         "messages": pick([msgs or [{"role": "user", "content": "Lily"}],
                           [{"role": "user", "content": "Lily"}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}, use]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}, {"type": "text", "text": "and?"}]}],
                           [{"role": "user", "content": "Lily"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}]}]],
                          [[], [{"role": "user", "content": [{"type": "image", "source": {}}]}]])}
    for k, v in [("system", lambda: pick(["Be kind.", [{"type": "text", "text": "Be kind."}]], [[{"type": "image"}]])),
                 ("stop_sequences", lambda: pick([["the"], []])), ("temperature", lambda: pick([0, 0.7])),
                 ("tools", lambda: pick([[{"name": "f", "input_schema": rng.choice(SCHEMAS[:4])}]], [[{"type": "web_search_20250305", "name": "w"}]])),
                 ("tool_choice", lambda: pick([{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "f"}, {"type": "none"}], [{"type": "x"}])),
                 ("thinking", lambda: pick([{"type": "enabled", "budget_tokens": 100}, {"type": "disabled"}])),
                 ("structured_outputs", lambda: d.get("structured_outputs"))]:
        if rng.random() < 0.2:
            e[k] = v()
    if d.get("stream") is True:
        e["stream"] = True
    return e

RESP_IDS = []  # responses answered (their ids, for previous_response_id and GET)

def responses_body(d):
    """a Responses request from chat body d: mostly valid (input from its messages or items, fields
    the API has), some fields refused or odd"""
    def pick(good, bad=()):
        r = rng.random()
        return odd() if r < 0.05 else rng.choice(bad) if r < 0.15 and bad else rng.choice(good)
    msgs = [m for m in d.get("messages", []) if isinstance(m, dict) and m.get("role") in ("user", "system", "assistant", "developer")]
    items = [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "42"},
             {"type": "reasoning", "summary": []}, {"role": "user", "content": [{"type": "input_text", "text": "Lily"}]}]
    e = {"input": pick([msgs or "Lily", "Once upon a time", rng.sample(items, rng.randint(1, 4))],
                       [[{"type": "web_search_call"}], [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], []])}
    for k, v in [("max_output_tokens", lambda: pick([rng.randint(1, 24)], [0])), ("instructions", lambda: pick(["Be kind.", ""])),
                 ("previous_response_id", lambda: pick(RESP_IDS[-8:] or ["resp_nope"], ["resp_nope"])),
                 ("store", lambda: pick([True, False])), ("top_logprobs", lambda: pick([2, 0], [21])),
                 ("text", lambda: pick([{"format": {"type": "json_object"}}, {"format": {"type": "json_schema", "schema": rng.choice(SCHEMAS[:6])}},
                                        {"format": {"type": "text"}}], [{"format": {"type": "xml"}}])),
                 ("tools", lambda: pick([[{"type": "function", "name": "f", "parameters": rng.choice(SCHEMAS[:4])}]], [[{"type": "web_search"}]])),
                 ("tool_choice", lambda: pick(["auto", "required", "none", {"type": "function", "name": "f"}])),
                 ("include", lambda: pick([["message.output_text.logprobs"], ["reasoning.encrypted_content"]])),
                 ("metadata", lambda: pick([{"a": "b"}])), ("truncation", lambda: pick(["disabled"], ["auto"])),
                 ("temperature", lambda: pick([0, 0.7])), ("background", lambda: pick([False], [True])),
                 ("structured_outputs", lambda: d.get("structured_outputs"))]:
        if rng.random() < {"max_output_tokens": 0.8, "previous_response_id": 0.4}.get(k, 0.15):
            e[k] = v()
    if "max_output_tokens" not in e:
        e["max_output_tokens"] = rng.randint(1, 24)
    if d.get("stream") is True:
        e["stream"] = True
    return e

counts, failures = {}, []
for i in range(N):
    path, raw, stream = body()
    leave = rng.random()
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        method = "POST"
        if isinstance(path, tuple):
            method, path = path
        c.putrequest(method, path)
        c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(len(raw)))
        c.endheaders()
        c.send(raw)
        if leave < 0.05:  # gone before the answer
            continue
        resp = c.getresponse()
        if leave < 0.12:  # gone in the middle of it
            resp.read(rng.randint(1, 80))
            continue
        data = resp.read()
        counts[resp.status] = counts.get(resp.status, 0) + 1
        if resp.status >= 500 and not (resp.status == 501 and path == "/infill"):  # (a model without FIM tokens)
            failures.append("%d on %s %r: %r" % (resp.status, path, raw[:160], data[:200]))
        elif resp.status != 200:
            e = json.loads(data)
            if path.startswith("/v1/messages") and e.get("type") != "error":
                failures.append("%d not in Anthropic's error shape on %s: %r" % (resp.status, path, data[:200]))
            if not isinstance(e.get("error", {}).get("message"), str):
                failures.append("%d without an error message: %r" % (resp.status, data[:200]))
        elif (resp.getheader("Content-Type") or "").startswith("text/event-stream") and path in ("/completion", "/infill"):
            last = data.rstrip().split(b"\n")[-1]  # llama.cpp's stream: no [DONE]; the last event says stop
            if not last.startswith(b"data: {") or json.loads(last[6:]).get("stop") is not True:
                failures.append("/completion stream not ending with stop: true on %r: %r" % (raw[:160], data[-200:]))
        elif (resp.getheader("Content-Type") or "").startswith("text/event-stream") and path == "/v1/messages":
            last = data.rstrip().split(b"\n")[-1]  # Anthropic's stream: message_stop, or an error event
            if not last.startswith(b"data: {") or json.loads(last[6:]).get("type") not in ("message_stop", "error"):
                failures.append("/v1/messages stream not ending with message_stop on %r: %r" % (raw[:160], data[-200:]))
        elif (resp.getheader("Content-Type") or "").startswith("text/event-stream") and path == "/v1/responses":
            last = data.rstrip().split(b"\n")[-1]  # the Responses stream: its last event has the whole response
            if not last.startswith(b"data: {") or json.loads(last[6:]).get("type") not in ("response.completed", "response.incomplete", "response.failed"):
                failures.append("/v1/responses stream not ending with its response on %r: %r" % (raw[:160], data[-200:]))
            else:
                RESP_IDS.append(json.loads(last[6:])["response"]["id"])
        elif (resp.getheader("Content-Type") or "").startswith("text/event-stream"):
            if not data.rstrip().endswith(b"data: [DONE]"):
                failures.append("stream without [DONE] on %r: %r" % (raw[:160], data[-200:]))
        elif stream:
            failures.append("a stream asked for, a %s answer: %r" % (resp.getheader("Content-Type"), raw[:160]))
        else:
            j = json.loads(data)
            if path == "/v1/responses" and isinstance(j, dict) and j.get("object") == "response":
                RESP_IDS.append(j["id"])
    except ConnectionRefusedError as e:
        print("server gone: %s" % e)
        sys.exit(1)
    except Exception as e:
        failures.append("%s: %s on %r" % (type(e).__name__, e, raw[:160]))
    finally:
        c.close()

# the cancelled requests finish in the engine's next steps
for _ in range(100):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    c.request("GET", "/metrics")
    m = c.getresponse().read().decode()
    running = [l for l in m.splitlines() if l.startswith("fitllm_requests_running ")]
    used = [l for l in m.splitlines() if l.startswith("fitllm_kv_blocks_used ")]
    if running and used and float(running[0].split()[1]) == 0 and float(used[0].split()[1]) == 0:
        break
    time.sleep(0.1)
else:
    failures.append("after the run: %s %s" % (running, used))
print("serve_stress: %d requests, by status %s; %d responses (/v1/responses) answered" % (N, dict(sorted(counts.items())), len(RESP_IDS)))
for f in failures[:20]:
    print("FAIL: " + f)
sys.exit(1 if failures else 0)
