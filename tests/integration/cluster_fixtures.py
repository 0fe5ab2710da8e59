"""Shared fixtures and helpers for the multi-broker integration tests (real ZooKeeper + broker
processes through ``broker.devcluster.DevCluster``).

Import what a test module needs explicitly (these are not conftest fixtures)::

    from tests.integration.cluster_fixtures import cluster_3, wait_until, ...

Every cluster is started from the main thread (the children get PR_SET_PDEATHSIG) and is
always stopped in the fixture's finalizer: with SIGTERM (controlled shutdown) when the tests
that used it passed, with SIGKILL when one of them failed (after printing the tail of every
broker's log, which pytest shows with the failure). Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidelog import Consumer, Record, TopicPartition
from tidelog.broker.devcluster import DevCluster, metadata
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.messages import MetadataResponse, PartitionMetadata, TopicMetadata
from tidelog.protocol.records import iter_all_records

T = TypeVar("T")

# Small timeouts so that hard kills are noticed quickly: a killed broker's ZooKeeper session
# expires after 6 s, a follower that stopped fetching leaves the ISR after 3 s, and a
# controlled shutdown that cannot move everything gives up after 3 x 0.5 s.
FAST_FAILOVER: dict[str, object] = {
    "zookeeper.session.timeout.ms": 6000,
    "replica.lag.time.max.ms": 3000,
    "controlled.shutdown.retry.backoff.ms": 500,
    "replica.fetch.backoff.ms": 200,
}


# -- waiting -------------------------------------------------------------------------------------


def wait_until(condition: Callable[[], T], timeout: float, message: str = "condition",
               interval: float = 0.05) -> T:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout`` seconds
    pass (AssertionError naming ``message`` and the last value or error). Connection errors
    while polling count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = condition()
            if value:
                return value
            last = value
        except (OSError, ConnectionError) as e:
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message}: not reached within {timeout} s (last: {last!r})")
        time.sleep(interval)


# -- the cluster ---------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<cannot read {path}: {e}>"


def dump_logs(cluster: DevCluster, lines: int = 80) -> None:
    for i, b in cluster.brokers.items():
        state = "running" if b.running else f"exited {b.proc.returncode if b.proc else None}"
        print(f"===== broker {i} ({state}) {b.log_path} =====")
        print(_tail(b.log_path, lines))


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


@contextlib.contextmanager
def started_cluster(directory: Path, brokers: int, extra_config: dict[str, object] | None = None,
                    ready_timeout: float = 60.0) -> Iterator[DevCluster]:
    """A started DevCluster on free ports; stopped on exit (killed if the block raised)."""
    cluster = DevCluster(directory, brokers=brokers, zk_port=0, base_port=0,
                         extra_config=dict(extra_config or {}))
    failed = True
    try:
        cluster.start(ready_timeout)
        yield cluster
        failed = False
    finally:
        shut_down(cluster, failed)


def cluster_fixture(request: pytest.FixtureRequest, directory: Path, brokers: int,
                    extra_config: dict[str, object] | None = None, *,
                    zk_tick_time_ms: int | None = None) -> Iterator[DevCluster]:
    """The body of a cluster fixture of any scope: the cluster is killed (and its logs shown)
    when any test failed while it was up, else stopped cleanly. ``zk_tick_time_ms`` sets
    ZooKeeper's tick (its sessions may last at most 20 ticks)."""
    session = request.session
    failed_before = session.testsfailed
    cluster = DevCluster(directory, brokers=brokers, zk_port=0, base_port=0,
                         extra_config=dict(extra_config or {}))
    if zk_tick_time_ms is not None:
        cluster.zookeeper.tick_time_ms = zk_tick_time_ms
    started = False
    try:
        cluster.start(60.0)
        started = True
        yield cluster
    finally:
        shut_down(cluster, failed=not started or session.testsfailed > failed_before)


@pytest.fixture(scope="module")
def cluster_3(request, tmp_path_factory) -> Iterator[DevCluster]:
    """One 3-broker cluster shared by a module."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("cluster3"), 3, FAST_FAILOVER)


@pytest.fixture
def fresh_cluster_3(request, tmp_path_factory) -> Iterator[DevCluster]:
    """A 3-broker cluster of the test's own (for tests that kill brokers)."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("failover"), 3, FAST_FAILOVER)


# -- metadata ------------------------------------------------------------------------------------


def broker_metadata(cluster: DevCluster, broker_id: int) -> MetadataResponse:
    return metadata(cluster.brokers[broker_id].port)


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
                  starts: dict[TopicPartition, int] | None = None) -> dict[TopicPartition, list[Record]]:
    """Every record of each partition from ``starts`` (default 0) up to ``ends`` (exclusive),
    read with a Consumer assigned to those partitions."""
    out: dict[TopicPartition, list[Record]] = {tp: [] for tp in ends}
    deadline = time.monotonic() + timeout
    with Consumer(bootstrap, auto_offset_reset="none", fetch_max_wait_ms=200) as consumer:
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


def end_offsets(bootstrap: str, tps: list[TopicPartition], timeout_ms: int = 30000) -> dict[TopicPartition, int]:
    with Consumer(bootstrap) as consumer:
        return consumer.end_offsets(tps, timeout_ms=timeout_ms)


# -- raw sockets (hostile input) -------------------------------------------------------------------


class RawClient:
    """A blocking socket speaking the framed protocol through ``protocol.connection``, or raw
    bytes. Reads are bounded by ``timeout``."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = ClientConnection(client_id="hostile-test")
        self.timeout = timeout
        self._buffered: list[tuple[int, dict]] = []

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, api_key: int, body: Any, api_version: int = 0) -> dict:
        """Send one request and return its response body."""
        correlation_id, frame = self.conn.send_request(api_key, api_version, body)
        self.sock.sendall(frame)
        cid, response = self.receive()
        assert cid == correlation_id
        return response

    def receive(self) -> tuple[int, dict]:
        deadline = time.monotonic() + self.timeout
        while not self._buffered:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self._buffered.extend(self.conn.receive_data(data))
        return self._buffered.pop(0)

    def send_raw(self, data: bytes) -> bool:
        """Send bytes; False when the broker had already closed the connection."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def read_raw_until_closed(self) -> tuple[list[bytes], bool]:
        """Read frames (raw bodies) until the broker closes or ``timeout`` passes; returns the
        frames and whether the connection was closed."""
        deadline = time.monotonic() + self.timeout
        buf = b""
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except ConnectionResetError:
                return _split_frames(buf), True
            if not data:
                return _split_frames(buf), True
            buf += data
        return _split_frames(buf), False


    def read_raw_until(self, done: Callable[[list[bytes]], bool]) -> tuple[list[bytes], bool]:
        """Read frames (raw bodies) until ``done(frames)``, the broker closes, or ``timeout``
        passes; returns the frames and whether the connection was closed."""
        deadline = time.monotonic() + self.timeout
        buf = b""
        while time.monotonic() < deadline:
            frames = _split_frames(buf)
            if done(frames):
                return frames, False
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            except ConnectionResetError:
                return _split_frames(buf), True
            if not data:
                return _split_frames(buf), True
            buf += data
        return _split_frames(buf), False


def _split_frames(buf: bytes) -> list[bytes]:
    frames, pos = [], 0
    while len(buf) - pos >= 4:
        (n,) = struct.unpack_from(">I", buf, pos)
        if len(buf) - pos - 4 < n:
            break
        frames.append(buf[pos + 4:pos + 4 + n])
        pos += 4 + n
    return frames


def log_dirs(cluster: DevCluster) -> dict[int, Path]:
    """Each broker's log directory (DevCluster's layout: ``broker-<id>/logs``)."""
    return {i: cluster.dir / f"broker-{i}" / "logs" for i in cluster.brokers}


def partition_dirs(cluster: DevCluster, topic: str) -> dict[int, list[str]]:
    """Per broker, the directories under its log dir that belong to ``topic``."""
    out = {}
    for i, d in log_dirs(cluster).items():
        names = os.listdir(d) if d.is_dir() else []
        out[i] = sorted(n for n in names if n.startswith(topic + "-"))
    return out


# -- replicas on disk (read after the brokers stopped) ------------------------------------------


def replica_records(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` of every record in one replica's segment files, in log order."""
    d = log_dirs(cluster)[broker_id] / f"{topic}-{partition}"
    out = []
    for seg in sorted(d.glob("*.log")):
        out += [(r.offset, r.value) for r in iter_all_records(seg.read_bytes())]
    return out


def replica_high_watermark(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> int | None:
    """The high watermark in a broker's replication-offset-checkpoint (None when absent)."""
    path = log_dirs(cluster)[broker_id] / "replication-offset-checkpoint"
    lines = path.read_text().splitlines()
    for line in lines[2:2 + int(lines[1])]:
        t, p, offset = line.rsplit(" ", 2)
        if (t, int(p)) == (topic, partition):
            return int(offset)
    return None
