"""Running the TypeScript packages' commands (typescript/, built by scripts/setup), and
the README's TypeScript blocks compiled as written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.readme import ROOT

TYPESCRIPT = ROOT / "typescript"


def _installed() -> None:
    if not (TYPESCRIPT / "node_modules").is_dir():
        raise AssertionError("typescript/node_modules is missing: run ./scripts/setup (npm ci)")


def run(command: list[str], cwd: Path, env: Mapping[str, str] | None, timeout: float) -> str:
    """``command`` in ``cwd``; its output, or an AssertionError holding it."""
    done = subprocess.run(
        command,
        cwd=cwd,
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


def npm(args: list[str], env: Mapping[str, str] | None = None, timeout: float = 120) -> str:
    """``npm ARGS`` in typescript/."""
    _installed()
    npm_bin = shutil.which("npm")
    assert npm_bin is not None, "npm is not on PATH (Node 20 is needed: scripts/setup)"
    return run([npm_bin, *args], TYPESCRIPT, env, timeout)


def node() -> str:
    """The node binary."""
    found = shutil.which("node")
    assert found is not None, "node is not on PATH (Node 20 is needed: scripts/setup)"
    return found


def compile_readme_blocks(blocks: dict[str, str], where: Path) -> dict[str, Path]:
    """README TypeScript ``blocks`` (name: code), compiled by tsc as the packages are
    (strict) in a project of their own that sees typescript/node_modules; their .js files."""
    _installed()
    (where / "src").mkdir(parents=True)
    (where / "node_modules").symlink_to(TYPESCRIPT / "node_modules")
    (where / "package.json").write_text('{"type": "module"}\n')
    config = {
        "extends": str(TYPESCRIPT / "tsconfig.base.json"),
        "compilerOptions": {"rootDir": "src", "outDir": "dist", "declaration": False},
        "include": ["src"],
    }
    (where / "tsconfig.json").write_text(json.dumps(config))
    for name, code in blocks.items():
        (where / "src" / f"{name}.ts").write_text(code)
    tsc = TYPESCRIPT / "node_modules" / "typescript" / "bin" / "tsc"
    run([node(), str(tsc), "-p", str(where)], where, None, 120)
    return {name: where / "dist" / f"{name}.js" for name in blocks}
