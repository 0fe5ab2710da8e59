"""The context-manager lifecycle shared by AsyncProducer, AsyncConsumer and AsyncAdmin.

``async with client:`` starts the client's ``run`` in a nursery of its own and closes it on
exit. The body's exception is not handed to that internal nursery, so it propagates as
itself rather than wrapped in an ExceptionGroup.
"""

from __future__ import annotations

import contextlib
from typing import Any

import sniffio
import trio


def require_trio(what: str) -> None:
    """Raise a RuntimeError naming the right import unless this runs under Trio (under
    asyncio, Trio's calls fail with an AttributeError that does not say why)."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library == "trio":
        return
    hint = (f"under asyncio use `from tidelog.asyncio import {what}`" if library == "asyncio"
            else "use `tidelog.asyncio` under asyncio, or `tidelog` (blocking) without an event loop")
    raise RuntimeError(f"tidelog.aio.{what} runs under Trio, but this is {library or 'no async event loop'}: {hint}")


class RunsInOwnNursery:
    """Mixin: the subclass provides ``async run(*, task_status)`` and ``async close()``."""

    _exit_stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self):
        require_trio(type(self).__name__)
        self._exit_stack = contextlib.AsyncExitStack()
        nursery = await self._exit_stack.enter_async_context(trio.open_nursery())
        try:
            await nursery.start(self.run)
        except BaseException:
            await self._exit_stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self.close()
        finally:
            await self._exit_stack.aclose()
