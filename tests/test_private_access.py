"""faust's, mode's and aiokafka's private names are touched in one adapter module each.

streams/faust_internals.py (faust and mode) and clients/aiokafka_internals.py (aiokafka)
hold every private attribute and protected override of those libraries the project
relies on, each with a test of the behaviour it relies on; an upgrade that changes one
fails there. This test reads every module of ours (packages, tests, benchmarks) and
fails on a private name of those libraries used anywhere else: an attribute ``x._name``
whose name the libraries define, or a subclass of one of their classes that overrides or
calls a private method."""

from __future__ import annotations

import ast
import functools
import importlib.machinery
from collections.abc import Iterator
from pathlib import Path

from tests.source import parse

ROOT = Path(__file__).resolve().parents[1]
OURS = ("events", "config", "clients", "receiver", "streams", "projections", "ledger")
SCANNED = (*OURS, "tests", "bench")
LIBRARIES = ("faust", "mode", "aiokafka")
ADAPTERS = {"streams/faust_internals.py", "clients/aiokafka_internals.py"}
# Private names the libraries also define, used here on objects of our own (or the
# standard library's): (module, name), each with whose object it is.
NOT_THEIRS = {
    ("tests/streams/channels/test_registry.py", "_client"),  # our channels' HTTP client
    ("tests/streams/channels/test_browser.py", "_metrics"),  # our browser channel's
    ("tests/streams/channels/test_browser.py", "_value"),  # prometheus_client's counter
    ("tests/events/test_publisher.py", "_producer"),  # our Publisher's
    # our Publisher's, SignedLog's, ProjectorDeadLetters' (and their _started, _send)
    ("tests/clients/test_durable_producers.py", "_producer"),
    ("tests/clients/test_durable_producers.py", "_started"),
    ("tests/clients/test_durable_producers.py", "_send"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def _their_private_names() -> frozenset[str]:
    """Every private method, attribute and class attribute the libraries define."""
    names: set[str] = set()
    for library in LIBRARIES:
        # The path finder, not sys.modules: faust replaces its module with a lazy one.
        spec = importlib.machinery.PathFinder.find_spec(library)
        assert spec is not None, library
        assert spec.origin is not None, library
        for path in Path(spec.origin).parent.rglob("*.py"):
            for node in ast.walk(parse(path.read_bytes())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return frozenset(n for n in names if _private(n))


def _their_names(tree: ast.Module) -> set[str]:
    """The local names this module binds to the libraries' modules and classes."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] in LIBRARIES
        ):
            bound |= {alias.asname or alias.name for alias in node.names}
    return bound


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) for every use of a library's private name in one module."""
    return sorted(set(_each_use(path)))


def _each_use(path: Path) -> Iterator[tuple[int, str]]:
    theirs = _their_private_names()
    tree = parse(path.read_text(encoding="utf-8"))
    bound = _their_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(_root_name(b) in bound for b in node.bases):
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _private(item.name):
                    yield item.lineno, f"{node.name} overrides {item.name}"
                elif isinstance(item, ast.Attribute) and item.attr in theirs:
                    yield item.lineno, f"{node.name} uses {ast.unparse(item)}"
        elif isinstance(node, ast.Attribute) and node.attr in theirs:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue  # our own attribute (a subclass of theirs is checked above)
            yield node.lineno, ast.unparse(node)


def test_their_private_names_are_known() -> None:
    """The scan sees the names the adapters use (else it would find nothing anywhere)."""
    assert {"_commit_offsets", "_db_for_partition", "_client", "_txn_manager"} <= (
        _their_private_names()
    )


def test_only_the_adapters_touch_faust_mode_and_aiokafka_private_names() -> None:
    found: list[str] = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            if module in ADAPTERS:
                continue
            for line, what in _uses(path):
                name = what.rpartition(".")[2].rpartition(" ")[2]
                if (module, name) not in NOT_THEIRS:
                    found.append(f"{module}:{line}: {what}")
    assert not found, (
        "faust/mode/aiokafka private names outside streams/faust_internals.py and "
        "clients/aiokafka_internals.py (move them there, with a test of the behaviour, or "
        "add an object of ours to NOT_THEIRS):\n" + "\n".join(found)
    )


def test_the_adapters_do_touch_them() -> None:
    """Each adapter holds private names of its library (the scan finds them there)."""
    for module in ADAPTERS:
        assert list(_uses(ROOT / module)), module
