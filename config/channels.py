"""A channel's own settings: its entry of ``LEDGER_CHANNEL_SETTINGS``, validated by its
plugin (events/channels/plugin.py)."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from config.settings import Settings
from events.channels import ChannelPlugin
from events.errors import ConfigError


def channel_config(plugin: ChannelPlugin, settings: Settings) -> BaseModel | None:
    """The channel's entry of ``LEDGER_CHANNEL_SETTINGS``, validated by its plugin.

    ``ConfigError`` names the setting and the field, never a value."""
    raw = settings.channel_settings.get(plugin.name)
    where = f"LEDGER_CHANNEL_SETTINGS[{plugin.name}]"
    if plugin.settings_model is None:
        if raw is not None:
            raise ConfigError(f"{where}: channel {plugin.name!r} takes no settings")
        return None
    try:
        return plugin.settings_model.model_validate({} if raw is None else raw.get_secret_value())
    except ValidationError as exc:
        err = exc.errors(include_input=False)[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"{where}{'.' + field if field else ''}: {err['msg']}",
            f"see `ledger channels` for what channel {plugin.name!r} takes",
        ) from None
