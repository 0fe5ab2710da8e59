"""Kafka's message bodies as compiled from Kafka's JSON specs: every served version round
trips, and an independent implementation (kafka-python's, generated from the same specs by
other code) reads our bytes and writes them back identically."""

from __future__ import annotations

import pytest

from tidelog.protocol.errors import InvalidRequestError
from tidelog.protocol.kafka.apis import KAFKA_APIS
from tidelog.protocol.kafka.schema import Reader, codec, snake, spec, valid_versions

SERVED = [(name, v) for api in KAFKA_APIS.values() for name in (api.request_spec, api.response_spec)
          for v in range(api.min_version, api.max_version + 1)]


def sample(fields: list, version: int, structs: dict, depth: int = 0) -> dict:
    """A body with every field of ``version`` set to a value other than its default."""
    body = {}
    for f in fields:
        kind = f["type"]
        item = kind.removeprefix("[]")
        if item in ("int8", "int16", "int32", "int64", "uint16"):
            value = 7
        elif item == "float64":
            value = 1.5
        elif item == "bool":
            value = True
        elif item == "string":
            value = f"{f['name']}-é"
        elif item in ("bytes", "records"):
            value = b"\x01\x02"
        elif item == "uuid":
            value = bytes(range(16))
        else:
            inner = f.get("fields") or structs[item]
            value = sample(inner, version, structs, depth + 1)
        body[snake(f["name"])] = [value, value] if kind.startswith("[]") else value
    return body


def _structs(doc: dict) -> dict:
    found = {s["name"]: s["fields"] for s in doc.get("commonStructs", [])}

    def walk(fields):
        for f in fields:
            if "fields" in f:
                found[f["type"].removeprefix("[]")] = f["fields"]
                walk(f["fields"])
    walk(doc["fields"])
    return found


@pytest.mark.parametrize("name,version", SERVED, ids=[f"{n}-v{v}" for n, v in SERVED])
def test_every_served_version_round_trips(name, version):
    doc = spec(name)
    c = codec(name, version)
    body = sample(doc["fields"], version, _structs(doc))
    encoded = bytes(c.encode(body))
    decoded = c.decode_all(encoded)
    assert bytes(c.encode(decoded)) == encoded


def _kafka_python_class(name: str):
    from kafka.protocol.api_message import ApiMessage

    pending, seen = [ApiMessage], {}
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            seen.setdefault(sub.__name__, sub)
            pending.append(sub)
    return seen.get(name)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python reads its own data files so
@pytest.mark.parametrize("name,version", SERVED, ids=[f"{n}-v{v}" for n, v in SERVED])
def test_an_independent_implementation_reads_and_rewrites_our_bytes(name, version):
    cls = _kafka_python_class(name)
    if cls is None or not cls.min_version <= version <= cls.max_version:
        pytest.skip(f"kafka-python has no {name} v{version}")
    doc = spec(name)
    body = sample(doc["fields"], version, _structs(doc))
    if name == "ApiVersionsResponse":
        body["error_code"] = 0  # kafka-python reads an error answer as v0 (KIP-511's fallback)
    ours = bytes(codec(name, version).encode(body))
    theirs = cls.decode(ours, version=version)
    theirs._header = None  # kafka-python leaves it unset on decoded messages, and encode reads it
    assert bytes(theirs.encode(version=version)) == ours


def test_defaults_fill_what_an_old_version_lacks():
    body = codec("FetchRequest", 2).decode_all(bytes(codec("FetchRequest", 2).encode({"topics": []})))
    assert body["max_bytes"] == 0x7FFFFFFF and body["isolation_level"] == 0
    assert codec("MetadataResponse", 0).decode_all(bytes(codec("MetadataResponse", 0).encode({})))[
        "topics"] == []


@pytest.mark.parametrize("data,problem", [
    (b"\x00\x00\x00\x05\x00\x01t", "topics: 5 elements announced"),  # 5 topics in 3 bytes
    (b"\x7f\xff\xff\xff", "announced"),  # 2^31-1 topics
    (b"\x00\x00\x00\x01\x00\x05ab", "name: 5 elements announced, only 2"),  # a name cut short
    (b"\x00\x00\x00\x01\xff\xfe", "length -2"),
])
def test_malformed_bodies_are_refused_naming_the_field(data, problem):
    with pytest.raises(InvalidRequestError, match=problem):
        codec("MetadataRequest", 1).decode_all(data)


def test_a_frame_cannot_decode_into_more_values_than_its_bound():
    # ten topics of empty names (two bytes each in a flexible version: name, tags)
    data = b"\x0b" + b"\x01\x00" * 10 + b"\x00\x00\x00\x00"
    assert len(codec("MetadataRequest", 9).decode(Reader(data))["topics"]) == 10
    r = Reader(data)
    r.budget = 15
    with pytest.raises(InvalidRequestError, match="too many values"):
        codec("MetadataRequest", 9).decode(r)


def test_every_spec_file_parses():
    for api in KAFKA_APIS.values():
        for name in (api.request_spec, api.response_spec):
            low, high = valid_versions(name)
            assert low <= api.min_version <= api.max_version <= high, name


def test_a_message_too_long_for_an_int16_length_is_cut_not_unencodable():
    message = "é" * 40_000  # 80,000 bytes of UTF-8
    body = {"topics": [{"name": "t", "error_code": 39, "error_message": message}]}
    old = codec("CreateTopicsResponse", 4).decode_all(bytes(codec("CreateTopicsResponse", 4).encode(body)))
    cut = old["topics"][0]["error_message"]
    assert len(cut.encode()) <= 0x7FFF and cut.endswith("...") and message.startswith(cut[:-3])
    flexible = codec("CreateTopicsResponse", 5)  # compact strings: no need to cut
    assert flexible.decode_all(bytes(flexible.encode(body)))["topics"][0]["error_message"] == message


def test_a_long_string_or_blob_costs_one_value_of_the_budget():
    records = b"x" * 2_000_000
    c = codec("ProduceRequest", 9)
    data = bytes(c.encode({"acks": 1, "timeout_ms": 1, "topic_data": [
        {"name": "t" * 1000, "partition_data": [{"index": 0, "records": records}]}]}))
    r = Reader(data)
    r.budget = 50  # far fewer values than bytes
    assert c.decode(r)["topic_data"][0]["partition_data"][0]["records"] == records
