"""A broker's memory, event loop and descriptors under hostile load (issue 14, points 5-7).

One single-broker cluster for the module, with ``socket.request.max.bytes`` 100 MiB, the
default ``queued.max.request.bytes`` and a short ZooKeeper session (4 s). In order:

* five connections each send a 100 MiB length prefix and 99 MiB of body, then stall: the
  broker's RSS grows by at most the budget plus 50 MB, and a good client keeps being served;
* large, slow-to-decode frames while another connection does ApiVersions round trips: every
  round trip is answered and the broker keeps its ZooKeeper session (its registration and
  the controller's znode are the same ones);
* the broker's descriptor limit lowered to 256: a client opens connections until the broker
  refuses them, closes them, and a new client is served; the broker is alive throughout.

Loads are bounded in count and time; nothing asserts timing.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import struct
import threading
import time

import pytest
from kazoo.client import KazooClient

from tests.support.cluster import cluster_fixture
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog.broker.network import QUEUED_MAX_REQUEST_BYTES_DEFAULT
from tidelog.protocol.codec import ApiKey, RequestHeader, encode_request
from tidelog.protocol.frames import encode_frame
from tidelog.protocol.messages import ApiVersionsRequest, MetadataRequest

MIB = 1 << 20
BUDGET = QUEUED_MAX_REQUEST_BYTES_DEFAULT
ROOT = "/tidelog"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("limits"), 1,
                               {"socket.request.max.bytes": 100 * MIB,
                                "zookeeper.session.timeout.ms": 4000})


def _broker(cluster):
    return cluster.brokers[1]


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class GoodClient:
    """Metadata and ApiVersions on a connection of its own, open the whole time."""

    def __init__(self, port: int):
        self.raw = RawClient(port, timeout=20)

    def __enter__(self) -> "GoodClient":
        return self

    def __exit__(self, *exc) -> None:
        self.raw.close()

    def check(self) -> None:
        body = self.raw.request(ApiKey.API_VERSIONS, ApiVersionsRequest().to_body())
        assert body["error_code"] == 0
        body = self.raw.request(ApiKey.METADATA, MetadataRequest(topics=None).to_body())
        assert [b["node_id"] for b in body["brokers"]] == [1]


def _zk_stats(cluster) -> tuple[int, int]:
    """The czxid of the broker's registration and of the controller znode: the same values
    mean the same ZooKeeper session registered them (no re-registration, no new election)."""
    zk = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=10)
    zk.start(timeout=10)
    try:
        return zk.get(f"{ROOT}/brokers/ids/1")[1].czxid, zk.get(f"{ROOT}/controller")[1].czxid
    finally:
        zk.stop()
        zk.close()


def _stall_sender(port: int, prefix_size: int, body: memoryview, stop: threading.Event,
                  sent: list[int], sockets: list[socket.socket]) -> None:
    """Send a length prefix and ``body``; give up when the broker stops reading (muted)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
    sockets.append(s)
    total = 0
    with contextlib.suppress(OSError):
        s.sendall(struct.pack(">I", prefix_size))
        while total < len(body) and not stop.is_set():
            total += s.send(body[total:total + MIB])
    sent.append(total)


def test_five_stalled_100_mib_frames_stay_within_the_memory_budget(cluster):
    broker = _broker(cluster)
    with GoodClient(broker.port) as good:
        _stall_five_frames(broker, good)


def _stall_five_frames(broker, good: GoodClient) -> None:
    good.check()
    before = _rss_bytes(broker.proc.pid)
    body = memoryview(bytes(99 * MIB))
    stop, sent, sockets = threading.Event(), [], []
    threads = [threading.Thread(target=_stall_sender, args=(broker.port, 100 * MIB, body, stop, sent, sockets))
               for _ in range(5)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            time.sleep(0.5)
            good.check()  # served all along
        stop.set()
        for t in threads:
            t.join(10)
        time.sleep(1.0)
        grown = _rss_bytes(broker.proc.pid) - before
        print(f"RSS grew by {grown / MIB:.1f} MiB with bytes sent per connection "
              f"{[round(n / MIB, 1) for n in sorted(sent)]} MiB (budget {BUDGET / MIB:.0f} MiB)")
        assert sum(n >= 99 * MIB for n in sent) >= 1  # at least one frame got its reservation
        assert grown <= BUDGET + 50_000_000
        good.check()
    finally:
        stop.set()
        for s in sockets:
            s.close()
    assert broker.running
    good.check()


def _slow_frame(correlation_id: int) -> bytes:
    """A Metadata request whose body carries ~40 MiB of small msgpack objects (slow to
    decode: millions of them) and a 50 MiB binary."""
    ints = [list(range(100))] * 400_000  # 40M small ints in 400k arrays
    body = {"topics": None, "pad": ints, "blob": bytes(50 * MIB)}
    return encode_frame(encode_request(RequestHeader(ApiKey.METADATA, 0, correlation_id, "slow"), body))


def test_slow_frames_keep_the_zookeeper_session_and_other_connections_answered(cluster):
    broker = _broker(cluster)
    registration = _zk_stats(cluster)
    stop = threading.Event()
    round_trips: list[float] = []
    failures: list[BaseException] = []

    def ping() -> None:
        try:
            with RawClient(broker.port, timeout=30) as raw:
                while not stop.is_set():
                    start = time.monotonic()
                    body = raw.request(ApiKey.API_VERSIONS, ApiVersionsRequest().to_body())
                    round_trips.append(time.monotonic() - start)
                    assert body["error_code"] == 0
                    time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    pinger = threading.Thread(target=ping)
    pinger.start()
    answered = 0
    try:
        frame = _slow_frame(1)
        print(f"slow frame: {len(frame) / MIB:.1f} MiB")
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as s:
                s.sendall(frame)
                data = b""
                with contextlib.suppress(OSError):
                    while chunk := s.recv(1 << 16):
                        data += chunk
                        if len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
                            break
                answered += bool(data)  # an answer (a response or an error), or a closed connection
            time.sleep(0.5)
    finally:
        time.sleep(1.0)
        stop.set()
        pinger.join(60)
    assert not failures, failures
    assert round_trips
    print(f"ApiVersions round trips during the slow frames: n={len(round_trips)} "
          f"max={max(round_trips) * 1000:.0f} ms "
          f"p50={sorted(round_trips)[len(round_trips) // 2] * 1000:.1f} ms; {answered} of 3 slow frames answered")
    assert _zk_stats(cluster) == registration
    assert broker.running
    with GoodClient(broker.port) as good:
        good.check()


def test_out_of_descriptors_connections_are_refused_then_served_again(cluster):
    broker = _broker(cluster)
    pid = broker.proc.pid
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (256, 256))
    with GoodClient(broker.port) as good:
        _exhaust_and_recover(broker, good)


def _exhaust_and_recover(broker, good: GoodClient) -> None:
    good.check()
    opened: list[RawClient] = []
    refused = 0
    try:
        for _ in range(400):  # bounded: more than the limit
            try:
                client = RawClient(broker.port, timeout=3)
            except OSError:
                refused += 1
                break
            opened.append(client)
            try:
                client.request(ApiKey.API_VERSIONS, ApiVersionsRequest().to_body())
            except (OSError, ConnectionError):
                refused += 1
                break
        print(f"{len(opened)} connections opened, the last refused: {bool(refused)}")
        assert refused
        assert broker.running
        good.check()
    finally:
        for client in opened:
            client.close()

    def served() -> bool:
        try:
            with GoodClient(broker.port) as client:
                client.check()
        except (OSError, ConnectionError, AssertionError):
            return False
        return True

    wait_until(served, timeout=20)
    assert broker.running
    good.check()
