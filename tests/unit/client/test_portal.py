"""The portal: a Trio loop on a background thread and bounded calls into it."""

from __future__ import annotations

import pytest
import trio

from tidelog._portal import Portal
from tidelog.errors import ClientClosedError, RequestTimedOut


@pytest.fixture
def portal():
    p = Portal("test-portal")
    yield p
    p.stop()


def test_call_returns_results_and_raises_errors(portal):
    async def add(a, b):
        await trio.sleep(0)
        return a + b

    async def fail():
        raise ValueError("nope")

    assert portal.call(add, 2, 3, timeout=5) == 5
    with pytest.raises(ValueError, match="nope"):
        portal.call(fail, timeout=5)


def test_a_call_past_its_timeout_is_cancelled_and_reported(portal):
    cancelled = []

    async def slow():
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            cancelled.append(True)
            raise

    with pytest.raises(RequestTimedOut, match="slow"):
        portal.call(slow, timeout=0.05)
    assert cancelled == [True]


def test_run_sync_runs_on_the_loop_thread(portal):
    assert portal.run_sync(lambda: portal.in_portal_thread) is True
    assert not portal.in_portal_thread


def test_blocking_calls_from_the_loop_thread_are_refused(portal):
    async def reenter():
        return portal.call(trio.sleep, 0, timeout=1)

    with pytest.raises(RuntimeError, match="own event loop thread"):
        portal.call(reenter, timeout=5)


def test_services_run_until_stop_and_calls_after_stop_are_refused(portal):
    started = []

    async def service(*, task_status=trio.TASK_STATUS_IGNORED):
        started.append(True)
        task_status.started()
        await trio.sleep_forever()

    portal.start(service)
    assert started == [True]
    portal.stop()
    assert not portal.running
    with pytest.raises(ClientClosedError):
        portal.call(trio.sleep, 0, timeout=1)


def test_finish_soon_runs_its_call_then_ends_the_loop_without_waiting(portal):
    ran = []

    async def last():
        await trio.sleep(0)
        ran.append(portal.in_portal_thread)
        await trio.sleep(0.01)

    with pytest.raises(RuntimeError, match="own thread"):
        portal.finish_soon(last)
    portal.run_sync(portal.finish_soon, last)  # returns at once: the call runs after
    portal._thread.join(10)  # the loop ends by itself once the call is done
    assert ran == [True] and not portal.running
