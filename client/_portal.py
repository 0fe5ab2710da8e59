"""The blocking facade's bridge: one Trio event loop in a background thread per client object.

Each blocking ``Producer``, ``Consumer`` and ``Admin`` owns one ``Portal``: a daemon thread
running ``trio.run``, whose root nursery runs the client's ``run`` task (cluster, sender,
fetcher). One thread per client object (rather than one per process) keeps lifetimes simple:
``close()`` stops exactly that client's loop and thread, and one client's slow callback
cannot stall another's I/O. It costs a thread and an event loop per client object.

Calls from the application's threads go through ``call`` (an async function) or
``run_sync`` (a sync function that must run on the Trio thread). Each call:

* runs in its own cancel scope in the portal's nursery, with a deadline when ``timeout`` is
  given (then RequestTimedOut);
* is awaited by the caller on a ``concurrent.futures.Future`` with a bounded wait, so the
  caller never blocks forever, even if the loop is wedged;
* is cancelled if the caller is interrupted (KeyboardInterrupt from Ctrl-C in the main
  thread, or any other exception while waiting), and the interruption is re-raised.

The producer's hot path does not come here: it appends to the accumulator from the caller's
thread (see tidelog.aio.accumulator).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from tidelog.errors import ClientClosedError, RequestTimedOut
from tidelog.records import ConsumerRecords

__all__ = ["Handoff", "Portal"]

T = TypeVar("T")

GRACE_S = 5.0  # how much longer than a call's own timeout the caller waits for the loop
START_TIMEOUT_S = 10.0


class _Call:
    __slots__ = ("future", "scope", "interrupted")

    def __init__(self) -> None:
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.scope: trio.CancelScope | None = None
        self.interrupted = False

    def cancel(self) -> None:  # on the Trio thread
        self.interrupted = True
        if self.scope is not None:
            self.scope.cancel()


class Portal:
    """A Trio loop in a daemon thread, and a way to call into it. ``stop`` ends it."""

    def __init__(self, name: str = "tidelog-client"):
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop_event: trio.Event | None = None
        self._crash: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self._token is None:
            raise RuntimeError(f"the client's event loop did not start: {self._crash!r}")

    def _main(self) -> None:
        try:
            trio.run(self._root)
        except BaseException as e:  # reported to whoever calls next
            self._crash = e
        finally:
            self._ready.set()

    async def _root(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop_event = trio.Event()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._ready.set()
            await self._stop_event.wait()
            nursery.cancel_scope.cancel()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def in_portal_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # -- calls ----------------------------------------------------------------------------------

    def call(self, afn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None) -> T:
        """Run ``await afn(*args)`` on the loop and return its result (or raise its error).
        ``timeout`` seconds bound the call (RequestTimedOut); None leaves it to ``afn``."""
        call = self.submit(afn, *args, timeout=timeout)
        return self._wait(call, None if timeout is None else timeout + GRACE_S)

    def submit(self, afn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None) -> _Call:
        """Start ``await afn(*args)`` on the loop; ``call.future`` completes with its outcome.
        The caller waits for it itself (and cancels with ``cancel`` if interrupted)."""
        call = _Call()

        async def runner() -> None:
            try:
                with trio.CancelScope() as scope:
                    call.scope = scope
                    if timeout is not None:
                        scope.deadline = trio.current_time() + timeout
                    if call.interrupted:
                        scope.cancel()
                    result = await afn(*args)
                    call.future.set_result(result)
                    return
                if call.interrupted:
                    call.future.set_exception(ClientClosedError("the call was interrupted"))
                else:
                    call.future.set_exception(RequestTimedOut(
                        f"{getattr(afn, '__name__', 'call')} did not complete within {timeout:g} s"))
            except BaseException as e:
                if not call.future.done():
                    call.future.set_exception(
                        ClientClosedError("the client was closed during the call")
                        if isinstance(e, trio.Cancelled) else e)
                if isinstance(e, trio.Cancelled):
                    raise

        self._submit(lambda: self._nursery.start_soon(runner))
        return call

    def run_sync(self, fn: Callable[..., T], *args: Any, timeout: float = 30.0) -> T:
        """Run ``fn(*args)`` on the loop's thread (for code that touches Trio objects)."""
        call = _Call()

        def runner() -> None:
            try:
                call.future.set_result(fn(*args))
            except BaseException as e:
                call.future.set_exception(e)

        self._submit(runner)
        return self._wait(call, timeout)

    def _submit(self, fn: Callable[[], None]) -> None:
        if self.in_portal_thread:
            raise RuntimeError("blocking client calls cannot be made from the client's own "
                               "event loop thread (e.g. inside a send callback)")
        if self._token is None or not self._thread.is_alive():
            raise ClientClosedError(f"the client is closed{self._crash_note()}")
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            self._thread.join(START_TIMEOUT_S)  # the loop just ended: let its thread record why
            raise ClientClosedError(f"the client is closed{self._crash_note()}") from None

    def _wait(self, call: _Call, timeout: float | None) -> Any:
        try:
            return call.future.result(timeout)
        except BaseException as e:
            if call.future.done():
                if isinstance(e, concurrent.futures.CancelledError):
                    raise ClientClosedError("the call was cancelled") from None
                raise  # the call's own outcome
            self._cancel(call)  # interrupted (KeyboardInterrupt) or the loop did not answer
            if isinstance(e, TimeoutError):
                raise RequestTimedOut(
                    f"the client's event loop did not answer within {timeout:g} s") from None
            raise

    def call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop's thread without waiting; ClientClosedError if
        the loop is not running (``run_soon`` ignores that)."""
        self._submit(lambda: fn(*args))

    def run_soon(self, fn: Callable[..., None], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop's thread without waiting (from any thread)."""
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass

    def cancel(self, call: _Call) -> None:
        self._cancel(call)

    def _cancel(self, call: _Call) -> None:
        try:
            self._token.run_sync_soon(call.cancel)
        except trio.RunFinishedError:
            pass

    def _crash_note(self) -> str:
        return f" (its event loop crashed: {self._crash!r})" if self._crash else ""

    # -- services -------------------------------------------------------------------------------

    def start(self, run: Callable[..., Awaitable[Any]], *, timeout: float = START_TIMEOUT_S) -> None:
        """Start a ``run(*, task_status)`` service in the loop's root nursery."""

        async def starter() -> None:
            await self._nursery.start(run)

        self.call(starter, timeout=timeout)

    def finish_soon(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """From the loop's own thread (a callback, which must not wait): run ``await
        afn(*args)`` and then end the loop, as ``stop`` would; ``stop`` from another thread
        then joins its thread."""
        if not self.in_portal_thread:
            raise RuntimeError("finish_soon is for the loop's own thread; other threads stop()")

        async def finisher() -> None:
            try:
                await afn(*args)
            finally:
                self._stop_event.set()

        try:
            self._nursery.start_soon(finisher)
        except RuntimeError:  # the loop is ending already
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel everything on the loop and join its thread (idempotent)."""
        if self.in_portal_thread:
            raise RuntimeError("a client cannot be closed from its own event loop thread")
        if self._thread.is_alive() and self._stop_event is not None:
            try:
                self._token.run_sync_soon(self._stop_event.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(timeout)


class Handoff:
    """One poll's outcome on its way from the Trio thread to the caller waiting for it (an
    application thread in the blocking facade, a task in the asyncio one), which may leave
    (interrupted, cancelled, timed out) at any moment. Exactly one side ends up owning it:
    the caller, if it was still waiting when the Trio thread offered it; otherwise the
    consumer again (``_reclaim``: records back among the unreturned ones, an error for the
    next poll), at once, on the thread that finds the other side gone: the Trio thread when
    it offers to a caller that left, the caller's when it leaves after the offer. Either way
    this happens before the application's next call (a seek, a commit, the next poll) reaches
    the Trio thread, so none of them runs as if those records had never been taken."""

    __slots__ = ("_lock", "_state", "_outcome", "_consumer", "_unclaimed")

    WAITING, OFFERED, TAKEN, LEFT = range(4)

    def __init__(self, consumer: Any, unclaimed: deque[BaseException]):
        """``consumer``: the Trio core's AsyncConsumer; ``unclaimed``: the facade's errors
        for its next polls to raise first."""
        self._lock = threading.Lock()
        self._state = self.WAITING
        self._outcome: Any = None
        self._consumer = consumer
        self._unclaimed = unclaimed

    async def poll(self, timeout_ms: int, limit: int) -> None:
        """On the Trio thread: the consumer's poll (a group's), its outcome offered here."""
        try:
            outcome = await self._consumer.poll(timeout_ms, limit)
        except Exception as e:  # what poll raises, for its caller
            outcome = e
        self.offer(outcome)

    def records(self) -> ConsumerRecords:
        """On the caller's thread, woken after the offer: the records, or the error raised."""
        outcome = self.take()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome if type(outcome) is ConsumerRecords else ConsumerRecords(outcome)

    def _reclaim(self, outcome: Any) -> None:
        """An outcome its caller left before taking, on the thread that found it so: an error
        for the next poll to raise (a partition's back in the consumer, which drops it once
        the partition is no longer assigned or was sought; any other in ``unclaimed``);
        records back among the unreturned ones, for the next poll to return first, not
        consumed until then."""
        if isinstance(outcome, BaseException):
            if not self._consumer.reclaim_error(outcome):
                self._unclaimed.append(outcome)
        else:
            self._consumer.put_back(outcome)

    def offer(self, outcome: Any) -> bool:
        """On the Trio thread: True if the caller is still waiting (wake it to ``take``)."""
        with self._lock:
            if self._state == self.WAITING:
                self._state, self._outcome = self.OFFERED, outcome
                return True
        self._reclaim(outcome)
        return False

    def take(self) -> Any:
        """On the caller's thread, woken after the offer: the outcome."""
        with self._lock:
            self._state = self.TAKEN
            outcome, self._outcome = self._outcome, None
            return outcome

    def leave(self) -> None:
        """On the caller's thread: it stops waiting; an outcome offered is reclaimed."""
        with self._lock:
            state, self._state = self._state, self.LEFT
            outcome, self._outcome = self._outcome, None
        if state == self.OFFERED:
            self._reclaim(outcome)
