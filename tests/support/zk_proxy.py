"""A TCP proxy in front of ZooKeeper that a test cuts and restores: the one way to make
ZooKeeper unreachable, and a session expire, while the server keeps running. Served by the
test's own Trio loop (which also proves the ZooKeeper client never blocks that loop)."""

from __future__ import annotations

import trio


class TcpProxy:
    """A loopback TCP proxy to ZooKeeper that can be cut (connections dropped, new ones
    refused) and restored."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port: int | None = None
        self._cut = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    def cut(self) -> None:
        self._cut = True
        for scope in list(self._scopes):
            scope.cancel()

    def restore(self) -> None:
        self._cut = False

    async def _handle(self, downstream):
        async with downstream:
            if self._cut:
                return
            try:
                upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                self._scopes.add(nursery.cancel_scope)
                nursery.start_soon(self._pump, downstream, upstream, nursery.cancel_scope)
                nursery.start_soon(self._pump, upstream, downstream, nursery.cancel_scope)
            self._scopes.discard(nursery.cancel_scope)

    @staticmethod
    async def _pump(source, sink, scope):
        try:
            async for chunk in source:
                await sink.send_all(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            scope.cancel()
