"""The slack channel's settings (the light half: no HTTP client here).

Configured like every other channel, as its entry of ``LEDGER_CHANNELS__SETTINGS``:
``{"slack": {"tokens": {"acme": "xoxb-..."}}}``. Before settings came in parts they were
``LEDGER_SLACK_TOKENS``, ``LEDGER_SLACK_API_URL`` and ``LEDGER_SLACK_LOOKUP_MAX_PAGES``;
those names are still read into this entry (config/legacy.py), with a warning.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from events.channels.urls import SLACK_WORKSPACE


class SlackSettings(BaseModel):
    """The slack channel's entry of ``LEDGER_CHANNELS__SETTINGS``."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tokens: dict[str, SecretStr] = Field(default_factory=dict)
    """One bot token (xoxb-...) per workspace, by the workspace name a recipient uses
    (``WORKSPACE/CHANNEL_ID``): no credential is ever in a recipient."""
    api_url: str = "https://slack.com/api/"
    """The Web API's base URL (tests point it at the fake Slack)."""
    lookup_max_pages: int = Field(default=10, ge=1, le=100)
    """How many pages of conversations.history (200 messages each) one lookup may read."""

    @field_validator("tokens")
    @classmethod
    def _workspaces(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for workspace, token in value.items():
            if not SLACK_WORKSPACE.fullmatch(workspace):
                raise ValueError(
                    f"workspace {workspace[:64]!r} must be 1-64 letters, digits, '_' or '-'"
                )
            if not token.get_secret_value().strip():
                raise ValueError(f"the token of workspace {workspace!r} is empty")
        return value

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname:
            raise ValueError("must be an http(s) URL with a host")
        return value if value.endswith("/") else value + "/"
