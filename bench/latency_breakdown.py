"""Where a small request's latency goes: sequential round trips, one at a time, idle machine.

One broker (DevCluster), this process as the client. Each step adds one layer:

* apiversions: a BrokerConnection round trip (client framing + broker dispatch), no records
* produce-aio: AsyncProducer.send_and_wait, acks=1, one 100-byte record
* produce-blocking: Producer.send(...).result()
* e2e-aio: AsyncProducer.send + AsyncConsumer.poll in one Trio loop, one record at a time
* e2e-blocking: Producer.send + Consumer.poll (blocking facades), one record at a time
* e2e-wire: the issue 21 regime, split in three by the packets on the loopback: this
  process sends at ``--rate`` records/s (one at a time, linger_ms 0, acks=1) while a
  consumer in a process of its own polls (fetch_max_wait_ms 500); tcpdump records the
  loopback, and each record's time stamp is found in the produce request the client wrote
  and in the fetch response the broker wrote. Per record: send -> produce request on the
  wire (the producing client), -> fetch response on the wire (the broker: read, append,
  the consumer's long poll woken, response written), -> poll returns (the consuming client:
  wake-up, read, decode, hand-off to the polling thread). The broker's part includes the
  wait for the consumer's next fetch request when the record arrived before it ("fetch not
  there"). Needs tcpdump and root.

    .venv/bin/python bench/latency_breakdown.py [--n 2000]
    .venv/bin/python bench/latency_breakdown.py --steps e2e-wire [--rate 1000] [--seconds 5] [--profile DIR]

``--profile DIR`` (e2e-wire) also records py-spy profiles of the broker, this process and
the consumer's while the records flow (which slows them: time the path without it).
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from tidelog.aio import AsyncConsumer, AsyncProducer  # noqa: E402
from tidelog.aio.admin import NewTopic  # noqa: E402
from tidelog.aio.cluster import parse_bootstrap  # noqa: E402
from tidelog.aio.connection import BrokerConnection  # noqa: E402
from tidelog.broker.devcluster import DevCluster  # noqa: E402
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import ApiVersionsRequest

VALUE = b"x" * 100
STAMP = struct.Struct(">q")
PAD = b"x" * (100 - STAMP.size)


def report(name: str, samples: list[int]) -> None:
    s = sorted(samples[len(samples) // 10:])
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))] / 1e3  # noqa: E731
    print(f"{name:18s} p50 {q(0.5):7.0f} us  p90 {q(0.9):7.0f} us  p99 {q(0.99):7.0f} us  "
          f"mean {statistics.mean(s) / 1e3:7.0f} us", flush=True)


async def aio_steps(host: str, port: int, bootstrap: str, n: int, steps: set[str]) -> None:
    clock = time.perf_counter_ns
    if "apiversions" in steps:
        async with trio.open_nursery() as nursery:
            conn = BrokerConnection(host, port)
            await nursery.start(conn.run)
            out = []
            for _ in range(n):
                t = clock()
                await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
                out.append(clock() - t)
            report("apiversions", out)
            await conn.close()
            nursery.cancel_scope.cancel()
    async with AsyncProducer(bootstrap, acks=1, linger_ms=0) as producer:
        if "produce-aio" in steps:
            await producer.send_and_wait("lat", VALUE)
            out = []
            for _ in range(n):
                t = clock()
                await producer.send_and_wait("lat", VALUE)
                out.append(clock() - t)
            report("produce-aio", out)
        if "e2e-aio" in steps:
            async with AsyncConsumer(bootstrap, fetch_max_wait_ms=500) as consumer:
                tp = TopicPartition("lat", 0)
                consumer.assign([tp])
                consumer.seek_to_end(tp)
                await consumer.position(tp)
                out = []
                for _ in range(n):
                    t = clock()
                    await producer.send("lat", VALUE)
                    got = []
                    while not got:
                        got = await consumer.poll(2000)
                    out.append(clock() - t)
                report("e2e-aio", out)


# -- e2e-wire: the path split by the packets on the loopback ---------------------------------------

# e2e-wire's processes stamp with the packets' clock, CLOCK_REALTIME: on this VM the wall clock
# is stepped against the monotonic one by up to ~0.3 ms within a second, so mapping the packets'
# time stamps onto the monotonic clock misplaced them by as much; a step inside one record's
# interval is rare
WIRE_CLOCK = time.time_ns


def _wire_consumer(bootstrap: str, topic: str, conn) -> None:
    """The consuming process: (stamp, time poll returned) for every record."""
    tp = TopicPartition(topic, 0)
    out: list[tuple[int, int]] = []
    clock = WIRE_CLOCK
    with Consumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=500) as consumer:
        consumer.assign([tp])
        consumer.position(tp)
        conn.send("ready")
        while True:
            records = consumer.poll(timeout_ms=1000)
            now = clock()
            if not records and conn.poll():
                break
            out.extend((STAMP.unpack_from(r.value)[0], now) for r in records if len(r.value) == 100)
    conn.send(out)


def start_capture(pcap: str, port: int) -> subprocess.Popen:
    """tcpdump writing the loopback's packets to or from ``port`` into ``pcap``, nanosecond
    time stamps (for ``read_pcap``); give it a second to attach, ``terminate`` it after."""
    return subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-B", "16384", "-U", "-w", pcap,
                             "--time-stamp-precision=nano", f"tcp port {port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def read_pcap(path: str, broker_port: int) -> tuple[dict[int, int], dict[int, int], list[int]]:
    """{stamp: wall-clock ns of the first packet to the broker carrying it},
    {stamp: ... from the broker}: the records' values found by their padding; and the times
    of the requests (packets with a payload) on the connection the records came back on:
    the consumer's fetches."""
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack_from("<I", data)[0]
    if magic != 0xA1B23C4D:
        raise RuntimeError("expected a nanosecond pcap from tcpdump --time-stamp-precision=nano")
    link = struct.unpack_from("<I", data, 20)[0]
    l2 = {1: 14, 113: 16, 276: 20}.get(link, 14)  # Ethernet (lo), Linux cooked v1, v2
    to_broker: dict[int, int] = {}
    from_broker: dict[int, int] = {}
    requests: dict[int, list[int]] = {}  # client port -> times of its requests
    fetch_port = None
    pos = 24
    probe = PAD[:16]
    while pos + 16 <= len(data):
        sec, nsec, incl, _ = struct.unpack_from("<IIII", data, pos)
        pkt = data[pos + 16:pos + 16 + incl]
        pos += 16 + incl
        ip = pkt[l2:]
        if len(ip) < 20 or ip[0] >> 4 != 4:
            continue
        tcp = ip[(ip[0] & 15) * 4:]
        sport, dport = struct.unpack_from(">HH", tcp)
        payload = tcp[(tcp[12] >> 4) * 4:]
        t = sec * 1_000_000_000 + nsec
        into = to_broker if dport == broker_port else from_broker if sport == broker_port else None
        if into is None:
            continue
        if dport == broker_port and payload:
            requests.setdefault(sport, []).append(t)
        i = payload.find(probe, 8)
        while i >= 0:
            into.setdefault(STAMP.unpack_from(payload, i - 8)[0], t)
            if into is from_broker:
                fetch_port = dport
            i = payload.find(probe, i + len(PAD))
    return to_broker, from_broker, requests.get(fetch_port, [])


def start_profiles(directory: str, pids: dict[str, int], seconds: float) -> list[subprocess.Popen]:
    """py-spy (raw collapsed stacks, 250 Hz, busy samples only) of each process."""
    spy = str(Path(sys.executable).parent / "py-spy")
    os.makedirs(directory, exist_ok=True)
    return [subprocess.Popen([spy, "record", "-p", str(pid), "-f", "raw", "-r", "250", "--nonblocking",
                              "-d", str(int(seconds)), "-o", os.path.join(directory, f"{who}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for who, pid in pids.items()]


def wire_step(bootstrap: str, rate: float, seconds: float, broker_pid: int, profile: str | None) -> None:
    import multiprocessing
    host, port = parse_bootstrap(bootstrap)[0]
    topic = f"wire{int(time.time())}"
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    pcap = tempfile.mktemp(suffix=".pcap")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_wire_consumer, args=(bootstrap, topic, child), daemon=True)
    proc.start()
    dump = None
    try:
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError("the consumer process did not start")
        dump = start_capture(pcap, port)
        spies = start_profiles(profile, {"broker": broker_pid, "producer": os.getpid(), "consumer": proc.pid},
                               seconds) if profile else []
        time.sleep(1.0)  # tcpdump (and py-spy) attached
        clock = WIRE_CLOCK
        with Producer(bootstrap, acks=1, linger_ms=0) as producer:
            producer.send(topic, b"warm").result(30)
            interval = 1e9 / rate
            start = clock()
            for i in range(int(rate * seconds)):
                ahead = start + i * interval - clock()
                if ahead > 0:
                    time.sleep(ahead / 1e9)
                producer.send(topic, STAMP.pack(clock()) + PAD)
            producer.flush(30)
        time.sleep(0.5)
        for spy in spies:
            spy.wait(30)
        parent.send("done")
        if not parent.poll(30):
            raise RuntimeError("the consumer process did not finish")
        polled = parent.recv()
    finally:
        if dump is not None:
            dump.terminate()
            dump.wait(10)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    to_broker, from_broker, fetches = read_pcap(pcap, port)
    os.unlink(pcap)
    rows = [(s, to_broker[s], from_broker[s], p) for s, p in polled[len(polled) // 20:]
            if s in to_broker and s in from_broker]
    print(f"e2e-wire at {rate:,.0f}/s: {len(rows)} of {len(polled)} records seen on the wire both ways")
    # the broker's segment includes waiting for the consumer's next fetch when the record
    # arrived first: the fetch request before the response that carried it came later
    waits = [max(0, fetches[bisect.bisect_left(fetches, f) - 1] - b) if fetches else 0 for _, b, f, _ in rows]
    late = sum(w > 0 for w in waits)
    print(f"records that reached the broker before the consumer's next fetch: {late} "
          f"({late / max(1, len(rows)):.0%})")
    report("send->produce", [b - s for s, b, _, _ in rows])
    report("produce->fetch", [f - b for _, b, f, _ in rows])
    report(" fetch not there", waits)
    report("fetch->poll", [p - f for _, _, f, p in rows])
    report("e2e", [p - s for s, _, _, p in rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--steps", default="apiversions,produce-aio,produce-blocking,e2e-aio,e2e-blocking")
    ap.add_argument("--rate", type=float, default=1000.0, help="e2e-wire: records/s")
    ap.add_argument("--seconds", type=float, default=5.0, help="e2e-wire: how long")
    ap.add_argument("--profile", default=None, help="e2e-wire: py-spy profiles of the three processes into DIR")
    args = ap.parse_args()
    steps = set(args.steps.split(","))
    clock = time.perf_counter_ns
    with tempfile.TemporaryDirectory() as d:
        cluster = DevCluster(d, brokers=1, zk_port=0, base_port=0)
        try:
            cluster.start()
            bootstrap = cluster.bootstrap
            host, port = parse_bootstrap(bootstrap)[0]
            with Admin(bootstrap) as admin:
                admin.create_topics([NewTopic("lat", 1, 1)])
            if "e2e-wire" in steps:
                wire_step(bootstrap, args.rate, args.seconds, cluster.brokers[1].proc.pid, args.profile)
            if steps & {"apiversions", "produce-aio", "e2e-aio"}:
                trio.run(aio_steps, host, port, bootstrap, args.n, steps)
            if not steps & {"produce-blocking", "e2e-blocking"}:
                return
            with Producer(bootstrap, acks=1, linger_ms=0) as producer:
                producer.send("lat", VALUE).result(30)
                if "produce-blocking" in steps:
                    out = []
                    for _ in range(args.n):
                        t = clock()
                        producer.send("lat", VALUE).result(30)
                        out.append(clock() - t)
                    report("produce-blocking", out)
                if "e2e-blocking" in steps:
                    with Consumer(bootstrap, fetch_max_wait_ms=500) as consumer:
                        tp = TopicPartition("lat", 0)
                        consumer.assign([tp])
                        consumer.seek_to_end(tp)
                        consumer.position(tp)
                        out = []
                        for _ in range(args.n):
                            t = clock()
                            producer.send("lat", VALUE)
                            got = []
                            while not got:
                                got = consumer.poll(2000)
                            out.append(clock() - t)
                        report("e2e-blocking", out)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
