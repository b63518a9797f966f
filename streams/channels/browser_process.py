"""How the browser channel starts Chromium: in its sandbox, never as root, with an empty
environment.

A page is hostile input. Chromium's sandbox (user namespaces, seccomp) confines its
renderers; Chromium refuses to run it as root, so a worker running as root starts Chromium
as an unprivileged user (``run_as``, created by ``scripts/chromium``) through ``setpriv``
(no capabilities, no new privileges, no supplementary groups), after handing it the
profile directory Playwright made. Either way the process gets an empty environment, so no
``LEDGER_*`` secret of the worker is in it (Debian's ``/usr/bin/chromium`` launcher adds
only its own ``CHROME_*``/``GOOGLE_*`` variables). ``sandbox: false`` is for hosts without
user namespaces: Chromium then runs ``--no-sandbox``, still unprivileged and without the
environment.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from events.errors import ConfigError

SETPRIV = Path("/usr/bin/setpriv")
WRAPPER = """#!/bin/sh
# Written by delivery-ledger's browser channel: Chromium as {user}, never as root.
for arg in "$@"; do
  case "$arg" in
    --user-data-dir=*) /bin/chown -R {uid}:{gid} -- "${{arg#--user-data-dir=}}" || exit 1 ;;
  esac
done
cd /
exec {setpriv} --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all \\
  --bounding-set=-all --no-new-privs -- {chromium} "$@"
"""


def unprivileged_user(name: str) -> pwd.struct_passwd | None:
    """The account Chromium runs as when this process is root; None when it is not root.
    ``ConfigError`` (one line and a hint) when root has no such account to use."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(
            f"the worker runs as root and there is no user {name!r} to run Chromium as",
            "run scripts/chromium (it creates the user), or name another in the browser "
            "settings' run_as",
        ) from None
    if account.pw_uid == 0:
        raise ConfigError(f"run_as {name!r} is root", "name an unprivileged user")
    if not SETPRIV.exists():
        raise ConfigError(f"{SETPRIV} is missing", "apt-get install util-linux")
    return account


class ChromiumProcess:
    """The executable and options of one worker's Chromium launches (``launch_options``);
    ``cleanup`` removes the wrapper a root worker writes."""

    def __init__(self, executable: Path, *, run_as: str, sandbox: bool) -> None:
        self._executable = executable
        self._run_as = run_as
        self._sandbox = sandbox
        self._wrapper_dir: Path | None = None

    def launch_options(self) -> dict[str, Any]:
        """``executable_path``, ``chromium_sandbox`` and an empty ``env`` for Playwright."""
        return {
            "executable_path": str(self._executable_path()),
            "chromium_sandbox": self._sandbox,
            "env": {},
        }

    def _executable_path(self) -> Path:
        account = unprivileged_user(self._run_as)
        if account is None:
            return self._executable
        if self._wrapper_dir is None:
            self._wrapper_dir = Path(tempfile.mkdtemp(prefix="ledger-chromium-"))  # 0700
        wrapper = self._wrapper_dir / "chromium"
        wrapper.write_text(
            WRAPPER.format(
                user=account.pw_name,
                uid=account.pw_uid,
                gid=account.pw_gid,
                setpriv=SETPRIV,
                chromium=shlex.quote(str(self._executable)),
            )
        )
        wrapper.chmod(0o700)
        return wrapper

    def cleanup(self) -> None:
        """Remove the wrapper (the worker is stopping)."""
        if self._wrapper_dir is not None:
            shutil.rmtree(self._wrapper_dir, ignore_errors=True)
            self._wrapper_dir = None
