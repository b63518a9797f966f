"""The words outcomes are recorded in: error classes and lookup outcomes.

They go into events (``error_class``, ``DeliveryReconciled.outcome``), so they belong to
the vocabulary, not to the channel adapters that produce them.
"""

from __future__ import annotations

import enum


class ErrorClass(enum.StrEnum):
    """Stable names for why an attempt did not confirm; they go into events."""

    CONNECT_REFUSED = "connect_refused"
    DNS_FAILURE = "dns_failure"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT_AFTER_WRITE = "timeout_after_write"
    RESET_AFTER_WRITE = "reset_after_write"
    HTTP_4XX = "http_4xx"
    HTTP_408 = "http_408"
    HTTP_409 = "http_409"
    HTTP_425 = "http_425"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    LEASE_EXPIRED = "lease_expired"
    PROTOCOL_ERROR = "protocol_error"
    CONNECT_FAILED = "connect_failed"  # no connection for another reason (unreachable, TLS)
    POOL_TIMEOUT = "pool_timeout"  # no free pooled connection in time; nothing was written
    INVALID_RECIPIENT = "invalid_recipient"  # the URL cannot be requested at all
    HTTP_3XX = "http_3xx"  # a redirect: we never follow one with a signed POST
    PROVIDER_FAILED = "provider_failed"  # the provider reports the message failed/undelivered
    # The provider refused the request in its answer, naming why (Slack's ok:false with
    # channel_not_found, invalid_auth, ...): nothing was posted, and a retry would not help.
    PROVIDER_REJECTED = "provider_rejected"
    # The sender refused to write the first byte (the lease rule): nothing left.
    FENCED = "fenced"
    # The hard total deadline struck before the first byte was written: nothing left.
    DEADLINE_BEFORE_WRITE = "deadline_before_write"
    # Polling a SENT delivery gave up before the provider said delivered or failed.
    SENT_UNCONFIRMED = "sent_unconfirmed"
    # The recipient resolves to an address deliveries may not reach (SSRF guard): final.
    BLOCKED_ADDRESS = "blocked_address"
    # A well-formed request the worker will not send (events/admission.py): a payload over
    # the limit, credentials in the recipient. Written by a raw producer; never retried.
    REFUSED_REQUEST = "refused_request"
    # An SMTP server's 4xx before the message was handed over (connect, EHLO, AUTH, MAIL,
    # RCPT, DATA): it took nothing, try later. After the message it is a doubt, not a no.
    SMTP_4XX = "smtp_4xx"
    # An SMTP server's 5xx: the message is refused for good (unknown user, policy, size).
    SMTP_5XX = "smtp_5xx"
    # A browser step before the submit failed (a selector missing, the start page did not
    # load): nothing was submitted.
    PAGE_STEP_FAILED = "page_step_failed"
    # Before the submit the browser target showed its declared login page (a redirect, an
    # expired session): nothing was submitted.
    LOGIN_PAGE = "login_page"
    # After the submit the target showed an error page, or a page without its confirmation:
    # it may have accepted the submission.
    ERROR_PAGE = "error_page"
    # An operator gave the delivery up (``ledger resolve --abandon``): final.
    ABANDONED_BY_OPERATOR = "abandoned_by_operator"
    # The receiver's handler for the key died mid-processing and it may not be re-run
    # (the receiver kit answers lookups ``stuck``): an operator must settle it.
    RECEIVER_STUCK = "receiver_stuck"
    # A channel's result without a class of its own (a channel should always give one).
    UNCLASSIFIED = "unclassified"


# 429/408/425: the receiver says it did not process the request (RFC 6585, 9110, 8470),
# so a retry is safe. The one place this set is written.
NOT_PROCESSED = frozenset({ErrorClass.HTTP_408, ErrorClass.HTTP_425, ErrorClass.HTTP_429})


class LookupOutcome(enum.StrEnum):
    """What a lookup by idempotency key said (``DeliveryReconciled.outcome``)."""

    # The receiver has it (``delivered`` in the result says whether it arrived).
    FOUND = "found"
    # Received, still being processed: not yet known, look again later.
    PROCESSING = "processing"
    # No request with this key was accepted (evidence only when repeated).
    NOT_FOUND = "not_found"
    # The provider has it and reports it failed/undelivered: it will not arrive.
    FAILED = "failed"
    # The endpoint has no lookup.
    UNSUPPORTED = "unsupported"
    # The lookup itself failed.
    LOOKUP_ERROR = "lookup_error"
    # The receiver's handler for the key died mid-processing and may not be re-run: only
    # an operator can settle it (receiver kit, ``stuck``).
    STUCK = "stuck"


# "Not found" is evidence only when repeated, spaced apart (ARCHITECTURE.md, protocol 6).
NOT_FOUND_REQUIRED = 2
