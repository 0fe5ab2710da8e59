"""A DevCluster's processes for the tests: start, stop or kill, failure dumps, metadata as
each broker serves it, consuming what was written.

Every cluster is started from the main thread (the children get PR_SET_PDEATHSIG) and is
always stopped: with SIGTERM (controlled shutdown) when the tests that used it passed, with
SIGKILL when one of them failed (after printing the tail of every broker's log, which pytest
shows with the failure). Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_until
from tidelog import Consumer, Record, TopicPartition
from tidelog.broker.devcluster import DevCluster
from tidelog.protocol.messages import MetadataResponse, PartitionMetadata, TopicMetadata

# -- processes ------------------------------------------------------------------------------------


def log_tail(path: Path, lines: int = 80, leave_out: str | None = None) -> str:
    """The last ``lines`` lines of a process's log (without those that contain ``leave_out``)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join([x for x in text if leave_out is None or leave_out not in x][-lines:])


def dump_logs(cluster: DevCluster, lines: int = 80, leave_out: str | None = None) -> None:
    """Print the tail of every broker's log (without the lines that contain ``leave_out``)."""
    for i, b in cluster.brokers.items():
        state = "running" if b.running else f"exited {b.proc.returncode if b.proc else None}"
        left_out = f", lines with {leave_out!r} left out" if leave_out else ""
        print(f"===== broker {i} ({state}) {b.log_path} (last {lines} lines{left_out}) =====")
        print(log_tail(b.log_path, lines, leave_out))


def shut_down(cluster: DevCluster, failed: bool, per_broker_timeout: float = 30.0) -> None:
    """SIGTERM every broker (SIGKILL after ``per_broker_timeout``) then ZooKeeper; SIGKILL
    everything at once when ``failed``."""
    if failed:
        dump_logs(cluster)
        cluster.kill()
        return
    try:
        for b in cluster.brokers.values():
            b.stop(per_broker_timeout)
    finally:
        cluster.kill()  # whatever is left (no-op for processes that exited), ZooKeeper included


def dump_zookeeper(cluster: DevCluster) -> None:
    """The controller and every partition state as ZooKeeper holds them (for diagnosis:
    the metadata the brokers serve may lag it)."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=5)
    try:
        zk.start(timeout=5)
        root = "/tidelog"
        print("zookeeper /controller:", zk.get(f"{root}/controller")[0] if zk.exists(f"{root}/controller") else None)
        print("zookeeper brokers:", sorted(zk.get_children(f"{root}/brokers/ids")))
        for topic in sorted(zk.get_children(f"{root}/brokers/topics")):
            for p in sorted(zk.get_children(f"{root}/brokers/topics/{topic}/partitions"), key=int):
                data, stat = zk.get(f"{root}/brokers/topics/{topic}/partitions/{p}/state")
                print(f"zookeeper {topic}-{p}: {data.decode()} (version {stat.version})")
    except Exception as e:  # noqa: BLE001 -- diagnosis only, on the way out
        print(f"<cannot read ZooKeeper: {e!r}>")
    finally:
        with contextlib.suppress(Exception):
            zk.stop()
            zk.close()


@contextlib.contextmanager
def started_cluster(directory: Path, brokers: int, extra_config: dict[str, object] | None = None,
                    ready_timeout: float = 60.0, security: str | None = None,
                    kafka: bool = False) -> Iterator[DevCluster]:
    """A started DevCluster on free ports; stopped on exit (killed if the block raised)."""
    cluster = DevCluster(directory, brokers=brokers, zk_port=0, base_port=0,
                         extra_config=dict(extra_config or {}), security=security, kafka=kafka)
    failed = True
    try:
        cluster.start(ready_timeout)
        yield cluster
        failed = False
    finally:
        shut_down(cluster, failed)


def cluster_fixture(request: pytest.FixtureRequest, directory: Path, brokers: int,
                    extra_config: dict[str, object] | None = None, *,
                    zk_tick_time_ms: int | None = None, security: str | None = None,
                    kafka: bool = False) -> Iterator[DevCluster]:
    """The body of a cluster fixture of any scope: the cluster is killed (and its logs shown)
    when any test failed while it was up, else stopped cleanly. ``zk_tick_time_ms`` sets
    ZooKeeper's tick (its sessions may last at most 20 ticks). ``kafka``: Kafka listeners too."""
    session = request.session
    failed_before = session.testsfailed
    cluster = DevCluster(directory, brokers=brokers, zk_port=0, base_port=0,
                         extra_config=dict(extra_config or {}), security=security, kafka=kafka)
    if zk_tick_time_ms is not None:
        cluster.zookeeper.tick_time_ms = zk_tick_time_ms
    started = False
    try:
        cluster.start(60.0)
        started = True
        yield cluster
    finally:
        shut_down(cluster, failed=not started or session.testsfailed > failed_before)


# -- metadata ------------------------------------------------------------------------------------


def broker_metadata(cluster: DevCluster, broker_id: int) -> MetadataResponse:
    return cluster.metadata(broker_id)


def running(cluster: DevCluster) -> list[int]:
    return [i for i, b in cluster.brokers.items() if b.running]


def topic_of(md: MetadataResponse, topic: str) -> TopicMetadata | None:
    for t in md.topics:
        if t.name == topic and t.error_code == 0:
            return t
    return None


def partitions_of(md: MetadataResponse, topic: str) -> dict[int, PartitionMetadata]:
    t = topic_of(md, topic)
    return {} if t is None else {p.partition_index: p for p in t.partitions}


def wait_topic_ready(cluster: DevCluster, topic: str, num_partitions: int, isr_size: int,
                     timeout: float = 30.0, via: Iterable[int] | None = None) -> dict[int, PartitionMetadata]:
    """Wait until every (running, or listed) broker's metadata shows ``topic`` with
    ``num_partitions`` partitions, each with a live leader and ``isr_size`` in-sync replicas.
    Returns the partitions as the last of those brokers describes them."""
    ids = list(via) if via is not None else running(cluster)

    def ready():
        out = None
        for i in ids:
            md = broker_metadata(cluster, i)
            live = {b.node_id for b in md.brokers}
            parts = partitions_of(md, topic)
            if len(parts) != num_partitions or any(
                    p.leader_id not in live or len(p.isr_nodes) != isr_size for p in parts.values()):
                return None
            out = parts
        return out

    return wait_until(ready, timeout, f"topic {topic!r} with {num_partitions} partitions and ISRs of {isr_size}")


def controller_id(cluster: DevCluster, via: int) -> int:
    return broker_metadata(cluster, via).controller_id


# -- consuming -----------------------------------------------------------------------------------


def consume_range(bootstrap: str, ends: dict[TopicPartition, int], timeout: float = 60.0,
                  starts: dict[TopicPartition, int] | None = None, **options: Any) -> dict[TopicPartition, list[Record]]:
    """Every record of each partition from ``starts`` (default 0) up to ``ends`` (exclusive),
    read with a Consumer assigned to those partitions (``options``: more Consumer options,
    e.g. the security ones)."""
    out: dict[TopicPartition, list[Record]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + timeout
    with Consumer(bootstrap, auto_offset_reset="none", fetch_max_wait_ms=200, **options) as consumer:
        consumer.assign(list(ends))
        for tp in ends:
            consumer.seek(tp, (starts or {}).get(tp, 0))
        remaining = {tp for tp, end in ends.items() if end > (starts or {}).get(tp, 0)}
        while remaining:
            if time.monotonic() > deadline:
                got = {str(tp): (out[tp][-1].offset if out[tp] else None, ends[tp]) for tp in remaining}
                raise AssertionError(f"records not all consumed within {timeout} s: (last, end) {got}")
            for r in consumer.poll(timeout_ms=500):
                tp = TopicPartition(r.topic, r.partition)
                if r.offset < ends[tp]:
                    out[tp].append(r)
                if r.offset >= ends[tp] - 1:
                    remaining.discard(tp)
    return out


def end_offsets(bootstrap: str, tps: list[TopicPartition], timeout_ms: int = 30000,
                **options: Any) -> dict[TopicPartition, int]:
    with Consumer(bootstrap, **options) as consumer:
        return consumer.end_offsets(tps, timeout_ms=timeout_ms)
