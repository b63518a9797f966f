"""Running the TypeScript packages' commands (typescript/, built by scripts/setup)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping

from tests.readme import ROOT

TYPESCRIPT = ROOT / "typescript"


def npm(args: list[str], env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    """``npm ARGS`` in typescript/; its output, or an AssertionError holding it."""
    if not (TYPESCRIPT / "node_modules").is_dir():
        raise AssertionError("typescript/node_modules is missing: run ./scripts/setup (npm ci)")
    npm_bin = shutil.which("npm")
    assert npm_bin is not None, "npm is not on PATH (Node 20 is needed: scripts/setup)"
    done = subprocess.run(
        [npm_bin, *args],
        cwd=TYPESCRIPT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    return output


def free_port() -> int:
    """A free port below the ephemeral range (32768-60999), on 127.0.0.1."""
    for port in range(23900, 24700):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 23900-24699")
