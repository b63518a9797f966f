"""``ledger mcp``: the ledger as a Model Context Protocol server, for agents.

Tools to publish a run's result (idempotent by run id, as the SDK and the HTTP API), to ask
whether its notifications really arrived (UNKNOWN stated as unknown), to list the UNKNOWN
ones and to explain a run's timeline; resolve and redrive for operators, off unless the
server is started with ``--operator NAME``. A run's timeline is a resource. Over stdio or
streamable HTTP (127.0.0.1 only).
"""

from __future__ import annotations

from ledger.mcp_server.server import build_server, serve_http, serve_stdio
from ledger.mcp_server.tools import LedgerTools

__all__ = ["LedgerTools", "build_server", "serve_http", "serve_stdio"]
