"""Partition assignors and the consumer protocol's member metadata. Pure: no I/O, no clock.

Theory of operation (Kafka's client-side assignment).

* The coordinator never looks inside a group's member metadata: each member sends, per
  assignor it supports, an opaque *subscription* (``encode_subscription``) in its JoinGroup;
  the coordinator picks the first assignor every member supports and hands all members'
  subscriptions to one member, the *leader*. The leader computes the assignment with that
  assignor and sends every member's *assignment* (``encode_assignment``) in its SyncGroup;
  the coordinator relays each member's part.
* Both byte formats are Kafka's consumer protocol (``ConsumerProtocolSubscription`` and
  ``ConsumerProtocolAssignment``: an int16 version, then the fields of that version), so a
  group can mix Tidelog consumers with Kafka clients on the Kafka listener (same protocol
  type "consumer", same assignor names). Written at version 3; any version is read (a newer
  one's trailing fields are ignored, as Kafka's clients do). Bytes that start like a msgpack
  array are the format Tidelog consumers wrote before (``[version, topics, user_data,
  owned, generation]`` and ``[version, partitions, user_data]``), still read, so a group can
  be upgraded member by member. Malformed bytes raise ``TidelogError``
  (INCONSISTENT_GROUP_PROTOCOL) naming the problem.

* Assignors (``assign(partitions_per_topic, subscriptions) -> {member_id: Assignment}``):

  - ``range``: per topic, the members subscribed to it in order, partitions split into
    contiguous ranges; the first ``partitions % members`` members get one extra. Members with a
    ``group_instance_id`` sort first, by it (so a restarted static member gets the same ranges
    back), then the others by member id.
  - ``roundrobin``: every partition (topics sorted) dealt in turn to the next member (same
    order) subscribed to its topic.
  - ``cooperative-sticky``: keeps each member's owned partitions (a partition claimed by two
    members goes to the claim of the higher generation; same-generation conflicts are
    dropped), gives unowned partitions to the least-loaded eligible member, then moves
    partitions from the most to the least loaded member while they differ by two or more
    (moving partitions the giver did not own before first). With equal subscriptions every
    member ends with ``floor(P/N)`` or ``ceil(P/N)`` partitions and keeps at least
    ``min(owned, floor(P/N))`` of its own. For the cooperative protocol a partition that
    changes owner is first only *revoked*: it is left out of the new owner's assignment in
    this generation; the old owner revokes it and rejoins, and the next rebalance hands it
    over (KIP-429's two-phase incremental rebalance).

* The rebalance protocol of a consumer is the highest protocol *all* its configured assignors
  support (``rebalance_protocol``): ``["range", "cooperative-sticky"]`` is eager, as in Kafka,
  so that a group can be upgraded member by member.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgpack

from tidelog.protocol.errors import INCONSISTENT_GROUP_PROTOCOL, InvalidRequestError, TidelogError
from tidelog.protocol.kafka.schema import Reader, codec
from tidelog.protocol.messages import NO_GENERATION
from tidelog.protocol.topics import TopicPartition

__all__ = ["PROTOCOL_TYPE", "EAGER", "COOPERATIVE", "Subscription", "Assignment",
           "encode_subscription", "decode_subscription", "encode_assignment", "decode_assignment",
           "Assignor", "RangeAssignor", "RoundRobinAssignor", "CooperativeStickyAssignor",
           "ASSIGNORS", "assignors_for", "rebalance_protocol"]

PROTOCOL_TYPE = "consumer"
EAGER, COOPERATIVE = "eager", "cooperative"
SUBSCRIPTION, ASSIGNMENT = "ConsumerProtocolSubscription", "ConsumerProtocolAssignment"
SUBSCRIPTION_VERSION = ASSIGNMENT_VERSION = _HIGHEST = 3
_VERSION = struct.Struct(">h")
_MAX_ELEMENTS = 1 << 20
_MAX_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Subscription:
    """What one member asks for. ``group_instance_id`` is not encoded: the coordinator
    reports it next to the member's metadata."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation: int = NO_GENERATION
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


# ---------------------------------------------------------------------------------------------
# encoding


def _by_topic(tps: Iterable[TopicPartition]) -> list[list]:
    grouped: dict[str, list[int]] = defaultdict(list)
    for tp in tps:
        grouped[tp.topic].append(tp.partition)
    return [[topic, sorted(ps)] for topic, ps in sorted(grouped.items())]


def _kafka_partitions(tps: Iterable[TopicPartition]) -> list[dict]:
    return [{"topic": topic, "partitions": ps} for topic, ps in _by_topic(tps)]


def encode_subscription(s: Subscription) -> bytes:
    out = bytearray(_VERSION.pack(SUBSCRIPTION_VERSION))
    codec(SUBSCRIPTION, SUBSCRIPTION_VERSION).encode(
        {"topics": sorted(s.topics), "user_data": s.user_data, "owned_partitions": _kafka_partitions(s.owned_partitions),
         "generation_id": s.generation, "rack_id": None}, out)
    return bytes(out)


def encode_assignment(a: Assignment) -> bytes:
    out = bytearray(_VERSION.pack(ASSIGNMENT_VERSION))
    codec(ASSIGNMENT, ASSIGNMENT_VERSION).encode(
        {"assigned_partitions": _kafka_partitions(a.partitions), "user_data": a.user_data}, out)
    return bytes(out)


def _kafka_body(data: bytes, name: str, what: str) -> dict | None:
    """The consumer protocol body of ``data`` in Kafka's format, or None for the msgpack one."""
    if not isinstance(data, (bytes, bytearray)):
        raise _bad(what, f"expected bytes, got {type(data).__name__}")
    if data[:1] and (data[0] & 0xF0 == 0x90 or data[0] in (0xDC, 0xDD)):
        return None
    if len(data) < 2:
        raise _bad(what, f"{len(data)} bytes, shorter than a version")
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        raise _bad(what, f"unknown version {version}")
    try:
        return codec(name, min(version, _HIGHEST)).decode(Reader(bytes(data), 2))
    except InvalidRequestError as e:
        raise _bad(what, str(e)) from None


def _from_kafka(entries: list | None) -> tuple[TopicPartition, ...]:
    out = []
    for entry in entries or ():
        if entry["topic"] is None:
            raise _bad("partitions", "a null topic name")
        for p in entry["partitions"] or ():
            if p < 0:
                raise _bad("partitions", f"bad partition number {p} of topic {entry['topic']!r}")
            out.append(TopicPartition(entry["topic"], p))
    return tuple(out)


def _bad(what: str, detail: str) -> TidelogError:
    return TidelogError(f"malformed consumer protocol {what}: {detail}", error=INCONSISTENT_GROUP_PROTOCOL)


def _unpack(data: bytes, what: str, min_fields: int) -> list:
    if not isinstance(data, (bytes, bytearray)):
        raise _bad(what, f"expected bytes, got {type(data).__name__}")
    try:
        value = msgpack.unpackb(data, raw=False, max_bin_len=_MAX_BYTES, max_str_len=_MAX_BYTES,
                                max_array_len=_MAX_ELEMENTS, max_map_len=_MAX_ELEMENTS)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise _bad(what, f"not msgpack ({e})") from None
    if not isinstance(value, list) or len(value) < min_fields:
        raise _bad(what, f"expected an array of at least {min_fields} fields")
    if not isinstance(value[0], int) or isinstance(value[0], bool) or value[0] < 1:
        raise _bad(what, f"unknown version {value[0]!r}")
    return value


def _partitions(raw: object, what: str) -> tuple[TopicPartition, ...]:
    if not isinstance(raw, list):
        raise _bad(what, "partitions must be an array of [topic, [partition, ...]]")
    out = []
    for entry in raw:
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                or not isinstance(entry[1], list)):
            raise _bad(what, f"bad partition entry {entry!r}")
        for p in entry[1]:
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise _bad(what, f"bad partition number {p!r} of topic {entry[0]!r}")
            out.append(TopicPartition(entry[0], p))
    return tuple(out)


def _user_data(raw: object, what: str) -> bytes | None:
    if raw is not None and not isinstance(raw, bytes):
        raise _bad(what, "user_data must be bytes or nil")
    return raw


def decode_subscription(data: bytes, group_instance_id: str | None = None) -> Subscription:
    body = _kafka_body(data, SUBSCRIPTION, "subscription")
    if body is not None:
        topics = body["topics"]
        if topics is None or None in topics:
            raise _bad("subscription", "topics must be an array of strings")
        return Subscription(tuple(topics), body["user_data"], _from_kafka(body["owned_partitions"]),
                            body["generation_id"], group_instance_id)
    v = _unpack(data, "subscription", 5)
    topics = v[1]
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise _bad("subscription", "topics must be an array of strings")
    generation = v[4]
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise _bad("subscription", f"bad generation {generation!r}")
    return Subscription(tuple(topics), _user_data(v[2], "subscription"),
                        _partitions(v[3], "subscription"), generation, group_instance_id)


def decode_assignment(data: bytes) -> Assignment:
    if not data:  # the coordinator's empty assignment (e.g. a member the leader left out)
        return Assignment(())
    body = _kafka_body(data, ASSIGNMENT, "assignment")
    if body is not None:
        return Assignment(_from_kafka(body["assigned_partitions"]), body["user_data"])
    v = _unpack(data, "assignment", 3)
    return Assignment(_partitions(v[1], "assignment"), _user_data(v[2], "assignment"))


# ---------------------------------------------------------------------------------------------
# assignors


def _member_key(member_id: str, s: Subscription) -> tuple:
    """Kafka's MemberInfo order: static members first by instance id, then by member id."""
    return (0, s.group_instance_id, member_id) if s.group_instance_id is not None else (1, member_id, "")


def _ordered_members(subscriptions: Mapping[str, Subscription]) -> list[str]:
    return sorted(subscriptions, key=lambda m: _member_key(m, subscriptions[m]))


def _topic_partitions(topic: str, partitions_per_topic: Mapping[str, int]) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(partitions_per_topic.get(topic, 0))]


def _subscribed_topics(subscriptions: Mapping[str, Subscription],
                       partitions_per_topic: Mapping[str, int]) -> list[str]:
    return sorted({t for s in subscriptions.values() for t in s.topics if t in partitions_per_topic})


class Assignor:
    """Base: ``name`` is the protocol name in JoinGroup; ``supported_protocols`` the
    rebalance protocols it can run under."""

    name = ""
    supported_protocols: tuple[str, ...] = (EAGER,)

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        raw = self.assign_partitions(partitions_per_topic, subscriptions)
        return {m: Assignment(tuple(sorted(raw.get(m, ())))) for m in subscriptions}

    def assign_partitions(self, partitions_per_topic: Mapping[str, int],
                          subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        raise NotImplementedError


class RangeAssignor(Assignor):
    name = "range"

    def assign_partitions(self, partitions_per_topic, subscriptions):
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        order = _ordered_members(subscriptions)
        for topic in _subscribed_topics(subscriptions, partitions_per_topic):
            members = [m for m in order if topic in subscriptions[m].topics]
            tps = _topic_partitions(topic, partitions_per_topic)
            per, extra = divmod(len(tps), len(members))
            start = 0
            for i, m in enumerate(members):
                count = per + (1 if i < extra else 0)
                out[m] += tps[start:start + count]
                start += count
        return out


class RoundRobinAssignor(Assignor):
    name = "roundrobin"

    def assign_partitions(self, partitions_per_topic, subscriptions):
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        order = _ordered_members(subscriptions)
        if not order:
            return out
        turn = 0
        for topic in _subscribed_topics(subscriptions, partitions_per_topic):
            for tp in _topic_partitions(topic, partitions_per_topic):
                while topic not in subscriptions[order[turn % len(order)]].topics:
                    turn += 1  # some member is subscribed (the topic came from one), so this ends
                out[order[turn % len(order)]].append(tp)
                turn += 1
        return out


class CooperativeStickyAssignor(Assignor):
    name = "cooperative-sticky"
    supported_protocols = (EAGER, COOPERATIVE)

    def assign_partitions(self, partitions_per_topic, subscriptions):
        owners = valid_owners(partitions_per_topic, subscriptions)
        assignment = sticky_assignment(partitions_per_topic, subscriptions, owners)
        return adjust_for_cooperative(assignment, owners)


def valid_owners(partitions_per_topic: Mapping[str, int],
                 subscriptions: Mapping[str, Subscription]) -> dict[TopicPartition, str]:
    """Partition -> the member that owns it and may keep it: the partition exists, the member
    is still subscribed to its topic, and no claim of a higher generation exists (claims of
    the same generation by two members cancel out)."""
    claims: dict[TopicPartition, list[tuple[int, str]]] = defaultdict(list)
    for member, s in subscriptions.items():
        for tp in s.owned_partitions:
            if tp.topic in s.topics and 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0):
                claims[tp].append((s.generation, member))
    owners = {}
    for tp, cs in claims.items():
        cs.sort(reverse=True)
        if len(cs) == 1 or cs[0][0] > cs[1][0]:
            owners[tp] = cs[0][1]
    return owners


def sticky_assignment(partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription],
                      owners: Mapping[TopicPartition, str]) -> dict[str, list[TopicPartition]]:
    """The balanced assignment that moves as few owned partitions as it can (see the module
    docstring)."""
    members = _ordered_members(subscriptions)
    current: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for tp, m in sorted(owners.items()):
        current[m].append(tp)
    for topic in _subscribed_topics(subscriptions, partitions_per_topic):
        eligible = [m for m in members if topic in subscriptions[m].topics]
        for tp in _topic_partitions(topic, partitions_per_topic):
            if tp not in owners:
                current[min(eligible, key=lambda m: len(current[m]))].append(tp)
    _balance(current, subscriptions, owners, members)
    return current


def _balance(current: dict[str, list[TopicPartition]], subscriptions: Mapping[str, Subscription],
             owners: Mapping[TopicPartition, str], members: Sequence[str]) -> None:
    """Move partitions from the most to the least loaded eligible member while two members
    differ by two or more. Each move lowers the sum of squared loads, so this ends; the
    bound on rounds is a guard."""
    for _ in range(sum(len(v) for v in current.values()) * max(1, len(members)) + 1):
        if not _move_one(current, subscriptions, owners, members):
            return


def _move_one(current: dict[str, list[TopicPartition]], subscriptions: Mapping[str, Subscription],
              owners: Mapping[TopicPartition, str], members: Sequence[str]) -> bool:
    by_load = sorted(members, key=lambda m: (-len(current[m]), members.index(m)))
    for giver in by_load:
        # partitions the giver did not own before move first: moving them costs no stickiness
        candidates = sorted(current[giver], key=lambda tp: (owners.get(tp) == giver, tp))
        for tp in candidates:
            takers = [m for m in reversed(by_load) if tp.topic in subscriptions[m].topics
                      and len(current[m]) + 2 <= len(current[giver])]
            if takers:
                taker = min(takers, key=lambda m: (len(current[m]), members.index(m)))
                current[giver].remove(tp)
                current[taker].append(tp)
                return True
    return False


def adjust_for_cooperative(assignment: dict[str, list[TopicPartition]],
                           owners: Mapping[TopicPartition, str]) -> dict[str, list[TopicPartition]]:
    """Leave out of each member's assignment the partitions another member still owns: that
    owner revokes them first, and a follow-up rebalance hands them over."""
    return {m: [tp for tp in tps if owners.get(tp, m) == m] for m, tps in assignment.items()}


ASSIGNORS: dict[str, type[Assignor]] = {
    a.name: a for a in (RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor)}


def assignors_for(names: Sequence[str]) -> list[Assignor]:
    """The configured assignors, in preference order; ValueError names an unknown one."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise ValueError("partition_assignment_strategy needs at least one assignor")
    out = []
    for n in names:
        if isinstance(n, Assignor):
            out.append(n)
        elif n in ASSIGNORS:
            out.append(ASSIGNORS[n]())
        else:
            raise ValueError(f"unknown partition assignor {n!r} (known: {', '.join(ASSIGNORS)})")
    return out


def rebalance_protocol(assignors: Sequence[Assignor]) -> str:
    """COOPERATIVE only if every configured assignor supports it, else EAGER."""
    return COOPERATIVE if all(COOPERATIVE in a.supported_protocols for a in assignors) else EAGER
