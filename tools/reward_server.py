#!/usr/bin/env python3
"""Serve Python reward functions, written as for TRL's GRPOTrainer, to `reward.kind = "http"`.

A TRL reward function takes the batch as lists and returns one number per row:

    def exact(prompts, completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

This server imports such functions from a file and answers oxalign's reward requests
(docs/REWARDS.md, "Python reward functions"): each request's `prompts`, `responses` (passed
as `completions`) and `answers` (passed as `answer`, a list holding None where a row has no
answer) go to every function named, and so do the dataset's other columns, each as a
keyword argument holding one value per row (None where a row lacks it), as TRL passes them
(a column named like a fixed argument is not passed again); the weighted sum per row comes back as
`{"rewards": [...]}`. A function that raises, returns the wrong number of values, or returns
anything but finite numbers makes the request fail with HTTP 500 and a message naming the
function and the row, so the run fails loudly (after its retries) instead of training on
a made-up reward. It uses the standard library only.

    python3 tools/reward_server.py --file my_rewards.py --function exact \
        [--function format_ok --weight 0.2] [--host 127.0.0.1] [--port 8000]

With `--port 0` the system picks a free port. The first line on stdout is the URL to put in
`[reward.http] url` (and the only one: what the functions print goes to stderr). The server listens on 127.0.0.1 unless told otherwise, reads at most
`--max-body-bytes` per request (Content-Length required), serves at most `--max-connections`
requests at once (others get 503 and oxalign retries) and drops a client that stalls for
`--read-timeout-s`. Nothing from a request reaches a shell.
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def fail(message):
    """Bad input: the message on stderr, exit code 2."""
    print(f"reward_server: {message}", file=sys.stderr)
    sys.exit(2)


def load_functions(path, names, weights):
    """The named functions of the Python file `path`, each with its weight."""
    spec = importlib.util.spec_from_file_location("oxalign_user_rewards", path)
    if spec is None or spec.loader is None:
        fail(f"cannot load {path!r}: expected a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        fail(f"importing {path!r} failed:\n{traceback.format_exc(limit=2)}")
    if len(weights) not in (0, len(names)):
        fail(
            f"{len(weights)} --weight for {len(names)} --function: "
            "give none (all 1) or one per function, in the same order"
        )
    funcs = []
    for i, name in enumerate(names):
        f = getattr(module, name, None)
        if not callable(f):
            fail(f"{path!r} defines no function {name!r}")
        funcs.append((name, f, weights[i] if weights else 1.0))
    return funcs


def parse_request(body):
    """`(prompts, completions, answers, columns)` of a request body, or raises ValueError;
    `columns` maps each dataset column to its values per row."""
    try:
        req = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"request body is not JSON: {e}")
    if not isinstance(req, dict):
        raise ValueError("expected a JSON object with prompts, responses and answers")
    cols = []
    for key in ("prompts", "responses", "answers"):
        col = req.get(key)
        if not isinstance(col, list):
            raise ValueError(f"`{key}` must be a list")
        cols.append(col)
    if len({len(c) for c in cols}) != 1:
        raise ValueError("prompts, responses and answers differ in length")
    rows = req.get("columns", [{}] * len(cols[0]))
    if not isinstance(rows, list) or len(rows) != len(cols[0]):
        raise ValueError("`columns` must be a list with one object per row")
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError("`columns` must hold one JSON object per row")
    names = sorted({k for r in rows for k in r} - FIXED_ARGUMENTS)
    return cols + [{k: [r.get(k) for r in rows] for k in names}]


# What every function gets by name; dataset columns with these names are not passed again.
FIXED_ARGUMENTS = {"prompts", "completions", "answer", "prompt", "completion"}


def score(funcs, prompts, completions, answers, columns):
    """The weighted sum of every function's rewards per row, or raises ValueError."""
    total = [0.0] * len(completions)
    for name, f, weight in funcs:
        try:
            values = f(prompts=prompts, completions=completions, answer=answers, **columns)
        except Exception as e:
            raise ValueError(
                f"reward function {name!r} raised {type(e).__name__}: {e}\n"
                + traceback.format_exc(limit=3)
            )
        try:
            values = list(values)
        except TypeError:
            raise ValueError(f"reward function {name!r} returned {type(values).__name__}, not a list")
        if len(values) != len(total):
            raise ValueError(
                f"reward function {name!r} returned {len(values)} values for {len(total)} rows"
            )
        for row, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(
                    f"reward function {name!r} gave row {row} the value {v!r}: "
                    "expected a finite number"
                )
            total[row] += weight * float(v)
    return total


def make_handler(funcs, limits):
    slots = threading.BoundedSemaphore(limits.max_connections)

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
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True
                return self.reply(411, {"error": "Content-Length required"})
            if int(length) > limits.max_body_bytes:
                self.close_connection = True
                return self.reply(413, {"error": f"body over {limits.max_body_bytes} bytes"})
            body = self.rfile.read(int(length))
            try:
                rewards = score(funcs, *parse_request(body))
            except ValueError as e:
                print(f"reward_server: {e}", file=sys.stderr, flush=True)
                return self.reply(500, {"error": str(e)})
            self.reply(200, {"rewards": rewards})

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", required=True, help="Python file defining the reward functions")
    p.add_argument("--function", action="append", required=True, help="function name (repeat)")
    p.add_argument("--weight", action="append", type=float, default=[], help="one per function")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--max-body-bytes", type=int, default=64 << 20)
    p.add_argument("--max-connections", type=int, default=16)
    p.add_argument("--read-timeout-s", type=float, default=30.0)
    p.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="exit when standard input closes (oxalign's reward.kind = \"python\" holds it open)",
    )
    args = p.parse_args()
    # stdout carries the address line only: what the user's module prints (at import or
    # while scoring) goes to stderr
    out, sys.stdout = sys.stdout, sys.stderr
    if args.exit_with_stdin:
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    funcs = load_functions(args.file, args.function, args.weight)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(funcs, args))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"http://{host}:{port}/", file=out, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
