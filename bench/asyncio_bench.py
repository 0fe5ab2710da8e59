"""The asyncio client (tidelog.asyncio) beside the Trio client (tidelog.aio) and the blocking
one (tidelog), in one run against one cluster.

    .venv/bin/python bench/asyncio_bench.py [--runs 3] [--produce-records 1000000]
        [--consume-records 1000000] [--round-trips 2000] [--clients trio,asyncio,blocking]

One broker process and ZooKeeper (``DevCluster`` in a temporary directory), the clients in
this process, 100-byte values, acks=1, the clients' default options (batch_size 16384,
linger_ms 5, max_poll_records 500). Each round runs every mode with every client, one after
the other (interleaved, so that the machine's drift hits them alike), each on a fresh topic:

* produce: ``send`` per record (``await producer.send(...)`` in Trio and asyncio), then
  ``flush``; records per second.
* consume: fill a topic (not timed), then one consumer (``assign``) polls it from the start
  until it has every record; records per second.
* round trip: ``send_and_wait`` one record at a time (linger_ms 0), ``--round-trips`` times;
  the median latency of one acknowledged send, in microseconds (what each hand-off between
  the application and the client's event loop costs, on top of the request).

Each figure is printed with the client process's CPU per record; the summary gives the median
of the rounds and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tidelog.aio  # noqa: E402
import tidelog.asyncio  # noqa: E402
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from tidelog.broker.devcluster import DevCluster  # noqa: E402

VALUE = os.urandom(100)


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# -- produce -----------------------------------------------------------------------------------


async def produce_trio(bootstrap: str, topic: str, n: int) -> float:
    async with tidelog.aio.AsyncProducer(bootstrap, acks=1) as producer:
        await (await producer.send(topic, VALUE))  # metadata, connection
        send = producer.send
        t0 = time.perf_counter()
        for _ in range(n):
            await send(topic, VALUE)
        await producer.flush()
        return time.perf_counter() - t0


async def produce_asyncio(bootstrap: str, topic: str, n: int) -> float:
    async with tidelog.asyncio.AsyncProducer(bootstrap, acks=1) as producer:
        await (await producer.send(topic, VALUE))
        send = producer.send
        t0 = time.perf_counter()
        for _ in range(n):
            await send(topic, VALUE)
        await producer.flush()
        return time.perf_counter() - t0


def produce_blocking(bootstrap: str, topic: str, n: int) -> float:
    with Producer(bootstrap, acks=1) as producer:
        producer.send(topic, VALUE).result(30)
        send = producer.send
        t0 = time.perf_counter()
        for _ in range(n):
            send(topic, VALUE)
        producer.flush()
        return time.perf_counter() - t0


# -- consume -----------------------------------------------------------------------------------


async def consume_trio(bootstrap: str, topic: str, n: int) -> float:
    async with tidelog.aio.AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got, t0 = 0, time.perf_counter()
        while got < n:
            got += len(await consumer.poll(timeout_ms=1000))
        return time.perf_counter() - t0


async def consume_asyncio(bootstrap: str, topic: str, n: int) -> float:
    async with tidelog.asyncio.AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got, t0 = 0, time.perf_counter()
        while got < n:
            got += len(await consumer.poll(timeout_ms=1000))
        return time.perf_counter() - t0


def consume_blocking(bootstrap: str, topic: str, n: int) -> float:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got, t0 = 0, time.perf_counter()
        while got < n:
            got += len(consumer.poll(timeout_ms=1000))
        return time.perf_counter() - t0


# -- round trip --------------------------------------------------------------------------------


async def round_trip_trio(bootstrap: str, topic: str, n: int) -> list[float]:
    async with tidelog.aio.AsyncProducer(bootstrap, acks=1, linger_ms=0) as producer:
        await producer.send_and_wait(topic, VALUE)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, VALUE)
            times.append(time.perf_counter() - t0)
        return times


async def round_trip_asyncio(bootstrap: str, topic: str, n: int) -> list[float]:
    async with tidelog.asyncio.AsyncProducer(bootstrap, acks=1, linger_ms=0) as producer:
        await producer.send_and_wait(topic, VALUE)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, VALUE)
            times.append(time.perf_counter() - t0)
        return times


def round_trip_blocking(bootstrap: str, topic: str, n: int) -> list[float]:
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        producer.send(topic, VALUE).result(30)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            producer.send(topic, VALUE).result(30)
            times.append(time.perf_counter() - t0)
        return times


RUNNERS = {
    "trio": lambda fn, *a: trio.run(fn, *a),
    "asyncio": lambda fn, *a: asyncio.run(fn(*a)),
    "blocking": lambda fn, *a: fn(*a),
}
MODES = {
    "produce": {"trio": produce_trio, "asyncio": produce_asyncio, "blocking": produce_blocking},
    "consume": {"trio": consume_trio, "asyncio": consume_asyncio, "blocking": consume_blocking},
    "round-trip": {"trio": round_trip_trio, "asyncio": round_trip_asyncio, "blocking": round_trip_blocking},
}


def fill(bootstrap: str, topic: str, n: int) -> None:
    with Producer(bootstrap, acks=1) as producer:
        for _ in range(n // 1000):
            producer.send_many(topic, [VALUE] * 1000)
        producer.flush()


def one(mode: str, client: str, bootstrap: str, topic: str, args) -> tuple[float, str]:
    """(figure, note): records/s for produce and consume, median us for round trips."""
    n = {"produce": args.produce_records, "consume": args.consume_records, "round-trip": args.round_trips}[mode]
    if mode == "consume":
        fill(bootstrap, topic, n)
    cpu0 = cpu_seconds()
    out = RUNNERS[client](MODES[mode][client], bootstrap, topic, n)
    cpu = cpu_seconds() - cpu0
    if mode == "round-trip":
        us = statistics.median(out) * 1e6
        return us, f"{us:,.0f} us median, p99 {sorted(out)[int(len(out) * 0.99)] * 1e6:,.0f} us"
    rate = n / out
    return rate, f"{rate:,.0f} records/s, client CPU {cpu / n * 1e6:.2f} us/record"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--produce-records", type=int, default=1_000_000)
    ap.add_argument("--consume-records", type=int, default=1_000_000)
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--clients", default="trio,asyncio,blocking")
    ap.add_argument("--modes", default="produce,consume,round-trip")
    args = ap.parse_args()
    clients = args.clients.split(",")
    modes = args.modes.split(",")
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        cluster = DevCluster(d, brokers=1, zk_port=0, base_port=0)
        try:
            cluster.start()
            bootstrap = cluster.bootstrap
            for run in range(args.runs):
                for mode in modes:
                    for client in clients:
                        topic = f"{mode}-{client}-{run}"
                        with Admin(bootstrap) as admin:
                            admin.create_topics([NewTopic(topic, 1, 1)])
                        time.sleep(0.5)  # let the leader settle before timing
                        figure, note = one(mode, client, bootstrap, topic, args)
                        results.setdefault((mode, client), []).append(figure)
                        print(f"run {run + 1} {mode:10} {client:8} {note} (load {os.getloadavg()[0]:.2f})",
                              flush=True)
        finally:
            cluster.stop()
    print("\nmedians:")
    for (mode, client), figures in results.items():
        unit = "us" if mode == "round-trip" else "records/s"
        print(f"  {mode:10} {client:8} {statistics.median(figures):>12,.0f} {unit} "
              f"({', '.join(f'{f:,.0f}' for f in figures)})")
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
