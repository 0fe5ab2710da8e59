"""The envelope, the version table and typed message bodies."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol import codec
from tidelog.protocol.apis import APIS, api_for, api_versions
from tidelog.protocol.codec import (
    INT16,
    INT32,
    REUSE_PACKER_BELOW,
    ApiKey,
    Message,
    RequestHeader,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    pack,
)
from tidelog.protocol.errors import InvalidRequestError, TidelogError, UnsupportedVersionError
from tidelog.protocol.messages import ApiVersion, ApiVersionsRequest, ApiVersionsResponse

int16_st = st.integers(-(1 << 15), (1 << 15) - 1)
int32_st = st.integers(-(1 << 31), (1 << 31) - 1)
scalar_st = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
             | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20))
value_st = st.recursive(
    scalar_st,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
body_st = st.dictionaries(st.text(max_size=10), value_st, max_size=5)
header_st = st.builds(RequestHeader, int16_st, int16_st, int32_st, st.none() | st.text(max_size=20))


def packed(*items) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def decode_error(frame) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        decode_request(frame)
    return info.value


# --- API keys and versions ---------------------------------------------------------------------


def test_api_keys_use_kafkas_numbers():
    assert (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.API_VERSIONS) == (0, 1, 3, 18)
    assert (ApiKey.OFFSETS_FOR_LEADER_EPOCH, ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS) == (23, 32, 33)
    assert (ApiKey.SASL_AUTHENTICATE, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_GROUPS,
            ApiKey.ELECT_LEADERS) == (36, 37, 42, 43)
    assert (ApiKey.DESCRIBE_ACLS, ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS) == (29, 30, 31)
    assert len({int(k) for k in ApiKey}) == len(ApiKey)  # no number named twice


def test_the_registry_holds_served_apis_with_their_version_ranges():
    assert all(key == api.key and api.min_version <= api.max_version for key, api in APIS.items())
    assert ApiKey.SASL_HANDSHAKE in APIS and ApiKey.SASL_AUTHENTICATE in APIS  # listed for clients to find
    assert all(api.request.__name__ == api.response.__name__.replace("Response", "Request") for api in APIS.values())


def test_api_for_accepts_a_served_key_and_version():
    assert api_for(RequestHeader(18, 0, 1)) is APIS[ApiKey.API_VERSIONS]


@pytest.mark.parametrize("key,named", [(99, "api key 99 is not served"), (-1, "api key -1 is not served")])
def test_api_for_refuses_a_key_that_is_not_served(key, named):
    with pytest.raises(UnsupportedVersionError, match=named):
        api_for(RequestHeader(key, 0, 1))


@pytest.mark.parametrize("version", [-1, 1, 7])
def test_api_for_refuses_a_version_outside_the_range(version):
    with pytest.raises(UnsupportedVersionError, match=f"METADATA version {version} is not supported"):
        api_for(RequestHeader(ApiKey.METADATA, version, 1))


# --- envelope round trips ----------------------------------------------------------------------


@given(header_st, body_st)
def test_request_round_trip(header, body):
    assert decode_request(encode_request(header, body)) == (header, body)


@given(int32_st, body_st)
def test_response_round_trip(correlation_id, body):
    assert decode_response(encode_response(correlation_id, body)) == (correlation_id, body)


def test_known_api_keys_decode_to_the_enum_and_unknown_ones_stay_ints():
    known, _ = decode_request(encode_request(RequestHeader(3, 0, 1, "c"), {}))
    unknown, _ = decode_request(encode_request(RequestHeader(1000, 5, 2, None), {}))
    assert known.api_key is ApiKey.METADATA
    assert type(unknown.api_key) is int and unknown.api_key == 1000


def test_encode_accepts_a_message_as_body():
    frame = encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, 4, "c"), ApiVersionsRequest("cli", "1.0"))
    _, body = decode_request(frame)
    assert ApiVersionsRequest.from_body(body) == ApiVersionsRequest("cli", "1.0")


@pytest.mark.parametrize("header", [RequestHeader(1 << 15, 0, 1), RequestHeader(0, -(1 << 15) - 1, 1),
                                    RequestHeader(0, 0, 1 << 31), RequestHeader(True, 0, 1)])
def test_encode_refuses_a_header_out_of_range(header):
    with pytest.raises(ValueError):
        encode_request(header, {})


def test_encode_refuses_a_body_without_str_keys():
    class Name(str):
        pass

    for body in ({1: "x"}, {"a": 1, b"b": 2}, {Name("a"): 1}):  # str exactly, as msgpack maps it
        with pytest.raises(TypeError, match="str keys"):
            encode_request(RequestHeader(0, 0, 1), body)
    with pytest.raises(TypeError):
        encode_response(1, [1, 2])
    assert encode_request(RequestHeader(0, 0, 1), {}) and encode_response(1, {"a": 1})


# --- malformed requests: InvalidRequestError naming the problem, with the correlation id ------


@pytest.mark.parametrize("frame, match", [
    (b"", "not valid msgpack"),
    (b"\xc1", "not valid msgpack: FormatError"),
    (packed(1, 2, 3), "must be an array .* got an array of 3 elements"),
    (msgpack.packb({"a": 1}), "must be an array .* got map"),
    (packed(0, 0, 1, None, {}) + b"\x00", "bytes after its msgpack value"),
    (packed("0", 0, 1, None, {}), "api_key: expected int, got str"),
    (packed(0, 1 << 15, 1, None, {}), r"api_version: 32768 is out of range \[-32768, 32767\]"),
    (packed(0, False, 1, None, {}), "api_version: expected int, got bool"),
    (packed(0, 0, 1, 5, {}), "client_id: expected str or nil, got int"),
    (packed(0, 0, 1, None, []), "request body: expected map, got array"),
    (packed(0, 0, 1, None, {b"k": 1}), "keys must be str, got bytes"),
    (packed(0, 0, 1, None, {"k": msgpack.ExtType(1, b"x")}), "max_ext_len"),
    (packed(0, 0, 1, None, {"k": msgpack.ExtType(1, b"")}), "ext type 1 is not allowed"),
    (packed(0, 0, 1, None, {"k": msgpack.Timestamp(1)}), "max_ext_len"),
    (packed(0, 0, 1, None, {"k": {1: 2}}), "not allowed for map key"),
])
def test_malformed_requests_name_the_problem(frame, match):
    with pytest.raises(InvalidRequestError, match=match):
        decode_request(frame)


def test_the_error_carries_the_correlation_id_when_it_could_be_read():
    assert decode_error(packed(0, 0, 77, None, [])).correlation_id == 77
    assert decode_error(packed(0, 0, 77, None, {"k": 1})[:-1]).correlation_id == 77  # truncated body
    assert decode_error(packed(0, 0, 77, 5, {}, "extra")).correlation_id == 77  # wrong length
    assert decode_error(packed(0, 0, 77, None, {}) + b"\xc1").correlation_id == 77  # trailing junk


@pytest.mark.parametrize("frame", [b"", b"\xc1", packed(0, 0), packed(0, 0, "77", None, {}),
                                   packed(0, 0, 1 << 31, None, {}), msgpack.packb({"a": 1})])
def test_the_correlation_id_is_none_when_it_could_not_be_read(frame):
    assert decode_error(frame).correlation_id is None


def test_malformed_responses_raise_invalid_request_with_the_correlation_id():
    with pytest.raises(InvalidRequestError, match="must be an array \\[correlation_id, body\\]") as info:
        decode_response(packed(5, {}, 1))
    assert info.value.correlation_id == 5
    with pytest.raises(InvalidRequestError, match="response body: expected map") as info:
        decode_response(packed(6, None))
    assert info.value.correlation_id == 6


def test_container_lengths_are_bounded():
    frame = b"\x95\x00\x00\x01\xc0\xdf\xff\xff\xff\xff"  # a map claiming 2**32 - 1 entries
    with pytest.raises(InvalidRequestError, match="max_map_len"):
        decode_request(frame)


# --- fuzz: parse or raise a protocol error, nothing else (h11's fuzz/afl-server.py) -----------


def assert_parses_or_raises_protocol_error(frame: bytes) -> None:
    try:
        header, body = decode_request(frame)
    except InvalidRequestError as e:
        assert e.correlation_id is None or -(1 << 31) <= e.correlation_id < (1 << 31)
        return
    assert isinstance(header, RequestHeader) and type(body) is dict


@given(st.binary(max_size=200))
def test_random_bytes_only_parse_or_raise_invalid_request(data):
    assert_parses_or_raises_protocol_error(data)


mutation_st = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.integers(1, 8)),
)


def mutate(frame: bytes, mutations) -> bytes:
    data = bytearray(frame)
    for kind, at, arg in mutations:
        at = at % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= arg
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data.insert(at, arg)
        elif kind == "delete":
            del data[at:at + arg]
    return bytes(data)


@given(header_st, body_st, st.lists(mutation_st, min_size=1, max_size=5))
def test_mutated_requests_only_parse_or_raise_invalid_request(header, body, mutations):
    assert_parses_or_raises_protocol_error(mutate(encode_request(header, body), mutations))


@given(st.binary(max_size=200))
def test_random_bytes_as_a_response_only_parse_or_raise_invalid_request(data):
    try:
        decode_response(data)
    except TidelogError as e:
        assert isinstance(e, InvalidRequestError)


# --- typed bodies ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Partition(Message):
    partition: int = field(metadata=INT32)
    leader: int | None = None
    replicas: list[int] = field(default_factory=list, metadata=INT32)


@dataclass(frozen=True, slots=True)
class Topic(Message):
    name: str
    partitions: list[Partition]
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


@dataclass(frozen=True, slots=True)
class Cluster(Message):
    topics: list[Topic]
    load: float = 0.0
    payload: bytes | None = None
    parent: Topic | None = None
    by_name: dict[str, Topic] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Node(Message):
    name: str
    children: list[Node] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Span(Message):
    low: int
    high: int

    def __post_init__(self):
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")


@dataclass(frozen=True, slots=True)
class EitherIntOrStr(Message):
    value: int | str


@dataclass(frozen=True, slots=True)
class HasTuple(Message):
    values: tuple[int, ...]


names_st = st.text(max_size=8)
partition_st = st.builds(Partition, int32_st, st.none() | st.integers(0, 1000), st.lists(int32_st, max_size=3))
topic_st = st.builds(Topic, names_st, st.lists(partition_st, max_size=3),
                     st.dictionaries(names_st, names_st, max_size=2), st.booleans())
cluster_st = st.builds(Cluster, st.lists(topic_st, max_size=3), st.floats(allow_nan=False),
                       st.none() | st.binary(max_size=10), st.none() | topic_st,
                       st.dictionaries(names_st, topic_st, max_size=2))


def wire(body: dict) -> dict:
    """A body as it comes back off the wire."""
    return decode_response(encode_response(1, body))[1]


@given(cluster_st)
def test_typed_bodies_round_trip_through_the_wire(cluster):
    body = cluster.to_body()
    assert Cluster.from_body(wire(body)) == cluster


def test_to_body_gives_plain_msgpack_values():
    cluster = Cluster([Topic("t", [Partition(0, 1, [1, 2])])], parent=Topic("p", []))
    assert cluster.to_body() == {
        "topics": [{"name": "t", "partitions": [{"partition": 0, "leader": 1, "replicas": [1, 2]}],
                    "configs": {}, "internal": False}],
        "load": 0.0, "payload": None,
        "parent": {"name": "p", "partitions": [], "configs": {}, "internal": False},
        "by_name": {}}


def cluster_body(**partition_overrides) -> dict:
    partitions = [{"partition": 0}, {"partition": 1, **partition_overrides}]
    topics = [{"name": f"t{i}", "partitions": partitions if i == 2 else []} for i in range(3)]
    return {"topics": topics}


def from_body_error(cls, body) -> str:
    with pytest.raises(InvalidRequestError) as info:
        cls.from_body(body)
    return str(info.value)


def test_a_wrong_type_names_the_field_path():
    body = cluster_body()
    body["topics"][2]["partitions"][0]["partition"] = "0"
    assert from_body_error(Cluster, body) == "topics[2].partitions[0].partition: expected int, got str"


@pytest.mark.parametrize("overrides, expected", [
    ({"partition": True}, "topics[2].partitions[1].partition: expected int, got bool"),
    ({"partition": 1 << 31}, r"topics[2].partitions[1].partition: 2147483648 is out of range [-2147483648, 2147483647]"),
    ({"leader": "x"}, "topics[2].partitions[1].leader: expected int, got str"),
    ({"replicas": [1, None]}, "topics[2].partitions[1].replicas[1]: expected int, got nil"),
    ({"replicas": [1, -(1 << 31) - 1]}, "topics[2].partitions[1].replicas[1]: -2147483649 is out of range"),
    ({"replicas": {}}, "topics[2].partitions[1].replicas: expected array, got map"),
])
def test_nested_errors_name_the_field_path(overrides, expected):
    assert from_body_error(Cluster, cluster_body(**overrides)).startswith(expected)


def test_a_missing_required_field_is_an_error():
    body = cluster_body()
    del body["topics"][1]["name"]
    assert from_body_error(Cluster, body) == "topics[1].name: missing required field"
    assert from_body_error(Cluster, {}) == "topics: missing required field"


def test_dict_values_and_keys_are_checked_with_their_path():
    topic = {"name": "t", "partitions": [], "configs": {"retention.ms": 5}}
    assert from_body_error(Cluster, {"topics": [topic]}) == \
        "topics[0].configs['retention.ms']: expected str, got int"
    body = {"topics": [], "by_name": {"a": {"name": "a", "partitions": [{}]}}}
    assert from_body_error(Cluster, body) == "by_name['a'].partitions[0].partition: missing required field"


def test_a_body_that_is_not_a_map_is_an_error():
    assert from_body_error(Cluster, [1]) == "expected map, got array"
    assert from_body_error(Cluster, {"topics": [7]}) == "topics[0]: expected map, got int"
    assert from_body_error(Cluster, {"topics": [], "parent": "p"}) == "parent: expected map, got str"


def test_defaults_apply_and_unknown_keys_are_ignored():
    body = {"topics": [{"name": "t", "partitions": [{"partition": 3, "from_the_future": 1}]}], "extra": [1]}
    assert Cluster.from_body(body) == Cluster([Topic("t", [Partition(3)])])


def test_float_fields_accept_ints_and_nothing_else():
    assert Cluster.from_body({"topics": [], "load": 2}).load == 2.0
    assert from_body_error(Cluster, {"topics": [], "load": "2"}) == "load: expected float, got str"
    assert from_body_error(Cluster, {"topics": [], "payload": "b"}) == "payload: expected bytes, got str"


def test_recursive_messages():
    tree = Node("root", [Node("a", [Node("a1")]), Node("b")])
    assert Node.from_body(wire(tree.to_body())) == tree
    body = tree.to_body()
    body["children"][0]["children"][0]["name"] = 1
    assert from_body_error(Node, body) == "children[0].children[0].name: expected str, got int"


def test_post_init_rules_become_invalid_request():
    assert Span.from_body({"low": 1, "high": 2}) == Span(1, 2)
    assert from_body_error(Span, {"low": 3, "high": 2}) == "low 3 is above high 2"


@pytest.mark.parametrize("cls", [EitherIntOrStr, HasTuple])
def test_unsupported_annotations_are_refused_when_first_used(cls):
    with pytest.raises(TypeError, match="unsupported|only `X | None`"):
        cls.from_body({"value": 1, "values": [1]})


# --- ApiVersions -------------------------------------------------------------------------------


def test_api_versions_messages_are_registered():
    assert APIS[ApiKey.API_VERSIONS].request is ApiVersionsRequest
    assert APIS[ApiKey.API_VERSIONS].response is ApiVersionsResponse


def test_api_versions_request_fields_are_optional():
    assert ApiVersionsRequest.from_body({}) == ApiVersionsRequest()


def test_api_versions_response_lists_the_supported_versions():
    response = ApiVersionsResponse(0, api_versions())
    decoded = ApiVersionsResponse.from_body(wire(response.to_body()))
    assert decoded == response
    assert {v.api_key: (v.min_version, v.max_version) for v in decoded.api_keys} == \
        {int(k): (api.min_version, api.max_version) for k, api in APIS.items()}


def test_api_version_fields_are_int16():
    body = {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 1 << 15}]}
    assert from_body_error(ApiVersionsResponse, body).startswith("api_keys[0].max_version: 32768 is out of range")
    assert ApiVersion(18, 0, 3).to_body() == {"api_key": 18, "min_version": 0, "max_version": 3}
    assert INT16["max"] == (1 << 15) - 1


# -- the reused packer -----------------------------------------------------------------------------


def test_pack_matches_packb_after_a_failure_and_after_a_large_value():
    value = {"a": [1, None, b"\x00" * 10, "x"], "b": {"c": True}}
    assert pack(value) == msgpack.packb(value, use_bin_type=True)
    with pytest.raises(TypeError):
        pack([1, object()])  # the half-packed value is not left in the packer
    assert pack(value) == msgpack.packb(value, use_bin_type=True)
    large = b"\x01" * REUSE_PACKER_BELOW
    assert pack(large) == msgpack.packb(large, use_bin_type=True)  # and its packer is dropped
    assert pack(value) == msgpack.packb(value, use_bin_type=True)


def test_a_pack_reached_during_a_pack_gets_a_packer_of_its_own():
    inner: list[bytes] = []

    class Items(dict):  # Python code run in the middle of a pack (as a finalizer could be)
        def items(self):
            inner.append(pack({"inner": 1}))
            return super().items()

    outer = pack(["first", Items(k="v"), "last"])
    assert inner == [msgpack.packb({"inner": 1})]
    assert msgpack.unpackb(outer) == ["first", {"k": "v"}, "last"]


def test_a_packer_that_failed_or_grew_large_is_not_kept():
    codec._packers.clear()
    with pytest.raises(TypeError):
        pack([b"x" * (1 << 20), object()])
    assert codec._packers == []
    pack(b"x" * REUSE_PACKER_BELOW)
    assert codec._packers == []
    pack(b"small")
    assert len(codec._packers) == 1


def test_threads_never_share_a_packer():
    barrier = threading.Barrier(4)

    def mismatches(n: int) -> list[list]:
        barrier.wait()  # all four pack at once
        values = ([n, i, b"%d" % (n * i)] for i in range(2000))
        return [v for v in values if pack(v) != msgpack.packb(v, use_bin_type=True)]

    with ThreadPoolExecutor(4) as pool:
        assert [bad for found in pool.map(mismatches, range(4)) for bad in found] == []
    assert len(codec._packers) <= codec.PACKER_POOL + 4  # bounded (a race may add one per thread)


def test_an_api_key_member_encodes_as_its_number():
    by_member = encode_request(RequestHeader(ApiKey.PRODUCE, 3, 7, "c"), {})
    by_number = encode_request(RequestHeader(0, 3, 7, "c"), {})
    assert by_member == by_number
    assert msgpack.unpackb(by_member)[:4] == [0, 3, 7, "c"]
