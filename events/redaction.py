"""URLs fit to show: no ``user:password@``, and secret-looking query values ``REDACTED``.

Events already in the log may carry credentials in a recipient (they were written before
the SDK refused them, or by a raw producer); the log is immutable, so whatever shows an
event's URL (dashboard, ``ledger run``/``status``, replay) shows it through here. Parsing
is by hand, not ``urllib``: a URL that ``urlsplit`` refuses (bad brackets, bad port) must
still come out redacted, never raw and never as an exception.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus

REDACTED = "REDACTED"

# Parameter names that carry credentials, matched on the decoded, lowercased name's end:
# the one list, both for what a recipient may not carry (events/channels/urls.py refuses
# it at admission) and for what is hidden when a URL is shown. ``sig``, ``key`` and
# ``X-Amz-Signature`` (presigned URLs) are credentials too.
_SECRET_NAME = re.compile(
    r"(^|[_.\-\[])(api[_-]?key|apikey|key|token|secret|password|passwd|pwd|pass|auth|"
    r"authorization|signature|sig|credentials?|session|sessionid|jwt|bearer)\]?$"
)
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<authority>[^/?#]*)(?P<rest>.*)$")
# A URL inside free text (timeline entries, reasons): from the scheme to the next blank.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")
# Sentence punctuation right after a URL belongs to the sentence.
_TRAILING = ".,;:!?)]}'\""


def secret_name(name: str) -> bool:
    """True if a query parameter called ``name`` looks like it carries a credential."""
    return _SECRET_NAME.search(unquote_plus(name).strip().lower()) is not None


def secret_params(text: str) -> list[str]:
    """The names of the secret-looking parameters in a query or fragment ``text`` (split
    on ``&`` and ``;``, as they are redacted)."""
    found = []
    for piece in re.split(r"[&;]", text):
        name, eq, _ = piece.partition("=")
        if eq and secret_name(name):
            found.append(name)
    return found


def _params(text: str) -> str:
    pieces = []
    for piece in re.split(r"([&;])", text):
        name, eq, _ = piece.partition("=")
        pieces.append(f"{name}={REDACTED}" if eq and secret_name(name) else piece)
    return "".join(pieces)


def redacted_url(url: str) -> str:
    """``url`` without userinfo, its secret-looking query (and fragment) values replaced."""
    match = _URL.match(url)
    if match is None:
        return url
    authority = match["authority"].rpartition("@")[2]
    rest, hash_, fragment = match["rest"].partition("#")
    path, question, query = rest.partition("?")
    return f"{match['scheme']}{authority}{path}{question}{_params(query)}{hash_}{_params(fragment)}"


def redacted_text(text: str) -> str:
    """``text`` with every URL in it redacted (``redacted_url``); the rest unchanged."""
    if "://" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        found = match[0]
        core = found.rstrip(_TRAILING)
        return redacted_url(core) + found[len(core) :]

    return _URL_IN_TEXT.sub(one, text)


def redacted_data(data: Any) -> Any:
    """JSON-like ``data`` (dicts, lists, tuples, strings) with every string redacted."""
    if isinstance(data, str):
        return redacted_text(data)
    if isinstance(data, dict):
        return {key: redacted_data(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [redacted_data(value) for value in data]
    return data
