"""Per-connection protocol state for both ends, sans-IO in the manner of h11.

Bytes in, events out; messages in, bytes out. The I/O layers (the broker's network module,
the client's connection) only move bytes between a socket and these objects, so everything
that can go wrong on the wire is decided here, in pure code, and unit tested without sockets.

Client side (``ClientConnection``)

* Correlation ids start at 0, increase by one per request and wrap within non-negative int32.
* Responses come back in request order (docs/architecture.md, section 3), so the client
  keeps a FIFO of the ids awaiting a response. Every response must carry the id at the head
  of that FIFO; anything else means the pairing of requests and responses can no longer be
  trusted.
* A request sent with ``expect_response=False`` (an acks=0 produce) never enters the FIFO.
* Any protocol error (bad frame, bad envelope, unexpected id) fails the connection for good:
  the call raises, and every later call raises the same kind of error. The owner closes the
  socket and fails whatever was in flight.

Server side (``ServerConnection``)

* Each frame becomes a ``Request``, or a ``BadRequest`` when its envelope does not parse.
* A BadRequest that carries a correlation id is answered like any request (with an
  INVALID_REQUEST error body) and the connection carries on: the framing is intact. One
  without a correlation id (unreadable envelope, or a frame over the size bound) cannot be
  answered in order, so the server must close the connection (``BadRequest.must_close``).
* ``in_flight`` counts requests received whose response bytes have not yet been handed out
  for writing. Handlers may finish in any order: ``send_response`` parks a response that is
  not the oldest one and returns the bytes that may be written now, so the bytes on the wire
  are always in request order. A request that gets no response (acks=0) must be completed
  with ``skip_response``, or it would hold back every response after it.
* A frame larger than ``decode_inline_max_bytes`` is not decoded here: ``receive_data`` ends
  its list with it, undecoded (``LargeFrame``), and keeps the frames after it buffered. The I/O
  layer decodes it with ``decode`` (pure: no state touched, safe in a worker thread), hands
  the result to ``admit`` (which gives it its place in the response order), and then asks
  for the requests behind it with ``receive_data(b"")``. So requests are still admitted, and
  handed to handlers, strictly in the order they were sent.
* ``partial_frame_size`` is the body size announced by the length prefix of a frame that is
  still arriving (None when there is none): what the I/O layer reserves before reading on.
* ``max_frame_bytes`` may be changed between reads: a connection that must authenticate
  first starts with a small bound (a SASL message is a few hundred bytes) and gets the
  listener's bound once authenticated. The new bound applies to frames whose length prefix
  has not been read yet.
* ``can_read`` is false while ``in_flight >= max_in_flight`` (or after a fatal error): the
  I/O layer stops reading until responses go out. The bound is checked between reads, so one
  read may exceed it by the requests that chunk held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidelog.protocol.codec import (
    Message,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidelog.protocol.errors import FrameTooLargeError, InvalidRequestError, TidelogError
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT, FrameDecoder, encode_frame

MAX_CORRELATION_ID = 0x7FFFFFFF
MAX_IN_FLIGHT_DEFAULT = 16

Body = dict[str, Any]


class ClientConnection:
    """The client end of one connection: numbers requests, pairs responses with them."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT, client_id: str | None = None,
                 *, first_correlation_id: int = 0):
        if not 0 <= first_correlation_id <= MAX_CORRELATION_ID:
            raise ValueError(f"first_correlation_id must be in [0, {MAX_CORRELATION_ID}], "
                             f"got {first_correlation_id}")
        self.client_id = client_id
        self._decoder = FrameDecoder(max_frame_bytes)
        self._next_correlation_id = first_correlation_id
        self._awaiting: deque[int] = deque()  # ids awaiting a response, oldest first
        self._failure: InvalidRequestError | None = None

    @property
    def in_flight(self) -> int:
        """Requests sent that still await their response."""
        return len(self._awaiting)

    def send_request(self, api_key: int, api_version: int, body: Body | Message,
                     expect_response: bool = True) -> tuple[int, bytes]:
        """Frame a request; returns its correlation id and the bytes to write."""
        self._raise_if_failed()
        correlation_id = self._next_correlation_id
        header = RequestHeader(api_key, api_version, correlation_id, self.client_id)
        frame = encode_frame(encode_request(header, body))
        self._next_correlation_id = (correlation_id + 1) & MAX_CORRELATION_ID
        if expect_response:
            self._awaiting.append(correlation_id)
        return correlation_id, frame

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[tuple[int, Body]]:
        """Every response completed by ``data``, as ``(correlation_id, body)`` in order.

        Raises InvalidRequestError (failing the connection) on any protocol violation.
        """
        self._raise_if_failed()
        try:
            return [self._accept(frame) for frame in self._decoder.feed(data)]
        except InvalidRequestError as e:
            self._failure = e
            raise

    def _accept(self, frame: bytes) -> tuple[int, Body]:
        correlation_id, body = decode_response(frame)
        if not self._awaiting:
            raise InvalidRequestError(
                f"response correlation id {correlation_id} arrived with no request in flight")
        if correlation_id != self._awaiting[0]:
            raise InvalidRequestError(
                f"response correlation id {correlation_id} does not match "
                f"the oldest in-flight request {self._awaiting[0]}")
        self._awaiting.popleft()
        return correlation_id, body

    def _raise_if_failed(self) -> None:
        if (f := self._failure) is not None:
            raise type(f)(f"connection already failed: {f}")


@dataclass(frozen=True, slots=True)
class Request:
    """A request whose envelope parsed. ``check_supported`` and ``from_body`` come next."""

    header: RequestHeader
    body: Body


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A frame that is not a valid request. ``error`` says why (an InvalidRequestError)."""

    correlation_id: int | None
    error: TidelogError

    @property
    def must_close(self) -> bool:
        """True when the request cannot be answered in order, so the connection must close."""
        return self.correlation_id is None


@dataclass(frozen=True, slots=True)
class LargeFrame:
    """A complete frame too large to decode inline: ``ServerConnection.decode`` it (in a
    worker thread, say), then ``admit`` the result."""

    data: bytes


@dataclass(slots=True)
class _Slot:
    """One request awaiting its response; ``frame`` is set once the response is ready."""

    correlation_id: int
    frame: bytes | None = None
    meta: Any = None  # what a subclass needs to encode the response (the Kafka listener's version)


class ServerConnection:
    """The server end of one connection: parses requests, keeps responses in request order."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT,
                 max_in_flight: int = MAX_IN_FLIGHT_DEFAULT,
                 decode_inline_max_bytes: int | None = None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.decode_inline_max_bytes = decode_inline_max_bytes  # None: decode every frame inline
        self._decoder = FrameDecoder(max_frame_bytes)
        self._slots: deque[_Slot] = deque()  # in request order

    @property
    def in_flight(self) -> int:
        """Requests received whose response bytes have not been handed out yet."""
        return len(self._slots)

    @property
    def failed(self) -> bool:
        """True after a frame over the size bound: the stream cannot be read any further."""
        return self._decoder.failed

    @property
    def max_frame_bytes(self) -> int:
        return self._decoder.max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._decoder.max_frame_bytes = value

    @property
    def can_read(self) -> bool:
        return self.in_flight < self.max_in_flight and not self.failed

    @property
    def partial_frame_size(self) -> int | None:
        """The announced body size of the frame still arriving, or None."""
        return None if self.failed else self._decoder.partial_frame_size

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Request | BadRequest | LargeFrame]:
        """Every request completed by ``data``, in order, up to and including the first
        ``LargeFrame`` (the frames after it wait for the next call). Never raises for bad
        input: an oversize frame ends the list with a fatal BadRequest (and every later call)."""
        events: list[Request | BadRequest | LargeFrame] = []
        inline_max = self.decode_inline_max_bytes
        decoder = self._decoder
        if (frame := decoder.whole_frame(data)) is not None and (inline_max is None or len(frame) <= inline_max):
            return [self._parse(frame)]  # the usual read: one whole frame, nothing buffered
        try:
            if frame is None:  # not the usual read: buffer it
                decoder.receive_data(data)
                frame = decoder.next_frame()
            while frame is not None:
                if inline_max is not None and len(frame) > inline_max:
                    events.append(LargeFrame(frame))
                    break
                events.append(self._parse(frame))
                frame = decoder.next_frame()
        except FrameTooLargeError as e:
            events.append(BadRequest(None, e))
        return events

    @staticmethod
    def decode(frame: bytes) -> Request | BadRequest:
        """A frame parsed into a request, touching no connection state (thread-safe)."""
        try:
            header, body = decode_request(frame)
        except InvalidRequestError as e:
            return BadRequest(e.correlation_id, e)
        return Request(header, body)

    def admit(self, event: Request | BadRequest) -> Request | BadRequest:
        """Give a ``decode``d request its place in the response order; returns it."""
        correlation_id = event.header.correlation_id if isinstance(event, Request) else event.correlation_id
        if correlation_id is not None:
            self._slots.append(_Slot(correlation_id, None, self._meta(event)))
        return event

    def _meta(self, event: Request | BadRequest) -> Any:
        """What ``_encode`` will need of this request (nothing, for the native protocol)."""
        return None

    def _encode(self, slot: _Slot, body: Body | Message) -> bytes:
        """The response frame for ``slot``'s request."""
        return encode_frame(encode_response(slot.correlation_id, body))

    def send_response(self, correlation_id: int, body: Body | Message) -> bytes:
        """Answer the oldest unanswered request with this id; returns the bytes to write now:
        this response and any parked behind it, or b"" while an older request is unanswered."""
        slot = self._unanswered(correlation_id)
        slot.frame = self._encode(slot, body)
        return self._release()

    def slow_encoder(self, correlation_id: int, body: Body | Message) -> Callable[[], bytes] | None:
        """For a response too costly to encode on the event loop (a Kafka fetch of records to
        translate): a function that encodes it, touching no connection state (run it in a
        worker thread), whose result goes to ``send_frame``. None: ``send_response`` it."""
        return None

    def send_frame(self, correlation_id: int, frame: bytes) -> bytes:
        """Answer with a frame a ``slow_encoder`` made; returns the bytes to write now."""
        self._unanswered(correlation_id).frame = frame
        return self._release()

    def skip_response(self, correlation_id: int) -> bytes:
        """Complete a request that gets no response (acks=0); returns the bytes to write now."""
        self._unanswered(correlation_id).frame = b""
        return self._release()

    def _parse(self, frame: bytes) -> Request | BadRequest:
        return self.admit(self.decode(frame))

    def _unanswered(self, correlation_id: int) -> _Slot:
        for slot in self._slots:  # at most max_in_flight (+ one read's worth) entries
            if slot.correlation_id == correlation_id and slot.frame is None:
                return slot
        raise ValueError(f"no request with correlation id {correlation_id} is awaiting a response")

    def _release(self) -> bytes:
        ready = []
        while self._slots and self._slots[0].frame is not None:
            ready.append(self._slots.popleft().frame)
        return b"".join(ready)
