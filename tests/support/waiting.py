"""Bounded polling for tests that watch real processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from tidelog import TidelogError

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, message: str = "condition",
               interval: float = 0.05) -> T:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (AssertionError naming ``message`` and the last value or error). Connection and
    client errors while polling count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except (OSError, TidelogError) as e:
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message}: not reached within {timeout:g} s (last: {last!r})")
        time.sleep(interval)


class NotYet(str):
    """A falsy condition result that says why (``wait_until`` reports the last one)."""

    def __bool__(self) -> bool:
        return False
