"""The broker fuzzer's inputs (tests/support/fuzz.py) are reproducible and cover the registry."""

from __future__ import annotations

import msgpack

from tests.support.fuzz import INTER_BROKER, LIVE_EXCLUDED, VALID, DupKey, Generator, RawStr, pack, replay
from tidelog.protocol.apis import APIS
from tidelog.protocol.codec import decode_request
from tidelog.protocol.errors import InvalidRequestError


def test_every_api_of_the_registry_has_a_valid_request_that_round_trips():
    g = Generator(0, 0)
    assert set(VALID) == set(APIS)
    assert INTER_BROKER <= set(APIS)
    for key, make in VALID.items():
        message = make(g.valid)
        assert type(message) is APIS[key].request
        assert APIS[key].request.from_body(message.to_body()) == message


def test_inputs_replay_from_seed_lane_and_number():
    g = Generator(7, 1)
    drawn = [g.structured(0) for _ in range(60)]
    again = replay(7, 1, 60, "structured")
    assert (again.mutation, again.kind, again.api_key) == (drawn[-1].mutation, drawn[-1].kind, drawn[-1].api_key)
    g2 = Generator(7, 4)
    streams = [g2.stream() for _ in range(5)]
    assert replay(7, 4, 5, "stream").data == streams[-1].data


def test_structured_inputs_fit_the_frame_and_cover_every_api():
    g = Generator(3, 0, max_frame_bytes=1 << 20)
    seen = set()
    for cid in range(1500):
        inp = g.structured(cid)
        assert len(inp.data) - 4 <= 1 << 20
        assert inp.correlation_id == cid
        seen.add(inp.api_key)
    assert seen == set(APIS) - LIVE_EXCLUDED


def test_pack_writes_what_packb_refuses():
    assert pack({"a": 1, DupKey("a"): 2}) == b"\x82\xa1a\x01\xa1a\x02"
    assert pack([RawStr(b"\xff")]) == b"\x91\xa1\xff"
    assert msgpack.unpackb(pack({"x": [1, 2]})) == {"x": [1, 2]}


def test_a_valid_envelope_stays_valid_whatever_the_body():
    g = Generator(5, 0)
    for cid in range(300):
        inp = g.structured(cid)
        try:
            header, _ = decode_request(inp.data[4:])
        except InvalidRequestError as e:  # the body may not decode; its correlation id is read
            assert e.correlation_id == cid, e
        else:
            assert header.correlation_id == cid
