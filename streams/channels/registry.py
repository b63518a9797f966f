"""Build the channel adapters a worker uses, by name, over one shared httpx client."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Self

import httpx

from events.channels import CHANNELS
from events.settings import Settings
from streams.channels.base import Channel
from streams.channels.http import create_http_client
from streams.channels.provider import ProviderChannel
from streams.channels.slack import SlackChannel
from streams.channels.webhook import WebhookChannel


def build_channels(
    settings: Settings, client: httpx.AsyncClient | None = None
) -> dict[str, Channel]:
    """One adapter per name in ``events.channels.CHANNELS``, all sharing one client.

    Without ``client``, one is created from settings (``create_http_client``); call this
    once per worker. ``ChannelRegistry`` does the same and also closes the client.
    """
    if client is None:
        client = create_http_client(settings)
    channels: dict[str, Channel] = {
        "webhook": WebhookChannel(client, settings),
        "provider": ProviderChannel(client, deadline_s=settings.send_deadline_s),
        "slack": SlackChannel(client, settings),
    }
    missing = CHANNELS - channels.keys()
    if missing:  # a channel the vocabulary accepts but nothing can send: fail at start-up
        raise RuntimeError(f"no adapter for channel(s): {', '.join(sorted(missing))}")
    return channels


class ChannelRegistry:
    """The worker's channels and the one pooled client they share; ``async with`` closes it."""

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else create_http_client(settings)
        self.channels: Mapping[str, Channel] = build_channels(settings, self.client)

    def get(self, name: str) -> Channel:
        """The adapter for channel ``name``; KeyError names the known ones."""
        try:
            return self.channels[name]
        except KeyError:
            known = ", ".join(sorted(self.channels))
            raise KeyError(f"no channel {name!r} (known: {known})") from None

    async def aclose(self) -> None:
        """Close the shared client if this registry created it."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
