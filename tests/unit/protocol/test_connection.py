"""Client and server connection state, alone and talking to each other in memory."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol.codec import (
    ApiKey,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from tidelog.protocol.connection import MAX_CORRELATION_ID, BadRequest, ClientConnection, Request, ServerConnection
from tidelog.protocol.errors import FrameTooLargeError, InvalidRequestError, TidelogError
from tidelog.protocol.frames import FrameDecoder, encode_frame
from tidelog.protocol.messages import ApiVersionsRequest


def response_frame(correlation_id: int, body: dict | None = None) -> bytes:
    return encode_frame(encode_response(correlation_id, body or {}))


def request_frame(correlation_id: int, body: dict | None = None, api_key: int = ApiKey.METADATA) -> bytes:
    return encode_frame(encode_request(RequestHeader(api_key, 0, correlation_id, "c"), body or {}))


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    return [data[a:b] for a, b in zip(points, points[1:])]


# --- client ------------------------------------------------------------------------------------


def test_client_numbers_requests_from_zero_and_frames_them():
    client = ClientConnection(client_id="app")
    ids = [client.send_request(ApiKey.METADATA, 0, {"n": i})[0] for i in range(3)]
    assert ids == [0, 1, 2] and client.in_flight == 3
    correlation_id, frame = client.send_request(ApiKey.API_VERSIONS, 0, ApiVersionsRequest())
    [body] = FrameDecoder().feed(frame)
    header, decoded = decode_request(body)
    assert header == RequestHeader(ApiKey.API_VERSIONS, 0, 3, "app") and correlation_id == 3
    assert decoded == ApiVersionsRequest().to_body()


def test_client_correlation_ids_wrap_within_int32():
    client = ClientConnection(first_correlation_id=MAX_CORRELATION_ID)
    assert [client.send_request(0, 0, {})[0] for _ in range(3)] == [MAX_CORRELATION_ID, 0, 1]


def test_client_pairs_responses_in_request_order():
    client = ClientConnection()
    for _ in range(3):
        client.send_request(ApiKey.FETCH, 0, {})
    stream = response_frame(0, {"a": 0}) + response_frame(1, {"a": 1}) + response_frame(2, {"a": 2})
    assert client.receive_data(stream[:6]) == []
    assert client.receive_data(stream[6:]) == [(0, {"a": 0}), (1, {"a": 1}), (2, {"a": 2})]
    assert client.in_flight == 0


def test_client_rejects_a_response_out_of_order_and_stays_failed():
    client = ClientConnection()
    client.send_request(ApiKey.FETCH, 0, {})
    client.send_request(ApiKey.FETCH, 0, {})
    with pytest.raises(InvalidRequestError,
                       match="response correlation id 1 does not match the oldest in-flight request 0"):
        client.receive_data(response_frame(1))
    with pytest.raises(InvalidRequestError, match="already failed"):
        client.receive_data(response_frame(0))
    with pytest.raises(InvalidRequestError, match="already failed"):
        client.send_request(ApiKey.FETCH, 0, {})


def test_client_rejects_a_response_with_nothing_in_flight():
    with pytest.raises(InvalidRequestError, match="no request in flight"):
        ClientConnection().receive_data(response_frame(0))


def test_client_does_not_await_requests_sent_without_expecting_a_response():
    client = ClientConnection()
    acks0, _ = client.send_request(ApiKey.PRODUCE, 0, {"acks": 0}, expect_response=False)
    acks1, _ = client.send_request(ApiKey.PRODUCE, 0, {"acks": 1})
    assert client.in_flight == 1
    assert client.receive_data(response_frame(acks1)) == [(acks1, {})]
    assert acks0 == 0 and acks1 == 1


def test_client_rejects_a_malformed_response():
    client = ClientConnection()
    client.send_request(ApiKey.FETCH, 0, {})
    with pytest.raises(InvalidRequestError, match="response body: expected map"):
        client.receive_data(encode_frame(msgpack.packb([0, 5])))


def test_client_rejects_an_oversize_response_before_buffering_it():
    client = ClientConnection(max_frame_bytes=100)
    client.send_request(ApiKey.FETCH, 0, {})
    with pytest.raises(FrameTooLargeError):
        client.receive_data(struct.pack(">I", 101))
    with pytest.raises(FrameTooLargeError):
        client.receive_data(response_frame(0))


# --- server ------------------------------------------------------------------------------------


def test_server_parses_requests_and_counts_them_in_flight():
    server = ServerConnection()
    events = server.receive_data(request_frame(7, {"x": 1}) + request_frame(8))
    assert events == [Request(RequestHeader(ApiKey.METADATA, 0, 7, "c"), {"x": 1}),
                      Request(RequestHeader(ApiKey.METADATA, 0, 8, "c"), {})]
    assert server.in_flight == 2


def test_server_reports_a_bad_envelope_with_its_correlation_id_and_carries_on():
    server = ServerConnection()
    bad = encode_frame(msgpack.packb([3, 0, 9, None, "not a map"]))
    events = server.receive_data(bad + request_frame(10))
    assert isinstance(events[0], BadRequest) and events[0].correlation_id == 9
    assert not events[0].must_close and isinstance(events[0].error, InvalidRequestError)
    assert isinstance(events[1], Request) and server.in_flight == 2
    assert decode_response(FrameDecoder().feed(server.send_response(9, {"error_code": 42}))[0]) == \
        (9, {"error_code": 42})


def test_server_reports_an_unreadable_frame_as_fatal():
    server = ServerConnection()
    [event] = server.receive_data(encode_frame(b"\xc1"))
    assert event.correlation_id is None and event.must_close
    assert server.in_flight == 0


def test_server_delivers_requests_before_an_oversize_frame_then_fails():
    server = ServerConnection(max_frame_bytes=1000)
    events = server.receive_data(request_frame(1) + struct.pack(">I", 1001))
    assert isinstance(events[0], Request)
    assert isinstance(events[1], BadRequest) and events[1].must_close
    assert isinstance(events[1].error, FrameTooLargeError)
    assert server.failed and not server.can_read
    [again] = server.receive_data(request_frame(2))
    assert isinstance(again.error, FrameTooLargeError)


def test_server_writes_responses_in_request_order_whatever_order_handlers_finish():
    server = ServerConnection()
    server.receive_data(request_frame(1) + request_frame(2) + request_frame(3))
    assert server.send_response(3, {"r": 3}) == b""
    assert server.send_response(2, {"r": 2}) == b""
    assert server.in_flight == 3
    written = server.send_response(1, {"r": 1})
    assert written == response_frame(1, {"r": 1}) + response_frame(2, {"r": 2}) + response_frame(3, {"r": 3})
    assert server.in_flight == 0


def test_server_skips_requests_that_get_no_response():
    server = ServerConnection()
    server.receive_data(request_frame(1, {"acks": 0}) + request_frame(2))
    assert server.send_response(2, {}) == b""
    assert server.skip_response(1) == response_frame(2)
    assert server.in_flight == 0


def test_server_answers_duplicate_correlation_ids_first_come_first_served():
    server = ServerConnection()
    server.receive_data(request_frame(5) + request_frame(5))
    assert server.send_response(5, {"n": 1}) == response_frame(5, {"n": 1})
    assert server.send_response(5, {"n": 2}) == response_frame(5, {"n": 2})


def test_server_refuses_a_response_nobody_asked_for():
    server = ServerConnection()
    server.receive_data(request_frame(1))
    with pytest.raises(ValueError, match="correlation id 2"):
        server.send_response(2, {})
    server.send_response(1, {})
    with pytest.raises(ValueError, match="correlation id 1"):
        server.send_response(1, {})


def test_server_can_read_until_max_in_flight():
    server = ServerConnection(max_in_flight=2)
    server.receive_data(request_frame(1))
    assert server.can_read
    server.receive_data(request_frame(2))
    assert not server.can_read and server.in_flight == 2
    server.send_response(1, {})
    assert server.can_read


def test_server_refuses_a_zero_in_flight_bound():
    with pytest.raises(ValueError):
        ServerConnection(max_in_flight=0)


# --- fuzz: the server turns any bytes into events, never an exception ------------------------


def assert_only_events(server: ServerConnection, parts: list[bytes]) -> None:
    for part in parts:
        for event in server.receive_data(part):
            assert isinstance(event, (Request, BadRequest))
            if isinstance(event, BadRequest):
                assert isinstance(event.error, TidelogError)
                assert isinstance(event.error, InvalidRequestError)


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=10))
def test_random_bytes_only_give_events(data, cuts):
    assert_only_events(ServerConnection(max_frame_bytes=200), chunks(data, cuts))


@given(st.lists(st.dictionaries(st.text(max_size=5), st.integers(-(1 << 63), (1 << 63) - 1) | st.binary(max_size=8),
                                max_size=3),
                min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=6),
       st.lists(st.integers(0, 10_000), max_size=8))
def test_mutated_request_streams_only_give_events(bodies, flips, cuts):
    stream = bytearray(b"".join(request_frame(i, body) for i, body in enumerate(bodies)))
    for at, mask in flips:
        stream[at % len(stream)] ^= mask
    assert_only_events(ServerConnection(max_frame_bytes=4096), chunks(bytes(stream), cuts))


# --- client and server in memory, pipelined ----------------------------------------------------


@st.composite
def conversations(draw):
    n = draw(st.integers(1, 12))
    acks = draw(st.lists(st.sampled_from([0, 1, -1]), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    up_cuts = draw(st.lists(st.integers(0, 10_000), max_size=10))
    down_cuts = draw(st.lists(st.integers(0, 10_000), max_size=10))
    return acks, order, up_cuts, down_cuts


@given(conversations())
def test_pipelined_requests_get_their_responses_in_order(conversation):
    acks, order, up_cuts, down_cuts = conversation
    client, server = ClientConnection(client_id="t"), ServerConnection(max_in_flight=100)
    sent = [client.send_request(ApiKey.PRODUCE, 0, {"acks": a, "n": i}, expect_response=a != 0)
            for i, a in enumerate(acks)]
    requests = []
    for part in chunks(b"".join(frame for _, frame in sent), up_cuts):
        requests.extend(server.receive_data(part))
    assert [r.header.correlation_id for r in requests] == [cid for cid, _ in sent]
    assert server.in_flight == len(acks)

    wire = b""
    for i in order:  # handlers finish in any order
        request = requests[i]
        if request.body["acks"] == 0:
            wire += server.skip_response(request.header.correlation_id)
        else:
            wire += server.send_response(request.header.correlation_id, {"n": request.body["n"]})
    assert server.in_flight == 0

    responses = []
    for part in chunks(wire, down_cuts):
        responses.extend(client.receive_data(part))
    expected = [(cid, {"n": i}) for i, ((cid, _), a) in enumerate(zip(sent, acks)) if a != 0]
    assert responses == expected
    assert client.in_flight == 0
