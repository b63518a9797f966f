"""Endpoint signing secrets encrypted for the log: ``cryptography``'s MultiFernet.

The registry's events hold a Fernet token, never the secret (events/endpoints.py). The
keys come from ``LEDGER_ENDPOINTS__ENCRYPTION_KEYS``: the first encrypts, every one
decrypts, so a new key is put first, the registry re-encrypted (``ledger endpoints
reencrypt``), and the old key dropped after.
"""

from __future__ import annotations

import base64
import os

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import SecretStr

from config.parts import EndpointSettings
from events.errors import ConfigError

KEY_HINT = (
    "set LEDGER_ENDPOINTS__ENCRYPTION_KEYS to a JSON list of Fernet keys; make one with: "
    "python -c 'import base64,os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'"
)


class SecretUnreadable(ValueError):
    """A token none of the keys decrypts (a key was dropped too early, or it was forged)."""


def new_webhook_secret() -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")


def new_encryption_key() -> str:
    """A fresh Fernet key (for LEDGER_ENDPOINTS__ENCRYPTION_KEYS)."""
    return Fernet.generate_key().decode("ascii")


class SecretBox:
    """Encrypts with the first key, decrypts with any."""

    def __init__(self, keys: list[SecretStr]) -> None:
        if not keys:
            raise ConfigError("no endpoint encryption key is configured", KEY_HINT)
        self._fernet = MultiFernet([Fernet(k.get_secret_value().encode("ascii")) for k in keys])

    @classmethod
    def of(cls, settings: EndpointSettings) -> SecretBox | None:
        """The box of ``settings``, or None when no key is configured."""
        return cls(settings.encryption_keys) if settings.encryption_keys else None

    def encrypt(self, secret: str) -> str:
        """``secret`` as a Fernet token under the first key."""
        return self._fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> SecretStr:
        """The secret in ``token``; ``SecretUnreadable`` if no key opens it."""
        try:
            return SecretStr(self._fernet.decrypt(token.encode("ascii")).decode("utf-8"))
        except (InvalidToken, UnicodeError, ValueError):
            raise SecretUnreadable("no configured encryption key decrypts this secret") from None

    def reencrypted(self, token: str) -> str:
        """``token`` under the first key (the same token if it already is)."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, UnicodeError, ValueError):
            raise SecretUnreadable("no configured encryption key decrypts this secret") from None
