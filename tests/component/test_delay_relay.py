"""The fault matrix's delay relay (tests/system/delayrelay.py) on loopback: bytes arrive
whole and in order with or without a delay, an end of stream is passed on, and a delay lowered
while chunks are held does not let later bytes overtake earlier ones."""

from __future__ import annotations

import socket
import threading

from tests.system.delayrelay import DelayLine, DelayRelay, RelayGroup


def test_due_times_keep_the_order_when_the_delay_drops() -> None:
    line = DelayLine()
    assert line.due(10.0, 0.5) == 10.5
    assert line.due(10.1, 0.0) == 10.5   # read later with no delay: still after the first chunk
    assert line.due(11.0, 0.0) == 11.0


class _Sink:
    """A one-connection server that keeps what it receives until the end of stream, then
    answers with the byte count (so the test sees the other direction work too)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.received = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while chunk := conn.recv(65536):
                self.received += chunk
            conn.sendall(b"%d" % len(self.received))


def _send_through(relay: DelayRelay, parts: list[bytes], delays_ms: list[float]) -> bytes:
    with socket.create_connection(relay.address, timeout=30) as conn:
        for part, delay_ms in zip(parts, delays_ms, strict=True):
            relay.set_delay(delay_ms)
            conn.sendall(part)
        conn.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := conn.recv(100):
            answer += chunk
    return answer


def test_relay_passes_bytes_in_order_through_changing_delays() -> None:
    sink = _Sink()
    relay = DelayRelay("a->b", "127.0.0.1", *sink.server.getsockname()[:2])
    group = RelayGroup([relay])
    group.start()
    try:
        parts = [bytes([i]) * (1000 + 7919 * i) for i in range(12)]
        delays_ms = [0, 0, 200, 200, 50, 0, 300, 0, 0, 100, 0, 0]
        answer = _send_through(relay, parts, delays_ms)
        sink.thread.join(30)
    finally:
        group.close()
        sink.server.close()
    expected = b"".join(parts)
    assert sink.received == expected
    assert answer == b"%d" % len(expected)
    assert relay.connections == 1
    assert relay.bytes_relayed == len(expected) + len(answer)
    assert group.error is None
