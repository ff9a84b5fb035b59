"""Out of memory at each allocation of `fitllm serve` in turn.

FL_MEM_FAIL_AFTER=N makes the server's N+1-th tracked allocation fail.  For each N (from 0, with a
stride that keeps the sweep near BUDGET seconds) a server starts and runs a fixed script of
requests three times.  The server may refuse to start (exit 1 with a message).  Once it listens,
every request of the first two passes (the injection lands in the first, or near its end in the
second: one pass's count varies by a few with the threads' timing) must answer what it answers
without injection, or a clean error: an HTTP error status with a JSON error body, a body or
stream that ends with an error (the status, 200, goes out before the reply is made), or a choice
that finished with "error" and its reason.  The third pass must answer exactly what it answers
without injection (a failure loses nothing: no block, budget or lock is left held).  Then SIGTERM
must stop the server with exit 0 and no sanitizer report.  The sweep ends past the allocations of
start-up and one pass.

Args: fitllm model [budget-seconds [--embeddings] [--concurrent] [--lora]] (--embeddings: a server
with it, and a script of embedding requests; --concurrent: the first pass's requests all at once,
its /metrics gauges then not compared; --lora: a server with an adapter from --lora-modules and a
slot for run-time adapters, and a script that loads one, generates with both and unloads it; a
request that names the run-time adapter may be refused when that pass's load was refused)."""
import atexit, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request

BIN, MODEL = sys.argv[1], sys.argv[2]
BUDGET = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
EMBD = "--embeddings" in sys.argv[4:]  # (a server with --embeddings, and a script with embeddings)
LORA = "--lora" in sys.argv[4:]
ARGS = ["serve", "-m", MODEL, "--port", "0", "-t", "1", "--max-seqs", "4", "--kv-mem", "1MiB", "-c", "512"] + (["--embeddings"] if EMBD else [])
if LORA:  # an adapter of stories260K: two steps of `train --lora 4` on TinyStories
    TMP = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, TMP, True)
    text = open(os.path.join(os.path.dirname(os.path.dirname(MODEL)), "data", "tinystories_val.txt"), encoding="utf-8").read()[:20000]
    open(os.path.join(TMP, "t.txt"), "w", encoding="utf-8").write(text)
    ADAPTER = os.path.join(TMP, "r.lora.gguf")
    subprocess.run([BIN, "train", "-m", MODEL, "-f", os.path.join(TMP, "t.txt"), "-c", "64", "--batch", "2", "--steps", "2",
                    "--lr", "3e-2", "--lora", "4", "-t", "1", "-o", os.path.join(TMP, "r.gguf")], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ARGS += ["--lora-modules", "tuned=" + ADAPTER, "--lora-slots", "1", "--max-lora-rank", "4"]
ERR_STATUS = {500, 503, 507}


def start(fail_after):
    """(process, url or None, stderr lines so far)"""
    env = dict(os.environ)
    if fail_after is not None:
        env["FL_MEM_FAIL_AFTER"] = str(fail_after)
    p = subprocess.Popen([BIN] + ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    lines, url = [], None
    got = threading.Event()

    def reader():
        nonlocal url
        for line in p.stderr:
            lines.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m and url is None:
                url = m.group(1)
                got.set()
        got.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    got.wait(60)
    p.reader = t
    return p, url, lines


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hang"
    p.reader.join(10)
    return rc


def request(url, method, path, body=None, stream=False):
    """('ok', normalized answer) or ('error', status) or ('bad', why)"""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
    except urllib.error.HTTPError as e:
        try:
            b = json.loads(e.read())
            assert isinstance(b["error"]["message"], str) and b["error"]["message"]
        except Exception:
            return "bad", "HTTP %d without a JSON error" % e.code
        return ("error", e.code) if e.code in ERR_STATUS else ("bad", "HTTP %d: %s" % (e.code, b["error"]["message"]))
    except Exception as e:
        return "bad", "no answer: %r" % e
    if path.endswith("_lora_adapter"):
        return "ok", raw  # (vLLM's plain-text answer)
    if stream:
        try:
            events = [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
        except ValueError:
            return "bad", "a stream event that is not JSON: %r" % raw[-300:]
        if events and ("error" in events[-1] or events[-1].get("type") in ("error", "response.failed")):
            return "error", "stream"
        text = "".join((c.get("text") or c.get("delta", {}).get("content") or "") for e in events for c in e.get("choices", []))
        text += "".join(json.dumps(t.get("function", {})) for e in events for c in e.get("choices", []) for t in c.get("delta", {}).get("tool_calls") or [])
        # the Responses API's output_text deltas, Anthropic's text deltas
        # (and llama.cpp's /completion: content)
        text += "".join(e["delta"] if isinstance(e.get("delta"), str) else e["delta"].get("text", "") if isinstance(e.get("delta"), dict)
                        else e["content"] if isinstance(e.get("content"), str) else "" for e in events if "choices" not in e)
        if events and "choices" not in events[-1]:
            return "ok", (text, sorted({str(e.get("type")) for e in events}), raw.rstrip().endswith("}"))  # (chunking varies)
        fins = [c.get("finish_reason") for e in events for c in e.get("choices", []) if c.get("finish_reason")]
        if "error" in fins:
            return "error", "finish_reason"
        return "ok", (text, fins, raw.rstrip().endswith("data: [DONE]"))
    if path == "/metrics":
        # the gauges that must be back to zero between requests (counters grow)
        keep = [l for l in raw.splitlines() if re.match(r"(fitllm|vllm):(num_requests_running|num_requests_waiting|kv_cache_usage_perc|gpu_cache_usage_perc)\b", l)]
        return "ok", keep
    try:
        b = json.loads(raw)
    except ValueError:
        return "bad", "HTTP 200 with a body that is not JSON: %r" % raw[:200]
    if isinstance(b, list):
        return "ok", b  # (llama.cpp's /lora-adapters)
    # a request the engine could not finish: finish_reason "error" and the reason beside it
    choices = b.get("choices") if isinstance(b.get("choices"), list) else []
    if any(c.get("finish_reason") == "error" and isinstance(c.get("error"), str) for c in choices):
        return "error", "finish_reason"
    if isinstance(b, dict) and isinstance(b.get("error"), dict) and isinstance(b["error"].get("message"), str) and "choices" not in b:
        return "error", "body"  # (the status, 200, went out before the body)
    if isinstance(b, dict) and isinstance(b.get("error"), str) and "content" in b:
        return "error", "native"  # (llama.cpp's /completion: the reason beside what was made)
    if b.get("status") == "failed" and isinstance(b.get("error"), dict) or b.get("stop_reason") == "error":
        return "error", "status"
    for k in ("id", "created", "created_at", "system_fingerprint"):
        b.pop(k, None)
    if isinstance(b.get("usage"), dict):
        u = b["usage"]  # (Anthropic's input_tokens leave out the prefix cache's: count them back)
        if isinstance(u.get("input_tokens"), int) and isinstance(u.get("cache_read_input_tokens"), int):
            u["input_tokens"] += u["cache_read_input_tokens"]
        # timings, and the prefix cache's hits (they depend on what earlier requests left cached)
        b["usage"] = {k: v for k, v in b["usage"].items() if "time" not in k and "cache" not in k and not k.endswith("tokens_details")}
    b.pop("timings", None)
    for c in choices:  # (a tool call's id is random)
        for t in (c.get("message") or {}).get("tool_calls") or []:
            t.pop("id", None)
    if path == "/v1/responses":
        b.pop("output", None)  # item ids are random; the text is in output_text
        b.pop("previous_response_id", None)
    return "ok", b


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                                    "required": ["city"]}}}]
SCRIPT = [
    ("GET", "/health", None, False),
    ("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}, False),
    ("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stream": True}, True),
    ("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["Lily"]}, False),
    ("POST", "/v1/completions", {"prompt": ["The cat", "A dog"], "max_tokens": 8, "temperature": 0, "logprobs": 2}, False),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "temperature": 0, "n": 2, "seed": 3}, False),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "temperature": 0, "stream": True}, True),
    ("POST", "/v1/completions", {"prompt": "Lily", "max_tokens": 16, "temperature": 0, "response_format": {"type": "json_object"}}, False),
    ("POST", "/v1/completions", {"prompt": "Tom", "max_tokens": 8, "temperature": 0, "guided_choice": ["yes", "no"]}, False),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 120, "temperature": 0,
                                      "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}, False),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 120, "temperature": 0,
                                      "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "stream": True}, True),
    ("POST", "/completion", {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0}, False),
    ("POST", "/v1/responses", {"input": "Once upon a time", "max_output_tokens": 8, "temperature": 0}, False),
    ("POST", "/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}, False),
    ("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 6, "temperature": 0, "stream": True, "store": False}, True),
    ("POST", "/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0, "stream": True}, True),
    ("POST", "/completion", {"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "stream": True}, True),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}, False),
    ("POST", "/tokenize", {"content": "Once upon a time"}, False),
    ("POST", "/detokenize", {"tokens": [1, 403, 407, 261, 378]}, False),
    ("GET", "/v1/models", None, False),
    ("GET", "/metrics", None, False),
]


if EMBD:
    SCRIPT = SCRIPT[:2] + [
        ("POST", "/v1/embeddings", {"input": "Once upon a time"}, False),
        ("POST", "/v1/embeddings", {"input": ["The cat", "A dog sat", [1, 403, 407]]}, False),
        ("POST", "/v1/embeddings", {"input": "Lily", "encoding_format": "base64"}, False),
        ("POST", "/embeddings", {"content": "Tom"}, False),
    ] + SCRIPT[-3:]


DEPENDS = set()  # requests on the state the pass's load_lora_adapter and unload_lora_adapter leave
if LORA:
    SCRIPT = SCRIPT[:1] + [
        ("POST", "/v1/completions", {"model": "tuned", "prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}, False),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "extra", "lora_path": ADAPTER}, False),
        ("POST", "/v1/completions", {"model": "extra", "prompt": "Lily", "max_tokens": 10, "temperature": 0}, False),
        ("POST", "/v1/chat/completions", {"model": "extra", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
                                          "temperature": 0, "stream": True}, True),
        ("POST", "/completion", {"prompt": "Tom", "n_predict": 8, "temperature": 0, "lora": [{"id": 0, "scale": 0.5}]}, False),
        ("GET", "/lora-adapters", None, False),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "extra"}, False),
    ] + SCRIPT[-2:]
    # what shows the run-time adapter's state: the load, the requests that name it, the lists, the
    # unload.  A load or unload refused for memory leaves the state as it was (an adapter not
    # loaded, or still loaded: the next pass's load then finds it), so in a pass where either
    # answered otherwise these are not compared
    DEPENDS = {2, 3, 4, 6, 7, 8}


CONCURRENT = "--concurrent" in sys.argv[4:]  # (the first pass's requests all at once)


def run_script(url, concurrent=False):
    if not concurrent:
        return [request(url, m, p, b, s) for (m, p, b, s) in SCRIPT]
    out = [None] * len(SCRIPT)

    def one(i):
        m, p, b, s = SCRIPT[i]
        out[i] = request(url, m, p, b, s)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(SCRIPT))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def sanitizer(lines):
    return [l for l in lines if re.search(r"AddressSanitizer|LeakSanitizer|runtime error|fatal:", l)]


def main():
    # without injection: the answers, and the allocations of start-up and one pass
    t0 = time.time()
    p, url, lines = start(None)
    if not url:
        print("FAIL: the server did not start:", "".join(lines)[-2000:])
        return 1
    base = run_script(url)
    again = run_script(url)
    rc = stop(p)
    one_run = time.time() - t0
    bad = [(SCRIPT[i][1], r) for i, r in enumerate(base) if r[0] != "ok"]
    if bad or rc != 0:
        print("FAIL: without injection:", bad, "exit", rc, "".join(lines)[-2000:])
        return 1
    if again != base:
        print("FAIL: without injection the second pass differs:", [(SCRIPT[i][1], a, b) for i, (a, b) in enumerate(zip(again, base)) if a != b][:2])
        return 1
    p, url, lines = start(10**9)
    run_script(url)
    rc = stop(p)
    counts = [int(m.group(1)) for l in lines for m in [re.search(r"no allocation failed \((\d+) allocations\)", l)] if m]
    if rc != 0 or not counts:
        print("FAIL: no allocation count at exit (exit %s)" % rc, "".join(lines)[-1000:])
        return 1
    total = counts[0]
    stride = int(os.environ.get("FL_OOM_STRIDE", 0)) or max(1, int(total * one_run / BUDGET) + 1)
    runs = refused = absorbed = errors = 0
    n = int(os.environ.get("FL_OOM_FROM", 0))
    while True:
        p, url, lines = start(n)
        runs += 1
        if not url:
            rc = stop(p)
            msgs = [l for l in lines if "FL_MEM_FAIL_AFTER" not in l and l.strip()]
            if rc != 1 or not msgs or sanitizer(lines):
                print("FAIL: FL_MEM_FAIL_AFTER=%d: start-up ended with exit %s" % (n, rc), "".join(lines)[-2000:])
                return 1
            refused += 1
        else:
            first = run_script(url, CONCURRENT)
            second = run_script(url)  # (the injection may land here: one pass's count varies by a few)
            if LORA and "extra" in json.dumps(request(url, "GET", "/v1/models")):
                # an unload refused for memory: the adapter is still there, and goes now
                cleanup = request(url, "POST", "/v1/unload_lora_adapter", {"lora_name": "extra"})
                if cleanup != base[7]:
                    print("FAIL: FL_MEM_FAIL_AFTER=%d: unloading the adapter again: %r" % (n, cleanup))
                    stop(p)
                    return 1
            third = run_script(url)
            rc = stop(p)
            why = None
            for k, got in enumerate((first, second)):
                loaded = not DEPENDS or (got[2] == base[2] and got[7] == base[7])
                for i, (a, b) in enumerate(zip(got, base)):
                    if CONCURRENT and k == 0 and SCRIPT[i][1] == "/metrics" and a[0] == "ok":
                        continue  # (its gauges count the requests beside it)
                    if i in DEPENDS and not loaded:
                        continue  # (the run-time adapter's load or unload was refused)
                    if a != b and a[0] != "error" and why is None:
                        why = "pass %d, %s %s: %r (without injection %r)" % (k + 1, SCRIPT[i][0], SCRIPT[i][1], a, b)
            for i, (a, b) in enumerate(zip(third, base)):
                if a != b and why is None:
                    why = "third pass, %s %s: %r (without injection %r)" % (SCRIPT[i][0], SCRIPT[i][1], a, b)
            if why is None and (rc != 0 or sanitizer(lines)):
                why = "exit %s" % rc
            if why:
                print("FAIL: FL_MEM_FAIL_AFTER=%d: %s" % (n, why))
                k = next((i for i, l in enumerate(lines) if sanitizer([l])), max(0, len(lines) - 30))
                print("".join(lines[k:k + 60]))
                return 1
            errors += sum(1 for a in first + second if a[0] == "error")
            if first == base and second == base:
                absorbed += 1
        n += stride
        if n > total:
            break
    print("serve: %d allocations to the end of one pass, %d runs (every %d): %d refused to start, %d request errors, "
          "%d runs answered as without injection" % (total, runs, stride, refused, errors, absorbed))
    return 0


sys.exit(main())
