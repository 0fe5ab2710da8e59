"""An acks=all producer that keeps sending from a thread while a test breaks the cluster,
and the oracle of docs/reliability.md's I1 (and I4) over what it had acknowledged."""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.support.cluster import consume_range, end_offsets
from tests.support.waiting import wait_until
from tidelog import Producer, RecordMetadata, TopicPartition


class SteadyProducer:
    """An acks=all Producer sending keyed records from a thread (a few thousand a second)
    until stopped; every record's future is kept. ``options``: more Producer options."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: int = 2000, **options):
        self.topic = topic
        self.producer = Producer(bootstrap, **{
            "acks": "all", "linger_ms": 2, "request_timeout_ms": 15000, "delivery_timeout_ms": 90000,
            "retry_backoff_ms": 50, "max_block_ms": 30000, **options})
        self.futures: list = []
        self._pause = 50 / rate_per_s
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def __enter__(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.producer.close(timeout=0 if exc[0] else 60)

    def _run(self) -> None:
        seq = 0
        try:
            while not self._stop.is_set():
                for _ in range(50):
                    self.futures.append(self.producer.send(self.topic, b"v-%d" % seq, key=b"k-%d" % (seq % 101)))
                    seq += 1
                time.sleep(self._pause)
        except BaseException as e:  # reported by finish()
            self._error = e

    def acked(self) -> int:
        return sum(1 for f in list(self.futures) if f.done() and f.exception(0) is None)

    def acked_in(self, partition: int, since: int = 0) -> int:
        return sum(1 for f in list(self.futures)[since:]
                   if f.done() and f.exception(0) is None and f.topic_partition.partition == partition)

    def wait_acked(self, n: int, timeout: float, partition: int | None = None, since: int = 0) -> None:
        if partition is None:
            wait_until(lambda: self.acked() >= n, timeout, f"{n} records acknowledged", interval=0.1)
        else:
            wait_until(lambda: self.acked_in(partition, since) >= n, timeout,
                       f"{n} records acknowledged in partition {partition}", interval=0.1)

    def finish(self, timeout: float = 90.0) -> list[tuple[bytes, RecordMetadata]]:
        """Stop sending, wait for every record's outcome; all must be acknowledged."""
        self._stop.set()
        self._thread.join(30)
        assert self._error is None, f"the producer thread failed: {self._error!r}"
        self.producer.flush(timeout=timeout)
        out, failures = [], []
        for seq, f in enumerate(self.futures):
            err = f.exception(0)
            if err is not None:
                failures.append((seq, err))
            else:
                out.append((b"v-%d" % seq, f.result(0)))
        assert not failures, f"{len(failures)} of {len(self.futures)} records failed, first: {failures[:3]}"
        return out


def assert_all_acked_present(cluster, topic: str, acked: list[tuple[bytes, RecordMetadata]],
                             partitions: int, *, unique_values: bool = False) -> None:
    """I1: every acknowledged record is at its offset; offsets strictly increase. With
    ``unique_values``, I4 too: each acknowledged value is in the topic once (SteadyProducer's
    values are distinct, so a second copy is a retry written twice)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = end_offsets(cluster.bootstrap, tps)
    records = consume_range(cluster.bootstrap, ends, timeout=90)
    by_offset = {tp: {r.offset: r.value for r in rs} for tp, rs in records.items()}
    for tp, rs in records.items():
        offsets = [r.offset for r in rs]
        assert offsets == sorted(set(offsets)), f"{tp}: offsets not strictly increasing"
    lost = [(m.partition, m.offset, v) for v, m in acked
            if by_offset[TopicPartition(topic, m.partition)].get(m.offset) != v]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost or changed, first: {lost[:5]}"
    if unique_values:
        count = Counter(r.value for rs in records.values() for r in rs)
        twice = [(v, count[v]) for v, _ in acked if count[v] > 1]
        assert not twice, f"{len(twice)} acknowledged values written more than once, first (value, times): {twice[:5]}"
