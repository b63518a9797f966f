"""The record guard's vocabulary: a refusal about one record, and a failure about none.

No record may stop a partition. Every reader of the log (worker, projector, rebuild,
verify, replay) handles a record in two kinds of step: pure steps that only compute from
the record and the state it meets (decode, fold, decide, index a timer), and steps that
talk to the world (the broker, the disk, a database). Any exception in a pure step is
about that one record: it is refused with a one-line reason saying who refused it and
where the record sits, and processing goes on with the next record. A failure of the
world is a ``SystemFailure``: the process stops and says which part failed, without
committing past the record, so nothing is lost.
"""

from __future__ import annotations

import enum

MAX_DETAIL = 300


class Refuser(enum.StrEnum):
    """Who refused a record: the first word of its one-line reason."""

    WORKER = "worker"
    PROJECTOR = "projector"
    READER = "reader"  # the projection's reader of the log (decoding)
    REPLAY = "replay"


class SystemFailure(Exception):
    """A failure that is not about one record (broker, producer fenced, disk, database):
    the process stops and says which part failed."""

    def __init__(self, part: str, cause: BaseException | None = None) -> None:
        detail = part if cause is None else f"{part}: {one_line(cause)}"
        super().__init__(detail)
        self.part = part


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, bounded: never a traceback, never record bytes."""
    text = " ".join(str(exc).split())
    if len(text) > MAX_DETAIL:
        text = text[: MAX_DETAIL - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def refusal(
    who: Refuser,
    topic: str,
    partition: int,
    offset: int,
    exc: BaseException,
    *,
    instance: str | None = None,
) -> str:
    """The one-line reason a record is refused: who refused it (``instance`` names which
    one, a worker's id), where it is, and why."""
    by = who.value if instance is None else f"{who.value} {instance}"
    return f"{by} refused {topic}[{partition}]@{offset}: {one_line(exc)}"
