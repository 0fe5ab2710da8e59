"""An in-memory stand-in for the KazooClient calls ZkClient makes, for its unit tests.

It keeps znodes in a dict (data and a stat with czxid, mzxid and version), answers at once,
and runs kazoo's watch recipes (ChildrenWatch, DataWatch) unchanged over it. A children
watch set by ``get_children`` fires once, on the next change of the children while
connected, as ZooKeeper's do. ``disconnect`` drops the connection: the watches set so far
are lost (kazoo sends no SetWatches on a reconnect; the recipes read again instead), and
changes made meanwhile fire nothing. ``reconnect`` tells the listeners CONNECTED again.
The real client's behaviour is covered by the integration tests against ZooKeeper."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent


@dataclass
class Stat:
    czxid: int
    mzxid: int
    version: int = 0
    ephemeralOwner: int = 0


class _Result:
    def __init__(self, fn: Callable[[], Any]):
        try:
            self._value, self._error = fn(), None
        except Exception as e:
            self._value, self._error = None, e

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _Handler:
    sleep_func = staticmethod(lambda s: None)

    @staticmethod
    def lock_object() -> threading.RLock:
        return threading.RLock()

    @staticmethod
    def spawn(fn: Callable, *args: Any, **kwargs: Any) -> None:
        fn(*args, **kwargs)


class StubKazoo:
    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, Stat]] = {"/": (b"", Stat(0, 0))}
        self.handler = _Handler()
        self.client_id = (1, b"")
        self.connected = True
        self._zxid = 0
        self._listeners: list[Callable[[str], Any]] = []
        self._child_watches: dict[str, list[Callable[[WatchedEvent], Any]]] = {}

    # -- the session

    def add_listener(self, listener: Callable[[str], Any]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], Any]) -> None:
        self._listeners.remove(listener)

    def retry(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def disconnect(self, state: str = KazooState.SUSPENDED) -> None:
        self.connected = False
        self._child_watches.clear()
        for listener in list(self._listeners):
            listener(state)

    def reconnect(self) -> None:
        self.connected = True
        for listener in list(self._listeners):
            listener(KazooState.CONNECTED)

    # -- znodes

    def exists(self, path: str, watch: Any = None) -> Stat | None:
        got = self.nodes.get(path)
        return None if got is None else got[1]

    def create(self, path: str, value: bytes = b"", acl: Any = None, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.nodes:
            raise NoNodeError(parent)
        if sequence:
            path += f"{sum(1 for p in self.nodes if p.startswith(path)):010d}"
        if path in self.nodes:
            raise NodeExistsError(path)
        self._zxid += 1
        self.nodes[path] = (value, Stat(self._zxid, self._zxid))
        self._children_changed(parent)
        return path

    def delete(self, path: str, version: int = -1) -> None:
        if path not in self.nodes:
            raise NoNodeError(path)
        del self.nodes[path]
        self._children_changed(path.rsplit("/", 1)[0] or "/")

    def delete_async(self, path: str) -> _Result:
        return _Result(lambda: self.delete(path))

    def get(self, path: str, watch: Any = None) -> tuple[bytes, Stat]:
        if path not in self.nodes:
            raise NoNodeError(path)
        return self.nodes[path]

    def get_async(self, path: str) -> _Result:
        return _Result(lambda: self.get(path))

    def get_children(self, path: str, watch: Callable[[WatchedEvent], Any] | None = None) -> list[str]:
        if path not in self.nodes:
            raise NoNodeError(path)
        if watch is not None:
            self._child_watches.setdefault(path, []).append(watch)
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix):])

    def _children_changed(self, path: str) -> None:
        if not self.connected:
            return
        for watch in self._child_watches.pop(path, []):
            watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, path))

    def stop(self) -> None:
        self.connected = False

    def close(self) -> None:
        pass
