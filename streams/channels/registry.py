"""Build the adapters of every installed channel plugin, over one shared httpx client."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import TracebackType
from typing import Self, cast

import httpx

from config.channels import channel_config
from config.settings import Settings
from events.channels import (
    ChannelPlugin,
    ChannelPluginError,
    channel_names,
    installed_plugins,
)
from events.errors import ConfigError
from streams.channels.base import AdapterBuild, AdapterFactory, Channel
from streams.channels.http import create_http_client
from streams.metrics import WorkerMetrics

# The built-ins: a worker without them was installed without its own entry points.
BUILT_IN = frozenset({"webhook", "provider", "slack", "smtp", "email_api", "browser"})


def adapter_factory(plugin: ChannelPlugin) -> AdapterFactory:
    """The plugin's adapter factory, imported now if it names one as ``module:attribute``."""
    if not isinstance(plugin.adapter, str):
        return cast(AdapterFactory, plugin.adapter)
    module_name, _, attribute = plugin.adapter.partition(":")
    try:
        found: object = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ChannelPluginError(
            f"channel {plugin.name!r}: adapter {plugin.adapter} cannot be imported: "
            f"{type(exc).__name__}: {exc}",
            "install the plugin's package completely (with its worker dependencies)",
        ) from exc
    if not callable(found):
        raise ChannelPluginError(
            f"channel {plugin.name!r}: adapter {plugin.adapter} is not callable"
        )
    return cast(AdapterFactory, found)


def build_channels(
    settings: Settings,
    client: httpx.AsyncClient | None = None,
    metrics: WorkerMetrics | None = None,
) -> dict[str, Channel]:
    """One adapter per installed channel plugin, all sharing one client.

    Without ``client``, one is created from settings (``create_http_client``); call this
    once per worker. ``ChannelRegistry`` does the same and also closes the client. A
    plugin that cannot be built, or settings or a deadline for a channel that is not
    installed, stop the worker at start (``ConfigError``), never at its first send.
    """
    missing = BUILT_IN - set(channel_names())
    if missing:
        raise ChannelPluginError(
            f"no channel plugin registered for {', '.join(sorted(missing))}",
            "reinstall the package so its entry points are registered: pip install -e .",
        )
    for setting, named in (
        ("LEDGER_CHANNELS__SETTINGS", settings.channels.settings),
        ("LEDGER_CHANNELS__SEND_DEADLINES", settings.channels.send_deadlines),
    ):
        unknown = set(named) - set(channel_names())
        if unknown:
            raise ConfigError(
                f"{setting} names channels that are not installed: {', '.join(sorted(unknown))}",
                "see `ledger channels` for the installed ones",
            )
    if client is None:
        client = create_http_client(settings.channels)
    channels: dict[str, Channel] = {}
    for plugin in installed_plugins():
        config = channel_config(plugin, settings.channels)
        build = AdapterBuild(
            plugin, client, settings.channels, settings.worker, settings.data_dir, config, metrics
        )
        adapter = adapter_factory(plugin)(build)
        if adapter.name != plugin.name:
            raise ChannelPluginError(
                f"channel {plugin.name!r}: its adapter calls itself {adapter.name!r}"
            )
        channels[plugin.name] = adapter
    return channels


class ChannelRegistry:
    """The worker's channels and the one pooled client they share; ``async with`` closes it."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.AsyncClient | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else create_http_client(settings.channels)
        self.channels: Mapping[str, Channel] = build_channels(settings, self.client, metrics)

    def get(self, name: str) -> Channel:
        """The adapter for channel ``name``; KeyError names the known ones."""
        try:
            return self.channels[name]
        except KeyError:
            known = ", ".join(sorted(self.channels))
            raise KeyError(f"no channel {name!r} (known: {known})") from None

    async def aclose(self) -> None:
        """Close what the adapters hold (a browser) and the shared client if this registry
        created it."""
        for adapter in self.channels.values():
            close = getattr(adapter, "aclose", None)
            if close is not None:
                await close()
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
