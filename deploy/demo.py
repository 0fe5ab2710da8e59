"""The Tidelog tour: a real local cluster, and what it promises.

    ./dev demo            (or: .venv/bin/python deploy/demo.py [--dir DIR] [--keep-running])

Starts ZooKeeper and three brokers as child processes, creates a topic with 6 partitions
replicated 3 times, produces 20,000 keyed records with acks=all, consumes them back, then
kills the leader of a partition with SIGKILL while producing more: the partition moves to
another in-sync replica and no acknowledged record is lost. The killed broker restarts,
recovers its log and rejoins. Finally every segment of one partition is checked with
``tidelog dump-log --verify``.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time

from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.devcluster import DevCluster

TOPIC = "orders"


def step(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def describe(admin: Admin) -> dict[int, object]:
    (desc,) = admin.describe_topics([TOPIC])
    for p in desc.partitions:
        print(f"  Partition: {p.partition}  Leader: {p.leader}  Replicas: {','.join(map(str, p.replicas))}"
              f"  Isr: {','.join(map(str, p.isr))}  Epoch: {p.leader_epoch}")
    return {p.partition: p for p in desc.partitions}


def produce(bootstrap: str, start: int, count: int) -> dict[int, tuple[int, int]]:
    """Send ``count`` keyed records; returns value number -> (partition, offset) of every ack."""
    acked = {}
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as producer:
        futures = [(n, producer.send(TOPIC, f"order {n}".encode(), key=f"customer-{n % 97}".encode()))
                   for n in range(start, start + count)]
        producer.flush(120)
        for n, f in futures:
            meta = f.result(30)
            acked[n] = (meta.partition, meta.offset)
    return acked


def consume_all(bootstrap: str, expected: int) -> list:
    records = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(6)])
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            records += consumer.poll(1.0)
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Tidelog demo: a local 3-broker cluster")
    p.add_argument("--dir", default="tidelog-data/demo", help="cluster directory (wiped first)")
    p.add_argument("--keep-running", action="store_true", help="leave the cluster up until Ctrl-C")
    args = p.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    cluster = DevCluster(args.dir, brokers=3, zk_port=0, base_port=0,
                         extra_config={"zookeeper.session.timeout.ms": 6000, "replica.lag.time.max.ms": 5000})
    try:
        step("start ZooKeeper and 3 brokers")
        cluster.start()
        bootstrap = cluster.bootstrap
        print(f"bootstrap servers: {bootstrap}")
        with Admin(bootstrap_servers=bootstrap) as admin:
            step(f"create topic {TOPIC!r}: 6 partitions, replication factor 3, min.insync.replicas 2")
            admin.create_topics([NewTopic(TOPIC, num_partitions=6, replication_factor=3,
                                          config={"min.insync.replicas": "2"})])
            describe(admin)

            step("produce 20,000 keyed records with acks=all")
            t0 = time.perf_counter()
            acked = produce(bootstrap, 0, 20_000)
            print(f"acknowledged {len(acked)} records in {time.perf_counter() - t0:.2f} s")

            step("consume them back")
            records = consume_all(bootstrap, len(acked))
            per_key = collections.defaultdict(set)
            for r in records:
                per_key[r.key].add(r.partition)
            print(f"consumed {len(records)} records; every key stayed in one partition: "
                  f"{all(len(v) == 1 for v in per_key.values())}")

            leader = describe(admin)[0].leader
            step(f"kill -9 broker {leader} (leader of partition 0) and keep producing")
            cluster.brokers[leader].kill()
            t0 = time.perf_counter()
            acked.update(produce(bootstrap, 20_000, 5_000))
            print(f"acknowledged 5,000 more in {time.perf_counter() - t0:.2f} s while broker {leader} was down")
            describe(admin)

            step(f"restart broker {leader}: it recovers its log and rejoins the ISR")
            cluster.brokers[leader].start()
            cluster.wait_ready()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(len(p.isr) < 3 for p in describe_quiet(admin).values()):
                time.sleep(0.5)
            describe(admin)

        step("every acknowledged record is there, at its acknowledged offset")
        records = consume_all(bootstrap, len(acked))
        found = {(r.partition, r.offset): r.value for r in records}
        lost = [n for n, where in acked.items() if found.get(where) != f"order {n}".encode()]
        print(f"acknowledged: {len(acked)}, consumed: {len(records)}, lost: {len(lost)}")

        step("tidelog dump-log --verify on the segments of partition 0, on every broker")
        rc = 0
        for i in cluster.brokers:
            part = cluster.dir / f"broker-{i}" / "logs" / f"{TOPIC}-0"
            files = sorted(str(part / f) for f in os.listdir(part) if f.endswith((".log", ".index", ".timeindex")))
            out = subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "dump-log", "--verify", *files],
                                 capture_output=True, text=True)
            problems = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
            print(f"  broker {i}: {len(files)} files of {part.name}: "
                  f"{'verified, no problems found' if out.returncode == 0 else problems[:3]}")
            rc |= out.returncode
        if args.keep_running:
            print(f"\nThe cluster keeps running (bootstrap {bootstrap}); Ctrl-C stops it.")
            while True:
                time.sleep(1)
        return 1 if lost or rc else 0
    except KeyboardInterrupt:
        return 0
    finally:
        step("stop the cluster")
        cluster.stop()


def describe_quiet(admin: Admin) -> dict[int, object]:
    (desc,) = admin.describe_topics([TOPIC])
    return {p.partition: p for p in desc.partitions}


if __name__ == "__main__":
    sys.exit(main())
