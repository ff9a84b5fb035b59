#!/usr/bin/env python3
"""/infill against the layout llama.cpp gives a fill-in-the-middle prompt, on a server whose model
has a code vocabulary (StarCoder's: <fim_prefix>, <fim_suffix>, <fim_middle>, <repo_name>,
<file_sep>): the reply equals /completion's for the token ids that layout gives (built here from
/tokenize), prefix and suffix are cut to 3/4 and 1/4 of the batch, the extra chunks go first,
--spm-infill puts the suffix first, streaming gives the same text, bad fields are 400.
usage: serve_infill.py URL N_CTX SPM(0|1)"""
import json, sys, urllib.request, urllib.error

url, n_ctx, spm = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def ids(text, special=False):
    st, b = post("/tokenize", {"content": text, "add_special": False, "parse_special": special})
    assert st == 200, b
    return json.loads(b)["tokens"]

def one(text):
    t = ids(text, True)
    assert len(t) == 1, (text, t)
    return t[0]

PRE, SUF, MID, REP, SEP = (one(x) for x in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"))
n_batch = min(2048, n_ctx)

def layout(prefix, suffix, prompt, extra, n_predict):
    p, s, q = ids(prefix), ids(suffix), ids(prompt, True)
    ext = [REP] + ids("myproject\n")
    for c in extra:
        ext += [SEP] + ids(c.get("filename", "tmp") + "\n") + ids(c["text"])
    ext += [SEP] + ids("filename\n")
    q4 = n_batch // 4
    p = p[len(p) - min(len(p), 3 * q4):]
    s = s[:max(0, min(len(s), q4 - (2 + len(q))))]
    take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(ext))
    a, b = [PRE] + p + q, [SUF] + s
    first, last = (b, a) if spm else (a, b)
    return ext[len(ext) - take:] + first + last + [MID]

fails = 0
def check(what, cond, info=""):
    global fails
    print(("ok   - " if cond else "FAIL - ") + what + ("" if cond else ": " + str(info)[:400]))
    fails += 0 if cond else 1

cases = [
    ("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", "", [], 12),
    ("import os\n" * 400 + "def main():\n", "\n" + "x = 1\n" * 300, "    ", [{"filename": "util.py", "text": "def helper():\n    pass\n"}], 16),
    ("class A:\n", "", "    def", [{"filename": "a.py", "text": "A = 1\n"}, {"text": "B = 2\n"}], 8),
]
for k, (prefix, suffix, prompt, extra, n) in enumerate(cases):
    want = layout(prefix, suffix, prompt, extra, n)
    body = {"input_prefix": prefix, "input_suffix": suffix, "prompt": prompt, "input_extra": extra, "n_predict": n,
            "temperature": 0, "return_tokens": True}
    st, b = post("/infill", body)
    st2, b2 = post("/completion", {"prompt": want, "n_predict": n, "temperature": 0, "return_tokens": True})
    ok = st == 200 and st2 == 200
    if ok:
        r, r2 = json.loads(b), json.loads(b2)
        ok = r["content"] == r2["content"] and r["tokens"] == r2["tokens"] and r["tokens_evaluated"] == len(want) == r2["tokens_evaluated"]
    check("infill case %d: the reply is /completion's for llama.cpp's layout (%d prompt tokens)" % (k, len(want)), ok, (st, b[:200], st2, b2[:200]))
    if k == 1:
        check("infill: a long prefix and suffix are cut to 3/4 and 1/4 of the batch", len(want) < n_batch + 200, len(want))
    if k == 0:  # streamed: the same text
        st3, b3 = post("/infill", dict(body, stream=True))
        text = "".join(json.loads(l[6:]).get("content", "") for l in b3.splitlines() if l.startswith("data: ") and l[6:] != "[DONE]")
        check("infill stream: the same text", st3 == 200 and text == json.loads(b)["content"], (st3, b3[:300]))

# token ids and strings mixed in input_prefix (llama.cpp's tokenize_mixed)
st, b = post("/infill", {"input_prefix": ["def f", PRE, "(x):"], "input_suffix": "", "n_predict": 4, "temperature": 0})
check("infill: input_prefix mixes strings and ids", st == 200, b)
for bad, what in ((dict(input_extra={"text": "x"}), "input_extra not an array"), (dict(input_extra=[{"filename": "a"}]), "a chunk without text"),
                  (dict(input_prefix=3.5), "input_prefix a number"), (dict(input_prefix=[-1]), "a bad token id"),
                  (dict(prompt=[1, 2]), "prompt not a string"), (dict(n_predict="x"), "n_predict not a number")):
    st, b = post("/infill", dict({"input_prefix": "a", "input_suffix": "b"}, **bad))
    check("infill: %s is 400" % what, st == 400 and "error" in b, (st, b))
sys.exit(1 if fails else 0)
