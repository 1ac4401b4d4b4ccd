#!/usr/bin/env python3
"""Serve a Python environment class to oxalign's multi-turn episodes (`env.kind = "http"`).

An environment is a class; each episode is one instance:

    class Guess:
        def __init__(self, prompt, answer=None, **columns):
            self.answer = answer
        def step(self, turn):                 # the model's turn, as text
            if self.answer in turn:
                return {"reward": 1.0, "done": True}
            return {"reply": [{"role": "user", "content": "No, try again."}],
                    "reward": 0.0, "done": False}
        def close(self):                       # optional
            pass

`step` returns a dict with `reply` (a list of {"role", "content"} messages, or one string,
sent as a `user` message), `reward` (a finite number) and `done`. The episode's dataset row
reaches `__init__`: the prompt text, the reference answer and every other column as a
keyword argument.

This server speaks the protocol of docs/ENVIRONMENTS.md: `POST /reset`, `/step`, `/close`,
JSON both ways. A step sent again with the same `turn_index` (oxalign retried it) gets the
stored answer instead of running again; an out-of-order one is refused (HTTP 409). An
exception in the class answers HTTP 500 with its message, so the episode fails loudly and
never turns into a made-up reward. Episodes idle longer than `--idle-timeout-s` are
forgotten. It uses the standard library only.

    python3 tools/env_server.py --file my_env.py --class Guess [--host 127.0.0.1] [--port 8000]

With `--port 0` the system picks a free port. The first line on stdout is the URL to put in
`[env.http] url` (and the only one: what the class prints goes to stderr). The server
listens on 127.0.0.1 unless told otherwise, reads at most `--max-body-bytes` per request
(Content-Length required), serves at most `--max-connections` requests at once (others get
503 and oxalign retries), holds at most `--max-episodes` episodes and drops a client that
stalls for `--read-timeout-s`. Nothing from a request reaches a shell.
"""

import argparse
import importlib.util
import json
import math
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fail(message):
    """Bad input: the message on stderr, exit code 2."""
    print(f"env_server: {message}", file=sys.stderr)
    sys.exit(2)


def load_class(path, name):
    """The class `name` of the Python file `path`."""
    spec = importlib.util.spec_from_file_location("oxalign_user_env", path)
    if spec is None or spec.loader is None:
        fail(f"cannot load {path!r}: expected a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        fail(f"importing {path!r} failed:\n{traceback.format_exc(limit=2)}")
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        fail(f"{path!r} defines no class {name!r}")
    return cls


class Refused(Exception):
    """A request the server refuses: (HTTP status, message)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def checked_step(answer):
    """The class's `step` answer in protocol form, or raises ValueError."""
    if not isinstance(answer, dict):
        raise ValueError(f"step returned {type(answer).__name__}, expected a dict")
    reply = answer.get("reply", [])
    if isinstance(reply, str):
        reply = [{"role": "user", "content": reply}]
    if not isinstance(reply, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in reply
    ):
        raise ValueError("step's reply must be a string or a list of {role, content} strings")
    reward = answer.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"step's reward {reward!r} is not a finite number")
    return {
        "reply": [{"role": m["role"], "content": m["content"]} for m in reply],
        "reward": float(reward),
        "done": bool(answer.get("done", False)),
    }


class Episodes:
    """The live episodes, each with its last answered turn."""

    def __init__(self, cls, max_episodes, idle_timeout_s):
        self.cls, self.max, self.idle = cls, max_episodes, idle_timeout_s
        self.lock = threading.Lock()
        self.live = {}  # id -> {"env", "turn", "answer", "used", "lock"}

    def expire(self):
        now = time.monotonic()
        with self.lock:
            old = [k for k, e in self.live.items() if now - e["used"] > self.idle]
            dropped = [self.live.pop(k) for k in old]
        for e in dropped:
            close(e["env"])

    def reset(self, req):
        self.expire()
        prompt = req.get("prompt")
        if not isinstance(prompt, str):
            raise Refused(400, "reset needs a string \"prompt\"")
        columns = req.get("columns") or {}
        if not isinstance(columns, dict):
            raise Refused(400, "\"columns\" must be an object")
        # a column named like a fixed argument (the answer column) is not passed again
        columns = {k: v for k, v in columns.items() if k not in ("prompt", "answer")}
        with self.lock:
            if len(self.live) >= self.max:
                raise Refused(503, f"{self.max} episodes are live; close some")
        try:
            env = self.cls(prompt=prompt, answer=req.get("answer"), **columns)
        except Exception as e:
            raise ValueError(f"{self.cls.__name__}(...) raised {type(e).__name__}: {e}")
        episode_id = uuid.uuid4().hex
        with self.lock:
            self.live[episode_id] = {
                "env": env, "turn": -1, "answer": None,
                "used": time.monotonic(), "lock": threading.Lock(),
            }
        return {"episode_id": episode_id}

    def get(self, req):
        with self.lock:
            e = self.live.get(req.get("episode_id"))
        if e is None:
            raise Refused(404, f"no live episode {req.get('episode_id')!r}")
        return e

    def step(self, req):
        e = self.get(req)
        index, turn = req.get("turn_index"), req.get("turn")
        if not isinstance(index, int) or not isinstance(turn, str):
            raise Refused(400, "step needs an integer \"turn_index\" and a string \"turn\"")
        with e["lock"]:
            e["used"] = time.monotonic()
            if index == e["turn"]:
                return e["answer"]  # a retry: the same answer, not a second step
            if index != e["turn"] + 1:
                raise Refused(409, f"turn_index {index} after turn {e['turn']}")
            try:
                answer = checked_step(e["env"].step(turn))
            except ValueError:
                raise
            except Exception as ex:
                raise ValueError(
                    f"{self.cls.__name__}.step raised {type(ex).__name__}: {ex}\n"
                    + traceback.format_exc(limit=3)
                )
            e["turn"], e["answer"] = index, answer
            return answer

    def close(self, req):
        with self.lock:
            e = self.live.pop(req.get("episode_id"), None)
        if e is not None:
            close(e["env"])
        return {}


def close(env):
    f = getattr(env, "close", None)
    if callable(f):
        try:
            f()
        except Exception as e:
            print(f"env_server: close raised {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def make_handler(episodes, limits):
    slots = threading.BoundedSemaphore(limits.max_connections)
    routes = {"/reset": episodes.reset, "/step": episodes.step, "/close": episodes.close}

    class Handler(BaseHTTPRequestHandler):
        timeout = limits.read_timeout_s
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: one line per failure only
            pass

        def reply(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            if not slots.acquire(blocking=False):
                self.close_connection = True
                return self.reply(503, {"error": "busy: too many requests at once"})
            try:
                self.answer()
            finally:
                slots.release()

        def answer(self):
            route = routes.get(self.path.rstrip("/") or "/")
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True
                return self.reply(411, {"error": "Content-Length required"})
            if int(length) > limits.max_body_bytes:
                self.close_connection = True
                return self.reply(413, {"error": f"body over {limits.max_body_bytes} bytes"})
            body = self.rfile.read(int(length))
            if route is None:
                return self.reply(404, {"error": f"no endpoint {self.path!r}: /reset, /step, /close"})
            try:
                req = json.loads(body)
                if not isinstance(req, dict):
                    raise Refused(400, "expected a JSON object")
                return self.reply(200, route(req))
            except json.JSONDecodeError as e:
                return self.reply(400, {"error": f"request body is not JSON: {e}"})
            except Refused as e:
                return self.reply(e.status, {"error": str(e)})
            except ValueError as e:
                print(f"env_server: {e}", file=sys.stderr, flush=True)
                return self.reply(500, {"error": str(e)})

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", required=True, help="Python file defining the environment class")
    p.add_argument("--class", dest="cls", required=True, help="the class's name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20)
    p.add_argument("--max-connections", type=int, default=64)
    p.add_argument("--max-episodes", type=int, default=4096)
    p.add_argument("--read-timeout-s", type=float, default=30.0)
    p.add_argument("--idle-timeout-s", type=float, default=600.0)
    args = p.parse_args()
    out, sys.stdout = sys.stdout, sys.stderr
    episodes = Episodes(load_class(args.file, args.cls), args.max_episodes, args.idle_timeout_s)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(episodes, args))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"http://{host}:{port}/", file=out, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
