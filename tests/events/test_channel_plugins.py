"""Channel plugins: discovered through the entry-point group, the built-ins included; the
light half never imports ``streams``; recipients and settings are checked by the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

from config.channels import channel_config
from config.settings import Settings, changed
from events.channels import (
    GROUP,
    Capabilities,
    ChannelPlugin,
    FirstAnswer,
    Lookup,
    channel_names,
    channel_plugin,
    check_recipient,
    recipient_refusal,
)
from events.errors import ConfigError


def test_the_built_ins_register_through_the_entry_point_group() -> None:
    from importlib.metadata import entry_points

    registered = {p.name: p.value for p in entry_points(group=GROUP)}
    assert registered["webhook"] == "events.channels.builtin:webhook"
    assert registered["provider"] == "events.channels.builtin:provider"
    assert {"webhook", "provider"} <= set(channel_names())


def test_capabilities_of_the_built_ins() -> None:
    webhook = channel_plugin("webhook").capabilities
    assert "header webhook-id" in webhook.key_carriers
    assert webhook.first_answer is FirstAnswer.CONFIRMED
    assert webhook.dedupe_rule is not None
    assert webhook.dedupe_rule.name == "webhook-id"
    provider = channel_plugin("provider").capabilities
    assert provider.first_answer is FirstAnswer.SENT
    assert provider.lookup is Lookup.BY_KEY
    assert provider.dedupe_rule is None  # a retention window is no contract


def test_loading_every_plugin_imports_nothing_of_streams() -> None:
    """The dependency rule: events imports neither streams nor projections, also when it
    loads the channel plugins (their adapters are named, not imported)."""
    code = (
        "import sys, events, events.channels as c; c.installed_plugins();"
        "from clients import DeliverySpec;"
        "DeliverySpec(channel='webhook', recipient='https://x.test/h');"
        "heavy = ('streams', 'projections', 'faust', 'httpx');"
        "print([m for m in sys.modules if m.split('.')[0] in heavy])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_recipients_are_checked_by_their_channel() -> None:
    with pytest.raises(ValueError, match="must be an http\\(s\\) URL"):
        check_recipient("webhook", "mailto:someone@example.test")
    with pytest.raises(ValueError, match="unknown channel 'pigeon' \\(known channels: "):
        check_recipient("pigeon", "coo")
    assert recipient_refusal("webhook", "https://x.test/h?token=abc") is not None
    assert recipient_refusal("provider", "https://x.test/messages") is None


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    token: SecretStr
    host: str = "api.example.test"


_CONFIGURED = ChannelPlugin(
    name="configured",
    description="a channel with settings",
    capabilities=Capabilities(("header X-Key",), Lookup.NONE, FirstAnswer.CONFIRMED),
    check_recipient=lambda _r: None,
    adapter="nowhere:factory",
    settings_model=_Config,
)


def test_per_channel_settings_are_hidden_and_validated_by_the_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "LEDGER_CHANNELS__SETTINGS", json.dumps({"configured": {"token": "xo-s3cr3t"}})
    )
    settings = Settings()
    assert "xo-s3cr3t" not in repr(settings)
    assert "xo-s3cr3t" not in json.dumps(settings.model_dump(mode="json"))
    config = channel_config(_CONFIGURED, settings.channels)
    assert isinstance(config, _Config)
    assert config.token.get_secret_value() == "xo-s3cr3t"
    assert "xo-s3cr3t" not in repr(config)

    wrong = Settings(channels={"settings": {"configured": {"tokn": "xo-s3cr3t"}}})
    with pytest.raises(ConfigError) as caught:
        channel_config(_CONFIGURED, wrong.channels)
    assert caught.value.message.startswith("LEDGER_CHANNELS__SETTINGS[configured].")
    assert "xo-s3cr3t" not in caught.value.message
    with pytest.raises(ConfigError, match="takes no settings"):
        channel_config(
            channel_plugin("provider"),
            changed(
                wrong, {"channels.settings": {"provider": wrong.channels.settings["configured"]}}
            ).channels,
        )


def test_a_plugin_declares_a_valid_name_and_how_the_key_travels() -> None:
    with pytest.raises(ValueError, match="channel name"):
        ChannelPlugin(
            name="Bad Name",
            description="",
            capabilities=Capabilities(("header X",), Lookup.NONE, FirstAnswer.SENT),
            check_recipient=lambda _r: None,
            adapter="m:f",
        )
    with pytest.raises(ValueError, match="how the idempotency key reaches"):
        Capabilities((), Lookup.NONE, FirstAnswer.SENT)
