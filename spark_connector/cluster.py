"""What the driver asks the cluster: which partitions a query reads, and their offsets.

One ``ClusterView`` per driver-side reader, opened lazily on first use (a reader must stay
cheap and picklable: Spark pickles it to the planner and the executors) and kept for the
query run: the streaming source runner is one long-lived process per run. Spark never calls
``stop()`` on it (FEASIBILITY 3), so the clients' daemon threads end with that process.

``partitions`` lists the partitions of the matching topics with their leader (-1 when the
partition has none right now). With ``assign`` it lists the assigned partitions the
metadata holds, so that the reader applies the same rules as with ``subscribe``: a
partition without a leader is held (its offsets cannot be looked up: the lookup would block
until it times out), and one whose topic was deleted is data loss.

Offset lookups (``earliest``, ``latest``, ``by_time``) that fail with a Tidelog error are
tried again, up to fetchOffset.numRetries more times, fetchOffset.retryIntervalMs apart
(``retrying``), as Spark's Kafka source retries its offset fetches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tidelog import Admin, Consumer, TidelogError, TopicPartition
from tidelog.spark.options import SourceOptions, Subscription
from tidelog.spark.planning import TP

__all__ = ["ClusterView", "retrying"]

log = logging.getLogger("spark_connector")

T = TypeVar("T")


def retrying(call: Callable[[], T], *, retries: int, interval_ms: int, what: str,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, tried again up to ``retries`` times when it raises a TidelogError."""
    for attempt in range(retries + 1):
        try:
            return call()
        except TidelogError as e:
            if attempt == retries:
                raise
            log.info("%s failed (%s); retry %d of %d in %d ms (fetchOffset.numRetries)", what, e, attempt + 1,
                     retries, interval_ms)
            sleep(interval_ms / 1000)
    raise AssertionError("unreachable")


class ClusterView:
    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._admin: Admin | None = None
        self._consumer: Consumer | None = None

    def __enter__(self) -> "ClusterView":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self.opts.bootstrap_servers,
                                **{"client_id": "tidelog-spark-driver", **self.opts.admin_options})
        return self._admin

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            options = {"client_id": "tidelog-spark-driver", **self.opts.consumer_options}
            self._consumer = Consumer(self.opts.bootstrap_servers, auto_offset_reset="none", **options)
        return self._consumer

    def partitions(self, subscription: Subscription | None = None) -> dict[TP, int]:
        """``{(topic, partition): leader id}`` of every partition the query reads now (with
        ``assign``: the assigned partitions that exist)."""
        sub = subscription or self.opts.subscription
        assigned = set(sub.assigned) if sub.kind == "assign" else None
        for attempt in range(3):
            names = [t for t in self.admin.list_topics() if sub.matches(t)]
            if not names:
                return {}
            try:
                described = self.admin.describe_topics(names)
            except TidelogError as e:  # a topic deleted between the two calls
                if attempt == 2:
                    raise
                log.info("listing partitions again: %s", e)
                continue
            return {(p.topic, p.partition): p.leader for d in described for p in d.partitions
                    if assigned is None or (p.topic, p.partition) in assigned}
        raise AssertionError("unreachable")

    def earliest(self, tps: list[TP]) -> dict[TP, int]:
        if not tps:
            return {}
        found = self._retrying(lambda: self.consumer.beginning_offsets([TopicPartition(*tp) for tp in tps]),
                               "looking up the log start offsets")
        return {(tp.topic, tp.partition): o for tp, o in found.items()}

    def latest(self, tps: list[TP]) -> dict[TP, int]:
        """The high watermarks (what a consumer may read up to)."""
        if not tps:
            return {}
        found = self._retrying(lambda: self.consumer.end_offsets([TopicPartition(*tp) for tp in tps]),
                               "looking up the high watermarks")
        return {(tp.topic, tp.partition): o for tp, o in found.items()}

    def log_end(self, tps: list[TP]) -> dict[TP, int]:
        """The log end offsets on the leaders (ahead of the high watermarks by the records the
        in-sync replicas have not all copied yet)."""
        if not tps:
            return {}
        found = self._retrying(lambda: self.admin.log_end_offsets([TopicPartition(*tp) for tp in tps]),
                               "looking up the log end offsets")
        return {(tp.topic, tp.partition): o for tp, o in found.items()}

    def by_time(self, timestamps: dict[TP, int]) -> dict[TP, int | None]:
        if not timestamps:
            return {}
        found = self._retrying(
            lambda: self.consumer.offsets_for_times({TopicPartition(*tp): ts for tp, ts in timestamps.items()}),
            "looking up offsets by timestamp")
        return {(tp.topic, tp.partition): (None if v is None else v.offset) for tp, v in found.items()}

    def _retrying(self, call: Callable[[], T], what: str) -> T:
        return retrying(call, retries=self.opts.fetch_offset_retries,
                        interval_ms=self.opts.fetch_offset_retry_interval_ms, what=what)

    def commit(self, group_id: str, offsets: dict[TP, int]) -> None:
        """Store ``offsets`` as ``group_id``'s committed offsets, as a commit outside group
        management (the query is not a group member): the coordinator accepts it while the
        group has no members, and refuses it (NON_EMPTY_GROUP) if consumers joined it."""
        if offsets:
            self.admin.alter_group_offsets(group_id, {TopicPartition(*tp): o for tp, o in offsets.items()})

    def close(self) -> None:
        for client in (self._admin, self._consumer):
            if client is not None:
                try:
                    client.close(timeout=5.0)
                except Exception as e:  # closing is best effort
                    log.debug("closing %s: %s", client, e)
        self._admin = self._consumer = None
