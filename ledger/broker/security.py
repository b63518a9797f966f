"""The local broker's SASL_SSL listener: a generated CA and broker certificate, SASL users
(PLAIN and SCRAM), and the KRaft ACL authorizer.

Made once under the broker's root and kept: clients keep trusting the same CA file, and
the users keep their passwords, across stop/start. The plaintext and controller listeners
stay as they are (the principal there is ``User:ANONYMOUS``, a super user, so the local
tools and tests that use them see no change); only the SASL_SSL listener is authenticated
and subject to ACLs.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

# The users the local broker knows: one per role of ledger/acls.py, and an administrator.
USERS = ("admin", "agent", "worker", "projector", "operator", "reader")
SUPER_USERS = ("User:ANONYMOUS", "User:admin")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@dataclass(frozen=True)
class BrokerSecurity:
    """The files of the SASL_SSL listener under ``root``."""

    root: Path

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (LEDGER_KAFKA__SSL_CAFILE)."""
        return self.root / "ca.pem"

    @property
    def keystore(self) -> Path:
        """The broker's private key (PKCS#8) and certificate chain, PEM."""
        return self.root / "broker-keystore.pem"

    @property
    def users_file(self) -> Path:
        """The SASL users and their passwords, JSON, readable by the owner only."""
        return self.root / "users.json"

    def ensure(self, host: str) -> dict[str, str]:
        """Create the CA, the broker certificate and the users if missing; the users."""
        self.ensure_tls(host)
        if not self.users_file.exists():
            users = {name: secrets.token_urlsafe(24) for name in USERS}
            _write_private(self.users_file, json.dumps(users, indent=2).encode())
        return self.users()

    def ensure_tls(self, host: str) -> None:
        """Create the CA and a broker certificate for ``host`` (and 127.0.0.1, localhost)
        if missing (docker-compose.yml runs this alone: its users come from the env)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if self.ca_file.exists() and self.keystore.exists():
            return
        ca = trustme.CA(organization_name="delivery-ledger local broker")
        leaf = ca.issue_cert(*dict.fromkeys([host, "127.0.0.1", "localhost"]))
        key = load_pem_private_key(leaf.private_key_pem.bytes(), None)
        pkcs8 = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        _write_private(self.keystore, pkcs8 + chain)
        self.ca_file.write_bytes(ca.cert_pem.bytes())

    def users(self) -> dict[str, str]:
        """The SASL users and their passwords."""
        loaded: dict[str, str] = json.loads(self.users_file.read_text())
        return loaded

    def scram_format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create every user for both SCRAM
        mechanisms (SCRAM credentials live in the KRaft metadata, written at format)."""
        args: list[str] = []
        for name, password in self.users().items():
            for mechanism in MECHANISMS[1:]:
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return args


def listener_properties(security: BrokerSecurity) -> dict[str, str]:
    """The server.properties entries of the SASL_SSL listener and the authorizer (the
    listener itself is added to ``listeners`` by the caller)."""
    users = security.users()
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return {
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        ),
        "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(security.keystore),
        "ssl.client.auth": "none",
        "authorizer.class.name": AUTHORIZER,
        "super.users": ";".join(SUPER_USERS),
        "allow.everyone.if.no.acl.found": "false",
    }


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
