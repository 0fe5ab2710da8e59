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
import time

import pytest

from tests.support import fuzz_lanes
from tests.support.cluster import log_tail
from tests.support.disk import log_dirs
from tests.support.fuzz import Driver, Names, Stats
from tests.support.fuzz_lanes import MAX_FRAME, consume_all, create_topics, fuzz_cluster, report_head
from tests.support.raw_client import RawClient
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
GOOD_TOPIC = "steady"
NAMES = Names()


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from fuzz_cluster(request, tmp_path_factory.mktemp("fuzz"))


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
    create_topics(cluster, NAMES, GOOD_TOPIC)
    client = GoodClient(cluster)
    client.check()
    yield client
    client.raw.close()


@pytest.fixture
def plan(request) -> list[tuple[int, float]]:
    return fuzz_lanes.plan(request.config, FIXED_SEED, SLICE_SECONDS)


def report(seed: int, stats: Stats) -> str:
    lines = [report_head("fuzz", seed, stats),
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
    assert consume_all(cluster, GOOD_TOPIC, len(good.values), "the well-behaved client's records consumed") \
        == good.values

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
