"""The retry policies a worker uses: each channel's default (``events/retry_policy.py``),
replaced field by field by ``LEDGER_CHANNELS__RETRY_POLICIES``, then by a test's overrides."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from config.parts import ChannelSettings
from events.channels import channel_names
from events.retry_policy import DEFAULT_POLICIES, RetryPolicy


def rules_for(
    settings: ChannelSettings, overrides: Mapping[str, RetryPolicy] | None = None
) -> Callable[[str], RetryPolicy]:
    """The policy lookup a worker uses: channel name -> RetryPolicy.

    The defaults above, replaced per channel by ``settings.retry_policies``
    (``LEDGER_CHANNELS__RETRY_POLICIES``), then by ``overrides`` (tests).
    """
    # An installed plugin channel without a default of its own gets the field defaults (as
    # ``for_channel`` gives it for LEDGER_CHANNELS__RETRY_POLICIES); without this its first retry
    # raised KeyError and left the delivery UNKNOWN for good.
    installed = {name: RetryPolicy() for name in channel_names()}
    policies = {
        **installed,
        **DEFAULT_POLICIES,
        **settings.retry_policies,
        **(overrides or {}),
    }

    def policy(channel: str) -> RetryPolicy:
        try:
            return policies[channel]
        except KeyError:
            raise KeyError(f"no retry policy for channel {channel!r}") from None

    return policy
