"""The README's Python blocks, each after a marker (``<!-- name -->``) a test looks it up by.

Every Python block in README.md runs as a test: ``test_readme_blocks`` refuses a block
without a marker, and a marker that no test asks for by name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(r"(?:<!-- ([a-z-]+) -->\n)?```python\n(.*?)```", re.S)


def python_blocks() -> list[tuple[str | None, str]]:
    """Every Python block of the README, with the marker before it (None: no marker)."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(README.read_text())]


def readme_shell_block(name: str) -> str:
    """The shell block after ``<!-- name -->``, as written."""
    found = re.findall(rf"<!-- {re.escape(name)} -->\n```sh\n(.*?)```", README.read_text(), re.S)
    assert len(found) == 1, f"README.md has {len(found)} sh blocks marked {name!r}"
    return str(found[0])


def readme_block(name: str) -> str:
    """The Python block after ``<!-- name -->``, as written."""
    found = [code for marker, code in python_blocks() if marker == name]
    assert len(found) == 1, f"README.md has {len(found)} python blocks marked {name!r}"
    return found[0]


_TS_BLOCK = re.compile(r"(?:<!-- ([a-z-]+) -->\n)?```ts\n(.*?)```", re.S)


def typescript_blocks() -> list[tuple[str | None, str]]:
    """Every TypeScript block of the README, with the marker before it (None: no marker)."""
    return [(m.group(1), m.group(2)) for m in _TS_BLOCK.finditer(README.read_text())]


def readme_typescript_block(name: str) -> str:
    """The TypeScript block after ``<!-- name -->``, as written."""
    found = [code for marker, code in typescript_blocks() if marker == name]
    assert len(found) == 1, f"README.md has {len(found)} ts blocks marked {name!r}"
    return found[0]


def readme_json_block(name: str) -> str:
    """The JSON block after ``<!-- name -->``, as written."""
    found = re.findall(rf"<!-- {re.escape(name)} -->\n```json\n(.*?)```", README.read_text(), re.S)
    assert len(found) == 1, f"README.md has {len(found)} json blocks marked {name!r}"
    return str(found[0])
