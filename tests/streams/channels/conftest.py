"""The raw-socket server fixture for exact transport behaviours."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

RawBehaviour = Callable[[socket.socket], None]


@pytest.fixture
def raw_server() -> Iterator[Callable[[RawBehaviour], str]]:
    """A one-connection-at-a-time TCP server on 127.0.0.1 whose behaviour a test writes.

    For exact transport behaviours (status then a cut body, garbage status lines) that an
    HTTP framework will not produce. Returns the base URL.
    """
    listeners: list[socket.socket] = []
    stop = threading.Event()

    def start(behaviour: RawBehaviour) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        listeners.append(listener)

        def serve() -> None:
            for _ in range(500):  # bounded: ~100 s at most
                if stop.is_set():
                    return
                try:
                    conn, _addr = listener.accept()
                except OSError:
                    continue
                with conn:
                    conn.settimeout(5)
                    behaviour(conn)

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    stop.set()
    for listener in listeners:
        listener.close()
