"""requirements.lock agrees with pyproject.toml, and the venv holds what the lock pins.

Broker-free and offline: a stale lock (a dependency added, dropped or re-ranged in
pyproject.toml without ``./scripts/lock``) fails here, not on a fresh machine.
"""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
PIN = re.compile(r"^(?P<req>[A-Za-z0-9][^\\#]*?)\s*\\?$")


def _lock_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ledger_lock_script", ROOT / "scripts/lock.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pins(text: str) -> dict[str, tuple[Requirement, int]]:
    """Each locked package: its ``name==version ; marker`` requirement and its hash count."""
    pins: dict[str, tuple[Requirement, int]] = {}
    current = ""
    for line in text.splitlines():
        match = PIN.match(line)
        if match:
            req = Requirement(match["req"])
            current = canonicalize_name(req.name)
            assert current not in pins, f"{req.name} is pinned twice in the lock"
            pins[current] = (req, 0)
        elif line.strip().startswith("--hash=sha256:") and current:
            req, count = pins[current]
            pins[current] = (req, count + 1)
    return pins


def _locked_version(req: Requirement) -> Version:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return Version(spec.version)


def test_lock_records_the_requirements_of_pyproject() -> None:
    """The lock was resolved from exactly today's dependencies (runtime, dev, build)."""
    script = _lock_script()
    wanted = script.lock_inputs()
    recorded = script.recorded_inputs()
    assert recorded, "requirements.lock has no '# input:' lines: regenerate it with ./scripts/lock"
    changes = [f"+ {req}" for req in sorted(set(wanted) - set(recorded))]
    changes += [f"- {req}" for req in sorted(set(recorded) - set(wanted))]
    assert not changes, (
        "requirements.lock is stale: pyproject.toml differs from the requirements it was "
        f"resolved from ({', '.join(changes)}); run ./scripts/lock"
    )


def test_every_requirement_is_pinned_within_its_range_with_hashes() -> None:
    """Every dependency pyproject.toml names is in the lock, at a version its range allows."""
    pins = _pins(LOCK.read_text())
    problems = []
    for line in _lock_script().lock_inputs():
        req = Requirement(line)
        names = [req.name] + [f"{req.name}-{extra}" for extra in sorted(req.extras)]
        for name in names:
            pinned = pins.get(canonicalize_name(name))
            if pinned is None:
                problems.append(f"{name} ({line}) is not in the lock")
            elif not req.specifier.contains(_locked_version(pinned[0]), prereleases=True):
                problems.append(f"{pinned[0]} is outside {line}")
    assert not problems, (
        "requirements.lock is stale: " + "; ".join(problems) + "; run ./scripts/lock"
    )
    unhashed = [str(req) for req, hashes in pins.values() if hashes == 0]
    assert not unhashed, f"pins without a hash (pip --require-hashes refuses them): {unhashed}"


@pytest.mark.parametrize("name", ["setuptools", "uv", "faust-streaming", "aiokafka"])
def test_the_lock_covers(name: str) -> None:
    """The build backend and the tool that writes the lock are locked too."""
    assert canonicalize_name(name) in _pins(LOCK.read_text())


def test_the_venv_holds_the_locked_versions() -> None:
    """scripts/setup installed from the lock, not from pyproject.toml's ranges."""
    drift = []
    for name, (req, _) in _pins(LOCK.read_text()).items():
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            installed = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            drift.append(f"{name} is not installed")
            continue
        if installed != _locked_version(req):
            drift.append(f"{name} {installed} (locked {_locked_version(req)})")
    assert not drift, "the venv differs from requirements.lock (run ./scripts/setup): " + ", ".join(
        drift
    )
