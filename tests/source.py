"""Python source parsed in a test, safe from other tests' garbage.

CPython 3.11.7 raises "SystemError: AST constructor recursion depth mismatch" (gh-106905)
when a finalizer runs inside ``ast.parse``: garbage another test left (a fenced aiokafka
producer's never-retrieved futures, which log when freed) may be collected just then. So
the collector is held off while a file is parsed; what is freed by reference counts alone
is the parse's own.
"""

from __future__ import annotations

import ast
import gc


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)`` with the garbage collector held off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if enabled:
            gc.enable()
