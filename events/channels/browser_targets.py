"""The browser channel's targets, declared as data: what to open, fill, click and read.

A target is a web form the channel submits for a delivery whose recipient is the target's
name. Declared in ``LEDGER_CHANNELS__SETTINGS`` (``{"browser": {"targets": {...}}}``) or in a
YAML/JSON file it names (``targets_file``); both are validated here, so a bad declaration
stops a worker at start with one line naming the field. Light: pydantic only (PyYAML is
imported when a YAML file is read).
"""

from __future__ import annotations

import enum
import json
import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from events.channels.urls import check_http_url

TARGET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class _Declared(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Fill(_Declared):
    """Fill the element at ``fill`` with the payload's field ``field``."""

    fill: str = Field(min_length=1)
    field: str = Field(min_length=1)


class Click(_Declared):
    """Click the element at ``click`` (before the submit: nothing irreversible)."""

    click: str = Field(min_length=1)


class WaitFor(_Declared):
    """Wait until the element at ``wait`` is attached."""

    wait: str = Field(min_length=1)


Step = Fill | Click | WaitFor


class KeyCarrier(_Declared):
    """Where the idempotency key (or the fencing token) goes: the value of a (hidden) input
    at ``input``, or the URL parameter ``param`` of the start URL. Exactly one."""

    input: str | None = None
    param: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.input is None) == (self.param is None):
            raise ValueError("give exactly one of input (a selector) or param (a URL parameter)")
        return self


class Confirmation(_Declared):
    """The element that proves acceptance, and its attribute holding the target's id."""

    selector: str = Field(min_length=1)
    attribute: str = Field(default="data-id", min_length=1)


class PageOutcome(enum.StrEnum):
    """What an error page after the submit means."""

    REJECTED = "rejected"  # the target refused it, nothing was accepted: FAILED
    UNKNOWN = "unknown"  # it may have been accepted: UNKNOWN, then the lookup


class ErrorRule(_Declared):
    """An error page the target renders after the submit, recognised by a selector."""

    selector: str = Field(min_length=1)
    outcome: PageOutcome = PageOutcome.UNKNOWN


class NotFoundMark(_Declared):
    """What a search page shows when it found nothing: an element (``selector``), a text
    (``text``; inside ``selector`` when both are given), or both."""

    selector: str | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.selector is None and self.text is None:
            raise ValueError("not_found needs a selector, a text, or both")
        return self


class SearchLookup(_Declared):
    """A search page in the browser: ``url`` with ``{key}`` (the results of one GET), or a
    page where the key is typed into ``fill`` and ``submit`` is clicked. Each element at
    ``result`` is one accepted submission, its ``attribute`` the target's id. Without
    ``key_attribute`` (the attribute of a result holding its key) any result counts as the
    key's, so a fuzzy search could match another key's submission. ``not_found`` is the
    page's "definitely not accepted"; a page showing neither stays a lookup error."""

    url: str
    fill: str | None = Field(default=None, min_length=1)
    submit: str | None = Field(default=None, min_length=1)
    result: str = Field(min_length=1)
    attribute: str = Field(default="data-id", min_length=1)
    key_attribute: str | None = Field(default=None, min_length=1)
    not_found: NotFoundMark

    @model_validator(mode="after")
    def _how(self) -> Self:
        if "{key}" in self.url:
            if self.fill is not None or self.submit is not None:
                raise ValueError(
                    "search url with {key} is the results page: leave out fill and submit"
                )
        elif self.fill is None or self.submit is None:
            raise ValueError("search url must contain {key}, or give fill and submit selectors")
        check_http_url(self.url.replace("{key}", "k"))
        return self


class TargetLookup(_Declared):
    """How to find a key's submission: ``url``, a URL answering JSON that lists the
    accepted submissions (``{key}`` in it is the idempotency key; ``list_field`` names the
    list, each item an object whose ``id_field`` is the target's id and ``key_field`` the
    key), or ``search``, a search page read in the browser. Exactly one."""

    url: str | None = None
    list_field: str = "accepted"
    id_field: str = "id"
    key_field: str = "key"
    search: SearchLookup | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        if (self.url is None) == (self.search is None):
            raise ValueError(
                "lookup needs exactly one of url (a list of accepted keys) or search (a page)"
            )
        if self.search is not None:
            extra = sorted({"list_field", "id_field", "key_field"} & self.model_fields_set)
            if extra:
                raise ValueError(f"lookup {', '.join(extra)} belong to a url lookup, not search")
        if self.url is not None:
            if "{key}" not in self.url:
                raise ValueError("lookup url must contain {key}")
            check_http_url(self.url.replace("{key}", "k"))
        return self


class LoginRule(_Declared):
    """How to tell the target's login page: an element (``selector``) or a URL matching
    ``url`` (a regular expression, searched), or either of both. Seen before the submit,
    the attempt ends with nothing submitted."""

    selector: str | None = Field(default=None, min_length=1)
    url: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.selector is None and self.url is None:
            raise ValueError("login needs a selector, a url (a regular expression), or both")
        if self.url is not None:
            try:
                re.compile(self.url)
            except re.error as exc:
                raise ValueError(f"login url is not a regular expression: {exc}") from None
        return self


class Target(_Declared):
    """One web form: open ``start_url``, run ``steps``, put the key (and the token), click
    ``submit`` (the one irreversible step), then read the confirmation or an error page."""

    start_url: str
    steps: tuple[Step, ...] = ()
    submit: str = Field(min_length=1)
    key: KeyCarrier
    # Where the fencing token goes, if the target accepts one (it refuses a stale token).
    fencing_token: KeyCarrier | None = None
    confirmation: Confirmation
    lookup: TargetLookup | None = None
    # The login page the target shows instead of the form (a session expired, a redirect).
    login: LoginRule | None = None
    errors: tuple[ErrorRule, ...] = ()
    # How long a submit may still be processed after the attempt gave up (None: default).
    settle_s: float | None = Field(default=None, ge=0, le=3600)

    @model_validator(mode="after")
    def _start(self) -> Self:
        check_http_url(self.start_url)
        return self


class BrowserSettings(_Declared):
    """The browser channel's entry of ``LEDGER_CHANNELS__SETTINGS``."""

    targets: dict[str, Target] = Field(default_factory=dict)
    # A YAML or JSON file holding ``{targets: {...}}``; merged with ``targets``.
    targets_file: Path | None = None
    # Chromium attempts in flight at once, per worker (each in a fresh context).
    concurrency: int = Field(default=2, ge=1, le=64)
    executable_path: Path = Path("/usr/bin/chromium")
    # Chromium runs in its sandbox (false: only where user namespaces are unavailable), and
    # a worker running as root starts it as this unprivileged user (scripts/chromium).
    sandbox: bool = True
    run_as: str = Field(default="ledger-browser", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    # How long a step before the submit may wait for its element (at most half the send
    # deadline): a selector missing past it is "not submitted", not the deadline.
    step_timeout_s: float = Field(default=5.0, gt=0, le=300)
    # Screenshots of failed attempts (default: DATA_DIR/browser-screenshots).
    screenshots_dir: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("targets_file"):
            return data
        path = Path(str(data["targets_file"]))
        declared = read_targets_file(path)
        inline = data.get("targets") or {}
        both = set(declared) & set(inline) if isinstance(inline, dict) else set()
        if both:
            raise ValueError(f"targets {sorted(both)} are declared both inline and in {path}")
        return {**data, "targets": {**declared, **(inline if isinstance(inline, dict) else {})}}

    @model_validator(mode="after")
    def _names(self) -> Self:
        for name in self.targets:
            if not TARGET_NAME.match(name):
                raise ValueError(f"target name {name[:80]!r} must match {TARGET_NAME.pattern}")
        return self


def read_targets_file(path: Path) -> dict[str, Any]:
    """The ``targets`` mapping of a YAML (``.yaml``/``.yml``) or JSON file; ``ValueError``
    in one line when it cannot be read, parsed, or validated (naming the field)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"targets_file {path}: {exc.strerror or exc}") from None
    kind: Literal["yaml", "json"] = "yaml" if path.suffix in (".yaml", ".yml") else "json"
    try:
        if kind == "yaml":
            import yaml

            raw = yaml.safe_load(text)
        else:
            raw = json.loads(text)
    except ImportError:
        raise ValueError(
            "targets_file is YAML but PyYAML is missing: pip install 'delivery-ledger[browser]'"
        ) from None
    except Exception as exc:  # noqa: BLE001 - JSONDecodeError or yaml.YAMLError, as one line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"targets_file {path}: not valid {kind}: {first}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("targets"), dict):
        raise ValueError(f"targets_file {path}: must hold a mapping with a 'targets' mapping")
    targets: dict[str, Any] = raw["targets"]
    for name, declared in targets.items():
        try:
            Target.model_validate(declared)
        except ValidationError as exc:
            err = exc.errors(include_input=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            raise ValueError(
                f"targets_file {path}: targets.{name}{'.' + where if where else ''}: {err['msg']}"
            ) from None
    return targets
