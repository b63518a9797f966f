"""The kafka settings part -> how a Kafka client connects: TLS, SASL, what a refusal means.

Every Kafka client of the ledger (publisher, worker and its outcome producer, continuity
guard, projector, replay, dashboard, topic creation, the broker probe) takes its security
options from here, so no client can be left on PLAINTEXT by accident.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaProducer
from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.helpers import create_ssl_context

from config.parts import KafkaSettings
from events.errors import LedgerError

NO_BROKER_HINT = "start one with 'ledger broker start'"
# How long a refused connection may take to explain itself (the diagnosis connects once).
DIAGNOSE_TIMEOUT_S = 10.0
# What the broker's ACLs answer to a principal without the right.
NOT_AUTHORIZED = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


def uses_tls(settings: KafkaSettings) -> bool:
    """True when the connection to the brokers is encrypted."""
    return settings.security_protocol in ("SSL", "SASL_SSL")


def tls_context(settings: KafkaSettings) -> ssl.SSLContext:
    """The client TLS context: the configured CA (or the system's), an optional client
    certificate; host names are always checked."""
    password = settings.ssl_key_password
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None,
            certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
            keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
            password=password.get_secret_value() if password is not None else None,
        )
    except (ssl.SSLError, OSError) as exc:
        which = (
            "LEDGER_KAFKA__SSL_CAFILE"
            if settings.ssl_certfile is None
            else "LEDGER_KAFKA__SSL_CERTFILE"
        )
        raise LedgerError(
            f"the TLS files cannot be loaded ({which}): {getattr(exc, 'reason', None) or exc}",
            "give PEM files: the CA certificate, and a certificate with its key",
        ) from None
    return context


def client_options(settings: KafkaSettings) -> dict[str, Any]:
    """aiokafka keyword arguments (producer, consumer, admin, client) for the brokers."""
    options: dict[str, Any] = {"security_protocol": settings.security_protocol}
    if uses_tls(settings):
        options["ssl_context"] = tls_context(settings)
    if settings.security_protocol.startswith("SASL_"):
        password = settings.sasl_password
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = password.get_secret_value() if password else None
    return options


def faust_credentials(settings: KafkaSettings) -> Any:
    """faust's ``broker_credentials`` for the same connection (None: PLAINTEXT)."""
    import faust  # the worker's dependency; the other clients need no faust

    protocol = settings.security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = tls_context(settings) if uses_tls(settings) else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    password = settings.sasl_password
    credentials = faust.SASLCredentials(
        username=settings.sasl_username,
        password=password.get_secret_value() if password else None,
        ssl_context=context,
        mechanism=settings.sasl_mechanism,
    )
    return credentials


async def connect_error(settings: KafkaSettings) -> LedgerError:
    """Why a client could not reach the brokers, in one line with a hint.

    aiokafka reports every failure as "Unable to bootstrap"; one more connection to the
    first bootstrap server, bounded in time, tells a broker that is down from one that
    refused our TLS or credentials. Never contains a secret.
    """
    where = settings.bootstrap_servers
    host, _, port = where.split(",")[0].strip().rpartition(":")
    try:
        conn = await asyncio.wait_for(
            create_conn(
                host or "127.0.0.1",
                int(port),
                request_timeout_ms=int(DIAGNOSE_TIMEOUT_S * 1000),
                **client_options(settings),
            ),
            DIAGNOSE_TIMEOUT_S,
        )
    except ssl.SSLCertVerificationError as exc:
        return LedgerError(
            f"the TLS certificate of the Kafka broker at {where} is not trusted: "
            f"{exc.verify_message}",
            "set LEDGER_KAFKA__SSL_CAFILE to the CA certificate that signed it",
        )
    except ssl.SSLError as exc:
        return LedgerError(
            f"TLS with the Kafka broker at {where} failed: {exc.reason or exc}",
            "check that LEDGER_KAFKA__SECURITY_PROTOCOL matches the listener (SSL, SASL_SSL)",
        )
    except (SaslAuthenticationFailed, AuthenticationFailedError):
        return LedgerError(
            f"the Kafka broker at {where} refused the credentials of SASL user "
            f"'{settings.sasl_username}' ({settings.sasl_mechanism})",
            "check LEDGER_KAFKA__SASL_USERNAME, LEDGER_KAFKA__SASL_PASSWORD and "
            "LEDGER_KAFKA__SASL_MECHANISM",
        )
    except UnsupportedSaslMechanismError:
        return LedgerError(
            f"the Kafka broker at {where} does not accept SASL mechanism {settings.sasl_mechanism}",
            "set LEDGER_KAFKA__SASL_MECHANISM to one the listener enables",
        )
    except ConnectionRefusedError:
        return LedgerError(f"no Kafka broker answers at {where}", NO_BROKER_HINT)
    except (KafkaError, OSError, TimeoutError, ValueError):
        return _closed_on_us(settings)
    conn.close()
    return _closed_on_us(settings)


def ensure_reachable(settings: KafkaSettings, topics: tuple[str, ...] = ()) -> dict[str, int]:
    """Connect once (bounded): a ``LedgerError`` saying why if the brokers refuse us.
    Returns the partition count of each of ``topics`` that exists.

    For processes that would otherwise fail inside a framework's start-up (the faust
    worker) with a traceback.
    """
    return asyncio.run(_ensure_reachable(settings, topics))


async def _ensure_reachable(settings: KafkaSettings, topics: tuple[str, ...]) -> dict[str, int]:
    client = AIOKafkaClient(
        bootstrap_servers=settings.bootstrap_servers,
        request_timeout_ms=int(DIAGNOSE_TIMEOUT_S * 1000),
        **client_options(settings),
    )
    quiet = logging.getLogger("aiokafka")  # every refused try is logged: we say it once
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    counts: dict[str, int] = {}
    try:
        await asyncio.wait_for(client.bootstrap(), DIAGNOSE_TIMEOUT_S)
        if topics:
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), DIAGNOSE_TIMEOUT_S)
            for topic in topics:
                if partitions := cluster.partitions_for_topic(topic):
                    counts[topic] = len(partitions)
    except (KafkaError, OSError, TimeoutError):
        raise await connect_error(settings) from None
    finally:
        quiet.setLevel(level)
        await client.close()
    return counts


async def start_producer(producer: AIOKafkaProducer, settings: KafkaSettings) -> None:
    """Start ``producer``; on failure stop it (or aiokafka warns of an unclosed producer)
    and raise one clear line: no broker answers, or the ACLs refuse this principal."""
    try:
        await producer.start()
    except KafkaConnectionError:
        await producer.stop()
        raise await connect_error(settings) from None
    except NOT_AUTHORIZED as exc:
        await producer.stop()
        raise not_allowed(settings, exc) from None
    except BaseException:
        await producer.stop()
        raise


def not_allowed(settings: KafkaSettings, exc: Exception) -> LedgerError:
    """An ACL refusal (one of ``NOT_AUTHORIZED``) in one line, naming the principal."""
    who = settings.sasl_username or "ANONYMOUS"
    return LedgerError(
        f"Kafka does not allow user '{who}' this: {exc}",
        "an administrator grants it with ACLs (README, Security: the ACLs per role)",
    )


def _closed_on_us(settings: KafkaSettings) -> LedgerError:
    where = settings.bootstrap_servers
    if settings.security_protocol == "PLAINTEXT":
        return LedgerError(
            f"no Kafka broker answers at {where} over PLAINTEXT",
            f"{NO_BROKER_HINT}; a broker that requires TLS or SASL needs "
            "LEDGER_KAFKA__SECURITY_PROTOCOL (and LEDGER_KAFKA__SASL_USERNAME/PASSWORD)",
        )
    return LedgerError(
        f"the Kafka broker at {where} closed the connection ({settings.security_protocol})",
        "check LEDGER_KAFKA__SECURITY_PROTOCOL against the listener, and the broker's log",
    )


async def append_one(settings: KafkaSettings, topic: str, value: bytes, key: bytes) -> None:
    """Write one record (acks=all, idempotent) with a producer of its own, and return once
    the broker has it: for rare writes (an endpoint or API key event, a breaker
    transition), not a hot path."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        **client_options(settings),
    )
    await start_producer(producer, settings)
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()
