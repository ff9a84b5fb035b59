#!/usr/bin/env python3
"""POST /v1/embeddings against a running `fitllm serve --embeddings` of stories260K (mean pooling):
vectors of the model's width, L2-normalized unless asked not to, the same whether an input comes
alone, in a list, as text or as its token ids, beside a running generation or not; base64 as the
same floats; usage; truncate_prompt_tokens; refusals.
usage: serve_embeddings.py URL      exit 1 on a failure"""
import base64, math, os, struct, sys, threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_client import Client  # noqa: E402

URL = sys.argv[1]
client = Client(URL)
check, post = client.check, client.post


def close(a, b, tol=1e-6):
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tol


def norm(v):
    return math.sqrt(sum(x * x for x in v))


TEXTS = ["Once upon a time", "The cat sat on the mat.", "Lily and Tom went to the park to play."]
st, one = post("/v1/embeddings", {"input": TEXTS[0], "model": "x"})
v0 = one["data"][0]["embedding"] if st == 200 else []
check("one input: a list of one embedding of 64 floats, norm 1, OpenAI's shape",
      st == 200 and one["object"] == "list" and one["data"][0]["object"] == "embedding" and one["data"][0]["index"] == 0
      and len(v0) == 64 and abs(norm(v0) - 1) < 1e-6)
st, tk = post("/tokenize", {"prompt": TEXTS[0]})
check("usage: the prompt's tokens", one["usage"] == {"prompt_tokens": tk["count"], "total_tokens": tk["count"]})
st, many = post("/v1/embeddings", {"input": TEXTS})
alone = [post("/v1/embeddings", {"input": t})[1]["data"][0]["embedding"] for t in TEXTS]
check("a list: one per input, in order, each as alone",
      st == 200 and [d["index"] for d in many["data"]] == [0, 1, 2]
      and all(close(d["embedding"], a) for d, a in zip(many["data"], alone)))
check("different texts, different vectors", not close(alone[0], alone[1], 1e-3))
st, ids = post("/v1/embeddings", {"input": tk["tokens"]})
check("token ids: as their text", st == 200 and close(ids["data"][0]["embedding"], v0))
st, b64 = post("/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
raw = base64.b64decode(b64["data"][0]["embedding"]) if st == 200 else b""
check("base64: the same floats, little-endian f32", len(raw) == 256 and close(struct.unpack("<64f", raw), v0))
st, raw_v = post("/v1/embeddings", {"input": TEXTS[0], "normalize": False})
rv = raw_v["data"][0]["embedding"] if st == 200 else [0]
check("normalize false: the pooled vector itself, the same direction",
      st == 200 and abs(norm(rv) - 1) > 1e-3 and close([x / norm(rv) for x in rv], v0, 1e-5))
st, tr = post("/v1/embeddings", {"input": tk["tokens"], "truncate_prompt_tokens": 2})
st2, last2 = post("/v1/embeddings", {"input": tk["tokens"][-2:]})
check("truncate_prompt_tokens 2: the last two tokens'", st == 200 and close(tr["data"][0]["embedding"], last2["data"][0]["embedding"])
      and tr["usage"]["prompt_tokens"] == 2)
# beside a generation that is running
res = {}
t = threading.Thread(target=lambda: res.update(g=post("/v1/completions", {"prompt": "Once", "max_tokens": 200, "ignore_eos": True})))
t.start()
st, during = post("/v1/embeddings", {"input": TEXTS})
t.join()
check("beside a running generation: the same vectors, and the generation finishes",
      st == 200 and all(close(d["embedding"], a, 1e-5) for d, a in zip(during["data"], alone))
      and res["g"][0] == 200 and res["g"][1]["usage"]["completion_tokens"] == 200)
for name, body in [("dimensions other than the model's", {"input": "a", "dimensions": 8}),
                   ("an empty list", {"input": []}),
                   ("an empty string", {"input": ""}),
                   ("a token id out of the vocabulary", {"input": [1, 99999]}),
                   ("encoding_format other than float / base64", {"input": "a", "encoding_format": "int8"}),
                   ("an input longer than the context", {"input": [1] * 2000}),
                   ("no input", {"model": "x"})]:
    st, b = post("/v1/embeddings", body)
    check("refused: " + name, st == 400 and "message" in b.get("error", {}))
print("serve_embeddings: %d failed" % client.fails)
sys.exit(1 if client.fails else 0)
