"""A working multi-broker cluster: one real ZooKeeper and three broker processes, shared by the
module (each test uses its own topics).

Placement follows Kafka's algorithm; 100,000 keyed records from the blocking Producer and a
batch from the Trio AsyncProducer all come back exactly once, in order, each key on its
murmur2 partition; ListOffsets by timestamp, seek and the long poll behave as Kafka's; topic
configs, CreatePartitions and DeleteTopics take effect on every broker.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
import trio

from tests.integration.cluster_fixtures import cluster_3  # noqa: F401
from tests.support.cluster import broker_metadata, consume_range, end_offsets, partitions_of, running, wait_topic_ready
from tests.support.disk import partition_dirs
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.aio import AsyncProducer
from tidelog.aio.partitioner import default_partition
from tidelog.aio.producer import Sender
from tidelog.errors import TidelogError
from tidelog.protocol.placement import assign_replicas

KEYED = "keyed"
KEYED_PARTITIONS = 6
BLOCKING_RECORDS = 100_000
ASYNC_RECORDS = 20_000
KEYS = 997  # a prime, so keys and partitions do not line up


def key_of(seq: int) -> bytes:
    return b"key-%d" % (seq % KEYS)


def value_of(seq: int) -> bytes:
    return b"seq-%d" % seq


def seq_of(value: bytes) -> int:
    return int(value.split(b"-")[1])


class FixedRng:
    """Stands in for ``random`` in assign_replicas: returns the given values in turn."""

    def __init__(self, values):
        self.values = list(values)

    def randrange(self, n):
        v = self.values.pop(0)
        assert 0 <= v < n
        return v


def create(admin: Admin, name: str, partitions: int, rf: int = 3, **config: str) -> None:
    admin.create_topics([NewTopic(name, partitions, rf, config=config)], timeout_ms=30000)


@pytest.fixture(scope="module")
def admin(cluster_3):
    with Admin(cluster_3.bootstrap, default_api_timeout_ms=30000) as a:
        yield a


@pytest.fixture(scope="module")
def keyed_topic(cluster_3, admin):
    """The 6-partition, RF 3 topic with 100,000 keyed records from the blocking Producer.
    Returns the acknowledgements: seq -> RecordMetadata."""
    create(admin, KEYED, KEYED_PARTITIONS)
    wait_topic_ready(cluster_3, KEYED, KEYED_PARTITIONS, 3)
    with Producer(cluster_3.bootstrap, acks="all", linger_ms=5, batch_size=64 * 1024) as producer:
        futures = [producer.send(KEYED, value_of(i), key=key_of(i)) for i in range(BLOCKING_RECORDS)]
        producer.flush(timeout=120)
        return {i: f.result(timeout=1) for i, f in enumerate(futures)}


# -- placement -------------------------------------------------------------------------------------


def test_placement_follows_kafkas_algorithm(cluster_3, keyed_topic):
    md = broker_metadata(cluster_3, 1)
    brokers = sorted(b.node_id for b in md.brokers)
    assert brokers == [1, 2, 3]
    parts = partitions_of(md, KEYED)
    assignment = {p: list(pm.replica_nodes) for p, pm in parts.items()}
    n = len(brokers)

    assert sorted(assignment) == list(range(KEYED_PARTITIONS))
    for p, replicas in assignment.items():
        assert len(replicas) == 3 and len(set(replicas)) == 3, (p, replicas)
        assert set(replicas) <= set(brokers)
        assert parts[p].leader_id == replicas[0], f"partition {p}: leader is not the preferred replica"
    leaders = defaultdict(int)
    for replicas in assignment.values():
        leaders[replicas[0]] += 1
    assert dict(leaders) == {b: KEYED_PARTITIONS // n for b in brokers}

    # first replicas go round-robin from the start index
    start = brokers.index(assignment[0][0])
    for p, replicas in assignment.items():
        assert replicas[0] == brokers[(start + p) % n], (p, replicas)
    # followers: the second replica sits at a shift that is constant within one pass over the
    # brokers and grows by one (mod n-1) with each pass; the third follows at shift + 1
    def offset(p: int, j: int) -> int:
        return (brokers.index(assignment[p][j]) - brokers.index(assignment[p][0])) % n

    shift0 = offset(0, 1) - 1
    for p in range(KEYED_PARTITIONS):
        shift = shift0 + p // n
        assert offset(p, 1) == 1 + shift % (n - 1), (p, assignment)
        assert offset(p, 2) == 1 + (shift + 1) % (n - 1), (p, assignment)

    # and the whole assignment is assign_replicas' for that start index and some initial shift
    matches = [s for s in range(n)
               if assign_replicas(brokers, KEYED_PARTITIONS, 3, rng=FixedRng([start, s])) == assignment]
    assert matches, f"{assignment} is not Kafka's placement for start index {start}"


# -- produce and consume -----------------------------------------------------------------------------


async def test_async_producer_then_every_record_consumed_once(cluster_3, keyed_topic):
    acks = dict(keyed_topic)
    async with AsyncProducer(cluster_3.bootstrap, acks="all", linger_ms=5) as producer:
        futures = {}
        for i in range(BLOCKING_RECORDS, BLOCKING_RECORDS + ASYNC_RECORDS):
            futures[i] = await producer.send(KEYED, value_of(i), key=key_of(i))
        with trio.fail_after(60):
            for i, f in futures.items():
                acks[i] = await f

    tps = [TopicPartition(KEYED, p) for p in range(KEYED_PARTITIONS)]
    ends = await trio.to_thread.run_sync(end_offsets, cluster_3.bootstrap, tps)
    assert sum(ends.values()) == BLOCKING_RECORDS + ASYNC_RECORDS
    records = await trio.to_thread.run_sync(consume_range, cluster_3.bootstrap, ends, 90.0)

    seen: dict[int, tuple[int, int]] = {}
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    for tp, rs in records.items():
        offsets = [r.offset for r in rs]
        assert offsets == list(range(ends[tp])), f"{tp}: offsets not 0..{ends[tp] - 1} in order"
        last_seq_of_key: dict[bytes, int] = {}
        for r in rs:
            seq = seq_of(r.value)
            assert seq not in seen, f"seq {seq} consumed twice: at {seen[seq]} and {(tp.partition, r.offset)}"
            seen[seq] = (tp.partition, r.offset)
            assert r.key == key_of(seq)
            partitions_of_key[r.key].add(tp.partition)
            assert last_seq_of_key.get(r.key, -1) < seq, f"{tp}: key {r.key!r} out of send order at {r.offset}"
            last_seq_of_key[r.key] = seq

    assert len(seen) == len(acks) == BLOCKING_RECORDS + ASYNC_RECORDS
    for seq, meta in acks.items():
        assert seen[seq] == (meta.partition, meta.offset), f"seq {seq} acked at {meta}, consumed at {seen[seq]}"
    for key, ps in partitions_of_key.items():
        assert ps == {default_partition(key, KEYED_PARTITIONS)}, f"key {key!r} in partitions {ps}"


# -- offsets ---------------------------------------------------------------------------------------


def test_offsets_for_times_and_seek(cluster_3, admin):
    topic, tp = "times", TopicPartition("times", 0)
    create(admin, topic, 1)
    wait_topic_ready(cluster_3, topic, 1, 3)
    t0 = int(time.time() * 1000) - 3_600_000
    n = 300
    filler = b"x" * 200  # enough bytes for the sparse time index to get entries
    with Producer(cluster_3.bootstrap, acks="all", linger_ms=0) as producer:
        metas = []
        for chunk in range(0, n, 20):  # several batches
            fs = [producer.send(topic, filler + b"%d" % i, timestamp_ms=t0 + 10 * i) for i in range(chunk, chunk + 20)]
            producer.flush(timeout=30)
            metas += [f.result(timeout=1) for f in fs]
    assert [m.offset for m in metas] == list(range(n))

    with Consumer(cluster_3.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        for ts, want in [(t0 - 60_000, 0), (t0, 0), (t0 + 1, 1), (t0 + 10 * 137, 137), (t0 + 10 * 137 + 9, 138),
                         (t0 + 10 * 240 - 5, 240), (t0 + 10 * (n - 1), n - 1)]:
            found = consumer.offsets_for_times({tp: ts})[tp]
            assert found is not None and found.offset == want, (ts - t0, found)
            assert found.timestamp == t0 + 10 * want
        assert consumer.offsets_for_times({tp: t0 + 10 * (n - 1) + 1})[tp] is None

        consumer.seek(tp, 123)
        assert consumer.position(tp) == 123
        records = wait_until(lambda: consumer.poll(timeout_ms=1000), 15, "records after seek(123)")
        assert records[0].offset == 123 and records[0].value == filler + b"123"
        assert records[0].timestamp == t0 + 1230
        consumer.seek(tp, 5)  # backwards, with records of the old position possibly buffered
        records = wait_until(lambda: consumer.poll(timeout_ms=1000), 15, "records after seek(5)")
        assert records[0].offset == 5 and records[0].value == filler + b"5"
        assert [r.offset for r in records] == list(range(5, 5 + len(records)))


def test_long_poll_returns_as_soon_as_a_record_arrives(cluster_3, admin):
    topic, tp = "longpoll", TopicPartition("longpoll", 0)
    create(admin, topic, 1)
    wait_topic_ready(cluster_3, topic, 1, 3)
    max_wait_ms = 5000
    with Producer(cluster_3.bootstrap, acks="all", linger_ms=0) as producer, \
            Consumer(cluster_3.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=max_wait_ms) as consumer:
        producer.send(topic, b"warm-up").result(timeout=30)  # metadata and connections ready
        consumer.assign([tp])
        assert consumer.position(tp) == 1  # the consumer's first fetch is now parked at the leader
        sent_at: list[float] = []

        def produce_later():
            time.sleep(0.5)
            sent_at.append(time.monotonic())
            producer.send(topic, b"wake-up")

        thread = threading.Thread(target=produce_later, daemon=True)
        started = time.monotonic()
        thread.start()
        records = consumer.poll(timeout_ms=10_000)
        received = time.monotonic()
        thread.join(10)
    assert [r.value for r in records] == [b"wake-up"]
    # without the long poll being woken the record would come with the next fetch, after
    # max_wait_ms (~4.5 s after it was sent)
    assert received - sent_at[0] < 2.5, f"record arrived {received - sent_at[0]:.2f} s after it was sent"
    assert received - started < max_wait_ms / 1000


@pytest.mark.parametrize("acks", [1, "all"])
def test_sends_from_many_threads_keep_each_threads_order(cluster_3, admin, acks, monkeypatch):
    """With linger_ms 0 a blocking send that finds the leader's connection idle writes the
    request from the application's thread, else the producer's loop thread writes it; with
    up to 5 requests in flight and four threads sending to one partition, both writers take
    turns on one connection. Each thread's records must land in its send order, once each."""
    topic, tp = f"threads-acks-{acks}", TopicPartition(f"threads-acks-{acks}", 0)
    create(admin, topic, 1)
    wait_topic_ready(cluster_3, topic, 1, 3)
    threads, per_thread = 4, 1500
    errors: list[BaseException] = []
    from_callers = []
    drain = Sender._drain_from_caller

    def counted(self):
        wrote = drain(self)
        from_callers.append(wrote)
        return wrote
    monkeypatch.setattr(Sender, "_drain_from_caller", counted)
    # acks=all would turn idempotence on, whose requests only the loop thread writes
    with Producer(cluster_3.bootstrap, acks=acks, linger_ms=0, max_in_flight_requests_per_connection=5,
                  enable_idempotence=False) as producer:
        producer.send(topic, b"warm-up", partition=0).result(timeout=30)

        def run(t: int) -> None:
            try:
                futures = []
                for seq in range(per_thread):
                    futures.append(producer.send(topic, f"{t}:{seq}".encode(), partition=0))
                    if seq % 50 == 49:  # let the connection go idle now and then
                        futures[-1].result(timeout=30)
                for f in futures:
                    f.result(timeout=30)
            except BaseException as e:
                errors.append(e)

        workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
    assert not errors, errors
    assert any(from_callers) and not all(from_callers), "both writers should have taken turns"
    total = 1 + threads * per_thread  # with acks=1 the HW follows the acknowledgements
    wait_until(lambda: end_offsets(cluster_3.bootstrap, [tp])[tp] >= total, 30, f"the HW of {tp} at {total}")
    ends = end_offsets(cluster_3.bootstrap, [tp])
    assert ends[tp] == total
    seen: dict[int, list[int]] = defaultdict(list)
    for r in consume_range(cluster_3.bootstrap, ends)[tp][1:]:
        t, seq = r.value.decode().split(":")
        seen[int(t)].append(int(seq))
    assert {t: seqs == list(range(per_thread)) for t, seqs in seen.items()} == {t: True for t in range(threads)}


# -- administration --------------------------------------------------------------------------------


def test_describe_and_alter_configs_round_trip(cluster_3, admin):
    topic = "configured"
    create(admin, topic, 2)
    before = admin.describe_configs(topic)
    assert before["retention.ms"].value == str(7 * 24 * 3600 * 1000) and before["retention.ms"].is_default

    admin.alter_configs(topic, {"retention.ms": "3600000"})
    after = admin.describe_configs(topic)
    assert after["retention.ms"].value == "3600000" and not after["retention.ms"].is_default
    assert {k: v.value for k, v in after.items() if k != "retention.ms"} == \
        {k: v.value for k, v in before.items() if k != "retention.ms"}

    with pytest.raises(TidelogError):
        admin.alter_configs(topic, {"retention.ms": "soon"})
    assert admin.describe_configs(topic, ["retention.ms"])["retention.ms"].value == "3600000"

    admin.alter_configs(topic, {"retention.ms": None})  # back to the broker default
    reset = admin.describe_configs(topic, ["retention.ms"])["retention.ms"]
    assert reset.value == str(7 * 24 * 3600 * 1000) and reset.is_default


def test_create_partitions_shows_up_in_metadata(cluster_3, admin):
    topic = "growing"
    create(admin, topic, 6)
    wait_topic_ready(cluster_3, topic, 6, 3)
    admin.create_partitions({topic: 8})
    parts = wait_topic_ready(cluster_3, topic, 8, 3)  # on every broker
    for p in (6, 7):
        assert len(set(parts[p].replica_nodes)) == 3
    assert [p.partition for d in admin.describe_topics([topic]) for p in d.partitions] == list(range(8))

    with Producer(cluster_3.bootstrap, acks="all") as producer:
        assert producer.partitions_for(topic) == list(range(8))
        metas = [producer.send(topic, b"new-%d" % p, partition=p).result(timeout=30) for p in (6, 7)]
    assert [(m.partition, m.offset) for m in metas] == [(6, 0), (7, 0)]
    got = consume_range(cluster_3.bootstrap, {TopicPartition(topic, 6): 1, TopicPartition(topic, 7): 1})
    assert [r.value for tp in sorted(got) for r in got[tp]] == [b"new-6", b"new-7"]


def test_delete_topic_removes_partition_directories_everywhere(cluster_3, admin):
    topic = "doomed"
    create(admin, topic, 4)
    wait_topic_ready(cluster_3, topic, 4, 3)
    with Producer(cluster_3.bootstrap, acks="all") as producer:
        for i in range(100):
            producer.send(topic, b"v%d" % i, key=b"k%d" % i)
        producer.flush(timeout=30)
    dirs = partition_dirs(cluster_3, topic)
    assert dirs == {i: [f"{topic}-{p}" for p in range(4)] for i in cluster_3.brokers}

    admin.delete_topics([topic])
    wait_until(lambda: not any(partition_dirs(cluster_3, topic).values()), 30,
               f"partition directories of {topic!r} removed on every broker")
    wait_until(lambda: all(not partitions_of(broker_metadata(cluster_3, i), topic) for i in running(cluster_3)),
               30, f"{topic!r} gone from every broker's metadata")
    assert topic not in admin.list_topics()

    # the name can be used again, and the new topic starts empty
    create(admin, topic, 2)
    wait_topic_ready(cluster_3, topic, 2, 3)
    tps = [TopicPartition(topic, p) for p in range(2)]
    assert end_offsets(cluster_3.bootstrap, tps) == {tp: 0 for tp in tps}
