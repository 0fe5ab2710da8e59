"""Where a small request's latency goes: sequential round trips, one at a time, idle machine.

One broker (DevCluster), this process as the client. Each step adds one layer:

* apiversions: a BrokerConnection round trip (client framing + broker dispatch), no records
* produce-aio: AsyncProducer.send_and_wait, acks=1, one 100-byte record
* produce-blocking: Producer.send(...).result()
* e2e-aio: AsyncProducer.send + AsyncConsumer.poll in one Trio loop, one record at a time
* e2e-blocking: Producer.send + Consumer.poll (blocking facades), one record at a time

    .venv/bin/python bench/latency_breakdown.py [--n 2000]
"""

from __future__ import annotations

import argparse
import statistics
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--steps", default="apiversions,produce-aio,produce-blocking,e2e-aio,e2e-blocking")
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
            trio.run(aio_steps, host, port, bootstrap, args.n, steps)
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
