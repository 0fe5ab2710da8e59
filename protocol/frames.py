"""Length-prefixed framing: the layer between a byte stream and whole messages.

Grammar::

    stream := frame*
    frame  := length:uint32 (big-endian) body:byte[length]

Sans-IO: ``FrameDecoder`` is handed whatever bytes the transport read, in chunks of any size,
and gives back complete frame bodies. It never touches a socket.

Theory of operation. The decoder keeps one ``bytearray`` of received-but-unconsumed bytes and
a read position into it. Extracting a frame copies its body out once and advances the read
position; the consumed prefix is deleted only when new data arrives (at most once per chunk).
That keeps both worst cases linear:

* many small frames in one chunk: each body is copied once, the prefix is dropped once;
* one large frame in many chunks: each chunk is appended (amortised O(chunk)); nothing is
  re-copied until the frame is complete, and then its body is copied out once.

A read that is exactly one whole frame while nothing is buffered (nearly every read at a low
rate: one request, one response) skips the buffer: ``whole_frame`` copies its body out of the
read once, and the size bound applies as on the buffered path (an oversize frame goes there,
and fails the decoder).

Invariants:

* The size bound is checked as soon as the 4-byte prefix is complete, before any of the body
  is waited for, so a peer cannot make the decoder hold more than ``max_frame_bytes`` plus one
  read chunk.
* ``partial_frame_size`` says, once a prefix is complete and its body is not, how many bytes
  that body will take: the broker reserves them from its request memory budget before it reads
  any more of the stream (``broker.network``).
* After a FrameTooLargeError the decoder is failed for good: the stream cannot be
  resynchronised, its buffer is released, and every later call raises the same kind of error.
"""

from __future__ import annotations

import struct

from tidelog.protocol.errors import FrameTooLargeError

MAX_FRAME_BYTES_DEFAULT = 100 * 1024 * 1024  # socket.request.max.bytes
MAX_UINT32 = 0xFFFFFFFF

_LENGTH = struct.Struct(">I")
PREFIX_SIZE = _LENGTH.size  # 4
# After a frame larger than this, its buffer is released at once (the rest, at most one read,
# is copied to a new one) instead of at the next receive_data: a large body is held once.
RELEASE_BUFFER_ABOVE = 1 << 20


def encode_frame(body: bytes | bytearray | memoryview) -> bytes:
    """The frame for ``body``: its length as 4 big-endian bytes, then the body itself.

    Raises ValueError when the body is too long for a uint32 length.
    """
    size = len(body)
    if size > MAX_UINT32:
        raise ValueError(f"frame body of {size} bytes does not fit a 4-byte length prefix")
    return _LENGTH.pack(size) + body


class FrameDecoder:
    """Reassembles frames from chunks of a byte stream; see the module docstring.

    Use ``feed(data)`` to get every frame completed by ``data``, or, when the frames decoded
    before a failure matter, ``receive_data(data)`` followed by ``next_frame()`` until it
    returns None (the h11 pattern).
    """

    __slots__ = ("max_frame_bytes", "_buf", "_pos", "_failure")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT):
        if max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be >= 0, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0  # bytes of _buf already handed out as frames
        self._failure: FrameTooLargeError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet returned as part of a frame."""
        return len(self._buf) - self._pos

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def partial_frame_size(self) -> int | None:
        """The body size a complete length prefix announces for a frame whose body has not
        fully arrived yet, or None (no prefix yet, or the next frame is complete). The I/O
        layer reserves memory for that body from it before reading any further."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < PREFIX_SIZE:
            return None
        (size,) = _LENGTH.unpack_from(buf, pos)
        return size if len(buf) - pos - PREFIX_SIZE < size else None

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data`` and return the bodies of every frame now complete, in order."""
        if (body := self.whole_frame(data)) is not None:
            return [body]
        self.receive_data(data)
        frames = []
        while (frame := self.next_frame()) is not None:
            frames.append(frame)
        return frames

    def whole_frame(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """The usual read, one whole frame and nothing before it: when nothing is buffered and
        ``data`` is exactly one frame within the bound, its body, copied out of ``data`` once
        (not through the buffer). Else None, and nothing changed: ``receive_data`` it."""
        if self._pos != len(self._buf) or self._failure is not None or len(data) < PREFIX_SIZE:
            return None
        (size,) = _LENGTH.unpack_from(data)
        if size != len(data) - PREFIX_SIZE or size > self.max_frame_bytes:
            return None
        if self._pos:  # only consumed bytes were left
            self._buf.clear()
            self._pos = 0
        return bytes(data[PREFIX_SIZE:])

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add ``data`` to the buffer (dropping the already consumed prefix first)."""
        self._raise_if_failed()
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None until more data arrives.

        Raises FrameTooLargeError as soon as a length prefix exceeds the bound.
        """
        self._raise_if_failed()
        buf, pos = self._buf, self._pos
        if len(buf) - pos < PREFIX_SIZE:
            return None
        (size,) = _LENGTH.unpack_from(buf, pos)
        if size > self.max_frame_bytes:
            raise self._fail(size)
        start = pos + PREFIX_SIZE
        if len(buf) - start < size:
            return None
        with memoryview(buf) as view:  # released before the bytearray is resized again
            body = bytes(view[start:start + size])
        self._pos = start + size
        if size > RELEASE_BUFFER_ABOVE:  # give the large buffer back now, keep what follows
            self._buf = buf[self._pos:]
            self._pos = 0
        return body

    def _fail(self, size: int) -> FrameTooLargeError:
        """Enter the failed state for good, releasing the buffer; returns the error to raise."""
        self._failure = FrameTooLargeError(size=size, limit=self.max_frame_bytes)
        self._buf = bytearray()
        self._pos = 0
        return self._failure

    def _raise_if_failed(self) -> None:
        # A fresh exception each time: re-raising one instance would grow its traceback.
        if (f := self._failure) is not None:
            raise FrameTooLargeError(str(f), size=f.size, limit=f.limit)
