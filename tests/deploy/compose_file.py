"""Reading docker-compose.yml the way docker compose does, without Docker.

``load`` parses strictly (a duplicate key is an error, beside a ``<<`` merge too), and
``interpolate`` substitutes ``${VAR}`` forms as compose does before it validates the file
against the Compose Specification's schema (``schema()``: compose-go's, the loader docker
compose itself uses, which ``scripts/compose-schema`` fetches through the Go module proxy).
``ledger_commands`` splits a service's command into the ``ledger`` invocations it runs,
and ``parse_ledger`` parses one with the CLI's own typer app, without running it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from ruamel.yaml import YAML
from typer._click import Command, Context
from typer.core import TyperGroup

from ledger.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# sh -c scripts: only `a && b && c` chains of plain words (the file's one-shot steps).
_SHELL_WORDS = frozenset({"&&"})


class Unset(Exception):
    """A ``${VAR:?message}`` (or ``${VAR?message}``) whose variable is missing."""


def load(text: str) -> dict[str, Any]:
    """The YAML document as plain dicts, lists and scalars, anchors and merges resolved.

    ruamel.yaml's round-trip loader: its safe loader skips the duplicate check in a
    mapping that holds a ``<<`` merge (ruamel.yaml 0.19), which is where a doubled
    ``environment:`` would be. Raises ruamel's ``DuplicateKeyError`` on a duplicate key.
    """
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    document = _plain(yaml.load(text))
    assert isinstance(document, dict), "a compose file is a mapping"
    return document


def _plain(node: object) -> object:
    # CommentedMap/CommentedSeq/ScalarString -> dict/list/str; a merge's keys are included.
    if isinstance(node, Mapping):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(item) for item in node]
    if isinstance(node, str):
        return str(node)
    return node


def interpolate(node: object, env: Mapping[str, str]) -> object:
    """Every string value of ``node`` with compose's substitutions (keys are left alone)."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env) for item in node]
    if isinstance(node, str):
        return substitute(node, env)
    return node


def substitute(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation of one string (compose-spec, "Interpolation").

    ``$$`` is a literal ``$``; ``$VAR`` and ``${VAR}`` the variable or ""; ``${VAR:-d}``
    d when unset or empty, ``${VAR-d}`` when unset; ``${VAR:?m}``/``${VAR?m}`` raise
    ``Unset(m)`` likewise; ``${VAR:+r}``/``${VAR+r}`` r when set (and not empty). ``d``,
    ``m`` and ``r`` are substituted too, so they may nest.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = _closing_brace(text, i + 1)
            out.append(_braced(text[i + 2 : end], env))
            i = end + 1
        elif plain := _NAME.match(text, i + 1):
            out.append(env.get(plain.group(), ""))
            i = plain.end()
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _closing_brace(text: str, opening: int) -> int:
    depth = 0
    for at in range(opening, len(text)):
        if text[at] == "{":
            depth += 1
        elif text[at] == "}":
            depth -= 1
            if depth == 0:
                return at
    raise ValueError(f"unclosed ${{ in {text!r}")


def _braced(inner: str, env: Mapping[str, str]) -> str:
    name = _NAME.match(inner)
    if name is None:
        raise ValueError(f"invalid interpolation ${{{inner}}}")
    var, rest = name.group(), inner[name.end() :]
    value = env.get(var)
    if not rest:
        return value or ""
    empty_counts = rest.startswith(":")
    operator, argument = rest[1 if empty_counts else 0], rest[2 if empty_counts else 1 :]
    missing = value is None or (empty_counts and value == "")
    if operator == "-":
        return substitute(argument, env) if missing else str(value)
    if operator == "?":
        if missing:
            raise Unset(f"{var}: {substitute(argument, env)}")
        return str(value)
    if operator == "+":
        return "" if missing else substitute(argument, env)
    raise ValueError(f"invalid interpolation ${{{inner}}}")


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (a mapping or ``KEY=VALUE`` list) as compose passes it:
    numbers and booleans as text; a key without a value takes the shell's (here: unset)."""
    given = service.get("environment") or {}
    if isinstance(given, list):
        given = dict(item.split("=", 1) if "=" in item else (item, None) for item in given)
    shown = {True: "true", False: "false"}
    return {
        key: shown.get(value, str(value)) if isinstance(value, bool) else str(value)
        for key, value in given.items()
        if value is not None
    }


def ledger_commands(command: str | list[str]) -> list[list[str]]:
    """The ``ledger ...`` argument lists a service's command runs, in order.

    Compose splits a string command into words (no shell); ``sh -c SCRIPT`` runs a script,
    read here as ``a && b`` chains of plain words, each optionally after ``exec``.
    Raises ValueError for anything else: other shell syntax, or a program that is not
    ``ledger``.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv[:2] in (["sh", "-c"], ["/bin/sh", "-c"]) and len(argv) == 3:
        lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        punctuation = {w for w in words if w and set(w) <= set(lexer.punctuation_chars)}
        if punctuation - _SHELL_WORDS:
            raise ValueError(f"shell syntax {sorted(punctuation - _SHELL_WORDS)} in {argv[2]!r}")
        runs: list[list[str]] = [[]]
        for word in words:
            if word == "&&":
                runs.append([])
            else:
                runs[-1].append(word)
    else:
        runs = [argv]
    found = []
    for run in runs:
        run = run[1:] if run[:1] == ["exec"] else run
        if run[:1] != ["ledger"] or any("$" in word for word in run):
            raise ValueError(f"not a plain ledger command: {shlex.join(run)!r}")
        found.append(run[1:])
    return found


def parse_ledger(args: list[str]) -> tuple[str, Context]:
    """The command path (``"topics create"``) and the parsed context of ``ledger ARGS``.

    Parses as the CLI would (types, choices, required arguments), without running the
    command. Raises typer's click errors (``UsageError``, ``BadParameter``) as ledger would.
    """
    command: Command = typer.main.get_command(app)
    context = Context(command, info_name="ledger")
    path: list[str] = []
    rest = list(args)
    while isinstance(command, TyperGroup):
        if not rest or rest[0].startswith("-"):
            raise ValueError(f"ledger {shlex.join(args)}: no command after {path or 'ledger'}")
        found = command.get_command(context, rest[0])
        if found is None:
            raise ValueError(f"ledger {shlex.join(args)}: no command {rest[0]!r}")
        path.append(rest.pop(0))
        command = found
        context = Context(command, parent=context, info_name=path[-1])
    parsed = command.make_context(path[-1], rest, parent=context.parent, resilient_parsing=False)
    return " ".join(path), parsed


def schema() -> dict[str, Any]:
    """The Compose Specification's JSON Schema (draft 7), at ``LEDGER_TEST_COMPOSE_SCHEMA``
    (``scripts/test`` sets it from ``scripts/compose-schema``; tests reach no network)."""
    path = os.environ.get("LEDGER_TEST_COMPOSE_SCHEMA")
    if not path:
        raise RuntimeError(
            "LEDGER_TEST_COMPOSE_SCHEMA is not set: "
            "export LEDGER_TEST_COMPOSE_SCHEMA=$(./scripts/compose-schema) (scripts/test does)"
        )
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded
