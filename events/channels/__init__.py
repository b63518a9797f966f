"""The delivery channels installed here, found through the ``delivery_ledger.channels``
entry-point group, and what a valid recipient is for each.

Only the light half of a plugin (``events.channels.plugin.ChannelPlugin``) is loaded
here, and only when a channel is first named; the adapter is the worker's business
(``streams.channels.registry``). The built-ins (webhook, provider, slack, smtp) register the
same way, in pyproject.toml.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points

from events.channels.plugin import (
    Capabilities,
    ChannelPlugin,
    DedupeRule,
    FirstAnswer,
    Lookup,
)
from events.channels.urls import check_http_url, credentials_in, shown, slack_recipient
from events.errors import LedgerError

GROUP = "delivery_ledger.channels"

__all__ = [
    "GROUP",
    "Capabilities",
    "ChannelPlugin",
    "ChannelPluginError",
    "DedupeRule",
    "FirstAnswer",
    "Lookup",
    "channel_names",
    "channel_plugin",
    "check_channel",
    "check_http_url",
    "check_recipient",
    "credentials_in",
    "forget_discovered",
    "installed_plugins",
    "recipient_refusal",
    "shown",
    "slack_recipient",
]

_INSTALL_HINT = (
    "install the package that provides it (pip install ...); the built-ins need the "
    "package itself installed: pip install -e ."
)


class ChannelPluginError(LedgerError):
    """A channel plugin that is registered but cannot be used (a broken installation, not
    bad input: exit code 1), found where it is loaded."""

    exit_code = 1


@functools.cache
def _registered() -> dict[str, EntryPoint]:
    """Every entry point of the group by name; one name registered twice is refused."""
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=GROUP):
        other = found.get(point.name)
        if other is not None and other.value != point.value:
            raise ChannelPluginError(
                f"channel {point.name!r} is registered twice ({other.value} and {point.value})",
                "uninstall one of the two packages",
            )
        found.setdefault(point.name, point)
    return found


_loaded: dict[str, ChannelPlugin] = {}


def forget_discovered() -> None:
    """Drop what discovery cached (for tests that install or remove a plugin)."""
    _registered.cache_clear()
    _loaded.clear()


def channel_names() -> list[str]:
    """The names of the installed channels, sorted; no plugin is imported."""
    return sorted(_registered())


def _known() -> str:
    return ", ".join(channel_names()) or "none installed"


def channel_plugin(name: str) -> ChannelPlugin:
    """The light half of channel ``name``, imported on first use; ``ValueError`` for a
    channel nothing registers, ``ChannelPluginError`` for one that cannot be loaded."""
    plugin = _loaded.get(name)
    if plugin is not None:
        return plugin
    point = _registered().get(name)
    if point is None:
        raise ValueError(f"unknown channel {name!r} (known channels: {_known()})")
    try:
        loaded = point.load()
    except Exception as exc:  # any import failure of a plugin is reported, as one line
        raise ChannelPluginError(
            f"channel plugin {name!r} ({point.value}) failed to load: {type(exc).__name__}: {exc}",
            _INSTALL_HINT,
        ) from exc
    if not isinstance(loaded, ChannelPlugin):
        raise ChannelPluginError(
            f"channel plugin {name!r} ({point.value}) is a {type(loaded).__name__}, "
            "not an events.channels.ChannelPlugin",
        )
    if loaded.name != name:
        raise ChannelPluginError(
            f"channel plugin {point.value} calls itself {loaded.name!r} but is registered "
            f"as {name!r}",
        )
    _loaded[name] = loaded
    return loaded


def installed_plugins() -> list[ChannelPlugin]:
    """Every installed channel's light half, by name."""
    return [channel_plugin(name) for name in channel_names()]


def check_channel(channel: str) -> str:
    """Refuse a channel no installed plugin provides."""
    channel_plugin(channel)
    return channel


def check_recipient(channel: str, recipient: str) -> str:
    """The channel's rule for a recipient's form; ``ValueError`` names what is wrong."""
    channel_plugin(channel).check_recipient(recipient)
    return recipient


def recipient_refusal(channel: str, recipient: str) -> str | None:
    """Why the channel refuses to request ``recipient`` now (its policy), or None."""
    return channel_plugin(channel).refuse(recipient)
