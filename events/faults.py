"""Fault-injection points: a process SIGKILLs itself at an exact point when settings name it.

Off by default. The failure-matrix tests enable them to crash a real process at the
moment that matters (after a send, before a commit), which no mock can reproduce.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

PUBLISHER_BEFORE_COMMIT = "publisher.before_commit"

log = logging.getLogger(__name__)


def crash_if_enabled(point: str, enabled: frozenset[str]) -> None:
    """SIGKILL this process right here if ``point`` is one of the enabled fault points."""
    if point not in enabled:
        return
    log.warning("fault injection: SIGKILL at %s", point)
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
