"""What the server tests' scripts share: a JSON POST to the server under test, and the checks'
tally (tests/serve_tools.py, tests/serve_embeddings.py)."""
import json, urllib.error, urllib.request


class Client:
    def __init__(self, url):
        self.url, self.fails = url, 0

    def check(self, name, ok):
        print(("ok   " if ok else "FAIL ") + name)
        self.fails += 0 if ok else 1

    def post(self, path, body):
        """(status, parsed JSON body) of POST path with body as JSON; errors too"""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
