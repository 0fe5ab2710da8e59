"""Delayed operations (Kafka's purgatory): consumers' and followers' long-poll fetches
(DelayedFetch) and acks=all produces (DelayedProduce), answered synchronously by the change
that completes them, or by the replica manager's timer at their deadline; never by a task."""

from __future__ import annotations

import inspect

import pytest
import trio

from tests.unit.log.helpers import make_batch
from tests.unit.replication.memory_leader import TP, MemoryBroker
from tests.unit.replication.test_fetcher import make_cluster
from tidelog.broker.deferred import DeferredResponse
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.segment import LogSegment
from tidelog.broker.replication.replica_manager import DelayedFetch, DelayedProduce
from tidelog.protocol.codec import pack
from tidelog.protocol.errors import (
    NONE,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    StopReplicaPartition,
    StopReplicaRequest,
    TopicProduceData,
)
from tidelog.protocol.topics import TopicPartition


async def running_leader(tmp_path, nursery, config: LogConfig | None = None):
    """A one-broker cluster's leader of TP, its replica manager running, closed after."""
    cluster, brokers = make_cluster(str(tmp_path), n=1, config=config)
    cluster.elect(1, [1])
    broker = brokers[0]
    await nursery.start(broker.replica_manager.run)
    yield broker
    broker.replica_manager._nursery.cancel_scope.cancel()
    for b in brokers:
        b.close()


@pytest.fixture
async def leader(tmp_path, nursery):
    async for broker in running_leader(tmp_path, nursery):
        yield broker


@pytest.fixture
async def roomy_leader(tmp_path, nursery):
    """A leader whose segments take batches of a thousand bytes (``leader``'s refuse them)."""
    async for broker in running_leader(tmp_path, nursery, LogConfig(segment_bytes=1 << 24, retention_ms=-1)):
        yield broker


def consumer_fetch(broker: MemoryBroker, offset: int, max_wait_ms: int = 500, min_bytes: int = 1):
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, 1 << 20, -1)])],
                       max_wait_ms=max_wait_ms, min_bytes=min_bytes)
    return broker.apis.fetch(req)


def attach(deferred: DeferredResponse) -> list:
    answers: list = []
    deferred.attach(answers.append)
    return answers


def typed(answer: dict) -> FetchResponse:
    """A fetch's answer (the FetchResponse's body, as the network writes it), read back as the
    typed message: the body must load as one."""
    assert isinstance(answer, dict), answer
    return FetchResponse.from_body(answer)


def partition_result(answer: dict):
    [topic] = typed(answer).responses
    [p] = topic.partitions
    return p


async def test_a_fetch_reads_no_more_than_the_brokers_bound_whatever_it_asks(roomy_leader):
    # Kafka's fetch.max.bytes: what one request can make the broker read and hold is the
    # broker's to bound; at least one batch still goes, as below any bound
    import dataclasses
    leader = roomy_leader
    rm = leader.replica_manager
    for _ in range(20):
        assert leader.produce(make_batch(10, size=100))["error_code"] == NONE.code
    one_batch = len(partition_result(consumer_fetch(leader, 0, max_wait_ms=0)).records) // 20
    rm.config = dataclasses.replace(rm.config, fetch_max_bytes=3 * one_batch)
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, 0, 2**31 - 1, -1)])],
                       max_wait_ms=0, max_bytes=2**31 - 1)
    assert len(partition_result(leader.apis.fetch(req)).records) == 3 * one_batch
    rm.config = dataclasses.replace(rm.config, fetch_max_bytes=1)
    assert len(partition_result(leader.apis.fetch(req)).records) == one_batch


async def test_a_fetch_with_records_there_is_answered_at_once(leader):
    leader.produce(make_batch(2))
    response = consumer_fetch(leader, 0)
    assert isinstance(response, dict)  # answered now
    assert partition_result(response).records


async def test_the_append_that_satisfies_a_waiting_fetch_answers_it_synchronously(leader):
    deferred = consumer_fetch(leader, 0)
    assert isinstance(deferred, DelayedFetch)
    answers = attach(deferred)
    assert answers == [] and leader.partition().watchers
    leader.produce(make_batch(1))  # no checkpoint between the append and the answer
    [response] = answers
    p = partition_result(response)
    assert p.error_code == NONE.code and p.records and p.high_watermark == 1
    assert not leader.partition().watchers


async def test_an_answer_is_written_before_the_bookkeeping_and_given_once(leader):
    # the answer goes out first (a waiting consumer's response is on a record's path); a
    # change of the partition during the answer does not answer it again, and once answered
    # the operation watches nothing, answering raising or not
    deferred = consumer_fetch(leader, 0)
    seen, answers = [], []

    def answer(body):
        seen.append(bool(leader.partition().watchers))  # still watching: forgotten after
        answers.append(body)
        leader.partition().notify()  # a nested try

    deferred.attach(answer)
    leader.produce(make_batch(1))
    assert len(answers) == 1 and seen == [True]
    assert not leader.partition().watchers and deferred.done

    failing = consumer_fetch(leader, 1)

    def broken(body):
        raise OSError("the connection went away")

    failing.attach(broken)
    leader.produce(make_batch(1))  # logged, not raised into the append
    assert not leader.partition().watchers and failing.done
    failing.cancel()  # a cancel after the answer changes nothing
    assert failing.done


async def test_the_fetch_an_append_answers_reads_it_from_memory_and_later_reads_the_segment(
        leader, monkeypatch):
    answers = attach(consumer_fetch(leader, 0))
    segment_reads = []
    read = LogSegment.read

    def counted(self, *args, **kwargs):
        segment_reads.append(args[0])
        return read(self, *args, **kwargs)

    monkeypatch.setattr(LogSegment, "read", counted)
    leader.produce(make_batch(2))
    [response] = answers
    assert segment_reads == []  # the appended batch, from memory
    assert partition_result(response).records == leader.log().read(0, 1 << 20)
    assert segment_reads == [0]  # the append's notify over, nothing of it is held


async def test_an_append_below_min_bytes_leaves_it_waiting_until_max_wait(leader, autojump_clock):
    big = len(make_batch(1)) * 3
    deferred = consumer_fetch(leader, 0, max_wait_ms=300, min_bytes=big)
    answers = attach(deferred)
    leader.produce(make_batch(1))
    assert answers == []
    start = trio.current_time()
    while not answers:
        await trio.sleep(0.01)
    assert trio.current_time() - start == pytest.approx(0.3, abs=0.02)
    assert partition_result(answers[0]).records  # what there is at the deadline


async def test_a_waiting_fetch_with_large_min_bytes_is_not_read_again_at_every_append(
        tmp_path, nursery, monkeypatch):
    """Its tries look at positions, not records: it is read when min_bytes are there, so the
    bytes read stay proportional to those produced (they grew with the square of min_bytes:
    one consumer could hold the event loop)."""
    cluster, (leader,) = make_cluster(str(tmp_path), n=1, config=LogConfig(segment_bytes=1 << 24, retention_ms=-1))
    cluster.elect(1, [1])
    await nursery.start(leader.replica_manager.run)
    batch = make_batch(1, size=1000)
    min_bytes = 200 * len(batch)
    answers = attach(consumer_fetch(leader, 0, max_wait_ms=60_000, min_bytes=min_bytes))
    read_bytes = [0]
    read = LogSegment.read

    def counted(self, *args, **kwargs):
        out = read(self, *args, **kwargs)
        read_bytes[0] += len(out)
        return out

    monkeypatch.setattr(LogSegment, "read", counted)
    produced = 0
    while not answers and produced < 400:
        leader.produce(make_batch(1, size=1000))
        produced += 1
    assert produced == 200  # answered by the append that brought min_bytes
    assert len(partition_result(answers[0]).records) == min_bytes
    assert read_bytes[0] <= 2 * min_bytes
    leader.close()


async def test_the_timer_answers_an_empty_fetch_at_max_wait_ms_in_deadline_order(leader, autojump_clock):
    late = attach(consumer_fetch(leader, 0, max_wait_ms=800))
    early = attach(consumer_fetch(leader, 0, max_wait_ms=200))
    await trio.sleep(0.25)
    assert len(early) == 1 and late == []
    assert not partition_result(early[0]).records
    await trio.sleep(0.6)
    assert len(late) == 1


async def test_losing_the_partition_answers_with_an_error(leader):
    answers = attach(consumer_fetch(leader, 0))
    leader.replica_manager.stop_replicas(StopReplicaRequest(
        0, 99, 0, [StopReplicaPartition(TP.topic, TP.partition)]))
    [response] = answers  # NOT_LEADER_OR_FOLLOWER, which Apis reports as UNKNOWN_TOPIC_OR_PARTITION
    assert partition_result(response).error_code == UNKNOWN_TOPIC_OR_PARTITION.code  # (no metadata here)
    assert "not the leader" in partition_result(response).error_message


async def test_an_answer_is_the_typed_responses_body_field_for_field_in_its_order(leader):
    # the replica manager builds the answer's maps itself (no typed message on a record's
    # path): they must be what the typed FetchResponse dumps, so the wire is the same
    waiting = attach(consumer_fetch(leader, 0))
    leader.produce(make_batch(3))
    at_once = consumer_fetch(leader, 1)
    lost = attach(consumer_fetch(leader, 3))
    leader.replica_manager.stop_replicas(StopReplicaRequest(
        0, 99, 0, [StopReplicaPartition(TP.topic, TP.partition)]))
    for answer in (waiting[0], at_once, lost[0]):
        dumped = typed(answer).to_body()
        assert dumped == answer
        assert pack(dumped) == pack(answer)  # the keys in the same order too
    assert partition_result(at_once).records and partition_result(lost[0]).error_code != NONE.code


async def test_a_cancelled_fetch_is_never_answered_and_stops_watching(leader, autojump_clock):
    deferred = consumer_fetch(leader, 0, max_wait_ms=100)
    answers = attach(deferred)
    deferred.cancel()
    assert not leader.partition().watchers
    leader.produce(make_batch(1))
    await trio.sleep(0.5)
    assert answers == []


async def test_without_the_timer_running_a_fetch_waits_in_a_coroutine(tmp_path):
    cluster, brokers = make_cluster(str(tmp_path), n=1)
    try:
        cluster.elect(1, [1])
        waiting = consumer_fetch(brokers[0], 0, max_wait_ms=50)
        assert not isinstance(waiting, DelayedFetch)
        response = await waiting
        assert isinstance(response, dict)  # answered now
    finally:
        for b in brokers:
            b.close()



async def test_answered_fetches_with_long_deadlines_are_purged_from_the_timer_heap(leader, autojump_clock):
    """Consumers answered at once every time while asking for a long max_wait_ms must not
    grow the purgatory until their deadlines pass (Kafka purges completed operations)."""
    from tidelog.broker.replication.replica_manager import PURGE_DELAYED_AT
    rm = leader.replica_manager
    answered = 0
    for offset in range(3 * PURGE_DELAYED_AT):
        answers = attach(consumer_fetch(leader, offset, max_wait_ms=3_600_000))
        leader.produce(make_batch(1))
        answered += len(answers)
    assert answered == 3 * PURGE_DELAYED_AT
    assert len(rm._delayed) <= 2 * PURGE_DELAYED_AT + 2
    assert 0 <= rm._delayed_done <= len(rm._delayed)
    waiting = attach(consumer_fetch(leader, 3 * PURGE_DELAYED_AT, max_wait_ms=200))
    await trio.sleep(0.3)  # the timer still answers what is left
    assert len(waiting) == 1
    await trio.sleep(3600)
    assert rm._delayed == [] and rm._delayed_done == 0


async def test_the_heap_count_holds_when_an_answer_purges_its_own_entry(leader):
    """An answer that ends other waiting fetches (here: cancels them) can purge the heap
    before its own bookkeeping runs; the count of finished entries still matches the heap."""
    from tidelog.broker.replication.replica_manager import PURGE_DELAYED_AT
    rm = leader.replica_manager
    others: list = []

    def answer(body):
        # latest deadline first: none is at the top of the heap, so the finished entries pile
        # up until one cancel's tidying purges them, ``first``'s among them
        for d in reversed(others):
            d.cancel()

    first = consumer_fetch(leader, 0, max_wait_ms=7_200_000)  # the latest deadline
    first.attach(answer)  # watching first: the append tries it first
    others += [consumer_fetch(leader, 0, max_wait_ms=3_600_000) for _ in range(PURGE_DELAYED_AT + 2)]
    for d in others:
        attach(d)
    leader.produce(make_batch(1))
    assert first.done and all(d.done for d in others)
    assert rm._delayed_done == sum(1 for _, _, d in rm._delayed if d.done)


# -- followers' fetches ----------------------------------------------------------------------


@pytest.fixture
async def three(tmp_path, nursery):
    """Broker 1 leading, 2 and 3 following, the leader's purgatory timer running;
    min.insync.replicas 2."""
    config = LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1, min_insync_replicas=2)
    cluster, brokers = make_cluster(str(tmp_path), n=3, config=config)
    cluster.elect(1, [1, 2, 3])
    await nursery.start(brokers[0].replica_manager.run)
    yield cluster
    brokers[0].replica_manager._nursery.cancel_scope.cancel()
    for b in brokers:
        b.close()


def follower_fetch(cluster, follower_id: int, offset: int, max_wait_ms: int = 500, min_bytes: int = 1):
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, 1 << 20, -1)])],
                       replica_id=follower_id, replica_epoch=cluster.brokers[follower_id].broker_epoch,
                       max_wait_ms=max_wait_ms, min_bytes=min_bytes)
    return cluster.leader.apis.fetch(req)


async def test_a_followers_waiting_fetch_is_answered_by_the_leaders_append(three):
    deferred = follower_fetch(three, 2, 0)
    assert isinstance(deferred, DelayedFetch)  # no task of its own
    answers = attach(deferred)
    three.leader.produce(make_batch(2))  # the append answers it, before the produce returns
    [response] = answers
    p = partition_result(response)
    assert p.error_code == NONE.code and p.records and p.high_watermark == 0  # 3 has not fetched yet
    assert not three.leader.partition().watchers


async def test_a_followers_fetch_that_moves_the_high_watermark_answers_the_consumers_waiting(three):
    three.leader.produce(make_batch(1))
    waiting_consumer = attach(consumer_fetch(three.leader, 0))  # nothing under the HW yet
    assert isinstance(follower_fetch(three, 2, 1), DelayedFetch)  # 2 holds the batch; 3 does not
    assert waiting_consumer == []
    follower_fetch(three, 3, 1)  # now every replica in the ISR holds it: the HW moves
    [response] = waiting_consumer
    assert partition_result(response).records and three.leader.log().high_watermark == 1


async def test_a_follower_fetch_whose_own_read_moves_the_high_watermark_is_answered_once(three):
    """A follower's try records its fetch, which may move the HW and notify the partition
    again from inside that try: the nested try of the same fetch is skipped, the consumers
    waiting are answered, and the follower's fetch once, by the next append."""
    leader = three.leader
    leader.produce(make_batch(1))
    follower = attach(follower_fetch(three, 2, 1))  # recorded at 1; 3 holds the HW at 0
    consumer = attach(consumer_fetch(leader, 0))
    # the controller takes 3 out of the ISR in a new epoch: the leader forgets what its
    # followers told it, so the HW stays at 0 until 2's waiting fetch is tried again
    three.elect(1, [1, 2])
    assert consumer and partition_result(consumer[0]).records  # 2's retried read moved the HW
    assert leader.log().high_watermark == 1 and follower == []
    leader.produce(make_batch(1))
    assert len(follower) == 1 and partition_result(follower[0]).records
    assert len(consumer) == 1


async def test_an_expansion_decided_before_a_reassignment_removed_the_follower_is_not_written(three):
    """A caught-up follower's fetch decides to add it to the ISR; the write runs in a task of
    its own. If a LeaderAndIsr that removes the follower from the replicas (a reassignment's
    end) arrives first, the decision is void: writing it would put a non-replica in the ISR,
    and the reassignment would never see its ISR settle."""
    from tests.unit.replication.memory_leader import CONTROLLER_EPOCH
    from tidelog.protocol.messages import PartitionState
    leader = three.leader
    writes = []

    async def isr_writer(tp, isr, leader_epoch, controller_epoch, version):
        writes.append(isr)
        return version + 1

    leader.replica_manager.isr_writer = isr_writer
    three.elect(1, [1, 2])
    leader.produce(make_batch(1))
    follower_fetch(three, 2, 1)
    follower_fetch(three, 3, 1)  # caught up: the expansion to [1, 2, 3] is decided, not yet written
    st = PartitionState(TP.topic, TP.partition, CONTROLLER_EPOCH, 1, three.leader_epoch + 1, [1, 2],
                        three.zk_version + 1, [1, 2])
    three.send(leader, st)  # the reassignment's end: 3 is no longer a replica
    for _ in range(5):
        await trio.lowlevel.checkpoint()
    assert writes == [] and leader.partition().isr == {1, 2}


async def test_a_produce_to_several_partitions_answers_a_waiting_follower_with_all_of_them(three):
    """The partitions are notified after every append of the request (Kafka's action queue):
    a follower's fetch on two of them is answered once, with both batches."""
    from tests.unit.replication.memory_leader import MemoryCluster
    other = TopicPartition(TP.topic, 1)
    second = MemoryCluster(list(three.brokers.values()), tp=other)
    second.elect(1, [1, 2, 3])
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(tp.partition, 0, 1 << 20, -1) for tp in (TP, other)])],
                       replica_id=2, replica_epoch=three.brokers[2].broker_epoch, max_wait_ms=500)
    answers = attach(three.leader.apis.fetch(req))
    produced = ProduceRequest(1, 1000, [TopicProduceData(TP.topic, [PartitionProduceData(tp.partition, make_batch(1))
                                                                      for tp in (TP, other)])])
    three.leader.apis.produce(produced)
    [response] = answers
    assert [bool(p.records) for p in typed(response).responses[0].partitions] == [True, True]


# -- acks=all produces -----------------------------------------------------------------------


def produce_all(cluster_or_broker, timeout_ms: int = 1000):
    request = ProduceRequest(-1, timeout_ms, [TopicProduceData(TP.topic, [PartitionProduceData(TP.partition,
                                                                                               make_batch(1))])])
    broker = getattr(cluster_or_broker, "leader", cluster_or_broker)
    return broker.apis.produce(request)


def produce_result(response: ProduceResponse):
    [topic] = response.responses
    [p] = topic.partition_responses
    return p


async def test_the_follower_fetch_that_commits_an_acks_all_batch_answers_it_synchronously(three):
    deferred = produce_all(three)
    assert isinstance(deferred, DelayedProduce)  # no task of its own
    answers = attach(deferred)
    follower_fetch(three, 2, 1)
    assert answers == []  # 3, in the ISR, does not hold it yet
    follower_fetch(three, 3, 1)  # the HW moves past the batch: answered inside this fetch
    [response] = answers
    assert produce_result(response).error_code == NONE.code and produce_result(response).base_offset == 0
    assert not three.leader.partition().watchers


async def test_an_acks_all_batch_committed_by_its_append_is_answered_at_once(leader):
    response = produce_all(leader)  # the leader alone in the ISR, min.insync.replicas 1
    assert isinstance(response, ProduceResponse) and produce_result(response).error_code == NONE.code


async def test_an_isr_shrinking_below_min_insync_answers_the_wait_with_an_error(three):
    answers = attach(produce_all(three))
    three.elect(1, [1])  # the controller shrinks the ISR below min.insync.replicas
    [response] = answers
    assert produce_result(response).error_code == NOT_ENOUGH_REPLICAS_AFTER_APPEND.code


async def test_the_timer_answers_an_acks_all_wait_at_its_timeout(three, autojump_clock):
    answers = attach(produce_all(three, timeout_ms=300))
    start = trio.current_time()
    while not answers:
        await trio.sleep(0.01)
    assert trio.current_time() - start == pytest.approx(0.3, abs=0.02)
    assert produce_result(answers[0]).error_code == REQUEST_TIMED_OUT.code
    assert not three.leader.partition().watchers


@pytest.fixture
async def throttled_source(tmp_path, nursery):
    """Broker 1 leading with 3 out of the ISR and every replica a throttled source (a move's
    catching-up replica, KIP-73), the leader's throttle at 1 MB/s."""
    config = LogConfig(segment_bytes=100_000, retention_ms=-1, leader_replication_throttled_replicas="*")
    cluster, brokers = make_cluster(str(tmp_path), n=3, config=config)
    cluster.elect(1, [1, 2])
    brokers[0].replica_manager.leader_quota.rate_of = lambda: 1_000_000
    await nursery.start(brokers[0].replica_manager.run)
    yield cluster
    brokers[0].replica_manager._nursery.cancel_scope.cancel()
    for b in brokers:
        b.close()


async def test_a_throttled_followers_waiting_fetch_is_charged_once_for_what_it_is_sent(throttled_source):
    """A waiting fetch is read again at every append until min_bytes are there; only the read
    that answers it is sent, and only its bytes drain the leader's throttle."""
    leader = throttled_source.leader
    quota = leader.replica_manager.leader_quota
    leader.produce(make_batch(1, size=100))
    answers = attach(follower_fetch(throttled_source, 3, 0, max_wait_ms=30_000, min_bytes=1000))
    for _ in range(4):  # each append tries it again: below min_bytes, nothing is sent
        leader.produce(make_batch(1, size=100))
    assert answers == [] and quota.throttled_bytes == 0
    while not answers:
        leader.produce(make_batch(1, size=100))
    [response] = answers
    sent = len(partition_result(response).records)
    assert sent >= 1000 and quota.throttled_bytes == sent


async def test_a_throttled_followers_fetch_answered_at_once_is_charged_for_its_bytes(throttled_source):
    leader = throttled_source.leader
    for _ in range(3):
        leader.produce(make_batch(1, size=100))
    response = follower_fetch(throttled_source, 3, 0)
    assert isinstance(response, dict)  # answered now
    assert leader.replica_manager.leader_quota.throttled_bytes == len(partition_result(response).records) > 0


async def test_a_fetch_naming_a_partition_many_times_is_tried_once_per_append(leader, monkeypatch):
    """Its partitions are keyed by partition, the last entry winning (Kafka's fetchData map):
    a request repeating one partition must not cost a try per entry at every append."""
    from tidelog.broker.log.log import Log

    leader.produce(make_batch(1))
    first, last = FetchPartition(TP.partition, 0, 1 << 20, -1), FetchPartition(TP.partition, 1, 1 << 20, -1)
    req = FetchRequest([FetchTopic(TP.topic, [first] * 5_000), FetchTopic(TP.topic, [first] * 4_999 + [last])],
                       max_wait_ms=60_000, min_bytes=1 << 30)
    deferred = leader.apis.fetch(req)
    assert isinstance(deferred, DelayedFetch)
    answers = attach(deferred)
    tries = [0]
    bytes_below = Log.bytes_below

    def counted(self, *args):
        tries[0] += 1
        return bytes_below(self, *args)

    monkeypatch.setattr(Log, "bytes_below", counted)
    leader.produce(make_batch(1))
    assert tries[0] == 1 and not answers
    deferred.try_complete(force=True)
    [answer] = answers
    [topic] = typed(answer).responses
    [p] = topic.partitions
    assert p.records == partition_result(consumer_fetch(leader, 1)).records  # the last entry's offset


@pytest.mark.parametrize("bound", ["request", "broker"])
async def test_min_bytes_above_what_the_fetch_may_return_is_answered_at_once(roomy_leader, bound):
    """min_bytes is capped at the bytes the answer may hold (the request's max_bytes, the
    broker's fetch.max.bytes, a quota's window cap), as Kafka's fetchMinBytes: else such a
    fetch waits its whole max_wait_ms though nothing more could be sent."""
    import dataclasses
    leader = roomy_leader
    rm = leader.replica_manager
    for _ in range(50):
        assert leader.produce(make_batch(10, size=100))["error_code"] == NONE.code
    max_bytes = 1 << 20
    if bound == "broker":
        rm.config = dataclasses.replace(rm.config, fetch_max_bytes=5000)
    else:
        max_bytes = 5000
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, 0, 1 << 20, -1)])],
                       max_wait_ms=60_000, min_bytes=10_000, max_bytes=max_bytes)
    answer = leader.apis.fetch(req)
    assert not isinstance(answer, DelayedFetch)
    assert 3000 < len(partition_result(answer).records) <= 5000


async def test_a_waiting_fetch_is_answered_once_what_it_may_return_is_there(roomy_leader):
    # its answer stops at whole batches below the bound: the positions complete it
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, 0, 1 << 20, -1)])],
                       max_wait_ms=60_000, min_bytes=10_000, max_bytes=5000)
    answers = attach(roomy_leader.apis.fetch(req))
    produced = 0
    while not answers and produced < 20:
        roomy_leader.produce(make_batch(10, size=100))
        produced += 1
    assert answers and produced * len(make_batch(10, size=100)) >= 5000
    assert 3000 < len(partition_result(answers[0]).records) <= 5000


async def test_the_purgatories_count_what_waits_for_replication_or_records(three, nursery):
    """Kafka's purgatory sizes: acks=all produces waiting for the high watermark and fetches
    waiting for records, whether they wait as delayed operations or as coroutines (a
    follower's fetch whose broker epoch is checked first, a produce validated in a worker
    thread); nothing else (an acks=1 produce awaited for its validation is in neither)."""
    from trio.testing import wait_all_tasks_blocked

    rm = three.leader.replica_manager
    produced = attach(produce_all(three))
    consumed = attach(consumer_fetch(three.leader, 0))  # nothing below the HW yet
    assert (rm.produce_purgatory_size, rm.fetch_purgatory_size) == (1, 1)
    results, waiting = rm.append_now(-1, {TP: make_batch(1)})
    nursery.start_soon(rm.await_replication, waiting, 60_000, results)
    follower = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, 2, 1 << 20, -1)])],
                            replica_id=2, replica_epoch=three.brokers[2].broker_epoch, max_wait_ms=60_000)
    nursery.start_soon(rm.fetch, follower)
    await wait_all_tasks_blocked()
    assert (rm.produce_purgatory_size, rm.fetch_purgatory_size) == (2, 2)
    cancelled = consumer_fetch(three.leader, 0)
    attach(cancelled)
    cancelled.cancel()
    assert (rm.produce_purgatory_size, rm.fetch_purgatory_size) == (2, 2)
    three.leader.produce(make_batch(1))  # wakes the follower's fetch: it reads from 2
    follower_fetch(three, 3, 3)  # 3 holds everything: its fetch moves the HW (2 was at 2)
    await wait_all_tasks_blocked()
    assert produced and consumed
    assert (rm.produce_purgatory_size, rm.fetch_purgatory_size) == (0, 0)


async def test_an_acks_all_produce_validated_in_a_worker_waits_as_a_delayed_produce(three):
    """Its task validates and appends, then hands over the wait for replication: a DelayedProduce,
    holding neither the request nor its records (the network layer gives the frame's memory back
    when the task returns)."""
    from tidelog.protocol.records import Codec

    batch = make_batch(3, codec=Codec.GZIP)  # compressed: validated in a worker thread
    request = ProduceRequest(-1, 1000, [TopicProduceData(TP.topic, [PartitionProduceData(TP.partition, batch)])])
    started = three.leader.apis.produce(request)
    assert inspect.isawaitable(started)
    waiting = await started
    assert isinstance(waiting, DelayedProduce)
    answers = attach(waiting)
    follower_fetch(three, 2, 3)
    follower_fetch(three, 3, 3)  # every replica in the ISR holds it: the HW passes it
    [response] = answers
    assert produce_result(response).error_code == NONE.code and produce_result(response).base_offset == 0
