"""Files only their owner may read: the data directory and what is kept under it.

Payloads, recipients, evidence, screenshots of internal pages, SASL passwords and the
broker's log segments all live under the data directory; none of it is for other users of
the machine. Directories are 0700 and files 0600, set where each is created (so a library
user without the CLI's umask gets them too); ``ledger`` also runs with umask 077.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
UMASK = 0o077


def private_dir(path: Path, *, ours: bool = True) -> Path:
    """``path`` as a directory, 0700, with every directory created for it 0700 too.
    ``ours=False`` (a directory the user named, such as a SQLite file's folder): only
    what is created here is tightened, an existing one is left as it is."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for created in missing:
        os.chmod(created, PRIVATE_DIR)
    if ours:
        os.chmod(path, PRIVATE_DIR)
    return path


def private_file(path: Path) -> Path:
    """``path`` exists and is 0600 (created empty if missing, its content kept)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
    os.close(fd)
    os.chmod(path, PRIVATE_FILE)
    return path
