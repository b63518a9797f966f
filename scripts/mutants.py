"""Can the delivery state machine fail? Break one rule at a time and see it catch each.

Each mutant changes one line of the worker's rules in a copy of the working tree and runs
``tests/streams/test_delivery_machine.py`` there; a mutant the machine does not catch is
a hole in the invariants. Broker-free, a few minutes; prints one row per mutant and exits
1 if any survived.

    .venv/bin/python scripts/mutants.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/streams/test_delivery_machine.py"


@dataclass(frozen=True)
class Mutant:
    guards: str  # the invariant that must catch it
    path: str
    old: str
    new: str
    # Further (old, new) edits of the same file, for a rule written in two places.
    more: tuple[tuple[str, str], ...] = ()


MUTANTS = [
    Mutant(
        "the receiver accepted at most once",
        "events/outcomes.py",
        "NOT_FOUND_REQUIRED = 2",
        "NOT_FOUND_REQUIRED = 1",
    ),
    Mutant(
        "a new claim only out of PENDING/RETRY_SCHEDULED (one live claim)",
        "events/delivery_state.py",
        "        if s.status not in (Status.PENDING, Status.RETRY_SCHEDULED):\n"
        "            return None\n"
        "        if e.fencing_token <= s.fencing_token or e.attempt != s.attempt + 1",
        "        if s.status not in (Status.PENDING, Status.RETRY_SCHEDULED, Status.CLAIMED):\n"
        "            return None\n        if e.fencing_token < s.fencing_token",  # any attempt
    ),
    Mutant(
        "a claim under a never-used token",
        "streams/decisions.py",
        "        fencing_token=state.fencing_token + 1,",
        "        fencing_token=max(1, state.fencing_token),",
    ),
    Mutant(
        "no retry out of UNKNOWN without evidence",
        "events/delivery_state.py",
        '    if s.reconciled == "not_found":\n        return s.not_found >= NOT_FOUND_REQUIRED',
        '    if s.reconciled in ("not_found", "processing", "lookup_error"):\n        return True',
    ),
    Mutant(
        "CONFIRMED and FAILED stay final",
        "events/delivery_state.py",
        "    if s.status.terminal or isinstance(e, DeliveryRequested):",
        "    if isinstance(e, DeliveryRequested):",
        # Alone, the terminal check is redundant: every event's own guard names the states
        # it leaves. So the mutant also loosens one of them (a lease expiry, a give-up).
        (
            (
                "        if s.status not in (Status.CLAIMED, Status.SENT):",
                "        if s.status not in (Status.CLAIMED, Status.SENT, Status.CONFIRMED):",
            ),
        ),
    ),
    Mutant(
        "the worker's fold and the projection's agree",
        "projections/fold.py",
        'kept_elsewhere=("payload", *_FROM_ROW)',
        'kept_elsewhere=("payload", "not_found", *_FROM_ROW)',
        (('given = {"payload": None, **', 'given = {"payload": None, "not_found": 0, **'),),
    ),
]


def run(mutant: Mutant, workdir: Path) -> tuple[bool, str]:
    """True if the machine caught ``mutant``, with the first assertion line it printed."""
    target = workdir / mutant.path
    text = target.read_text()
    mutated = text
    for old, new in ((mutant.old, mutant.new), *mutant.more):
        if old and mutated.count(old) != 1:
            raise SystemExit(
                f"mutant for {mutant.guards!r}: {old.strip()!r} not once in {mutant.path}"
            )
        mutated = mutated.replace(old, new)
    target.write_text(mutated)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", TEST],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        target.write_text(text)
    lines = done.stdout.splitlines()
    errors = [ln.strip() for ln in lines if ln.lstrip().startswith("E ")]
    why = next((ln for ln in errors if "AssertionError" in ln), errors[0] if errors else "")
    return done.returncode != 0, why[:110]


def main() -> int:
    console = Console()
    table = Table(title="mutants of the worker's rules vs tests/streams/test_delivery_machine.py")
    for column in ("invariant", "caught", "how"):
        table.add_column(column)
    survived = 0
    with tempfile.TemporaryDirectory(prefix="ledger-mutants-") as tmp:
        workdir = Path(tmp) / "tree"
        files = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        for name in files:
            source = ROOT / name
            if source.is_file():
                (workdir / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, workdir / name)
        clean, why = run(Mutant("(none: the unmutated rules)", TEST, "", ""), workdir)
        if clean:
            console.print(f"the unmutated machine fails already: {why}")
            return 1
        with console.status("running mutants") as status:
            for n, mutant in enumerate(MUTANTS, 1):
                status.update(f"mutant {n}/{len(MUTANTS)}: {mutant.guards}")
                caught, why = run(mutant, workdir)
                survived += not caught
                table.add_row(mutant.guards, "yes" if caught else "[red]SURVIVED[/red]", why)
    console.print(table)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
