"""A kit receiver run as a process of its own (the kit's uvicorn server), whose handler
records each run's start and completion in a file and sleeps as the payload asks: a test
SIGKILLs it mid-handler and starts it again over the same database.

Run: ``python -m tests.receiver.dying_receiver`` with PORT, RECEIVER_DB, RUNS_FILE,
WEBHOOK_SECRETS, HANDLER_LEASE_S and IDEMPOTENT_HANDLER ("1" or "0") in the environment.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import uvicorn

from events.ports import free_port
from receiver import ReceivedWebhook, SqliteStore, WebhookReceiver
from receiver.asgi import asgi_app
from receiver.uvicorn_server import uvicorn_config

ROOT = Path(__file__).resolve().parents[2]


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def main() -> None:
    """Serve the kit on 127.0.0.1:$PORT until terminated."""
    runs = Path(os.environ["RUNS_FILE"])

    async def handler(event: ReceivedWebhook) -> str:
        _append(runs, f"start {event.webhook_id}")
        await asyncio.sleep(float(event.payload.get("sleep_s", 0)))
        _append(runs, f"done {event.webhook_id}")
        return f"made-{event.webhook_id}"

    kit = WebhookReceiver(
        handler,
        secrets=os.environ["WEBHOOK_SECRETS"].split(),
        store=SqliteStore(os.environ["RECEIVER_DB"]),
        handler_lease_s=float(os.environ["HANDLER_LEASE_S"]),
        idempotent_handler=os.environ["IDEMPOTENT_HANDLER"] == "1",
    )
    config = uvicorn_config(
        asgi_app(kit, "/hooks"), host="127.0.0.1", port=int(os.environ["PORT"]), log_level="info"
    )
    uvicorn.Server(config).run()


class DyingReceiver:
    """The receiver above as a child process, started (again) on demand."""

    def __init__(
        self, tmp: Path, secret: str, *, lease_s: float, idempotent: bool, port: int | None = None
    ) -> None:
        self.port = free_port() if port is None else port
        self.base = f"http://127.0.0.1:{self.port}"
        self.db = tmp / "receiver.sqlite3"
        self.runs = tmp / "handler_runs.txt"
        self.log = tmp / "receiver.log"
        self.env = os.environ | {
            "PORT": str(self.port),
            "RECEIVER_DB": str(self.db),
            "RUNS_FILE": str(self.runs),
            "WEBHOOK_SECRETS": secret,
            "HANDLER_LEASE_S": str(lease_s),
            "IDEMPOTENT_HANDLER": "1" if idempotent else "0",
            "PYTHONPATH": str(ROOT),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process and wait (10 s at most) until it answers."""
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.receiver.dying_receiver"],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=out,
            )
        for _ in range(100):
            try:
                httpx.get(f"{self.base}/hooks/lookup/probe", timeout=1)
                return
            except httpx.TransportError:
                assert self.process.poll() is None, self.log.read_text()
                time.sleep(0.1)
        raise AssertionError(f"the receiver did not listen: {self.log.read_text()}")

    def lines(self) -> list[str]:
        """The handler's records: ``start KEY`` and ``done KEY``, in order."""
        return self.runs.read_text().splitlines() if self.runs.exists() else []

    def wait_for(self, line: str, timeout_s: float = 20.0) -> None:
        """Wait until the handler wrote ``line``."""
        deadline = time.monotonic() + timeout_s
        while line not in self.lines():
            assert time.monotonic() < deadline, f"no {line!r} in {self.lines()}"
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the process (mid-handler, as a test arranges) and reap it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        assert self.process.returncode == -signal.SIGKILL

    def stop(self) -> None:
        """Terminate the process if it runs (a test's clean-up)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


if __name__ == "__main__":
    main()
