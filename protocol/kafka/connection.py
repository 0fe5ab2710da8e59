"""The server end of a Kafka-protocol connection, sans-IO: ``protocol.connection``'s
``ServerConnection`` with Kafka's headers and bodies.

Framing is the same (an int32 length, then the frame), and so is everything that makes the
native server connection safe: the frame-size bound, requests in flight, responses in
request order, large frames decoded off the event loop. What differs:

* A request frame is Kafka's request header (v1, or v2 with tagged fields from the API's
  first flexible version on), then the body in Kafka's encoding of that version
  (``schema``). The request handed on is Tidelog's: its header carries the API key and
  native version 0, its body Tidelog's shape (``apis.KafkaApi.request``); the Kafka
  version is remembered with the request, and the response is encoded for it.
* A response is Kafka's response header (v0, or v1 with tagged fields for flexible
  versions, except ApiVersions, always v0) and the body.
* A request Kafka's rules cannot answer in order closes the connection (a Kafka broker does
  the same): an API key this listener does not serve, a version outside the served range
  (except ApiVersions: KIP-511's v0 answer), a header or body that does not decode. A
  string that is not UTF-8 (the client id, a topic name, a group id) decodes, with
  replacement characters, as Kafka's broker reads it; the broker refuses the name it makes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.protocol.codec import ApiKey, Message, RequestHeader
from tidelog.protocol.connection import BadRequest, Body, Request, ServerConnection
from tidelog.protocol.errors import (
    UNSUPPORTED_VERSION,
    InvalidRequestError,
    TidelogError,
    UnsupportedVersionError,
)
from tidelog.protocol.frames import PREFIX_SIZE
from tidelog.protocol.kafka.apis import (
    KAFKA_APIS,
    KafkaApi,
    answers_as_error,
    api_versions,
    error_response,
    held_request,
    to_translate,
)
from tidelog.protocol.kafka.schema import Reader, codec, flexible_versions, header_string

_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id
_RESPONSE_HEAD = struct.Struct(">ii")  # length, correlation id
_NO_TAGS = b"\x00"


# Tidelog-encoded records, and bytes (``records.translation_bytes``), a fetch answer may
# translate on the event loop (about 3 ms each); more are translated in a worker thread
# (``slow_encoder``). A compressed batch counts its stored bytes 32 times: one of ~32 KiB
# is translated aside.
TRANSLATE_ON_LOOP_RECORDS = 2_000
TRANSLATE_ON_LOOP_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class _Detached:
    """What ``_encode`` reads of a slot, copied for a worker thread."""

    correlation_id: int
    meta: Any


@dataclass(frozen=True, slots=True)
class KafkaRequest(Request):
    """A Kafka request as Tidelog's (``header.api_version`` is the native version); ``version``
    is the Kafka version the response is encoded for. ``refused``: an ApiVersions request of
    a version not served, answered with KIP-511's v0 response. ``client_throttles``: its
    client waits out a throttle_time_ms itself (KIP-219, ``KafkaApi.client_throttles``)."""

    key: int = 0  # the Kafka API key (the header has the native one serving it)
    version: int = 0
    refused: bool = False
    client_throttles: bool = False


def _flexible(spec: str, version: int) -> bool:
    low, high = flexible_versions(spec)
    return low <= version <= high


class KafkaServerConnection(ServerConnection):
    """``ServerConnection`` speaking Kafka's protocol (see the module docstring)."""

    @staticmethod
    def decode(frame: bytes) -> KafkaRequest | BadRequest:
        """A frame parsed into a request, touching no connection state (thread-safe)."""
        try:
            return _decode(frame)
        except TidelogError as e:
            return BadRequest(None, e)
        except RecursionError:
            return BadRequest(None, InvalidRequestError("the request nests too deeply"))

    def _meta(self, event: Request | BadRequest) -> Any:
        if isinstance(event, KafkaRequest):
            # the records of a Produce are not kept until its answer: only what an error names
            return event.key, event.version, event.refused, held_request(event.key, event.body)
        return None

    def slow_encoder(self, correlation_id: int, body: Body | Message) -> Callable[[], bytes] | None:
        """A fetch answer with more than ``TRANSLATE_ON_LOOP_RECORDS`` records, or
        ``TRANSLATE_ON_LOOP_BYTES`` bytes, of Tidelog-encoded batches to translate is encoded
        off the event loop."""
        slot = self._unanswered(correlation_id)
        if slot.meta is None or slot.meta[0] != ApiKey.FETCH:
            return None
        count, cost = to_translate(body)
        if count <= TRANSLATE_ON_LOOP_RECORDS and cost <= TRANSLATE_ON_LOOP_BYTES:
            return None
        detached = _Detached(correlation_id, slot.meta)
        return functools.partial(self._encode, detached, body)

    def _encode(self, slot: Any, body: Body | Message) -> bytes:
        key, version, refused, request = slot.meta
        api: KafkaApi = KAFKA_APIS[key]
        if refused:
            version = 0
            kafka_body: Body = {"error_code": UNSUPPORTED_VERSION.code, "api_keys": api_versions()}
        else:
            native = body.to_body() if isinstance(body, Message) else dict(body)
            kafka_body = (error_response(key, request, native) if answers_as_error(key, version, native)
                          else api.response(native, version))
        out = bytearray(_RESPONSE_HEAD.size)
        if key != ApiKey.API_VERSIONS and _flexible(api.response_spec, version):
            out += _NO_TAGS
        codec(api.response_spec, version).encode(kafka_body, out)
        _RESPONSE_HEAD.pack_into(out, 0, len(out) - PREFIX_SIZE, slot.correlation_id)
        return bytes(out)


def _decode(frame: bytes) -> KafkaRequest:
    if len(frame) < _HEAD.size:
        raise InvalidRequestError(f"a {len(frame)}-byte frame is shorter than a request header")
    key, version, correlation_id = _HEAD.unpack_from(frame, 0)
    r = Reader(frame, _HEAD.size)
    api = KAFKA_APIS.get(key)
    if api is None:
        name = ApiKey(key).name if key in ApiKey._value2member_map_ else "unknown"
        raise UnsupportedVersionError(f"api key {key} ({name}) is not served on a Kafka listener")
    client_id = _client_id(r)
    header = RequestHeader(api.native_key, 0, correlation_id, client_id)
    if not api.min_version <= version <= api.max_version:
        if key == ApiKey.API_VERSIONS:
            return KafkaRequest(header, {}, key=key, version=0, refused=True)
        raise UnsupportedVersionError(f"{api.key.name} version {version} is not served: this listener speaks "
                                      f"versions {api.min_version} to {api.max_version}")
    if _flexible(api.request_spec, version):
        _skip_tags(r)
    # bytes after the body are ignored, as Kafka's brokers do: librdkafka's Metadata v12 of
    # every topic carries three
    body = codec(api.request_spec, version).decode(r)
    return KafkaRequest(header, api.request(body, version), key=key, version=version,
                        client_throttles=api.client_throttles(version))


_client_id = header_string("client id")


def _skip_tags(r: Reader) -> None:
    for _ in range(r.count(r.uvarint("header tagged fields"), "header tagged fields")):
        r.uvarint("header tag")
        r.take(r.uvarint("header tag size"), "header tagged field")
