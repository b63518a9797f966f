"""Where a new installation's outcome keys live: two files under the data directory.

``ledger init`` (and the demo) writes an Ed25519 pair into ``DATA_DIR/keys`` once: the
directory is 0700, both files 0600, and an existing pair is never overwritten. Workers
sign with the stored signing key and every folding reader checks with the stored verify
key, unless ``LEDGER_SIGNING__SIGNING_KEY`` / ``LEDGER_SIGNING__VERIFY_KEYS`` say otherwise
(several hosts share keys through those variables or a shared data directory).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from clients.outcome_signing import (
    OutcomeSigner,
    OutcomeVerifier,
    new_pair,
    outcome_signer,
    outcome_verifier,
    private_key,
    public_text,
)
from config.settings import Settings
from events.errors import ConfigError

KEY_DIR = "keys"
SIGNING_FILE = "outcome-signing.key"
VERIFY_FILE = "outcome-verify.key"
OPERATOR_SIGNING_FILE = "operator-signing.key"
OPERATOR_VERIFY_FILE = "operator-verify.key"


@dataclass(frozen=True)
class StoredKeys:
    """The key files of one data directory."""

    directory: Path

    @classmethod
    def of(cls, data_dir: Path) -> StoredKeys:
        """The key files under ``data_dir``."""
        return cls(data_dir / KEY_DIR)

    @property
    def signing_path(self) -> Path:
        """The workers' secret signing key (base64)."""
        return self.directory / SIGNING_FILE

    @property
    def verify_path(self) -> Path:
        """Its public verify key (base64)."""
        return self.directory / VERIFY_FILE

    @property
    def operator_signing_path(self) -> Path:
        """The operators' secret signing key (base64)."""
        return self.directory / OPERATOR_SIGNING_FILE

    @property
    def operator_verify_path(self) -> Path:
        """Its public verify key (base64)."""
        return self.directory / OPERATOR_VERIFY_FILE

    def operator_key(self) -> str | None:
        """The stored operator signing key, if there is one."""
        return _read(self.operator_signing_path)

    def operator_verify_key(self) -> str | None:
        """The stored operator verify key, if there is one."""
        return _read(self.operator_verify_path)

    def signing_key(self) -> str | None:
        """The stored signing key, if there is one."""
        return _read(self.signing_path)

    def verify_key(self) -> str | None:
        """The stored verify key, if there is one."""
        return _read(self.verify_path)

    def create(self) -> bool:
        """Write the outcome pair and the operator pair, each unless it is stored; True
        when it wrote either."""
        wrote = False
        for signing_path, verify_path in (
            (self.signing_path, self.verify_path),
            (self.operator_signing_path, self.operator_verify_path),
        ):
            if signing_path.exists():
                continue
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            signing, verify = new_pair()
            _write_private(verify_path, verify)
            _write_private(signing_path, signing)  # last: its presence means "done"
            wrote = True
        return wrote


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    return text or None


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only, from its first byte."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as out:
        out.write(text + "\n")
    os.chmod(path, 0o600)


def signing_key_text(settings: Settings) -> str | None:
    """The workers' signing key: the variable's, else the data directory's (None when
    signing is off or no key is found)."""
    if not settings.signing.outcomes:
        return None
    if settings.signing.signing_key is not None:
        return settings.signing.signing_key.get_secret_value()
    return StoredKeys.of(settings.data_dir).signing_key()


def verify_key_texts(settings: Settings) -> list[str]:
    """Every public key a reader accepts outcome signatures from (empty when off)."""
    if not settings.signing.outcomes:
        return []
    stored = StoredKeys.of(settings.data_dir).verify_key()
    return [*settings.signing.verify_keys, *([stored] if stored else [])]


def operator_key_text(settings: Settings) -> str | None:
    """The operators' signing key: the variable's, else the data directory's (None when
    signing is off or no key is found)."""
    if not settings.signing.outcomes:
        return None
    if settings.signing.operator_key is not None:
        return settings.signing.operator_key.get_secret_value()
    return StoredKeys.of(settings.data_dir).operator_key()


def operator_verify_texts(settings: Settings) -> list[str]:
    """Every public key a reader accepts operator signatures from."""
    if not settings.signing.outcomes:
        return []
    stored = StoredKeys.of(settings.data_dir).operator_verify_key()
    own = operator_key_text(settings)
    texts = [*settings.signing.operator_verify_keys, *([stored] if stored else [])]
    if own is not None:
        texts.append(public_text(private_key(own)))
    return texts


def operator_signer_for(settings: Settings) -> OutcomeSigner | None:
    """The signer of operator events (None when signing is off); ``ConfigError`` when
    signing is on and there is no operator key here."""
    if not settings.signing.outcomes:
        return None
    text = operator_key_text(settings)
    if text is None:
        raise ConfigError(
            "acting as an operator needs the operator signing key, and there is none here",
            f"run 'ledger init' (writes it into {settings.data_dir / KEY_DIR}), or set "
            "LEDGER_SIGNING__OPERATOR_KEY",
        )
    return outcome_signer(text)


def signer_for(settings: Settings) -> OutcomeSigner | None:
    """The worker's outcome signer (None when signing is off)."""
    return outcome_signer(signing_key_text(settings))


def verifier_for(settings: Settings) -> OutcomeVerifier | None:
    """The outcome check of a folding reader (None when outcome signing is off)."""
    return outcome_verifier(
        verify_key_texts(settings), signing_key_text(settings), operator_verify_texts(settings)
    )


def require_outcome_keys(settings: Settings, *, signs: bool) -> None:
    """Refuse to start a worker (``signs``) or a folding reader without the keys outcome
    signing needs; with signing turned off, warn at every start."""
    if not settings.signing.outcomes:
        logging.getLogger("ledger").warning(
            "outcome signing is OFF (LEDGER_SIGNING__OUTCOMES=false): anyone who may write "
            "%s can forge a delivery's outcome",
            settings.kafka.topic_deliveries,
        )
        return
    hint = (
        f"run 'ledger init' (writes a key pair into {settings.data_dir / KEY_DIR}), or set "
        "LEDGER_SIGNING__SIGNING_KEY / LEDGER_SIGNING__VERIFY_KEYS (ledger outcome-keys), or "
        "turn signing off on purpose with LEDGER_SIGNING__OUTCOMES=false"
    )
    if signs and signing_key_text(settings) is None:
        raise ConfigError("outcome signing is on but this worker has no signing key", hint)
    if not signs and not verify_key_texts(settings) and signing_key_text(settings) is None:
        raise ConfigError("outcome signing is on but this reader has no verify key", hint)
