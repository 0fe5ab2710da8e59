"""The exceptions the client raises, and the one place where a broker's error code becomes one.

Hierarchy (every exception the SDK raises on purpose is a ``TidelogError``, so it carries
``error`` (the registry's ErrorCode), ``code``, ``retriable`` and ``invalid_metadata``)::

    protocol.errors.TidelogError
     |- what a broker's error code turns into: protocol.errors.error_for(code)
     |    (OffsetOutOfRangeError, CorruptRecordError, RecordTooLargeError, ... or a plain
     |     TidelogError whose .error names the code, e.g. NOT_LEADER_OR_FOLLOWER)
     '- TidelogClientError                     failures seen only by the client
          |- RequestTimedOut (also TimeoutError)   a deadline passed (request, delivery, max_block)
          |- BrokerConnectionError                 connect/read/write failed; retriable
          |    '- NoBrokersAvailable               no bootstrap or known broker answered
          |- AuthenticationFailedError             the broker refused who we are; not retried
          |    |- SaslAuthenticationError          a wrong user or password, an unknown mechanism
          |    '- SslAuthenticationError           a TLS handshake failed (untrusted certificate...)
          |- ClientClosedError                     the producer/consumer/admin is closed
          |    '- CallbackNotRunError              a listener or commit callback could not run
          |- NoOffsetForPartitionError             auto_offset_reset="none" and no position
          |- RecordDeserializationError            a key or value deserializer raised
          '- CommitFailedError                     the group rebalanced: the commit was not applied
               '- RebalanceInProgressError         a rebalance is under way: poll, then commit again

``broker_error`` is the client's single code-to-exception boundary: everything that reads an
``error_code`` from a response and decides to raise goes through it, so the message always
names where the error came from (topic, partition, node) and what the code means.
"""

from __future__ import annotations

from typing import Any

from tidelog.protocol.errors import (
    BROKER_NOT_AVAILABLE,
    ILLEGAL_GENERATION,
    NETWORK_EXCEPTION,
    NONE,
    OFFSET_OUT_OF_RANGE,
    REBALANCE_IN_PROGRESS,
    REQUEST_TIMED_OUT,
    SASL_AUTHENTICATION_FAILED,
    SSL_HANDSHAKE_FAILED,
    UNKNOWN_SERVER_ERROR,
    CorruptRecordError,
    ErrorCode,
    InvalidRequestError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TidelogError,
    error_for,
    for_code,
    is_error_body,
)

__all__ = [
    "TidelogError", "TidelogClientError", "RequestTimedOut", "BrokerConnectionError",
    "NoBrokersAvailable", "AuthenticationFailedError", "SaslAuthenticationError", "SslAuthenticationError",
    "ClientClosedError", "CallbackNotRunError", "NoOffsetForPartitionError", "CommitFailedError",
    "RebalanceInProgressError", "RecordDeserializationError",
    "OffsetOutOfRangeError", "CorruptRecordError", "RecordTooLargeError", "broker_error",
]


class TidelogClientError(TidelogError):
    """Base of the errors that originate in the client rather than in a broker's reply."""

    error: ErrorCode = UNKNOWN_SERVER_ERROR


class RequestTimedOut(TidelogClientError, TimeoutError):
    """A deadline passed: a request's, a record's delivery timeout, or a call's max block."""

    error = REQUEST_TIMED_OUT


class BrokerConnectionError(TidelogClientError):
    """The connection to a broker could not be opened or broke; requests on it may be retried
    after a metadata refresh (NETWORK_EXCEPTION is retriable and invalidates metadata)."""

    error = NETWORK_EXCEPTION


class NoBrokersAvailable(BrokerConnectionError):
    """Neither the bootstrap servers nor any broker known from metadata could be reached."""

    error = BROKER_NOT_AVAILABLE


class AuthenticationFailedError(TidelogClientError):
    """The broker did not accept the client's identity. Not retriable: the same credentials
    or certificates would fail again, so the call fails now instead of timing out."""

    error = SASL_AUTHENTICATION_FAILED


class SaslAuthenticationError(AuthenticationFailedError):
    """SASL failed: a wrong username or password, or a mechanism the listener does not enable."""


class SslAuthenticationError(AuthenticationFailedError):
    """The TLS handshake failed: the broker's certificate is not trusted or does not name the
    host, or the broker refused the client's certificate."""


def decode_response(response_type: type, body: Any) -> Any:
    """``response_type.from_body(body)``; a body that is a whole-request error (what a broker
    answers a request it refused outright: only ``error_code`` and ``error_message``, and the
    ``throttle_time_ms`` a quota adds to any answer) raises that error instead of a schema
    mismatch."""
    try:
        return response_type.from_body(body)
    except InvalidRequestError:
        if is_error_body(body) and body["error_code"]:
            code, message = body["error_code"], body.get("error_message")
            if code == SASL_AUTHENTICATION_FAILED.code:
                raise SaslAuthenticationError(message) from None
            if code == SSL_HANDSHAKE_FAILED.code:
                raise SslAuthenticationError(message) from None
            raise error_for(code, message) from None
        raise


class ClientClosedError(TidelogClientError):
    """The client object was closed (or is closing) before the operation could complete."""


class CallbackNotRunError(ClientClosedError):
    """A rebalance listener method or commit callback handed to the application's thread or
    event loop was not run there, or was interrupted before it returned: the consumer call
    that was to run it (poll, commit, unsubscribe, close) had ended (interrupted, timed out,
    its event loop closed). A missed ``on_partitions_assigned`` is run by the next poll, as
    Kafka's consumer does; other callbacks are reported by it."""


class WakeupError(TidelogClientError):
    """``Consumer.wakeup()`` was called: the poll that was waiting (or the next one) stops
    with this error instead of returning records (Kafka's WakeupException). The consumer is
    still usable; the usual reaction is to leave the poll loop and ``close`` it."""


class NoOffsetForPartitionError(TidelogClientError):
    """A partition has no position and ``auto_offset_reset`` is "none" (seek first)."""

    error = OFFSET_OUT_OF_RANGE


class RecordDeserializationError(TidelogClientError):
    """The consumer's ``key_deserializer`` or ``value_deserializer`` raised for the record at
    ``offset`` of ``topic_partition`` (Kafka's RecordDeserializationException; the cause is
    chained). The partition's position stays at that record: ``seek`` past it to skip it."""

    def __init__(self, message: str, topic_partition: Any, offset: int):
        super().__init__(message)
        self.topic_partition = topic_partition
        self.offset = offset


class CommitFailedError(TidelogClientError):
    """An offset commit the coordinator refused because this member's generation is over:
    the group rebalanced and its partitions may belong to other members now. Not retriable:
    the message says why and what to change (``error`` is the broker's code when it sent one)."""

    error = ILLEGAL_GENERATION


class RebalanceInProgressError(CommitFailedError):
    """A commit was attempted while the group is rebalancing: call ``poll`` to complete the
    rebalance, then commit again (or commit in ``on_partitions_revoked``)."""

    error = REBALANCE_IN_PROGRESS


def broker_error(code: int, where: str, message: str | None = None) -> TidelogError:
    """The exception for an error code a broker returned, naming where it applies
    (``"topic 'orders' partition 3"``, ``"node 2"``) and the code's meaning."""
    err = for_code(code)
    if err is NONE:
        raise ValueError("broker_error called for a success code")
    detail = message or err.message
    name = err.name if err.code == code else f"error code {code}"
    return error_for(code, f"{where}: {name}: {detail}")
