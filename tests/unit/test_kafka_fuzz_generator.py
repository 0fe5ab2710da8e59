"""The Kafka listener fuzzer's inputs (tests/support/kafka_fuzz.py) are reproducible, cover
every API and version of ``KAFKA_APIS``, and encode as the listener's own codec does."""

from __future__ import annotations

import struct

from tests.support.kafka_fuzz import (
    INTER_BROKER,
    OBJECT_BOUND,
    PROBE_CORRELATION_ID,
    SERVED,
    Generator,
    Names,
    decode_response,
    encode_tracked,
    is_flexible,
    kafka_batch,
    predict,
    probe,
    replay,
    split_frames,
)
from tidelog.protocol.kafka.apis import KAFKA_APIS
from tidelog.protocol.kafka.records import decode_records, encode_records
from tidelog.protocol.kafka.schema import codec


def test_inputs_replay_from_seed_lane_and_number():
    for lane_kind, lane in (("valid", 0), ("frames", 2), ("stream", 4)):
        g = Generator(7, lane)
        drawn = [getattr(g, {"valid": "valid", "frames": "mutated", "stream": "stream"}[lane_kind])()
                 for _ in range(40)]
        again = replay(7, lane, 40, lane_kind)
        assert again.data == drawn[-1].data and again.mutation == drawn[-1].mutation
        assert again.number == 40
    assert replay(7, 0, 5, "valid").data != replay(8, 0, 5, "valid").data
    assert replay(7, 0, 5, "valid").data != replay(7, 1, 5, "valid").data


def test_same_seed_lane_and_number_give_the_same_bytes():
    a, b = Generator(11, 1), Generator(11, 1)
    for _ in range(100):
        assert a.mutated().data == b.mutated().data
        assert a.valid().data == b.valid().data


def test_sampled_bodies_encode_as_the_listeners_codec_does_at_every_served_version():
    g = Generator(3, 0)
    for key, api in KAFKA_APIS.items():
        for version in range(api.min_version, api.max_version + 1):
            for i in range(6):
                body = g.sampler.body(key, version, 0.15 if i % 2 else 0.0)
                data, slots = encode_tracked(api.request_spec, version, body)
                assert data == bytes(codec(api.request_spec, version).encode(body)), (api.spec, version, body)
                assert all(s.offset + s.size <= len(data) for s in slots)
                assert any(s.kind == "tags" for s in slots) == is_flexible(api.request_spec, version)


def test_valid_inputs_cover_every_api_and_version_and_decode():
    g = Generator(5, 0)
    seen = set()
    for _ in range(3000):
        inp = g.valid()
        assert not inp.decoder_error, inp.describe()
        if inp.closes:  # only for a grown list over the decoder's object bound
            assert OBJECT_BOUND in inp.expects[-1].why, inp.describe()
        else:
            assert [(e.correlation_id, e.key, e.version) for e in inp.expects] == [(inp.number, inp.api_key,
                                                                                      inp.version)]
        seen.add((inp.api_key, inp.version))
    every = {(k, v) for k, api in KAFKA_APIS.items() for v in range(api.min_version, api.max_version + 1)}
    assert seen == every, sorted(every - seen)


def test_mutated_frames_cover_every_api_refused_keys_and_versions():
    g = Generator(9, 2)
    keys, mutations, closes, answered = set(), set(), 0, 0
    refused_keys = set()
    for _ in range(3000):
        inp = g.mutated()
        if inp.api_key is not None:
            keys.add(inp.api_key)
        mutations.update(inp.tags)
        closes += inp.closes
        answered += not inp.closes
        for e in inp.expects:
            if e.closes and "is not served on a Kafka listener" in e.why:
                refused_keys.add(int(e.why.split()[2]))
        assert len(inp.data) - 4 <= 1 << 20
    assert keys == set(SERVED)
    assert set(INTER_BROKER) <= refused_keys
    assert {"flip", "cut", "length", "int", "tags", "version", "api_key", "header", "random"} <= mutations
    assert closes > 100 and answered > 100


def test_streams_expect_at_most_what_their_whole_frames_get():
    g = Generator(4, 4, Names(), max_frame_bytes=4096)
    for _ in range(300):
        inp = g.stream()
        assert len(inp.expects) <= len(split_frames(inp.data, 4096))


def test_predict_reads_the_frame_as_the_listener_does():
    head = struct.pack(">hhi", 18, 0, 42) + b"\x00\x01x"
    assert predict(head, 1 << 20)[0].correlation_id == 42
    assert not predict(head, 1 << 20)[0].closes
    assert predict(struct.pack(">hhi", 4, 0, 1) + b"\x00\x00", 1 << 20)[0].closes  # LeaderAndIsr
    assert predict(b"\x00\x12", 1 << 20)[0].closes
    refused = predict(struct.pack(">hhi", 18, 99, 3) + b"\x00\x00", 1 << 20)[0]  # KIP-511: a v0 answer
    assert (refused.closes, refused.version, refused.correlation_id) == (False, 0, 3)


def test_a_kafka_batch_carries_its_records_and_a_valid_crc():
    records = [(0, 0, b"k", b"v", None), (1, 1, None, b"w", (("h", b"x"),))]
    batch = kafka_batch(encode_records(records), count=2)
    assert batch[16] == 2 and len(batch) == 61 + len(encode_records(records))
    assert struct.unpack_from(">i", batch, 8)[0] == len(batch) - 12
    assert decode_records(batch[61:], 2, 0) == tuple(records)
    from crc32c import crc32c
    assert struct.unpack_from(">I", batch, 17)[0] == crc32c(batch[21:])


def test_the_probe_and_its_response_decode():
    data, expect = probe()
    assert predict(data[4:], 1 << 20)[0] == expect
    body = {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}]}
    response = struct.pack(">i", PROBE_CORRELATION_ID) + bytes(codec("ApiVersionsResponse", 3).encode(body))
    assert decode_response(response, expect)["api_keys"][0]["max_version"] == 3
