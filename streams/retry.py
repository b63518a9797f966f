"""The retry policies a worker uses, for one delivery's channel and recipient.

In order, the first that has one wins:

1. the endpoint registry (``ledger.endpoints``): the ``retry_policy`` of the registered
   endpoint the recipient belongs to (the endpoint gate's matching,
   streams/endpoint_gate.py), read as the worker follows the registry, so an ``ledger
   endpoints update --retry-policy`` applies to the next decision without a restart. It is
   a whole policy: the fields the operator gave over the channel's defaults (the CLI
   fills them in), never merged with the environment's;
2. ``LEDGER_CHANNELS__RETRY_POLICIES`` for the channel (the environment fallback), each
   field over the channel's default;
3. the channel's default (``events/retry_policy.py``), or the field defaults for an
   installed plugin channel without one of its own.

Decisions stay pure: they get the policy from ``Context.rules`` as an input, like any other
argument; which policy that is, is decided here, at the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from config.parts import ChannelSettings
from events.channels import channel_names
from events.retry_policy import DEFAULT_POLICIES, RetryPolicy
from streams.endpoint_gate import Registry

# (channel, recipient) -> the policy that applies to it.
PolicyLookup = Callable[[str, str], RetryPolicy]
# (channel, recipient) -> its registered endpoint's policy, or None.
EndpointPolicy = Callable[[str, str], RetryPolicy | None]


def rules_for(
    settings: ChannelSettings, overrides: Mapping[str, RetryPolicy] | None = None
) -> Callable[[str], RetryPolicy]:
    """The environment's policy lookup: channel name -> RetryPolicy.

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


def endpoint_rules(
    fallback: Callable[[str], RetryPolicy], registry: EndpointPolicy | None = None
) -> PolicyLookup:
    """(channel, recipient) -> policy: the registry's endpoint policy where it sets one,
    else ``fallback``'s for the channel (``rules_for``)."""

    def policy(channel: str, recipient: str) -> RetryPolicy:
        own = None if registry is None else registry(channel, recipient)
        return fallback(channel) if own is None else own

    return policy


class RegistryRetryPolicies:
    """The registry's retry policies: ``endpoint_of`` places a recipient in an endpoint
    (the endpoint gate's matching), whose spec may carry ``retry_policy``."""

    def __init__(self, registry: Registry, endpoint_of: Callable[[str, str], str | None]) -> None:
        self._registry = registry
        self._endpoint_of = endpoint_of

    def __call__(self, channel: str, recipient: str) -> RetryPolicy | None:
        """The policy of the recipient's registered endpoint, if it sets one."""
        endpoint_id = self._endpoint_of(channel, recipient)
        if endpoint_id is None:
            return None
        endpoint = self._registry.endpoints.get(endpoint_id)
        return None if endpoint is None else endpoint.spec.retry_policy
