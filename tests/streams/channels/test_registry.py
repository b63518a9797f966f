"""The registry builds every installed channel over one shared client, and closes what it
owns; a channel's settings are validated by its plugin at start."""

import httpx
import pytest

from config.settings import Settings
from events.channels import channel_names
from events.errors import ConfigError
from streams.channels.registry import ChannelRegistry, build_channels


async def test_every_channel_over_one_client() -> None:
    async with httpx.AsyncClient() as client:
        channels = build_channels(Settings(), client)
        assert set(channels) == set(channel_names()) >= {"webhook", "provider"}
        assert {c.name for c in channels.values()} == set(channel_names())
        # Every HTTP channel shares the client; smtp speaks SMTP (a connection per attempt).
        http = [c for c in channels.values() if c.name != "smtp"]
        assert all(c._client is client for c in http)  # type: ignore[attr-defined]


async def test_registry_closes_only_a_client_it_created() -> None:
    async with ChannelRegistry(Settings()) as registry:
        own = registry.client
        assert registry.get("webhook").name == "webhook"
    assert own.is_closed
    async with httpx.AsyncClient() as shared:
        async with ChannelRegistry(Settings(), shared):
            pass
        assert not shared.is_closed


async def test_settings_for_a_channel_that_is_not_installed_stop_the_start() -> None:
    settings = Settings(channels={"settings": {"pigeon": {"token": "t0ps3cret"}}})
    async with httpx.AsyncClient() as client:
        with pytest.raises(ConfigError, match="not installed: pigeon") as caught:
            build_channels(settings, client)
    assert "t0ps3cret" not in str(caught.value)


async def test_a_deadline_for_a_channel_that_is_not_installed_stops_the_start() -> None:
    settings = Settings(channels={"send_deadlines": {"pigeon": 20}})
    async with httpx.AsyncClient() as client:
        with pytest.raises(
            ConfigError, match=r"LEDGER_CHANNELS__SEND_DEADLINES .* not installed: pigeon"
        ):
            build_channels(settings, client)


async def test_each_adapter_gets_its_own_channels_deadline() -> None:
    settings = Settings(
        channels={
            "send_deadline_s": 3,
            "send_deadlines": {"browser": 9, "slack": 4},
            "http_timeout_s": 2,
        }
    )
    async with httpx.AsyncClient() as client:
        channels = build_channels(settings, client)
    deadlines = {name: c._deadline_s for name, c in channels.items()}  # type: ignore[attr-defined]
    assert deadlines == {
        "webhook": 3,
        "provider": 3,
        "slack": 4,
        "smtp": 3,
        "email_api": 3,
        "browser": 9,
    }
