"""The import graph of our packages, read from the source (every import, also those inside
functions and under TYPE_CHECKING): dependencies point one way and make no circle.

events imports nothing of ours; config and clients import events (clients may import
config); receiver imports events only; streams and projections import those and never
each other; api (the HTTP ingest API) imports those and projections; ledger sits on top
(docs: ARCHITECTURE.md, "Layout"). The dashboard (in projections) and the API serve through
the receiver kit's ``receiver.uvicorn_server`` (one way to run uvicorn), so both may import
receiver, which itself imports events only (docs/ARCHITECTURE.md, "HTTP servers")."""

from __future__ import annotations

import ast
from pathlib import Path

from ledger.cli import COMMANDS, module_commands
from tests.source import parse

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("events", "config", "clients", "receiver", "streams", "projections", "api", "ledger")
ALLOWED = {
    "events": set(),
    "config": {"events"},
    "clients": {"events", "config"},
    "receiver": {"events"},
    "streams": {"events", "config", "clients"},
    "projections": {"events", "config", "clients", "receiver"},
    "api": {"events", "config", "clients", "receiver", "projections"},
    "ledger": set(PACKAGES) - {"ledger"},
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            targets |= {t for t in map(ours, names) if t is not None and t != module}
        edges[module] = targets
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_dependencies_point_one_way() -> None:
    edges = _graph()
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        for target in targets
        if target.split(".")[0] != module.split(".")[0]
        and target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    )
    assert wrong == []


def test_the_import_graph_has_no_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_check_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_commands_never_import_the_cli() -> None:
    """ledger/cli.py adds the apps of ledger/commands: nothing there imports it back."""
    edges = _graph()
    up = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if module.startswith("ledger.commands")
        for target in targets
        if target == "ledger.cli"
    )
    assert up == []


def test_the_cli_knows_every_command_of_every_command_module() -> None:
    """ledger/cli.py imports a command's module when it is used: its table names every
    command module of ledger/commands (one with an app), and exactly the commands each
    module's app defines."""
    commands_dir = Path(__file__).resolve().parents[1] / "ledger" / "commands"
    modules = {p.stem for p in commands_dir.glob("*.py") if "\napp = typer.Typer(" in p.read_text()}
    assert len(modules) >= 16
    assert {module for module, _ in COMMANDS.values()} == modules
    for module in sorted(modules):
        whole = {name for name, (m, group) in COMMANDS.items() if m == module and group}
        named = whole.pop() if whole else None
        defined = set(module_commands(module, named).commands)
        assert defined == {name for name, (m, _) in COMMANDS.items() if m == module}, module
