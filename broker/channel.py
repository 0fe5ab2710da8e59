"""Request channels between brokers (controller to broker, follower to leader).

A channel is one connection to one broker (over the inter-broker listener's TLS and SASL,
``tidelog.security.open_stream``), used one request at a time: a request is
written, then its response read, under one lock. Followers have at most one fetch in flight
per leader and the controller sends its requests to each broker in order, so nothing is lost
by not pipelining, and a timed-out or broken exchange simply closes the connection (the next
request reconnects). Failures surface as ``BrokerUnreachable``.
"""

from __future__ import annotations

import logging

import trio

from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import NETWORK_EXCEPTION, TidelogError
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT
from tidelog.security import SecurityConfig, open_stream

logger = logging.getLogger("tidelog.channel")


class BrokerUnreachable(TidelogError):
    error = NETWORK_EXCEPTION


class BrokerChannel:
    def __init__(self, broker_id: int, host: str, port: int, *, client_id: str,
                 connect_timeout_s: float = 5.0, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT,
                 security: SecurityConfig | None = None):
        self.broker_id = broker_id
        self.security = security
        self.host, self.port = host, port
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._stream: trio.abc.Stream | None = None
        self._conn: ClientConnection | None = None
        self._lock = trio.Lock()

    def retarget(self, host: str, port: int) -> None:
        if (host, port) != (self.host, self.port):
            self.host, self.port = host, port
            self._drop()

    async def request(self, api_key: ApiKey, message: Message, timeout_s: float) -> Message:
        """Send ``message`` and return the typed response; BrokerUnreachable on any failure."""
        async with self._lock:
            try:
                with trio.fail_after(timeout_s):
                    return await self._exchange(api_key, message)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                    TidelogError) as e:
                self._drop()
                raise BrokerUnreachable(
                    f"request {api_key.name} to broker {self.broker_id} at {self.host}:{self.port} failed: "
                    f"{type(e).__name__}: {e}") from None

    async def _exchange(self, api_key: ApiKey, message: Message) -> Message:
        if self._stream is None:
            await self._connect()
        _, frame = self._conn.send_request(api_key, 0, message.to_body())
        await self._stream.send_all(frame)
        while True:
            data = await self._stream.receive_some(1 << 16)
            if not data:
                raise BrokerUnreachable("connection closed by the peer")
            for _, body in self._conn.receive_data(data):
                return response_type(api_key).from_body(body)

    async def _connect(self) -> None:
        self._conn = ClientConnection(self.max_frame_bytes, self.client_id)
        self._stream = await open_stream(self.host, self.port, self.security, self._conn,
                                         connect_timeout_s=self.connect_timeout_s,
                                         describe=f"broker {self.broker_id} at {self.host}:{self.port}")

    def _drop(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            sock = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket
            try:
                sock.close()
            except OSError:
                pass
        self._conn = None

    async def aclose(self) -> None:
        self._drop()
