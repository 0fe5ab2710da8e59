"""The fuzzer against a real broker process (issue 14, point 9).

One single-broker cluster for the module (``socket.request.max.bytes`` 1 MiB, no topic
auto-creation, groups that rebalance at once and time out within 10 s, 32 MiB of retention
per partition). ``tests.support.fuzz``
sends structure-aware and random inputs on several pipelined connections: mutated bodies of
every API of the registry, the inter-broker ones included, mutated and compressed record
batches, mutated envelopes, random frames and random byte streams. They name only the fuzz
topics and groups; a well-behaved client produces to a topic of its own.

Asserted: the broker never exits; every answer decodes and carries the correlation id it
should, or the broker closed a connection whose input it could not answer; nothing waits
a minute unanswered; no answer says UNKNOWN_SERVER_ERROR and every inter-broker request is
refused; the well-behaved client, every two seconds while the fuzzer's requests are in flight,
produces one record and reads back everything it produced; at the end the broker's log holds
no traceback and no failed handler, it stops cleanly, an SDK consumer reads every
acknowledged record, and ``dump-log --verify`` finds nothing wrong in any segment.

In CI: FIXED_SEED then a random seed (printed), SLICE_SECONDS in all. By hand, for hours::

    pytest -m integration tests/integration/test_fuzz.py --fuzz-seconds 3600 [--fuzz-seed 7] -s

A finding names its seed, lane and input number: ``tests.support.fuzz.replay`` rebuilds it.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.support.cluster import cluster_fixture, log_tail, wait_topic_ready
from tests.support.disk import log_dirs
from tests.support.fuzz import Driver, Names, Stats
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, TopicPartition
from tidelog.broker.log.dump import run as dump_run
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from tidelog.protocol.records import build_batch, iter_all_records

FIXED_SEED = 14
SLICE_SECONDS = 24.0
MAX_FRAME = 1 << 20
GOOD_TOPIC = "steady"
NAMES = Names()


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("fuzz"), 1, {
        "socket.request.max.bytes": MAX_FRAME, "auto.create.topics.enable": False,
        "max.partitions.per.topic": 64, "max.partitions.per.request": 128,
        "group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000,
        "group.max.session.timeout.ms": 10000, "offsets.topic.num.partitions": 1,
        "offsets.topic.replication.factor": 1,
        # the fuzz topics take what the broker accepts, hours of it: kept to a few segments
        "log.segment.bytes": 4 << 20, "log.retention.bytes": 32 << 20, "log.retention.check.interval.ms": 10000,
        "log.segment.delete.delay.ms": 1000})


class GoodClient:
    """A well-behaved raw client on a connection of its own: each check produces one record
    (acks=all) and reads back everything it produced, in order."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.raw = RawClient(cluster.brokers[1].port, timeout=30)
        self.values: list[bytes] = []

    def check(self) -> None:
        value = b"good-%d" % len(self.values)
        produce = ProduceRequest(-1, 10000, [TopicProduceData(GOOD_TOPIC, [PartitionProduceData(0, build_batch(
            [value], timestamp_ms=int(time.time() * 1000)))])])
        p = ProduceResponse.from_body(self.raw.request(ApiKey.PRODUCE, produce)).responses[0].partition_responses[0]
        assert (p.error_code, p.base_offset) == (NONE.code, len(self.values)), p
        self.values.append(value)
        assert self.stored() == self.values

    def stored(self) -> list[bytes]:
        response = FetchResponse.from_body(self.raw.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic(GOOD_TOPIC, [FetchPartition(0, 0, 8 << 20)])], max_wait_ms=0, max_bytes=8 << 20)))
        p = response.responses[0].partitions[0]
        assert p.error_code == NONE.code, p
        return [r.value for r in iter_all_records(p.records or b"")]


@pytest.fixture(scope="module")
def good(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(t, NAMES.partitions, 1) for t in NAMES.topics] + [NewTopic(GOOD_TOPIC, 1, 1)])
    for t in NAMES.topics:
        wait_topic_ready(cluster, t, NAMES.partitions, 1)
    wait_topic_ready(cluster, GOOD_TOPIC, 1, 1)
    client = GoodClient(cluster)
    client.check()
    yield client
    client.raw.close()


@pytest.fixture
def plan(request) -> list[tuple[int, float]]:
    """(seed, seconds) of each run: --fuzz-seed for --fuzz-seconds, else the fixed seed and a
    random one, half the slice each."""
    seconds = request.config.getoption("--fuzz-seconds")
    seed = request.config.getoption("--fuzz-seed")
    if seed is not None:
        return [(seed, seconds or SLICE_SECONDS)]
    total = seconds or SLICE_SECONDS
    return [(FIXED_SEED, total / 2), (random.SystemRandom().randrange(1, 2**31), total / 2)]


def report(seed: int, stats: Stats) -> str:
    rate = stats.total / stats.seconds if stats.seconds else 0.0
    lines = [f"fuzz seed {seed}: {stats.total} inputs in {stats.seconds:.1f} s ({rate:.0f}/s), "
             f"{stats.responses} responses, {stats.checks} good-client checks, "
             f"connections closed by the broker {dict(stats.closed)}, load average {os.getloadavg()}",
             f"  inputs: {dict(stats.inputs)}",
             f"  apis: {dict(sorted(stats.apis.items()))}",
             f"  mutations: {dict(sorted(stats.mutations.items()))}",
             f"  error codes: {dict(stats.errors.most_common())}",
             f"  responses over the client's object bound, by API: {dict(stats.amplified)}",
             f"  reproduce: --fuzz-seed {seed} --fuzz-seconds {stats.seconds:.0f}"]
    lines += [f"  e.g. {e}" for e in stats.amplified_examples[:2]]
    lines += [f"  FINDING {f}" for f in stats.findings]
    return "\n".join(lines)


def test_fuzzing_never_kills_poisons_or_starves_the_broker(cluster, good, plan, capsys):
    broker = cluster.brokers[1]
    for seed, seconds in plan:
        with capsys.disabled():
            print(f"\nfuzzing the broker with seed {seed} for {seconds:g} s")
        stats = Driver(broker.port, seed, seconds=seconds, names=NAMES, max_frame_bytes=MAX_FRAME,
                       check=good.check, alive=lambda: broker.running).run()
        with capsys.disabled():
            print(report(seed, stats))
        assert stats.total > 0 and stats.checks > 0
        assert not stats.findings, "\n".join(stats.findings)
    assert broker.running, "the broker process exited"
    good.check()
    good.raw.close()

    # every acknowledged record, for an ordinary consumer too
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(GOOD_TOPIC, 0)])
        got: list[bytes] = []
        wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=500)) or len(got) >= len(good.values),
                   60, "the well-behaved client's records consumed")
    assert got == good.values

    # a clean stop, no traceback, and every segment verifies
    assert broker.stop(60) == 0, log_tail(broker.log_path, 60)
    text = broker.log_path.read_text(errors="replace")
    for needle in ("Traceback", "handler failed on", "does not encode", "unexpected error on the connection"):
        assert needle not in text, f"{needle!r} in the broker's log:\n" + _around(text, needle)
    segments = [str(p) for d in log_dirs(cluster).values() for p in sorted(d.glob("*/*.log"))]
    assert any(f"{GOOD_TOPIC}-0" in s for s in segments)
    with open(os.devnull, "w") as out:
        assert dump_run(segments, verify=True, out=out) == 0, "dump-log --verify found problems"


def _around(text: str, needle: str, lines: int = 40) -> str:
    at = text.index(needle)
    start = text.rfind("\n", 0, max(0, at - 2000)) + 1
    return "\n".join(text[start:].splitlines()[:lines])
