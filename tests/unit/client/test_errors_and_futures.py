"""The code-to-exception boundary, and record futures waited on from threads and from Trio."""

from __future__ import annotations

import threading

import pytest
import trio

from tidelog.aio.accumulator import ProduceResult, RecordFuture
from tidelog.errors import (
    BrokerConnectionError,
    ClientClosedError,
    NoBrokersAvailable,
    RequestTimedOut,
    TidelogClientError,
    broker_error,
)
from tidelog.protocol.errors import (
    NETWORK_EXCEPTION,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    OffsetOutOfRangeError,
    TidelogError,
)
from tidelog.protocol.topics import TopicPartition
from tidelog.records import RecordMetadata

TP = TopicPartition("t", 2)


def test_broker_error_names_where_what_and_why():
    e = broker_error(NOT_LEADER_OR_FOLLOWER.code, "topic 't' partition 2")
    assert isinstance(e, TidelogError) and e.error is NOT_LEADER_OR_FOLLOWER
    assert e.retriable and e.invalid_metadata
    assert str(e).startswith("topic 't' partition 2: NOT_LEADER_OR_FOLLOWER: ")
    e = broker_error(OFFSET_OUT_OF_RANGE.code, "partition t-2", "custom")
    assert isinstance(e, OffsetOutOfRangeError) and str(e).endswith("custom")


def test_broker_error_for_an_unknown_code_keeps_the_number():
    e = broker_error(9999, "node 1")
    assert "error code 9999" in str(e)


def test_broker_error_refuses_success():
    with pytest.raises(ValueError):
        broker_error(0, "x")


def test_client_errors_carry_registry_codes():
    assert isinstance(RequestTimedOut("x"), TimeoutError)
    assert BrokerConnectionError("x").error is NETWORK_EXCEPTION
    assert BrokerConnectionError("x").retriable
    assert issubclass(NoBrokersAvailable, BrokerConnectionError)
    assert all(issubclass(c, (TidelogClientError, TidelogError))
               for c in (RequestTimedOut, ClientClosedError, NoBrokersAvailable))


def test_future_result_from_another_thread():
    result = ProduceResult(TP)
    future = RecordFuture(result, 3, 1234)
    got = []
    waiter = threading.Thread(target=lambda: got.append(future.result(5)))
    waiter.start()
    assert not future.done()
    result.complete(base_offset=100)
    waiter.join(5)
    assert got == [RecordMetadata("t", 2, 103, 1234)]


def test_many_waiting_threads_and_a_completion_racing_them_all_see_it():
    # the waiters' event is made by the first of them: each round starts the waiters and the
    # completion together, so some wait before the event exists, some after, some after done
    for _ in range(200):
        result = ProduceResult(TP)
        futures = [RecordFuture(result, i, 0) for i in range(4)]
        got: list = []
        start = threading.Barrier(5)

        def wait(f: RecordFuture) -> None:
            start.wait()
            got.append(f.result(5).offset)

        threads = [threading.Thread(target=wait, args=(f,)) for f in futures]
        for t in threads:
            t.start()
        start.wait()
        result.complete(base_offset=10)
        for t in threads:
            t.join(10)
        assert sorted(got) == [10, 11, 12, 13]
    assert result.wait(0) and result.done()  # done: no event needed


def test_future_result_times_out():
    future = RecordFuture(ProduceResult(TP), 0, 0)
    with pytest.raises(RequestTimedOut):
        future.result(0.01)
    with pytest.raises(RequestTimedOut):
        future.exception(0.01)


def test_acks_zero_futures_resolve_with_offset_minus_one():
    result = ProduceResult(TP)
    result.complete()
    assert RecordFuture(result, 5, 77).result(0) == RecordMetadata("t", 2, -1, 77)


def test_callbacks_run_once_on_completion_or_at_once_when_done():
    result = ProduceResult(TP)
    future = RecordFuture(result, 0, 0)
    seen = []
    future.add_done_callback(lambda f: seen.append(("a", f.result(0).offset)))
    result.complete(base_offset=5)
    result.complete(base_offset=6)  # a second completion is ignored
    future.add_done_callback(lambda f: seen.append(("b", f.result(0).offset)))
    assert seen == [("a", 5), ("b", 5)]


async def test_futures_are_awaitable_in_trio():
    result = ProduceResult(TP)
    futures = [RecordFuture(result, i, 0) for i in range(3)]
    got = []

    async def wait(f):
        got.append((await f).offset)

    async with trio.open_nursery() as nursery:
        for f in futures:
            nursery.start_soon(wait, f)
        await trio.sleep(0.01)
        result.complete(base_offset=10)
    assert sorted(got) == [10, 11, 12]
    assert (await futures[0]).offset == 10  # already done


async def test_awaiting_a_failed_future_raises_its_error():
    result = ProduceResult(TP)
    result.complete(error=ClientClosedError("closed"))
    with pytest.raises(ClientClosedError):
        await RecordFuture(result, 0, 0)


@pytest.mark.parametrize("throttle", [{}, {"throttle_time_ms": 250}])
def test_a_whole_request_error_raises_its_error_even_with_a_throttle(throttle):
    # a client over its quota gets the throttle on every answer, a refusal included
    from tidelog.errors import decode_response
    from tidelog.protocol.errors import NOT_CONTROLLER
    from tidelog.protocol.messages import CreateTopicsResponse

    body = {"error_code": NOT_CONTROLLER.code, "error_message": "broker 2 is not the controller", **throttle}
    with pytest.raises(TidelogError, match="not the controller") as info:
        decode_response(CreateTopicsResponse, body)
    assert info.value.error is NOT_CONTROLLER
