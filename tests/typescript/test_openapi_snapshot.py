"""The TypeScript client's types are generated from typescript/client/openapi.json: that
file must be the document the app serves now, so an API change without a client change
fails here (regenerate with ``python -m api.snapshot > typescript/client/openapi.json``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from api.snapshot import SNAPSHOT
from tests.readme import ROOT


def test_the_committed_openapi_snapshot_is_what_the_app_generates() -> None:
    # In a clean process: no plugin channel a test put on sys.path, no LEDGER_* settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "PYTHONPATH"))}
    made = subprocess.run(
        [sys.executable, "-m", "api.snapshot"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    committed = (ROOT / SNAPSHOT).read_text()
    assert json.loads(made) == json.loads(committed), (
        f"{SNAPSHOT} is not the app's OpenAPI document: run "
        f"'python -m api.snapshot > {SNAPSHOT}' and rebuild the client (scripts/setup)"
    )
    assert made == committed  # byte for byte too: the file is generated, never edited
