"""The peer benchmark's receiver: a webhook endpoint as a user would write it in Python.

A ``ThreadingHTTPServer`` (listen backlog 128, HTTP/1.1 keep-alive, a thread per
connection) that verifies every POST with the official ``standardwebhooks`` library
(``Webhook(secret).verify(body, headers)``), answers 200 with a JSON id, and records when
each ``webhook-id`` arrived. It does NOT dedupe: a second send of one key is recorded as a
second arrival, so the benchmark can check "exactly once" on what the receiver saw.

    python -m bench.verifying_receiver --port 18592 --secret-env BENCH_PEER_SECRET

Besides ``POST <any path>`` it serves, for the benchmark:

* ``GET /_arrivals?since=N``: ``{"total": T, "arrivals": [[key, unix_time], ...]}``, the
  arrivals from index N on (poll with the last ``total`` to fetch only what is new);
* ``GET /_stats``: ``{"total": T, "rejected": R, "lookups": L}`` (cheap);
* ``GET /lookup/<key>``: the lookup contract (200 ``{status: delivered, id}`` or 404), so
  the workers' UNKNOWN path has a lookup if it is ever needed.

On start it prints one JSON line ``{"base": URL, "pid": PID}`` to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from urllib.parse import parse_qs, urlsplit

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

BACKLOG = 128


class Arrivals:
    """Every verified arrival in order (key, unix time), and how many were refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._log: list[tuple[str, float]] = []
        self._first: set[str] = set()
        self.rejected = 0
        self.lookups = 0

    def record(self, key: str, at: float) -> None:
        """Append one arrival (a repeated key is appended again: nothing is deduped)."""
        with self._lock:
            self._log.append((key, at))
            self._first.add(key)

    def refuse(self) -> None:
        """Count one request that failed verification."""
        with self._lock:
            self.rejected += 1

    def seen(self, key: str) -> bool:
        """Has ``key`` arrived at least once? (a lookup: counted)"""
        with self._lock:
            self.lookups += 1
            return key in self._first

    def since(self, index: int) -> tuple[int, list[tuple[str, float]]]:
        """The total count and the arrivals from ``index`` on."""
        with self._lock:
            return len(self._log), self._log[index:]


class VerifyingServer(ThreadingHTTPServer):
    """The listen backlog of the benchmark's shape; handler threads die with the server."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, port: int, secret: str) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.webhook = Webhook(secret)
        self.arrivals = Arrivals()


class Handler(BaseHTTPRequestHandler):
    """Verify, record, answer."""

    protocol_version = "HTTP/1.1"  # keep-alive: the workers' client pools connections
    # Headers and body leave in one write (handle_one_request flushes after each request),
    # and with no Nagle delay: otherwise every keep-alive answer can wait out a delayed ACK.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True
    server: VerifyingServer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a log line per request would be most of the receiver's work."""

    def _answer(self, status: int, document: object) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        """One webhook: verified by the standardwebhooks library, then recorded."""
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = dict(self.headers.items())
        try:
            self.server.webhook.verify(body, headers)
        except (WebhookVerificationError, ValueError):
            self.server.arrivals.refuse()
            self._answer(401, {"error": "signature verification failed"})
            return
        key = self.headers["webhook-id"]
        self.server.arrivals.record(key, time.time())
        self._answer(200, {"id": f"msg_{key[:24]}"})

    def do_GET(self) -> None:
        """The benchmark's read-outs and the lookup contract."""
        url = urlsplit(self.path)
        arrivals = self.server.arrivals
        if url.path == "/_arrivals":
            since = int(parse_qs(url.query).get("since", ["0"])[0])
            total, new = arrivals.since(since)
            self._answer(200, {"total": total, "arrivals": new})
        elif url.path == "/_stats":
            total, _ = arrivals.since(sys.maxsize)
            self._answer(
                200, {"total": total, "rejected": arrivals.rejected, "lookups": arrivals.lookups}
            )
        elif url.path.startswith("/lookup/"):
            key = url.path.removeprefix("/lookup/")
            if arrivals.seen(key):
                self._answer(200, {"status": "delivered", "id": f"msg_{key[:24]}"})
            else:
                self._answer(404, {"error": "not found"})
        else:
            self._answer(404, {"error": "not found"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--secret-env",
        required=True,
        help="name of the environment variable holding the whsec_ secret",
    )
    args = parser.parse_args()
    secret = os.environ.get(args.secret_env)
    if not secret:
        raise SystemExit(f"verifying_receiver: {args.secret_env} is not set")
    server = VerifyingServer(args.port, secret)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever to return: call it from another thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(json.dumps({"base": f"http://{host!s}:{port}", "pid": os.getpid()}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
