"""Responses completed later by a callback rather than by a task (Kafka's delayed operations).

A request handler may return a ``DeferredResponse`` instead of a body or an awaitable: the
network layer then ``attach``-es the function that answers the request, and whoever
completes the operation calls it, synchronously, in the scheduler pass that made the
answer possible (the append that satisfies a consumer's long poll answers it right there,
instead of waking a task that answers one pass later). ``cancel`` is called when the
connection closes first; a completion after that is ignored.

An awaitable handler result may itself resolve to a deferred response (a produce validated
in a worker thread, appended, then waiting for replication): the handler's part is done
then, and the network layer waits for the answer holding neither the request nor its frame's
share of the request memory budget; the wrappers (metrics, quotas) wrap it as they wrap a
deferred result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

__all__ = ["CLOSE_CONNECTION", "DeferredResponse", "Throttled", "is_awaitable", "is_deferred"]


class DeferredResponse(Protocol):
    """What an operation answered later provides; see the module docstring. A protocol, not a
    base class, so the layers that produce them (the replica manager's DelayedFetch) import
    nothing of the network layer."""

    def attach(self, complete: Callable[[Any], None]) -> None:
        """Start waiting; ``complete(body)`` answers the request (exactly once)."""
        ...

    def cancel(self) -> None:
        """The request will not be answered (its connection closed): stop waiting."""
        ...


def is_deferred(result: Any) -> bool:
    """True for a handler result that is a deferred response (it has ``attach``). Cheaper than
    an isinstance check against the protocol, on the path of every response."""
    return getattr(type(result), "attach", None) is not None


def is_awaitable(result: Any) -> bool:
    """``inspect.isawaitable`` for a handler's result (a coroutine, or an object with
    ``__await__``) without the abstract base class's check, on the path of every response.
    A generator-based coroutine (``types.coroutine``) is not one: no handler returns one."""
    return getattr(type(result), "__await__", None) is not None


class _CloseConnection:
    __slots__ = ()

    def __repr__(self) -> str:
        return "CLOSE_CONNECTION"


# A handler's answer that is no response but the end of its connection, once the responses
# before it are written: a produce with acks=0 that failed (Kafka's rule: the client, which
# reads no response, learns of the error by the connection's end and refreshes its metadata,
# instead of sending to a former leader until its metadata ages out)
CLOSE_CONNECTION = _CloseConnection()


class Throttled(NamedTuple):
    """A handler's answer (a response, None or ``CLOSE_CONNECTION``) to send at once, after
    which its connection starts no request for ``throttle_ms``: Kafka's muted channel for a
    client that waits out the throttle_time_ms of the response itself (KIP-219)."""

    response: Any
    throttle_ms: int
