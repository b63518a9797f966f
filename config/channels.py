"""A channel's own settings: its entry of ``LEDGER_CHANNELS__SETTINGS``, validated by its
plugin (events/channels/plugin.py). Every channel is configured this way, the built-in
ones too (slack's tokens included); webhook endpoints, which the address guard of every
channel reads, stay typed fields of the channels part."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from config.parts import ChannelSettings
from events.channels import ChannelPlugin, builtin
from events.channels.slack import SlackSettings
from events.errors import ConfigError


def channel_config(plugin: ChannelPlugin, settings: ChannelSettings) -> BaseModel | None:
    """The channel's entry of ``LEDGER_CHANNELS__SETTINGS``, validated by its plugin.

    ``ConfigError`` names the setting and the field, never a value."""
    raw = settings.settings.get(plugin.name)
    where = f"LEDGER_CHANNELS__SETTINGS[{plugin.name}]"
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


def slack_settings(channels: ChannelSettings) -> SlackSettings:
    """The slack entry of ``LEDGER_CHANNELS__SETTINGS``, validated (ConfigError if not)."""
    config = channel_config(builtin.slack, channels)
    assert isinstance(config, SlackSettings)  # the slack plugin's settings model
    return config
