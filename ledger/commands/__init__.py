"""CLI command groups. Each module here defines ``register(app)``; cli.py loads them all."""

from __future__ import annotations

import importlib
import pkgutil

import typer


def register_all(app: typer.Typer) -> None:
    """Import every module of this package and let it add its commands to ``app``."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(app)
