"""What goes wrong in a browser attempt: before the submit (nothing was submitted) or after
it began (the page or the browser went away), each said in one line."""

from __future__ import annotations


class NotSubmitted(Exception):
    """A step before the submit failed: nothing was submitted."""


class PageLost(Exception):
    """The page, its navigation or the browser went away after the submit began."""


class Blocked(NotSubmitted):
    """The address policy refused the page the attempt had to open: nothing submitted."""


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message``, bounded (Playwright's messages run long)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
