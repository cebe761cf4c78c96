"""A stand-in for the services the examples deliver to: it de-duplicates by Idempotency-Key.

    python examples/receiver.py                       # listens on http://127.0.0.1:9000
    python examples/receiver.py --port 9100           # another port
    python examples/receiver.py --slow /replies=20    # hold new requests to /replies 20 s

Every POST is printed with its path, its Idempotency-Key and whether it was applied. The first
request of a key is applied; a repeat of the key (a delivery re-sent after a crash) gets the
first answer again and is not applied twice, as Stripe-style APIs behave. Standard library
only, so it runs with any Python 3.11.

``--slow PATH=SECONDS`` keeps the first request of each key to PATH waiting that long before it
answers: long enough to kill the sender while its delivery is in flight and watch the re-sent
request arrive with the same key.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_seen: dict[str, bytes] = {}  # Idempotency-Key -> the answer given the first time
_lock = threading.Lock()
_slow: dict[str, float] = {}  # path -> seconds to hold a new key's request


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        key = self.headers.get("Idempotency-Key")
        with _lock:
            first = key is None or key not in _seen
            if first:
                answer = json.dumps({"path": self.path, "applied": True}).encode()
                if key is not None:
                    _seen[key] = answer
            else:
                answer = _seen[str(key)]
        verdict = "applied" if first else "duplicate key: answered as before, not applied again"
        shown = f"{key[:12]}…" if key else "none"
        print(f"POST {self.path} key={shown} {verdict} {body.decode(errors='replace')}", flush=True)
        if first and self.path in _slow:
            print(f"  holding the answer {_slow[self.path]:g}s", flush=True)
            time.sleep(_slow[self.path])
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        except (BrokenPipeError, ConnectionResetError):
            print(f"  the sender of {self.path} hung up before the answer", flush=True)

    do_PUT = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request is printed above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--slow", action="append", default=[], metavar="PATH=SECONDS")
    args = parser.parse_args()
    for item in args.slow:
        path, _, seconds = item.partition("=")
        try:
            _slow[path] = float(seconds)
        except ValueError:
            parser.error(f"--slow {item!r}: give PATH=SECONDS, e.g. /replies=20")
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"receiver on http://127.0.0.1:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
