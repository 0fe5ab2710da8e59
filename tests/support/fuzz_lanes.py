"""What the two fuzzers share (``tests.support.fuzz``, the native listener's, and
``tests.support.kafka_fuzz``, the Kafka listener's): the lane driver, and the plumbing of the
integration tests that run them against a broker.

``LaneDriver`` keeps several connections (``Lane``) busy at once on one selector: it opens a
lane's connection, asks the fuzzer for a round of inputs (``_fill``), writes them, hands every
response frame to the fuzzer's oracle (``_judge``), notices connections the broker closes and
lanes that wait longer than ``hang_s``, calls the well-behaved client's ``check`` every
``check_every_s`` and records findings. Each fuzzer keeps its own generator, its own lanes'
bookkeeping and its own oracle; a lane is ``busy`` while it awaits something (the Kafka
fuzzer's lanes also await a close).

Both listeners' record batches keep Kafka's v2 header layout (the CRC at byte 17, over bytes
21 on), so ``BatchMutations`` holds the batch mutations that need not know the records' format
(bits and bytes flipped, cut, several batches); each fuzzer builds its own batches.

Every input is a pure function of ``(seed, lane, number)``: ``nth_input`` is the replay both
fuzzers build on.
"""

from __future__ import annotations

import math
import os
import random
import selectors
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from random import Random
from typing import Any

from crc32c import crc32c

from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, TopicPartition

PROBE_CORRELATION_ID = 0x7FFFFFF0


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def error_codes(body: Any, out: list[int], depth: int = 0, max_depth: int = 8) -> list[int]:
    """Every ``error_code`` in a response body (nested at most ``max_depth`` deep)."""
    if depth > max_depth:
        return out
    if type(body) is dict:
        for k, v in body.items():
            if k == "error_code" and type(v) is int:
                out.append(v)
            elif type(v) in (dict, list):
                error_codes(v, out, depth + 1, max_depth)
    elif type(body) is list:
        for v in body:
            error_codes(v, out, depth + 1, max_depth)
    return out


def nth_input(generator: Any, number: int, lane_kind: str, draw: Callable[[Any, str], Any]) -> Any:
    """Input ``number`` (counting from 1) that ``draw`` makes of a fresh lane generator."""
    out = None
    for _ in range(number):
        out = draw(generator, lane_kind)
    assert out is not None
    return out


# -- record batches (both listeners' batches keep Kafka's v2 header layout) -------------------------


def wrap(value: int, bits: int) -> int:
    """``value`` as a signed int of ``bits`` bits (wrapped around)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def recompute_crc(batch: bytearray) -> None:
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))


class BatchMutations:
    """Record sets for a Produce, one valid batch mutated, or several batches: ``make`` draws
    a kind of ``KINDS`` by ``WEIGHTS``. Here the kinds that need not know the batch format; a
    fuzzer's mutator adds the others (``header``, ``block``, ``compressed``, ``bomb``), a valid
    batch (``valid_batch``) and a small one (``small_batch``)."""

    KINDS = ("flip", "flip_crc", "header", "block", "compressed", "bomb", "multi", "cut", "untouched")
    WEIGHTS: tuple[int, ...] = ()
    rng: Random
    max_frame_bytes: int

    def valid_batch(self) -> bytes:
        raise NotImplementedError

    def small_batch(self) -> bytes:
        raise NotImplementedError

    def header(self) -> tuple[bytes, str]:
        raise NotImplementedError

    def make(self) -> tuple[bytes, str]:
        kind = self.rng.choices(self.KINDS, self.WEIGHTS)[0]
        records, detail = getattr(self, kind)()
        return records, f"{kind}:{detail}"

    def untouched(self) -> tuple[bytes, str]:
        return self.valid_batch(), "valid"

    def flip(self) -> tuple[bytes, str]:
        b = bytearray(self.valid_batch())
        n = self.rng.randint(1, 8)
        for _ in range(n):
            b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return bytes(b), f"{n} bits"

    def flip_crc(self) -> tuple[bytes, str]:
        b = bytearray(self.valid_batch())
        n = self.rng.randint(1, 6)
        for _ in range(n):
            b[self.rng.randrange(21, len(b))] = self.rng.randrange(256)
        recompute_crc(b)
        return bytes(b), f"{n} bytes"

    def multi(self) -> tuple[bytes, str]:
        r = self.rng
        what = r.choice(("good+bad", "bad+good", "duplicated", "many-small", "good+garbage"))
        good = self.valid_batch()
        if what == "good+bad":
            return good + self.flip_crc()[0], what
        if what == "bad+good":
            return self.header()[0] + good, what
        if what == "duplicated":
            return good * r.randint(2, max(2, min(1000, (self.max_frame_bytes // 2) // len(good)))), what
        if what == "many-small":
            return self.small_batch() * r.randint(100, 5000), what
        return good + r.randbytes(r.randrange(1, 100)), what

    def cut(self) -> tuple[bytes, str]:
        b = self.valid_batch()
        at = self.rng.randrange(len(b))
        return (b[:at], f"at {at}") if self.rng.random() < 0.7 else (b + b[:at], f"extended by {at}")


@dataclass
class Stats:
    """What a run counted; each fuzzer's ``Stats`` adds its own counts."""
    inputs: Counter = field(default_factory=Counter)  # by kind
    apis: Counter = field(default_factory=Counter)  # by API (and version), requests of a valid envelope
    mutations: Counter = field(default_factory=Counter)  # by mutation kind
    errors: Counter = field(default_factory=Counter)  # responses carrying each error code
    responses: int = 0
    closed: Counter = field(default_factory=Counter)  # connections the broker closed, by lane kind
    checks: int = 0
    seconds: float = 0.0
    findings: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.inputs.values())


class BrokerExited(Exception):
    def __init__(self, stats: Stats):
        super().__init__("the broker process exited")
        self.stats = stats


class Lane:
    """One connection: what it sent and what it still awaits. ``ROUNDS`` seeds the round
    sizes, an rng of their own so that the inputs replay without them."""

    ROUNDS = "{seed}/{index}/rounds"

    def __init__(self, index: int, kind: str, port: int, generator: Any):
        self.index, self.kind, self.port, self.generator = index, kind, port, generator
        self.sock: socket.socket | None = None
        self.out = bytearray()
        self.inbuf = bytearray()
        self.pending: deque = deque()
        self.last_progress = time.monotonic()
        self.rounds = Random(self.ROUNDS.format(seed=generator.seed, index=index))

    def busy(self) -> bool:
        """Whether it still awaits something of the broker (or has bytes to write)."""
        return bool(self.pending or self.out)

    def overdue(self) -> bool:
        """Whether what it still awaits at the end of a run is a hang."""
        return bool(self.pending)

    def connect(self) -> socket.socket:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.setblocking(False)
        self.out.clear()
        self.inbuf.clear()
        self.pending.clear()
        self.last_progress = time.monotonic()
        return self.sock

    def take_frames(self) -> list[bytes]:
        frames, pos, buf = [], 0, self.inbuf
        while len(buf) - pos >= 4:
            (n,) = struct.unpack_from(">I", buf, pos)
            if len(buf) - pos - 4 < n:
                break
            frames.append(bytes(buf[pos + 4:pos + 4 + n]))
            pos += 4 + n
        del buf[:pos]
        return frames


class LaneDriver:
    """Sends inputs on several lanes at once and hands every answer to the oracle (module
    docstring). Stops after ``seconds`` or ``max_inputs``, or once ``max_findings`` findings
    are recorded, then waits at most ``min(hang_s, DRAIN_CAP_S)`` for what is still due.

    A fuzzer fills a round (``_fill``), counts its APIs (``_count_apis``), judges a response
    frame (``_judge``), names a lane's last inputs (``_recent``) and says what a connection
    the broker closed means (``_closed_by_broker``). The wording of its hang findings:
    ``HANG``, ``LATE``, ``AWAITING``."""

    DRAIN_CAP_S = math.inf
    HANG = "no answer"
    LATE = "not answered"
    AWAITING = "awaiting"

    def __init__(self, port: int, seed: int, lanes: list[Lane], stats: Stats, *, seconds: float, max_inputs: int,
                 batch: int, hang_s: float, check: Callable[[], None] | None, check_every_s: float,
                 alive: Callable[[], bool] | None, max_findings: int):
        self.port, self.seed, self.seconds, self.max_inputs = port, seed, seconds, max_inputs
        self.batch, self.hang_s, self.max_findings = batch, hang_s, max_findings
        self.check, self.check_every_s, self.alive = check, check_every_s, alive
        self.lanes = lanes
        self.stats = stats
        self.selector = selectors.DefaultSelector()

    # -- the loop --

    def run(self) -> Stats:
        start = time.monotonic()
        deadline = start + self.seconds
        next_check = start + self.check_every_s
        try:
            while time.monotonic() < deadline and self.stats.total < self.max_inputs \
                    and len(self.stats.findings) < self.max_findings:
                for lane in self.lanes:
                    if lane.sock is None or not lane.busy():
                        self._next_round(lane)
                self._pump(0.05)
                now = time.monotonic()
                self._look_for_hangs(now)
                if now >= next_check:
                    self._check()
                    next_check = time.monotonic() + self.check_every_s
            self._drain(min(self.hang_s, self.DRAIN_CAP_S))
            self._check()
        finally:
            for lane in self.lanes:
                self._close(lane)
            self.selector.close()
        self.stats.seconds = time.monotonic() - start
        return self.stats

    def _drain(self, timeout: float) -> None:
        """Wait for what is still due (bounded), then hang checks as usual."""
        end = time.monotonic() + timeout
        while any(lane.sock is not None and lane.busy() for lane in self.lanes) and time.monotonic() < end:
            self._pump(0.05)
        for lane in self.lanes:
            if lane.sock is not None and lane.overdue():
                self._hang(lane, f"{self.LATE} within {timeout:g} s of the end of the run")

    def _next_round(self, lane: Lane) -> None:
        if lane.sock is None or lane.kind == "stream":
            self._close(lane)
            try:
                sock = lane.connect()
            except OSError as e:
                self._finding(lane, f"cannot connect: {e!r}")
                self._check()  # raises BrokerExited if it is gone
                return
            self._connected(lane)
            self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, lane)
        self._fill(lane)
        lane.last_progress = time.monotonic()
        self.selector.modify(lane.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, lane)

    def _connected(self, lane: Lane) -> None:
        """A lane has a new connection."""

    def _fill(self, lane: Lane) -> None:
        """Queue a round of inputs on a connected lane (``lane.out``, ``lane.pending``)."""
        raise NotImplementedError

    def _count(self, inp: Any) -> None:
        s = self.stats
        s.inputs[inp.kind] += 1
        self._count_apis(inp)
        for tag in inp.tags:
            s.mutations[f"{inp.kind}/{tag}"] += 1

    def _count_apis(self, inp: Any) -> None:
        raise NotImplementedError

    def _pump(self, timeout: float) -> None:
        for key, events in self.selector.select(timeout):
            lane = key.data
            if events & selectors.EVENT_WRITE and lane.out:
                self._write(lane)
            if lane.sock is not None and events & selectors.EVENT_READ:
                self._read(lane)

    def _write(self, lane: Lane) -> None:
        try:
            sent = lane.sock.send(lane.out)
        except BlockingIOError:
            return
        except OSError:
            self._closed_by_broker(lane)
            return
        del lane.out[:sent]
        if not lane.out:
            if lane.kind == "stream":
                try:
                    lane.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self._stream_ended(lane)
            self.selector.modify(lane.sock, selectors.EVENT_READ, lane)

    def _stream_ended(self, lane: Lane) -> None:
        """A stream lane wrote all it had and ended its stream."""

    def _read(self, lane: Lane) -> None:
        try:
            data = lane.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._closed_by_broker(lane)
            return
        lane.last_progress = time.monotonic()
        lane.inbuf += data
        for f in lane.take_frames():
            self._judge(lane, f)
            if lane.sock is None:  # the oracle closed it: the rest is of a connection judged already
                return

    # -- the oracle's --

    def _judge(self, lane: Lane, response: bytes) -> None:
        raise NotImplementedError

    def _recent(self, lane: Lane) -> str:
        raise NotImplementedError

    def _closed_by_broker(self, lane: Lane) -> None:
        raise NotImplementedError

    def _close(self, lane: Lane) -> None:
        if lane.sock is not None:
            try:
                self.selector.unregister(lane.sock)
            except (KeyError, ValueError):
                pass
            lane.sock.close()
            lane.sock = None
        lane.pending.clear()
        lane.out.clear()

    def _look_for_hangs(self, now: float) -> None:
        for lane in self.lanes:
            if lane.sock is not None and lane.busy() and now - lane.last_progress > self.hang_s:
                self._hang(lane, f"{self.HANG} for {self.hang_s:g} s")

    def _hang(self, lane: Lane, why: str) -> None:
        self._finding(lane, f"hang: {why}; {self.AWAITING} {self._recent(lane)}")
        self._close(lane)

    def _check(self) -> None:
        if self.alive is not None and not self.alive():
            self._finding(None, "the broker process exited")
            raise BrokerExited(self.stats)
        if self.check is not None:
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 -- the well-behaved client's failure is a finding
                self._finding(None, f"the well-behaved client failed: {e!r}")
            self.stats.checks += 1

    def _finding(self, lane: Lane | None, what: str) -> None:
        where = f"seed {self.seed} lane {lane.index} ({lane.kind})" if lane is not None else f"seed {self.seed}"
        self.stats.findings.append(f"{where}: {what}")


# -- the integration tests' plumbing ----------------------------------------------------------------

# the single broker both fuzz tests run against: 1 MiB frames, no topic auto-creation, groups that
# rebalance at once and time out within 10 s
MAX_FRAME = 1 << 20
BROKER_CONFIG = {
    "socket.request.max.bytes": MAX_FRAME, "auto.create.topics.enable": False,
    "max.partitions.per.topic": 64, "max.partitions.per.request": 128,
    "group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000,
    "group.max.session.timeout.ms": 10000, "offsets.topic.num.partitions": 1,
    "offsets.topic.replication.factor": 1,
    # the fuzz topics take what the broker accepts, hours of it: kept to a few segments
    "log.segment.bytes": 4 << 20, "log.retention.bytes": 32 << 20, "log.retention.check.interval.ms": 10000,
    "log.segment.delete.delay.ms": 1000}


def plan(config: Any, fixed_seed: int, slice_seconds: float) -> list[tuple[int, float]]:
    """(seed, seconds) of each run: --fuzz-seed for --fuzz-seconds, else the fixed seed and a
    random one, half the slice each."""
    seconds = config.getoption("--fuzz-seconds")
    seed = config.getoption("--fuzz-seed")
    if seed is not None:
        return [(seed, seconds or slice_seconds)]
    total = seconds or slice_seconds
    return [(fixed_seed, total / 2), (random.SystemRandom().randrange(1, 2**31), total / 2)]


def create_topics(cluster: Any, names: Any, good_topic: str) -> None:
    """The fuzz topics (``names.topics``) and the well-behaved client's, ready."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(t, names.partitions, 1) for t in names.topics] + [NewTopic(good_topic, 1, 1)])
    for t in names.topics:
        wait_topic_ready(cluster, t, names.partitions, 1)
    wait_topic_ready(cluster, good_topic, 1, 1)


def report_head(what: str, seed: int, stats: Stats) -> str:
    """The first line of a run's report."""
    rate = stats.total / stats.seconds if stats.seconds else 0.0
    return (f"{what} seed {seed}: {stats.total} inputs in {stats.seconds:.1f} s ({rate:.0f}/s), "
            f"{stats.responses} responses, {stats.checks} good-client checks, "
            f"connections closed by the broker {dict(stats.closed)}, load average {os.getloadavg()}")


def consume_all(cluster: Any, topic: str, count: int, what: str) -> list[bytes]:
    """Partition 0 of ``topic`` from the start, read by the SDK's consumer until ``count``
    records (at most a minute)."""
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=500)) or len(got) >= count,
                   60, what)
    return got


def fuzz_cluster(request: Any, path: Any, **kw: Any) -> Iterator:
    """The module's single-broker cluster (``BROKER_CONFIG``), for a fixture to yield from."""
    yield from cluster_fixture(request, path, 1, dict(BROKER_CONFIG), **kw)
