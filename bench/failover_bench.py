"""Failover time: from killing (SIGKILL) or stopping (SIGTERM, controlled shutdown) the
leader of a partition to the first acknowledged acks=all write on its successor.

    .venv/bin/python bench/failover_bench.py [--runs 3] [--session-timeout-ms 6000]

A 3-broker cluster (RF 3, min.insync.replicas 2); a producer sends one record at a time to
partition 0 with acks=all; the leader is killed or stopped; the time until the next
acknowledgement from the new leader is reported. A hard kill is only noticed when the
broker's ZooKeeper session expires, so that time is bounded below by
zookeeper.session.timeout.ms; a controlled shutdown moves leadership first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from tidelog import Admin, NewTopic, Producer
from tidelog.broker.devcluster import DevCluster

TOPIC = "failover"


def leader_of(admin: Admin) -> int:
    (desc,) = admin.describe_topics([TOPIC])
    return desc.partitions[0].leader


def measure(cluster: DevCluster, admin: Admin, how: str) -> float:
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=0,
                  retry_backoff_ms=20, max_in_flight_requests_per_connection=1) as producer:
        producer.send(TOPIC, b"warm-up", partition=0).result(30)
        leader = leader_of(admin)
        broker = cluster.brokers[leader]
        t0 = time.monotonic()
        if how == "kill":
            broker.kill()
        else:
            broker.proc.send_signal(15)
        while True:
            meta = producer.send(TOPIC, b"probe", partition=0).result(120)
            if leader_of(admin) != leader:
                elapsed = time.monotonic() - t0
                break
            if time.monotonic() - t0 > 120:
                raise TimeoutError("no new leader within 120 s")
        del meta
        if how != "kill":
            broker.proc.wait(60)
    broker.start()
    cluster.wait_ready(60)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    d = tempfile.mkdtemp(prefix="tidelog-failover-")
    cluster = DevCluster(d, 3, zk_port=0, base_port=0, extra_config={
        "zookeeper.session.timeout.ms": args.session_timeout_ms, "replica.lag.time.max.ms": 5000,
        "auto.leader.rebalance.enable": False, "controlled.shutdown.retry.backoff.ms": 200})
    results: dict[str, list[float]] = {"kill": [], "sigterm": []}
    try:
        cluster.start()
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})])
            time.sleep(1)
            for _ in range(args.runs):
                for how in ("sigterm", "kill"):
                    results[how].append(measure(cluster, admin, how))
                    time.sleep(6)  # let the restarted broker rejoin the ISR
    finally:
        cluster.stop()
    summary = {how: {"median_s": round(statistics.median(v), 3), "runs_s": [round(x, 3) for x in v]}
               for how, v in results.items()}
    summary["session_timeout_ms"] = args.session_timeout_ms
    summary["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(summary) if args.json else
          f"controlled shutdown (SIGTERM) -> first ack on the new leader: median {summary['sigterm']['median_s']} s "
          f"{summary['sigterm']['runs_s']}\n"
          f"hard kill (SIGKILL) -> first ack on the new leader: median {summary['kill']['median_s']} s "
          f"{summary['kill']['runs_s']} (zookeeper.session.timeout.ms {args.session_timeout_ms})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
