"""What the server tests' scripts share: a JSON POST to the server under test, and the checks'
tally, a typed event stream, and a greedy chat completion to compare with (tests/serve_tools.py,
tests/serve_embeddings.py, tests/serve_responses.py, tests/serve_messages.py)."""
import json, urllib.error, urllib.request


class Client:
    def __init__(self, url):
        self.url, self.fails = url, 0

    def check(self, name, ok):
        """print the check's line; returns ok, so a failure can say more"""
        print(("ok   " if ok else "FAIL ") + name)
        self.fails += 0 if ok else 1
        return ok

    def post(self, path, body):
        """(status, parsed JSON body) of POST path with body as JSON; errors too"""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def events(self, path, body):
        """the events of a streamed POST of body (stream set): [(the event line's name, data)]"""
        req = urllib.request.Request(self.url + path, data=json.dumps(dict(body, stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
        out, name = [], None
        with urllib.request.urlopen(req) as r:
            for line in r:
                line = line.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    out.append((name, json.loads(line[6:])))
                    name = None
        return out

    def chat(self, messages, **kw):
        """the greedy chat completion of messages (kw: its other fields); asserts a 200"""
        st, b = self.post("/v1/chat/completions", dict(kw, messages=messages, temperature=0))
        assert st == 200, b
        return b
