"""A blocking socket speaking the framed protocol through ``protocol.connection``, or raw
bytes (the hostile-input tests). For one request on a connection of its own, use
``tidelog.broker.health.request``."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from tidelog.protocol.connection import ClientConnection


class RawClient:
    """A blocking socket speaking the framed protocol through ``protocol.connection``, or raw
    bytes. Reads are bounded by ``timeout``."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = ClientConnection(client_id="hostile-test")
        self.timeout = timeout
        self._buffered: list[tuple[int, dict]] = []

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, api_key: int, body: Any, api_version: int = 0) -> dict:
        """Send one request and return its response body."""
        correlation_id, frame = self.conn.send_request(api_key, api_version, body)
        self.sock.sendall(frame)
        cid, response = self.receive()
        assert cid == correlation_id
        return response

    def receive(self) -> tuple[int, dict]:
        deadline = time.monotonic() + self.timeout
        while not self._buffered:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self._buffered.extend(self.conn.receive_data(data))
        return self._buffered.pop(0)

    def send_raw(self, data: bytes) -> bool:
        """Send bytes; False when the broker had already closed the connection."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def read_raw_until_closed(self) -> tuple[list[bytes], bool]:
        """Read frames (raw bodies) until the broker closes or ``timeout`` passes; returns the
        frames and whether the connection was closed."""
        return self.read_raw_until(lambda frames: False)

    def read_raw_until(self, done: Callable[[list[bytes]], bool]) -> tuple[list[bytes], bool]:
        """Read frames (raw bodies) until ``done(frames)``, the broker closes, or ``timeout``
        passes; returns the frames and whether the connection was closed."""
        deadline = time.monotonic() + self.timeout
        buf = b""
        while time.monotonic() < deadline:
            frames = split_frames(buf)
            if done(frames):
                return frames, False
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except ConnectionResetError:
                return split_frames(buf), True
            if not data:
                return split_frames(buf), True
            buf += data
        return split_frames(buf), False


def split_frames(buf: bytes) -> list[bytes]:
    frames, pos = [], 0
    while len(buf) - pos >= 4:
        (n,) = struct.unpack_from(">I", buf, pos)
        if len(buf) - pos - 4 < n:
            break
        frames.append(buf[pos + 4:pos + 4 + n])
        pos += 4 + n
    return frames
