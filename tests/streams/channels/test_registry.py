"""The registry builds every known channel over one shared client, and closes what it owns."""

import httpx

from events.channels import CHANNELS
from events.settings import Settings
from streams.channels.registry import ChannelRegistry, build_channels


async def test_every_channel_over_one_client() -> None:
    async with httpx.AsyncClient() as client:
        channels = build_channels(Settings(), client)
        assert set(channels) == CHANNELS
        assert {c.name for c in channels.values()} == CHANNELS
        assert all(c._client is client for c in channels.values())  # type: ignore[attr-defined]


async def test_registry_closes_only_a_client_it_created() -> None:
    async with ChannelRegistry(Settings()) as registry:
        own = registry.client
        assert registry.get("webhook").name == "webhook"
    assert own.is_closed
    async with httpx.AsyncClient() as shared:
        async with ChannelRegistry(Settings(), shared):
            pass
        assert not shared.is_closed
