"""The blocking Consumer's bridge for group callbacks (no cluster needed): listener and
commit callbacks handed over by the Trio core run on the thread that made the call, their
results and exceptions travel back, and the call's own timeout does not count their time."""

from __future__ import annotations

import threading
import time

import pytest

from tidelog import ClientClosedError, Consumer, RequestTimedOut, TopicPartition
from tidelog.errors import CallbackNotRunError

NOWHERE = "127.0.0.1:9"  # nothing is contacted: no request is made in these tests


def test_callbacks_run_on_the_calling_thread_and_return_their_result():
    with Consumer(NOWHERE, group_id="g") as consumer:
        async def work():
            first = await consumer._aio.invoke_callback(lambda x: (threading.current_thread().name, x), 5)
            second = await consumer._aio.invoke_callback(lambda: "again")
            return first, second

        assert consumer._serve(work, timeout=5) == ((threading.current_thread().name, 5), "again")


def test_a_callback_exception_reaches_the_trio_side_and_the_caller():
    with Consumer(NOWHERE, group_id="g") as consumer:
        def boom():
            raise ValueError("listener failed")

        async def work():
            try:
                await consumer._aio.invoke_callback(boom)
            except ValueError as e:
                return f"seen on the loop: {e}"

        assert consumer._serve(work, timeout=5) == "seen on the loop: listener failed"


def test_time_spent_in_callbacks_does_not_count_against_the_timeout():
    with Consumer(NOWHERE, group_id="g") as consumer:
        async def work():
            await consumer._aio.invoke_callback(time.sleep, 0.6)
            return "done"

        assert consumer._serve(work, timeout=0.3) == "done"


def test_a_call_that_does_not_finish_times_out():
    import trio

    with Consumer(NOWHERE, group_id="g") as consumer:
        async def hang():
            await trio.sleep_forever()

        with pytest.raises(RequestTimedOut):
            consumer._serve(hang, timeout=0.2)


def test_a_callback_handed_over_as_the_call_times_out_still_runs_on_the_caller():
    """The race between the deadline and a hand-over: a listener callback the loop hands over
    after the caller stopped waiting (but before it left) runs before the timeout is raised;
    left in the inbox, the loop would wait for it forever (its wait is shielded)."""
    import trio

    consumer = Consumer(NOWHERE, group_id="g")
    go, ran = threading.Event(), []

    async def work():
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(go.wait)
            return await consumer._aio.invoke_callback(lambda: ran.append(threading.current_thread().name) or 1)

    real_cancel = consumer._portal.cancel

    def cancel_after_the_hand_over(call):
        go.set()  # the loop now hands the callback over, after the caller's wait ended
        inbox = consumer._inboxes[-1]
        while inbox.items.empty():
            time.sleep(0.01)
        real_cancel(call)

    consumer._portal.cancel = cancel_after_the_hand_over
    try:
        with pytest.raises(RequestTimedOut):
            consumer._serve(work, timeout=0.05)
        assert ran == [threading.current_thread().name]
        consumer._portal.cancel = real_cancel

        async def after():
            return "served"
        assert consumer._serve(after, timeout=5) == "served"
    finally:
        consumer._portal.cancel = real_cancel
        consumer.close(1)


def test_group_calls_need_a_group_and_validate():
    with Consumer(NOWHERE) as consumer:
        with pytest.raises(ValueError, match="needs a consumer group"):
            consumer.subscribe(["t"])
    with Consumer(NOWHERE, group_id="g") as consumer:
        with pytest.raises(ValueError, match="exactly one"):
            consumer.subscribe(["t"], pattern="t.*")
        consumer.subscribe("t")
        assert consumer.subscription() == {"t"}
        with pytest.raises(ValueError, match="mutually exclusive"):
            consumer.assign([("t", 0)])


def hold_commits(consumer):
    """The consumer's commits, without a coordinator: one of partition 0 is answered after a
    moment, any other never."""
    import trio

    async def commit(offsets, deadline, metadata=None):
        if TopicPartition("t", 0) in offsets:
            await trio.sleep(0.2)
        else:
            await trio.sleep_forever()

    consumer._aio._coordinator.offsets.commit = commit


def test_close_waits_for_async_commits_and_runs_their_callbacks_on_the_closing_thread():
    """As Kafka's close: commits in flight are waited for, within the close's timeout, and
    their callbacks run (on the thread that closes); one still in flight at the timeout
    fails with ClientClosedError rather than being dropped."""
    consumer = Consumer(NOWHERE, group_id="g", enable_auto_commit=False)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer.assign([tp0, tp1])
    hold_commits(consumer)
    seen = []

    def callback(offsets, error):
        seen.append((offsets, type(error).__name__ if error else None, threading.current_thread().name))

    consumer.commit_async({tp0: 5}, callback)
    consumer.commit_async({tp1: 7}, callback)
    consumer.close(timeout=2)
    me = threading.current_thread().name
    assert seen == [({tp0: 5}, None, me), ({tp1: 7}, ClientClosedError.__name__, me)]


def test_a_commit_callback_raising_while_closing_is_raised_once_closed():
    consumer = Consumer(NOWHERE, group_id="g", enable_auto_commit=False)
    tp0 = TopicPartition("t", 0)
    consumer.assign([tp0])
    hold_commits(consumer)
    seen = []

    def boom(offsets, error):
        raise ValueError("callback failed")

    consumer.commit_async({tp0: 5}, boom)
    consumer.commit_async({tp0: 6}, lambda offsets, error: seen.append(offsets))
    with pytest.raises(ValueError, match="callback failed"):
        consumer.close(timeout=5)
    assert seen == [{tp0: 6}] and consumer.closed and not consumer._portal.running


def test_a_callback_after_its_call_ended_fails_rather_than_running_on_the_loop_thread():
    """A call's task can outlive the call (it timed out, or Ctrl-C) and then reach a
    listener: it is not run on the client's thread, where every consumer call it made would
    raise; it fails with ClientClosedError (the rebalance goes on without it, as when a
    listener raises)."""
    import trio

    consumer = Consumer(NOWHERE, group_id="g")
    left, finished = threading.Event(), threading.Event()
    ran, failed = [], []

    async def work():
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(left.wait)
                await consumer._aio.invoke_callback(lambda: ran.append(threading.current_thread().name))
            except ClientClosedError as e:
                failed.append(str(e))
            finally:
                finished.set()

    with pytest.raises(RequestTimedOut):
        consumer._serve(work, timeout=0.2)
    left.set()
    assert finished.wait(10)
    consumer.close(1)
    assert ran == [] and len(failed) == 1 and "not called" in failed[0]


def test_a_callback_a_left_poll_could_not_run_is_reported_by_the_next_poll(monkeypatch):
    """A poll whose caller gave up (the client's thread was stuck) reaches a commit callback
    afterwards: the callback fails with CallbackNotRunError, and the next poll raises that,
    once, as a callback's own error would be, so that the application knows it was not
    called. (A missed on_partitions_assigned is not reported but run by the next poll:
    tests/unit/client/test_group_member_robustness.py.)"""
    import trio

    monkeypatch.setattr("tidelog.blocking.GRACE_S", 0.1)
    consumer = Consumer(NOWHERE, group_id="g", request_timeout_ms=200)
    left, finished, ran = threading.Event(), threading.Event(), []

    def on_commit(offsets, error):
        ran.append(offsets)

    async def poll(timeout_ms, max_records):  # a commit's completion, after the caller left
        try:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(left.wait)
                await consumer._aio.invoke_callback(on_commit, {TopicPartition("t", 0): 1}, None)
            return []
        finally:
            finished.set()

    real_poll, consumer._aio.poll = consumer._aio.poll, poll
    with pytest.raises(RequestTimedOut):
        consumer.poll(timeout_ms=0)
    left.set()
    assert finished.wait(10)
    consumer._portal.run_sync(lambda: None)  # after the loop's step that ended that poll
    consumer._aio.poll = real_poll
    with pytest.raises(CallbackNotRunError, match="on_commit was not called"):
        consumer.poll(timeout_ms=10)
    assert consumer.poll(timeout_ms=10) == [] and ran == []
    consumer.close(1)
