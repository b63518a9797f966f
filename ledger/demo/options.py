"""What ``ledger demo`` was asked to do, and the names the demo's parts share: the fake
Slack's workspace, token and conversation, the fake email API's key, the browser target."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import SecretStr

# The fake Slack's workspace, bot token and conversation: the demo's own, on 127.0.0.1.
DEMO_SLACK_WORKSPACE = "demo"
DEMO_SLACK_TOKEN = SecretStr("xoxb-demo-only-token")
DEMO_SLACK_CHANNEL = "C0DEMO0001"
# The fake email API's key and the demo's sender (LEDGER_CHANNELS__SETTINGS[email_api]).
DEMO_EMAIL_API_KEY = "re_demo_only_key"
BROWSER_TARGET = "demo-form"


@dataclass
class DemoOptions:
    """What ``ledger demo`` was asked to do."""

    runs: int = 40
    rate: float = 8.0  # runs per second
    once: bool = False
    seed: int = 7
