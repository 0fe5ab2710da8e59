"""A structure-aware fuzzer of the broker's request path (issue 14, point 9): the inputs, and a
driver that sends them on several pipelined connections and judges every answer.

Inputs (``Generator``), each the exact bytes to write:

- ``body``: a valid envelope (``encode_request``) around a mutated body of one API of the
  registry (``protocol.apis.APIS``, the inter-broker APIs included). Each starts as a small
  valid typed request of that API (``VALID``), is turned into its body map and then mutated
  1-3 times at random paths: a field dropped, duplicated (a map with the same key twice, a
  list element twice), retyped, set to an extreme int (0, -1, the int8..int64 bounds, 2^63,
  2^64-1), an odd float, a long or non-UTF-8 string, an invalid topic name (``..``, ``/``,
  NUL, 250 chars), nested garbage (deep arrays, maps with int keys, ext types), an unknown
  field, or a list grown to hundreds of thousands of elements within the frame limit.
- ``batch``: a Produce whose records are a mutated record batch: bytes flipped (with and
  without the CRC recomputed), header fields that lie (count, last offset delta, length,
  magic, attributes, timestamps, producer fields; CRC recomputed so the checks beyond the CRC
  run), records blocks that are not msgpack or have the wrong shape, compressed blocks
  (gzip, lz4, zstd) of garbage, of torn streams, under the wrong codec, and bombs that fit in
  the frame, several batches back to back.
- ``frame``: a frame with a correct length prefix around random bytes, a mutated envelope
  (api key, version, correlation id, client id, body of the wrong type or shape), a valid
  request with bytes flipped, or one cut short.
- ``stream``: random bytes on a connection of their own, ended with end-of-stream.

Every input is a pure function of ``(seed, lane, number)``: each connection (lane) has its
own ``Generator(seed, lane)``, so ``replay(seed, lane, number)`` rebuilds an input the
driver reports, whatever the timing of the run was.

The oracle (``Driver``): every response frame decodes (``decode_response``); on the
connections with valid envelopes, responses carry the correlation ids sent, in order (an
acks=0 produce may have none), no response says UNKNOWN_SERVER_ERROR, the inter-broker APIs
are refused, and nothing closes such a connection but an acks=0 produce that failed (Kafka's
rule: no response to tell it); on the other connections, the broker
answers a probe behind the inputs or closes the connection; nothing waits longer than
``hang_s`` without an answer. ``check`` (the test's well-behaved client) is called every
``check_every_s`` while the lanes' requests are in flight.

One kind of answer is counted, not failed (``Stats.amplified``): a request listing hundreds of
thousands of entries (group ids, partitions) within the frame limit gets one result map per
entry, and that well-formed response can pass the object bound ``decode_response`` applies to
every frame (``protocol.codec``: one object per 64 bytes, at least 2^20), so Tidelog's own
client would refuse it. It is decoded without the bound, judged like any other, and reported.
"""

from __future__ import annotations

import copy
import math
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

import msgpack
from crc32c import crc32c

from tests.support import fuzz_lanes
from tests.support.fuzz_lanes import PROBE_CORRELATION_ID, BatchMutations, LaneDriver, frame, wrap
from tidelog.protocol import messages as m
from tidelog.protocol.apis import APIS
from tidelog.protocol.codec import ApiKey, RequestHeader, decode_request, decode_response, encode_request
from tidelog.protocol.errors import UNKNOWN_SERVER_ERROR, InvalidRequestError, all_codes
from tidelog.protocol.records import Codec, build_batch, compress

INTER_BROKER = frozenset({ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA,
                          ApiKey.CONTROLLED_SHUTDOWN})
# APIs that may legitimately wait (a long poll, a rebalance): never byte-flipped blindly
WAITING = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})

INT_EXTREMES = (0, -1, 1, 127, 128, -129, 255, 32767, 32768, -32769, 65535, 65536, 2**31 - 1, 2**31,
                -2**31, -2**31 - 1, 2**32, 2**63 - 1, 2**63, -2**63, 2**64 - 1)
FLOAT_ODDITIES = (math.nan, math.inf, -math.inf, 0.5, -0.0, 1e300, float(2**64))
BAD_NAMES = ("..", ".", "/", "a/b", "../victim", "/etc/passwd", "\x00", "nul\x00name", "x" * 250, "x" * 249, "",
             " ", "tab\tname", "é", "__consumer_offsets", "a" * 32768, "CON", "coll.x", "coll_x", "-", "_")
# a valid int field set to these by a mutation would make the request wait that long
CLAMPED = {"max_wait_ms": 1000, "rebalance_timeout_ms": 10000, "session_timeout_ms": 10000}
MAX_FUZZ_INT = 2**64 - 1  # what msgpack can carry


# -- msgpack with what packb refuses to write ----------------------------------------------------


@dataclass(frozen=True)
class RawStr:
    """A msgpack str whose bytes need not be UTF-8."""
    data: bytes


@dataclass(frozen=True)
class DupKey:
    """A map key written as ``key``: a map holding it and ``key`` has the key twice."""
    key: Any
    salt: int = 0


@dataclass(frozen=True)
class Packed:
    """Bytes written as they are (deep nesting that would overflow a recursive packer)."""
    data: bytes


def pack(value: Any) -> bytes:
    """msgpack of ``value``, with RawStr, DupKey and Packed written as they say."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        out = bytearray()
        _pack_into(out, value, msgpack.Packer(use_bin_type=True))
        return bytes(out)


def _pack_into(out: bytearray, value: Any, packer: msgpack.Packer) -> None:
    t = type(value)
    if t is dict:
        out += packer.pack_map_header(len(value))
        for k, v in value.items():
            _pack_into(out, k.key if type(k) is DupKey else k, packer)
            _pack_into(out, v, packer)
    elif t is list or t is tuple:
        out += packer.pack_array_header(len(value))
        for v in value:
            _pack_into(out, v, packer)
    elif t is RawStr:
        n = len(value.data)
        out += (bytes([0xA0 | n]) if n < 32 else b"\xd9" + bytes([n]) if n < 256
                else b"\xda" + struct.pack(">H", n) if n < 65536 else b"\xdb" + struct.pack(">I", n))
        out += value.data
    elif t is Packed:
        out += value.data
    else:
        out += packer.pack(value)


# -- valid requests, one small instance per API --------------------------------------------------


@dataclass
class Names:
    """What the generated requests name: the fuzz topics (never the well-behaved client's),
    topics CreateTopics and DeleteTopics may churn, and groups."""
    topics: tuple[str, ...] = ("fuzz-a", "fuzz-b")
    churn: tuple[str, ...] = ("fuzz-c", "fuzz-d", "fuzz-e")
    groups: tuple[str, ...] = ("fuzz-g1", "fuzz-g2")
    partitions: int = 2


def _now_ms() -> int:
    return int(time.time() * 1000)


class Valid:
    """Small valid typed requests, one builder per API (``VALID``)."""

    def __init__(self, rng: Random, names: Names):
        self.rng, self.names = rng, names

    def topic(self) -> str:
        return self.rng.choice(self.names.topics)

    def partition(self) -> int:
        return self.rng.randrange(self.names.partitions)

    def group(self) -> str:
        # mostly a group of its own, so a join never waits for members of an earlier input
        return self.rng.choice(self.names.groups) if self.rng.random() < 0.2 else f"fuzz-g-{self.rng.getrandbits(40):x}"

    def epoch(self) -> int:
        return self.rng.choice((-1, 0, 2**31 - 1, self.rng.randrange(1000, 2**31)))

    def broker_epoch(self) -> int:
        return self.rng.choice((-1, 0, self.rng.randrange(2**40, 2**62)))

    def batch(self) -> bytes:
        rng = self.rng
        records = [(rng.choice((None, b"k%d" % i)), rng.randbytes(rng.randrange(0, 64)),
                    rng.choice((None, [("h", b"v")], [("a", None), ("b", b"")])), None)
                   for i in range(rng.randint(1, 5))]
        return build_batch(records, codec=rng.choice(list(Codec)), timestamp_ms=_now_ms())

    def partition_state(self) -> m.PartitionState:
        return m.PartitionState(self.topic(), self.partition(), self.epoch(), self.rng.choice((1, 2, -1)),
                                self.epoch(), [1], self.rng.randrange(100), [1, 2], self.rng.random() < 0.5)

    def live_broker(self) -> m.LiveBroker:
        return m.LiveBroker(self.rng.choice((1, 2, 3)), "127.0.0.1", self.rng.randrange(1, 65536))


def _produce(v: Valid) -> m.Message:
    return m.ProduceRequest(v.rng.choice((1, -1)), 5000, [m.TopicProduceData(v.topic(), [
        m.PartitionProduceData(v.partition(), v.batch())])])


def _fetch(v: Valid) -> m.Message:
    r = v.rng
    return m.FetchRequest([m.FetchTopic(v.topic(), [m.FetchPartition(v.partition(), r.choice((0, r.randrange(100))),
                                                                        r.randrange(1, 1 << 16))])],
                          max_wait_ms=r.randrange(0, 100), min_bytes=r.choice((0, 1)), max_bytes=1 << 16)


def _list_offsets(v: Valid) -> m.Message:
    return m.ListOffsetsRequest([m.ListOffsetsTopic(v.topic(), [
        m.ListOffsetsPartition(v.partition(), v.rng.choice((-1, -2, -3, _now_ms() - 1000)))])])


def _metadata(v: Valid) -> m.Message:
    return m.MetadataRequest(v.rng.choice((None, [v.topic()], [v.topic(), v.rng.choice(v.names.churn)])),
                             v.rng.random() < 0.5)


def _leader_and_isr(v: Valid) -> m.Message:
    return m.LeaderAndIsrRequest(v.rng.choice((1, 2, 0)), v.epoch(), v.broker_epoch(), [v.partition_state()],
                                 [v.live_broker()], {v.topic(): {"retention.ms": "1000"}})


def _stop_replica(v: Valid) -> m.Message:
    return m.StopReplicaRequest(v.rng.choice((1, 2, 0)), v.epoch(), v.broker_epoch(), [
        m.StopReplicaPartition(v.topic(), v.partition(), v.epoch(), v.rng.random() < 0.5)])


def _update_metadata(v: Valid) -> m.Message:
    return m.UpdateMetadataRequest(v.rng.choice((1, 2, 0)), v.epoch(), v.broker_epoch(), [v.partition_state()],
                                   [v.live_broker()], [v.rng.choice(v.names.churn)], "fuzz-cluster",
                                   {v.topic(): {"cleanup.policy": "compact"}})


def _controlled_shutdown(v: Valid) -> m.Message:
    return m.ControlledShutdownRequest(v.rng.choice((1, 2, -1)), v.broker_epoch())


def _offset_commit(v: Valid) -> m.Message:
    return m.OffsetCommitRequest(v.group(), [m.OffsetCommitTopic(v.topic(), [
        m.OffsetCommitPartition(v.partition(), v.rng.randrange(0, 1000), -1, "meta")])],
        retention_time_ms=v.rng.choice((-1, 60000)))


def _offset_fetch(v: Valid) -> m.Message:
    return m.OffsetFetchRequest(v.group(), v.rng.choice((None, [m.OffsetFetchTopic(v.topic(), [0, 1])])))


def _find_coordinator(v: Valid) -> m.Message:
    return m.FindCoordinatorRequest(v.group(), v.rng.choice((0, 1)))


def _join_group(v: Valid) -> m.Message:
    return m.JoinGroupRequest(v.group(), v.rng.randrange(6000, 10001), "", "consumer",
                              [m.JoinGroupProtocol("range", b"\x00\x01meta")], v.rng.randrange(1000, 5000))


def _heartbeat(v: Valid) -> m.Message:
    return m.HeartbeatRequest(v.group(), v.rng.randrange(-1, 5), f"member-{v.rng.randrange(5)}")


def _leave_group(v: Valid) -> m.Message:
    return m.LeaveGroupRequest(v.group(), [m.MemberIdentity(f"member-{v.rng.randrange(5)}")])


def _sync_group(v: Valid) -> m.Message:
    member = f"member-{v.rng.randrange(5)}"
    return m.SyncGroupRequest(v.group(), v.rng.randrange(-1, 5), member, [m.SyncGroupAssignment(member, b"\x00")])


def _describe_groups(v: Valid) -> m.Message:
    return m.DescribeGroupsRequest([v.group(), v.group()])


def _list_groups(v: Valid) -> m.Message:
    return m.ListGroupsRequest(v.rng.choice(([], ["Stable"], ["Empty", "Dead"])))


def _api_versions(v: Valid) -> m.Message:
    return m.ApiVersionsRequest("fuzz", "0")


def _create_topics(v: Valid) -> m.Message:
    r = v.rng
    topic = m.CreatableTopic(r.choice(v.names.churn), r.randint(1, 3), 1,
                             r.choice((None, {"0": [1], "1": [1]})),
                             r.choice(({}, {"retention.ms": "60000"}, {"cleanup.policy": "compact"})))
    return m.CreateTopicsRequest([topic], 5000, r.random() < 0.5)


def _delete_topics(v: Valid) -> m.Message:
    return m.DeleteTopicsRequest([v.rng.choice(v.names.churn)], 5000)


def _delete_records(v: Valid) -> m.Message:
    return m.DeleteRecordsRequest([m.DeleteRecordsTopic(v.topic(), [
        m.DeleteRecordsPartition(v.partition(), v.rng.choice((-1, 0, v.rng.randrange(100))))])], 5000)


def _init_producer_id(v: Valid) -> m.Message:
    return v.rng.choice((m.InitProducerIdRequest(), m.InitProducerIdRequest(None, 60000, v.rng.randrange(1000), 0)))


def _offsets_for_leader_epoch(v: Valid) -> m.Message:
    return m.OffsetsForLeaderEpochRequest([m.OffsetForLeaderTopic(v.topic(), [
        m.OffsetForLeaderPartition(v.partition(), v.rng.randrange(-1, 3))])])


CONFIGS = ({"retention.ms": "600000"}, {"retention.ms": None}, {"cleanup.policy": "compact"},
           {"cleanup.policy": "delete"}, {"max.message.bytes": "100000"}, {"max.message.bytes": None},
           {"min.insync.replicas": "2"}, {"min.insync.replicas": None}, {"segment.bytes": "1048576"},
           {"message.timestamp.difference.max.ms": "1000"}, {"message.timestamp.difference.max.ms": None},
           {"compression.type": "gzip"}, {"retention.bytes": "100000"}, {"retention.bytes": None})


def _describe_configs(v: Valid) -> m.Message:
    return m.DescribeConfigsRequest([m.DescribeConfigsResource(m.TOPIC_RESOURCE, v.topic(), None),
                                     m.DescribeConfigsResource(m.BROKER_RESOURCE, "1", ["log.dirs"])])


def _alter_configs(v: Valid) -> m.Message:
    return m.AlterConfigsRequest([m.AlterConfigsResource(m.TOPIC_RESOURCE, v.topic(), dict(v.rng.choice(CONFIGS)))],
                                 v.rng.random() < 0.5)


def _create_partitions(v: Valid) -> m.Message:
    return m.CreatePartitionsRequest([m.CreatePartitionsTopic(v.rng.choice(v.names.churn), v.rng.randint(1, 5))],
                                     5000, v.rng.random() < 0.5)


def _delete_groups(v: Valid) -> m.Message:
    return m.DeleteGroupsRequest([v.group()])


def _elect_leaders(v: Valid) -> m.Message:
    return m.ElectLeadersRequest(v.rng.choice((None, [m.TopicPartitionRef(v.topic(), v.partition())])), 0, 5000)


def _alter_partition_reassignments(v: Valid) -> m.Message:
    r = v.rng
    replicas = r.choice((None, r.sample((1, 2, 3), r.randint(1, 3)), [r.choice((1, 2, 3, 7))]))
    return m.AlterPartitionReassignmentsRequest([m.ReassignableTopic(v.topic(), [
        m.ReassignablePartition(v.partition(), replicas)])], 5000)


def _list_partition_reassignments(v: Valid) -> m.Message:
    return m.ListPartitionReassignmentsRequest(
        v.rng.choice((None, [m.ListPartitionReassignmentsTopics(v.topic(), [v.partition()])])), 5000)


def _describe_log_dirs(v: Valid) -> m.Message:
    return m.DescribeLogDirsRequest(v.rng.choice((None, [m.DescribableLogDirTopic(v.topic(), [v.partition()])])))


VALID: dict[ApiKey, Callable[[Valid], m.Message]] = {
    ApiKey.PRODUCE: _produce, ApiKey.FETCH: _fetch, ApiKey.LIST_OFFSETS: _list_offsets,
    ApiKey.METADATA: _metadata, ApiKey.LEADER_AND_ISR: _leader_and_isr, ApiKey.STOP_REPLICA: _stop_replica,
    ApiKey.UPDATE_METADATA: _update_metadata, ApiKey.CONTROLLED_SHUTDOWN: _controlled_shutdown,
    ApiKey.OFFSET_COMMIT: _offset_commit, ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator, ApiKey.JOIN_GROUP: _join_group, ApiKey.HEARTBEAT: _heartbeat,
    ApiKey.LEAVE_GROUP: _leave_group, ApiKey.SYNC_GROUP: _sync_group, ApiKey.DESCRIBE_GROUPS: _describe_groups,
    ApiKey.LIST_GROUPS: _list_groups, ApiKey.API_VERSIONS: _api_versions, ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DELETE_TOPICS: _delete_topics, ApiKey.DELETE_RECORDS: _delete_records,
    ApiKey.INIT_PRODUCER_ID: _init_producer_id, ApiKey.OFFSETS_FOR_LEADER_EPOCH: _offsets_for_leader_epoch,
    ApiKey.DESCRIBE_CONFIGS: _describe_configs, ApiKey.ALTER_CONFIGS: _alter_configs,
    ApiKey.CREATE_PARTITIONS: _create_partitions, ApiKey.DELETE_GROUPS: _delete_groups,
    ApiKey.ELECT_LEADERS: _elect_leaders, ApiKey.ALTER_PARTITION_REASSIGNMENTS: _alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _list_partition_reassignments, ApiKey.DESCRIBE_LOG_DIRS: _describe_log_dirs,
}


def _acl_filter(v: Valid) -> m.AclFilter:
    return m.AclFilter(v.rng.randrange(1, 6), v.rng.randrange(1, 13), v.rng.randrange(1, 4),
                       v.rng.choice((None, v.topic(), "*")), v.rng.randrange(1, 5),
                       v.rng.choice((None, "User:alice", "User:*")), v.rng.choice((None, "*")))


def _describe_acls(v: Valid) -> m.Message:
    f = _acl_filter(v)
    return m.DescribeAclsRequest(f.resource_type_filter, f.operation, f.permission_type, f.resource_name_filter,
                                 f.pattern_type_filter, f.principal_filter, f.host_filter)


def _create_acls(v: Valid) -> m.Message:
    return m.CreateAclsRequest([m.AclCreation(2, v.topic(), v.rng.choice(("User:alice", "User:*")), "*",
                                              v.rng.randrange(2, 13), v.rng.randrange(2, 4), v.rng.randrange(3, 5))])


def _delete_acls(v: Valid) -> m.Message:
    return m.DeleteAclsRequest([_acl_filter(v)])


VALID.update({ApiKey.DESCRIBE_ACLS: _describe_acls, ApiKey.CREATE_ACLS: _create_acls,
              ApiKey.DELETE_ACLS: _delete_acls})


# Not sent to the live broker: AlterClientQuotas succeeds whenever a mutation or a flipped bit
# leaves it well formed (validate_only gone, a name turned into the default entity or the run's
# own client id), and a quota on the run's clients throttles them all, the well-behaved one
# included: that is quotas working, not a finding (a run fell to 40 inputs/s). Its decoding and
# checks are covered by the unit and component tests of entity_configs.py and quotas.py.
LIVE_EXCLUDED = frozenset({ApiKey.ALTER_CLIENT_QUOTAS})


def _quota_entity(v: Valid) -> list[m.ClientQuotaEntityData]:
    # never the default entity (None), nor the fuzzer's own ids: a real quota on the clients of
    # the run would throttle them, the well-behaved one included (see _guard_quotas)
    return [m.ClientQuotaEntityData(v.rng.choice(("user", "client-id")), v.rng.choice(("alice", "app")))]


VALID.update({
    ApiKey.DESCRIBE_CLIENT_QUOTAS: lambda v: m.DescribeClientQuotasRequest(
        [m.ClientQuotaFilterComponent(v.rng.choice(("user", "client-id")), v.rng.randrange(0, 3))], v.rng.random() < 0.5),
    ApiKey.ALTER_CLIENT_QUOTAS: lambda v: m.AlterClientQuotasRequest(
        [m.AlterClientQuotasEntry(_quota_entity(v), [m.ClientQuotaOp("producer_byte_rate", 1024.0 * v.rng.randrange(1, 9))])],
        validate_only=True),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: lambda v: m.DescribeUserScramCredentialsRequest(
        v.rng.choice((None, [m.ScramUserName("alice")]))),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: lambda v: m.AlterUserScramCredentialsRequest(
        [m.ScramCredentialDeletion("mallory", v.rng.randrange(0, 3))]),
})
VALID.update({
    ApiKey.SASL_HANDSHAKE: lambda v: m.SaslHandshakeRequest(v.rng.choice(("PLAIN", "SCRAM-SHA-256", "GSSAPI"))),
    ApiKey.SASL_AUTHENTICATE: lambda v: m.SaslAuthenticateRequest(v.rng.randbytes(v.rng.randrange(0, 64))),
})


# -- body mutations ----------------------------------------------------------------------------


def _nodes(value: Any, out: list, depth: int = 0) -> list:
    """Every (container, key) of a body, containers before what they hold."""
    if depth > 12:
        return out
    if type(value) is dict:
        for k in list(value):
            out.append((value, k))
            _nodes(value[k], out, depth + 1)
    elif type(value) is list and len(value) <= 64:
        for i in range(len(value)):
            out.append((value, i))
            _nodes(value[i], out, depth + 1)
    return out


NAME_WORDS = ("name", "topic", "group", "member", "key", "resource", "protocol", "client", "host", "cluster")


class BodyMutator:
    """Mutations of a body map in place; each returns what it did."""

    KINDS = ("drop", "duplicate", "retype", "int", "float", "string", "name", "nested", "huge_list",
             "unknown_field", "empty", "bytes")
    WEIGHTS = (8, 6, 10, 14, 3, 6, 8, 4, 1, 3, 4, 3)

    def __init__(self, rng: Random, max_frame_bytes: int):
        self.rng, self.max_frame_bytes = rng, max_frame_bytes

    def mutate(self, body: dict) -> list[str]:
        done = []
        for _ in range(self.rng.choice((1, 1, 1, 2, 2, 3))):
            nodes = _nodes(body, [])
            if not nodes:
                body["fuzz"] = self.retyped(None)
                done.append("unknown_field:fuzz")
                continue
            container, key = self.rng.choice(nodes)
            kind = self.rng.choices(self.KINDS, self.WEIGHTS)[0]
            done.append(f"{kind}:{key!r:.30}")
            getattr(self, kind)(container, key)
        return done

    def drop(self, c: Any, k: Any) -> None:
        del c[k]

    def duplicate(self, c: Any, k: Any) -> None:
        if type(c) is list:
            c.insert(k, copy.deepcopy(c[k]))
        else:
            key = DupKey(k.key if type(k) is DupKey else k, self.rng.getrandbits(32))
            c[key] = self.rng.choice((copy.deepcopy(c[k]), self.retyped(c[k])))

    def retype(self, c: Any, k: Any) -> None:
        c[k] = self.retyped(c[k])

    def retyped(self, old: Any) -> Any:
        r = self.rng
        choices = [None, True, False, 0, -1, 1.5, "", "text", b"", b"\x00bin", [], {}, [old], {"x": old},
                   msgpack.ExtType(r.randrange(128), b"ext"), RawStr(b"\xff\xfe"), {1: 2}, [None] * 3]
        return r.choice([x for x in choices if type(x) is not type(old)] or choices)

    def int(self, c: Any, k: Any) -> None:
        value = self.rng.choice(INT_EXTREMES) if self.rng.random() < 0.8 else self.rng.randint(-2**63, MAX_FUZZ_INT)
        c[k] = _clamped(k, value)

    def float(self, c: Any, k: Any) -> None:
        c[k] = self.rng.choice(FLOAT_ODDITIES)

    def string(self, c: Any, k: Any) -> None:
        r = self.rng
        c[k] = r.choice(("x" * r.choice((250, 256, 1000, 32767, 32768, 70000)), "\u0000" * 5, "😀" * 100,
                         "\u202e\ufeff", RawStr(b"\xc3\x28\xa0\xa1"), RawStr(r.randbytes(r.randrange(1, 64))),
                         "%s%n%x", "\n" * 10))

    def name(self, c: Any, k: Any) -> None:
        value = self.rng.choice(BAD_NAMES)
        if type(c[k]) is list:
            c[k] = [value]
        elif type(c[k]) is dict:
            c[k] = {value: v for v in list(c[k].values())[:1]} or {value: value}
        else:
            c[k] = value

    def nested(self, c: Any, k: Any) -> None:
        r = self.rng
        depth = r.choice((50, 500, 10_000, 100_000))
        c[k] = r.choice((Packed(b"\x91" * depth + b"\xc0"), Packed(b"\x81\xa1a" * depth + b"\xc0"),
                         {1: {2: [3]}}, {"a": [{"b": [[[[]]]]}], "c": {"d": {}}},
                         [[1, [2, [3, [4, "x"]]]]], Packed(b"\xc1"), Packed(b"\xd6\xff\x00\x00\x00\x01"),  # a msgpack timestamp
                         Packed(b"\xd7\xff" + b"\xff" * 8)))

    def huge_list(self, c: Any, k: Any) -> None:
        old = c[k]
        item = copy.deepcopy(old[0]) if type(old) is list and old else old
        size = max(1, len(pack(item)))
        n = self.rng.randint(1000, max(1001, (self.max_frame_bytes - 4096) // size))
        c[k] = [item] * min(n, 400_000)

    def unknown_field(self, c: Any, k: Any) -> None:
        target = c if type(c) is dict else c[k] if type(c[k]) is dict else None
        if target is not None:
            target[self.rng.choice(("fuzz", "", "ÿ", "x" * 300))] = self.retyped(None)
        else:
            c[k] = {"fuzz": 1}

    def empty(self, c: Any, k: Any) -> None:
        c[k] = self.rng.choice(([], {}, "", b"", None, 0))

    def bytes(self, c: Any, k: Any) -> None:
        c[k] = self.rng.randbytes(self.rng.randrange(0, 300))


def _clamped(key: Any, value: int) -> int:
    """A valid value for a field that makes the request wait is kept short (a fetch with
    max_wait_ms 2^31-1 waiting that long is correct, not a hang)."""
    cap = CLAMPED.get(key) if type(key) is str else None
    if cap is not None and 0 <= value <= 2**31 - 1:
        return value % (cap + 1)
    return value


def _guard_inter_broker(body: dict) -> None:
    """Keep an inter-broker request's claims off what a young cluster holds (controller epoch
    1, a broker epoch that is a small zxid), so that the broker refuses each one for certain."""
    if type(body.get("controller_epoch")) is int and 0 < body["controller_epoch"] < 1000:
        body["controller_epoch"] += 1000
    if type(body.get("broker_epoch")) is int and 0 < body["broker_epoch"] < 2**32:
        body["broker_epoch"] += 2**40


# -- record batch mutations ----------------------------------------------------------------------

_TAIL = struct.Struct(">hiqqqhii")  # attributes .. record_count: the bytes the CRC starts with
_HEAD = struct.Struct(">qiibI")


def forge(block: bytes, *, count: int, codec: int = 0, attributes: int | None = None,
          last_offset_delta: int | None = None, first_ts: int | None = None, max_ts: int | None = None,
          producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1, base_offset: int = 0,
          leader_epoch: int = -1, magic: int = 2, batch_length: int | None = None, crc: int | None = None) -> bytes:
    """A batch with every header field as given (wrapped to its width), the CRC computed
    unless given."""
    now = _now_ms()
    tail = _TAIL.pack(wrap(codec if attributes is None else attributes, 16),
                      wrap(count - 1 if last_offset_delta is None else last_offset_delta, 32),
                      wrap(now if first_ts is None else first_ts, 64), wrap(now if max_ts is None else max_ts, 64),
                      wrap(producer_id, 64), wrap(producer_epoch, 16), wrap(base_sequence, 32),
                      wrap(count, 32))
    crc = crc32c(block, crc32c(tail)) if crc is None else crc & 0xFFFFFFFF
    length = len(tail) + len(block) + 9 if batch_length is None else batch_length
    return _HEAD.pack(wrap(base_offset, 64), wrap(length, 32), wrap(leader_epoch, 32), wrap(magic, 8), crc) \
        + tail + block


_BOMBS: dict[str, bytes] = {}


def bombs() -> dict[str, bytes]:
    """Compressed blocks that inflate far beyond any limit, made once per process."""
    if not _BOMBS:
        zeros = b"\x00" * (64 << 20)
        nil_records = b"\xdd" + struct.pack(">I", 8_000_000) + b"\x95\x00\x00\xc0\xc0\xc0" * 8_000_000
        for codec in (Codec.GZIP, Codec.LZ4, Codec.ZSTD):
            _BOMBS[f"zeros-{codec.name}"] = compress(codec, zeros)
            _BOMBS[f"records-{codec.name}"] = compress(codec, nil_records)
        _BOMBS["zeros-GZIP-raw-deflate"] = zlib.compress(zeros, 9)
    return _BOMBS


class BatchMutator(BatchMutations):
    """Record sets for a Produce: one valid batch mutated, or several batches."""

    WEIGHTS = (10, 12, 16, 14, 12, 3, 6, 5, 6)

    def __init__(self, rng: Random, valid: Valid, max_frame_bytes: int):
        self.rng, self.valid, self.max_frame_bytes = rng, valid, max_frame_bytes

    def valid_batch(self) -> bytes:
        return self.valid.batch()

    def small_batch(self) -> bytes:
        return build_batch([b"s"], timestamp_ms=_now_ms())

    def _int(self) -> int:
        return self.rng.choice(INT_EXTREMES) if self.rng.random() < 0.7 else self.rng.randint(-2**63, 2**63 - 1)

    def header(self) -> tuple[bytes, str]:
        r = self.rng
        n = r.randint(1, 4)
        block = msgpack.packb([[0, i, None, b"v%d" % i, None] for i in range(n)], use_bin_type=True)
        fields = {"count": n}
        for name in r.sample(("count", "last_offset_delta", "first_ts", "max_ts", "attributes", "producer_id",
                              "producer_epoch", "base_sequence", "base_offset", "leader_epoch", "magic",
                              "batch_length"), r.randint(1, 3)):
            if name == "count":
                fields[name] = r.choice((0, -1, n - 1, n + 1, 2**31 - 1, -2**31, 10_000))
            elif name == "attributes":
                fields[name] = r.choice((0x08, 0x10, 0x20, 0x40, 0x07, 0x02, 0x05, 0x06, 0x7F, -1, 0x30, 0x28))
            elif name == "magic":
                fields[name] = r.choice((0, 1, 3, -1, 127))
            elif name == "batch_length":
                fields[name] = r.choice((0, -1, 48, 49, len(block) + 48, len(block) + 50, 2**31 - 1))
            else:
                fields[name] = self._int()
        return forge(block, **fields), ",".join(f"{k}={v}" for k, v in fields.items())

    def _records_block(self) -> tuple[bytes, int, str]:
        """A records block (uncompressed) of some shape, the count the header should claim."""
        r = self.rng
        n = r.randint(1, 5)
        shape = r.choice(("not-msgpack", "map", "scalar", "arity", "types", "deltas", "timestamps", "headers",
                          "extra", "many", "short", "trailing", "nested"))
        recs: Any = [[0, i, None, b"v", None] for i in range(n)]
        if shape == "not-msgpack":
            return r.randbytes(r.randrange(1, 200)), n, shape
        if shape == "map":
            recs = {"records": recs}
        elif shape == "scalar":
            recs = r.choice((0, "x", None, b"bin", 1.5))
        elif shape == "arity":
            recs = [rec[:r.randrange(0, 5)] + ([None] * r.randrange(0, 3)) for rec in recs]
        elif shape == "types":
            rec = recs[r.randrange(n)]
            rec[r.randrange(5)] = r.choice(("str", 1.5, [], {}, True, -1, b"b", None, 2**63 - 1, -2**63))
        elif shape == "deltas":
            for rec in recs:
                rec[1] = r.choice((0, -1, n, 2**31, r.randrange(n)))
        elif shape == "timestamps":
            for rec in recs:
                rec[0] = r.choice((-1, -2**63, 2**63 - 1, 10**12, 1, 2**64 - 1))
        elif shape == "headers":
            recs[0][4] = r.choice(([[1, b"x"]], [["k"]], "str", [["k", "v"]], [["k", b"v", 3]], {"k": b"v"}, [None]))
        elif shape == "extra":
            recs.append([0, n, None, b"extra", None])
        elif shape == "many":
            n = r.randint(1000, 60_000)
            recs = [[0, i, None, None, None] for i in range(n)]
        elif shape == "short":
            recs = recs[:-1] if n > 1 else []
        elif shape == "nested":
            return b"\x91" * 10_000 + b"\xc0", n, shape
        block = pack(recs)
        if shape == "trailing":
            block += r.randbytes(r.randrange(1, 20))
        return block, n, shape

    def block(self) -> tuple[bytes, str]:
        block, n, shape = self._records_block()
        return forge(block, count=n), shape

    def compressed(self) -> tuple[bytes, str]:
        r = self.rng
        codec = r.choice((Codec.GZIP, Codec.LZ4, Codec.ZSTD))
        what = r.choice(("garbage", "records", "torn", "wrong-codec", "empty", "valid"))
        if what == "garbage":
            data = r.randbytes(r.randrange(0, 300))
            n = r.randint(1, 3)
        elif what == "empty":
            data, n = compress(codec, b""), 1
        else:
            block, n, shape = self._records_block() if what != "valid" else (
                msgpack.packb([[0, 0, None, b"ok", None]]), 1, "valid")
            data = compress(codec, block)
            if what == "torn":
                data = data[:r.randrange(len(data))]
            elif what == "wrong-codec":
                codec = r.choice([c for c in (Codec.GZIP, Codec.LZ4, Codec.ZSTD) if c != codec])
            what += f"/{shape}"
        return forge(data, count=n, codec=codec), f"{codec.name}/{what}"

    def bomb(self) -> tuple[bytes, str]:
        name, data = self.rng.choice(sorted(bombs().items()))
        codec = Codec[name.split("-")[1]]
        count = self.rng.choice((1, 8_000_000, 2**31 - 1))
        return forge(data, count=count, codec=codec), f"{name},count={count}"


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """One input: the bytes to write (length prefix included) and what to expect."""
    lane: int
    number: int
    kind: str  # body, batch, frame, stream
    api_key: int | None
    mutation: str
    data: bytes
    correlation_id: int | None = None  # known when the envelope is valid
    may_skip: bool = False  # an acks=0 produce: answered only if refused as a whole, its connection
    # closed if refused otherwise
    tags: tuple[str, ...] = ()  # the mutation kinds, for the statistics

    def describe(self) -> str:
        api = ApiKey(self.api_key).name if self.api_key in APIS else self.api_key
        return (f"lane {self.lane} input {self.number}: {self.kind} {api} [{self.mutation}] "
                f"{len(self.data)} bytes, starts {self.data[:120].hex()}")


class Generator:
    """The inputs of one lane: a pure function of ``(seed, lane)`` and how many were drawn."""

    def __init__(self, seed: int, lane: int, names: Names | None = None, max_frame_bytes: int = 1 << 20):
        self.rng = Random(f"{seed}/{lane}")
        self.seed, self.lane, self.number = seed, lane, 0
        self.max_frame_bytes = max_frame_bytes
        self.valid = Valid(self.rng, names or Names())
        self.body_mutator = BodyMutator(self.rng, max_frame_bytes)
        self.batch_mutator = BatchMutator(self.rng, self.valid, max_frame_bytes)
        self.apis = sorted(set(APIS) - LIVE_EXCLUDED)

    def _next(self, kind: str, api_key: int | None, mutation: str, data: bytes, **kw: Any) -> Input:
        self.number += 1
        return Input(self.lane, self.number, kind, api_key, mutation, data, **kw)

    def structured(self, correlation_id: int) -> Input:
        """A valid envelope: a mutated body of any API, or a Produce of a mutated batch."""
        for _ in range(5):
            if self.rng.random() < 0.3:
                made = self._batch_body()
            else:
                made = self._mutated_body()
            api_key, version, body, mutation, kind, tags = made
            data = frame(_encode(api_key, version, correlation_id, body))
            if len(data) - 4 <= self.max_frame_bytes:
                skip = api_key == ApiKey.PRODUCE and _acks_zero(data)
                return self._next(kind, api_key, mutation, data, correlation_id=correlation_id, may_skip=skip,
                                  tags=tags)
        return self._next("body", ApiKey.API_VERSIONS, "none", frame(encode_request(
            RequestHeader(ApiKey.API_VERSIONS, 0, correlation_id, "fuzz"), m.ApiVersionsRequest())),
            correlation_id=correlation_id)

    def _mutated_body(self) -> tuple:
        api_key = self.rng.choice(self.apis)
        body = VALID[api_key](self.valid).to_body()
        done = self.body_mutator.mutate(body)
        if api_key in INTER_BROKER:
            _guard_inter_broker(body)
        version = self._version(api_key)
        tags = tuple(d.split(":")[0] for d in done) + (("version",) if version else ())
        return api_key, version, body, f"v{version} " + " ".join(done), "body", tags

    def _batch_body(self) -> tuple:
        records, mutation = self.batch_mutator.make()
        acks = self.rng.choice((1, 1, -1, -1, 0))
        body = m.ProduceRequest(acks, 5000, [m.TopicProduceData(self.valid.topic(), [
            m.PartitionProduceData(self.valid.partition(), records)])]).to_body()
        return ApiKey.PRODUCE, 0, body, f"acks={acks} " + mutation, "batch", (mutation.split(":")[0],)

    def _version(self, api_key: int) -> int:
        return 0 if self.rng.random() < 0.95 else self.rng.choice((-1, 1, 7, 32767, -32768))

    def framed(self) -> Input:
        """A frame with a correct length prefix whose body is anything."""
        r = self.rng
        kind = r.choice(("random", "random-array", "envelope", "envelope", "flipped", "cut", "trailing", "empty"))
        if kind == "random":
            body = r.randbytes(r.randrange(0, 2048))
        elif kind == "random-array":
            body = bytes([0x95]) + r.randbytes(r.randrange(0, 512))
        elif kind == "envelope":
            body, detail = self._mutated_envelope()
            kind += ":" + detail
        elif kind == "empty":
            body = b""
        else:
            api_key = r.choice([k for k in self.apis if k not in WAITING])
            body = _encode(api_key, 0, r.randrange(2**31), VALID[api_key](self.valid).to_body())
            if kind == "flipped":
                b = bytearray(body)
                for _ in range(r.randint(1, 4)):
                    b[r.randrange(len(b))] = r.randrange(256)
                body = bytes(b)
            elif kind == "cut":
                body = body[:r.randrange(len(body))]
            else:
                body += r.randbytes(r.randint(1, 16))
            return self._next("frame", api_key, kind, frame(body), tags=(kind,))
        return self._next("frame", None, kind, frame(body), tags=(kind.split(":")[0],))

    def _mutated_envelope(self) -> tuple[bytes, str]:
        r = self.rng
        api_key = r.choice(self.apis)
        items: list[Any] = [int(api_key), 0, r.randrange(2**31), "fuzz", VALID[api_key](self.valid).to_body()]
        if api_key in WAITING:
            items[4] = {}
        i = r.randrange(6)
        if i == 5:  # the shape
            items = r.choice((items[:4], items + [0], {"api_key": 0}, items[0], [items]))
            return pack(items), "shape"
        items[i] = r.choice((None, "x", b"b", 1.5, [], {}, True, RawStr(b"\xff"), "x" * 70000, 999, 17, 36,
                             *INT_EXTREMES[:8], -2**31, 2**31, 2**63, -2**63, math.nan, {1: 2}, [1, 2],
                             msgpack.ExtType(1, b"x")))
        return pack(items), f"item {i}={items[i]!r:.30}"

    def stream(self) -> Input:
        """Bytes for a connection of their own, ended with end-of-stream."""
        r = self.rng
        kind = r.choice(("random", "huge-prefix", "partial", "frames-then-garbage"))
        if kind == "random":
            data = r.randbytes(r.randint(1, 4096))
        elif kind == "huge-prefix":
            data = struct.pack(">I", r.choice((0xFFFFFFFF, 0x80000000, self.max_frame_bytes + 1))) + r.randbytes(100)
        elif kind == "partial":
            data = struct.pack(">I", r.randrange(1, self.max_frame_bytes)) + r.randbytes(r.randrange(0, 1000))
        else:
            data = frame(encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, 7, "fuzz"), m.ApiVersionsRequest()))
            data += r.randbytes(r.randint(1, 64))
        return self._next("stream", None, kind, data, tags=(kind,))


def _acks_zero(data: bytes) -> bool:
    """Whether the broker reads this Produce as acks=0 (no response when it is appended): read
    as the broker reads it, since a map may carry ``acks`` twice."""
    try:
        _, body = decode_request(data[4:])
    except InvalidRequestError:
        return False
    return type(body.get("acks")) is int and body["acks"] == 0


def _encode(api_key: int, version: int, correlation_id: int, body: dict) -> bytes:
    header = [int(api_key), version, correlation_id, "fuzz", body]
    return pack(header)


def draw(g: Generator, lane_kind: str) -> Input:
    if lane_kind == "structured":
        return g.structured(0)
    if lane_kind == "frames":
        return g.framed()
    return g.stream()


def replay(seed: int, lane: int, number: int, lane_kind: str, names: Names | None = None,
           max_frame_bytes: int = 1 << 20) -> Input:
    """Input ``number`` of a lane, as the driver drew it (correlation ids as ``Driver`` numbers
    them: structured lanes count from 0, one id per input and one per probe)."""
    return fuzz_lanes.nth_input(Generator(seed, lane, names, max_frame_bytes), number, lane_kind, draw)


# -- the driver ---------------------------------------------------------------------------------


def _probe(correlation_id: int) -> bytes:
    return frame(encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, correlation_id, "fuzz-probe"),
                                m.ApiVersionsRequest()))


@dataclass
class Stats(fuzz_lanes.Stats):
    """``fuzz_lanes.Stats`` (``apis`` by API name, ``errors`` by error name) and the responses
    over the client's object bound."""
    amplified: Counter = field(default_factory=Counter)  # responses over the client's object bound, by API
    amplified_examples: list[str] = field(default_factory=list)


@dataclass
class _Pending:
    correlation_id: int
    input: Input | None  # None: the probe


class Lane(fuzz_lanes.Lane):
    """One connection: what it sent and what it still awaits (a stream lane's input may go
    unanswered)."""

    def __init__(self, index: int, kind: str, port: int, generator: Generator):
        super().__init__(index, kind, port, generator)
        self.next_correlation_id = 0
        self.acks_zero: list[int] = []  # the numbers of the acks=0 produces sent on this connection

    def overdue(self) -> bool:
        return bool(self.pending) and self.kind != "stream"


class Driver(LaneDriver):
    """Sends inputs on several lanes at once and judges every answer (module docstring;
    ``fuzz_lanes.LaneDriver`` the loop).

    ``lanes``: structured lanes (valid envelopes, ``batch`` inputs pipelined per round), one
    frames lane and one stream lane. Stops after ``seconds`` or ``max_inputs``, or once
    ``max_findings`` findings are recorded."""

    DRAIN_CAP_S = 30.0

    def __init__(self, port: int, seed: int, *, seconds: float, max_inputs: int = 10**9,
                 structured_lanes: int = 3, batch: int = 32, names: Names | None = None,
                 max_frame_bytes: int = 1 << 20, hang_s: float = 60.0,
                 check: Callable[[], None] | None = None, check_every_s: float = 2.0,
                 alive: Callable[[], bool] | None = None, max_findings: int = 20):
        kinds = ["structured"] * structured_lanes + ["frames", "stream"]
        lanes = [Lane(i, k, port, Generator(seed, i, names, max_frame_bytes)) for i, k in enumerate(kinds)]
        super().__init__(port, seed, lanes, Stats(), seconds=seconds, max_inputs=max_inputs, batch=batch,
                         hang_s=hang_s, check=check, check_every_s=check_every_s, alive=alive,
                         max_findings=max_findings)

    def _fill(self, lane: Lane) -> None:
        if lane.kind == "structured":
            for _ in range(self.lane_round_size(lane)):
                cid = lane.next_correlation_id
                lane.next_correlation_id += 1
                inp = lane.generator.structured(cid)
                self._count(inp)
                lane.out += inp.data
                lane.pending.append(_Pending(cid, inp))
                if inp.may_skip:
                    lane.acks_zero.append(inp.number)
            self._add_probe(lane, lane.next_correlation_id)
            lane.next_correlation_id += 1
        elif lane.kind == "frames":
            for _ in range(self.lane_round_size(lane) // 4 + 1):
                inp = lane.generator.framed()
                self._count(inp)
                lane.out += inp.data
                lane.pending.append(_Pending(-1, inp))
            self._add_probe(lane, PROBE_CORRELATION_ID)
        else:
            inp = lane.generator.stream()
            self._count(inp)
            lane.out += inp.data
            lane.pending.append(_Pending(-1, inp))

    def lane_round_size(self, lane: Lane) -> int:
        return lane.rounds.randint(1, self.batch)

    def _add_probe(self, lane: Lane, correlation_id: int) -> None:
        lane.out += _probe(correlation_id)
        lane.pending.append(_Pending(correlation_id, None))

    def _count_apis(self, inp: Input) -> None:
        if inp.api_key in APIS:
            self.stats.apis[ApiKey(inp.api_key).name] += 1

    # -- the oracle --

    def _judge(self, lane: Lane, response: bytes) -> None:
        self.stats.responses += 1
        try:
            cid, body = decode_response(response)
        except InvalidRequestError as e:
            if OBJECT_BOUND not in str(e) or (parsed := _unbounded(response)) is None:
                self._finding(lane, f"a response that does not decode ({e}): {response[:200].hex()}")
                return
            cid, body = parsed
            self._amplified(lane, cid, len(response))
        codes = fuzz_lanes.error_codes(body, [])
        for code in set(codes):  # responses that carry each code (not entries: a list of 10^5 would swamp it)
            self.stats.errors[_CODE_NAMES.get(code, f"unregistered {code}")] += 1
        if lane.kind != "structured":
            if UNKNOWN_SERVER_ERROR.code in codes:
                self._finding(lane, f"UNKNOWN_SERVER_ERROR in {body!r:.300} after {self._recent(lane)}")
            if cid == PROBE_CORRELATION_ID and lane.kind == "frames":
                lane.pending.clear()
            return
        pending = lane.pending
        while pending and pending[0].correlation_id != cid and pending[0].input is not None \
                and pending[0].input.may_skip:
            pending.popleft()
        if not pending or pending[0].correlation_id != cid:
            expected = pending[0].correlation_id if pending else None
            self._finding(lane, f"response with correlation id {cid}, expected {expected}")
            self._close(lane)
            return
        inp = pending.popleft().input
        if inp is None:
            return
        if UNKNOWN_SERVER_ERROR.code in codes:
            self._finding(lane, f"UNKNOWN_SERVER_ERROR for {inp.describe()}: {body!r:.300}")
        if inp.api_key in INTER_BROKER and body.get("error_code", 0) == 0:
            self._finding(lane, f"inter-broker request accepted: {inp.describe()}: {body!r:.300}")

    def _amplified(self, lane: Lane, cid: int, size: int) -> None:
        """A well-formed response too dense for the client's object bound (a known limit,
        counted and reported, see the module docstring)."""
        inp = next((p.input for p in lane.pending if p.correlation_id == cid and p.input is not None), None)
        api = ApiKey(inp.api_key).name if inp is not None and inp.api_key in APIS else "?"
        self.stats.amplified[api] += 1
        if len(self.stats.amplified_examples) < 5 and inp is not None:
            self.stats.amplified_examples.append(f"{size}-byte response to {inp.describe()}")

    def _recent(self, lane: Lane) -> str:
        return "; ".join(p.input.describe() for p in list(lane.pending)[:4] if p.input is not None)

    def _closed_by_broker(self, lane: Lane) -> None:
        self.stats.closed[lane.kind] += 1
        # an acks=0 produce that failed ends its connection (Kafka's rule), once the requests
        # read with it are answered: one must come before the first request left unanswered
        unanswered = next((p.input.number for p in lane.pending if p.input is not None and not p.input.may_skip),
                          None)
        after_acks_zero = unanswered is None or any(n < unanswered for n in lane.acks_zero)
        if lane.kind == "structured" and lane.pending and not after_acks_zero:
            self._finding(lane, f"the broker closed a connection of valid envelopes awaiting {self._recent(lane)}")
        elif lane.kind == "structured" and lane.pending:
            self.stats.closed["structured, after an acks=0 produce"] += 1
        self._close(lane)

    def _close(self, lane: Lane) -> None:
        super()._close(lane)
        if isinstance(lane, Lane):
            lane.acks_zero.clear()


_CODE_NAMES = {e.code: e.name for e in all_codes()}
OBJECT_BOUND = "decodes into more than"  # protocol.codec's message for a frame over its object bound


def _unbounded(response: bytes) -> tuple[int, dict] | None:
    """``(correlation_id, body)`` of a response decoded without the object bound, or None if
    it is not a well-formed response even so."""
    try:
        items = msgpack.unpackb(response, raw=False)
    except Exception:  # noqa: BLE001 -- any failure means not well-formed
        return None
    if type(items) is not list or len(items) != 2 or type(items[0]) is not int or type(items[1]) is not dict:
        return None
    return items[0], items[1]
