"""Partition reassignment: how fast a move copies, and what it costs the producers meanwhile.

    .venv/bin/python bench/reassign_bench.py move      [--gib 1] [--throttle 50000000] [--runs 3]
    .venv/bin/python bench/reassign_bench.py rebalance [--throttle 10000000] [--runs 3]

Real broker processes and ZooKeeper from ``broker.devcluster.DevCluster`` in a temporary
directory; the clients are this process. The throttles are set and cleared as ``tidelog
reassign --execute --throttle`` and ``--verify`` do (the brokers' rates, the topics' replica
lists); a move is timed from AlterPartitionReassignments to ListPartitionReassignments
answering that nothing moves any more (the target is then the replica set, the leaving replica
deleted).

* move: 3 brokers and a topic with ``--partitions`` partitions, RF 1, on broker 1, filled with
  ``--gib`` GiB of 64 KiB values; then a 4th broker is added. The partitions move to broker 4,
  back to broker 1, to 4 ..., alternately with no throttle and with ``--throttle``: each move
  copies the whole data to a broker that holds none of it. Reports each move's time, its
  effective rate (the .log bytes of the partitions over the time) and the cores the source
  and the destination broker used meanwhile.
* rebalance: 3 brokers, then a 4th; per run a topic with 12 partitions, RF 3, min ISR 2 on
  brokers 1-3 (topic creation's placement), ``--fill-mib`` MiB of data per partition. Before the
  move: a latency window (acks=all, ``--rate`` records/s of ``--value-size`` bytes, ``--latency-s``
  seconds, every record's send-to-acknowledgement time) and a throughput window (acks=all,
  ``send_many`` as fast as the producer takes them for ``--throughput-s`` seconds, then flush:
  records over the time to the last acknowledgement). Then the plan of ``tidelog reassign
  --generate`` for brokers 1-4 is executed with ``--throttle`` and the same two windows run
  during the move (the report says whether it was still running at the end of each); the
  move's time is reported too. The figure the issue asks for is throughput during / before.
  Most of what broker 4 copies is what the throughput window during the move writes, so the
  move outlasts both windows; three runs take 6-8 minutes at 10 MB/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog import Admin, Producer, TopicPartition  # noqa: E402
from tidelog.aio.admin import NewTopic  # noqa: E402
from tidelog.broker.devcluster import DevCluster  # noqa: E402
from tidelog.commands.reassign import generate, throttled_replicas  # noqa: E402
from tidelog.perf import Latency  # noqa: E402
from tidelog.protocol.placement import assign_replicas  # noqa: E402
from tidelog.protocol.throttles import FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS  # noqa: E402

MIB = 1 << 20
MOVE_TIMEOUT_S = 600.0  # a move that takes longer is reported as a failure, not waited for


def start_cluster(extra: dict[str, object] | None = None) -> DevCluster:
    cluster = DevCluster(tempfile.mkdtemp(prefix="tidelog-reassign-"), 3, zk_port=0, base_port=0,
                         extra_config={"auto.leader.rebalance.enable": False, **(extra or {})})
    cluster.start()
    return cluster


def stop_cluster(cluster: DevCluster) -> None:
    """Stop it and remove its directory: a run leaves gigabytes there."""
    try:
        cluster.stop()
    finally:
        shutil.rmtree(cluster.dir, ignore_errors=True)


def wait_leaders(admin: Admin, topic: str, deadline_s: float = 60.0) -> None:
    """Until every partition of ``topic`` has a leader and its whole replica set in the ISR."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        (d,) = admin.describe_topics([topic])
        if d.partitions and all(p.leader >= 0 and set(p.isr) == set(p.replicas) for p in d.partitions):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: no leader or a short ISR after {deadline_s} s")


def assignment(admin: Admin, topic: str) -> dict[tuple[str, int], list[int]]:
    (d,) = admin.describe_topics([topic])
    return {(topic, p.partition): list(p.replicas) for p in d.partitions}


def set_throttles(admin: Admin, wanted: dict, current: dict, rate: int) -> None:
    """What ``tidelog reassign --execute --throttle`` sets (the topics' lists are replaced,
    not merged: nothing else moves here)."""
    for topic, (leader, follower) in throttled_replicas(wanted, current).items():
        admin.alter_configs(topic, {LEADER_REPLICAS: leader or None, FOLLOWER_REPLICAS: follower or None})
    for b in sorted({b for r in [*wanted.values(), *current.values()] for b in r}):
        admin.alter_broker_configs(b, {LEADER_RATE: str(rate), FOLLOWER_RATE: str(rate)})


def clear_throttles(admin: Admin, brokers: list[int], topic: str) -> None:
    """What ``tidelog reassign --verify`` clears once the moves are done."""
    for b in brokers:
        admin.alter_broker_configs(b, {LEADER_RATE: None, FOLLOWER_RATE: None})
    admin.alter_configs(topic, {LEADER_REPLICAS: None, FOLLOWER_REPLICAS: None})


def start_moves(admin: Admin, wanted: dict) -> float:
    results = admin.alter_partition_reassignments({TopicPartition(t, p): r for (t, p), r in wanted.items()})
    if bad := {tp: r for tp, r in results.items() if r[0] != 0}:
        raise RuntimeError(f"moves refused: {bad}")
    return time.monotonic()


def moving(admin: Admin) -> bool:
    return bool(admin.list_partition_reassignments())


def wait_moved(admin: Admin, started: float) -> float:
    """Seconds from ``started`` until nothing moves any more (polled every 0.1 s)."""
    while moving(admin):
        if time.monotonic() - started > MOVE_TIMEOUT_S:
            raise TimeoutError(f"the moves did not finish within {MOVE_TIMEOUT_S} s")
        time.sleep(0.1)
    return time.monotonic() - started


def log_bytes(cluster: DevCluster, broker: int, topic: str) -> int:
    """The .log bytes of ``topic``'s partitions on ``broker``'s disk."""
    logs = cluster.dir / f"broker-{broker}" / "logs"
    return sum(f.stat().st_size for f in logs.glob(f"{topic}-*/*.log"))


def fill(bootstrap: str, topic: str, partitions: int, nbytes_per_partition: int, value_size: int,
         acks: int | str) -> None:
    """Random values sent partition by partition in 1 MiB send_many calls (not timed)."""
    value = os.urandom(value_size)
    per_call = max(1, MIB // value_size)
    with Producer(bootstrap, acks=acks, linger_ms=10, batch_size=MIB, max_request_size=4 * MIB,
                  buffer_memory=64 * MIB) as producer:
        for p in range(partitions):
            for _ in range(-(-nbytes_per_partition // (per_call * value_size))):
                producer.send_many(topic, [value] * per_call, partition=p)
        producer.flush(600)


# -- move ---------------------------------------------------------------------------------------------


def run_move(args: argparse.Namespace) -> None:
    cluster = start_cluster()
    topic = "bulk"
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(topic, replica_assignment={p: [1] for p in range(args.partitions)})])
            wait_leaders(admin, topic)
            t0 = time.monotonic()
            fill(cluster.bootstrap, topic, args.partitions, int(args.gib * (1 << 30)) // args.partitions,
                 64 * 1024, acks=1)
            print(f"filled {log_bytes(cluster, 1, topic) / MIB:.0f} MiB in {time.monotonic() - t0:.1f} s",
                  flush=True)
            cluster.add_broker()
            here, there = 1, 4
            results: dict[str, list[tuple[float, float]]] = {"none": [], "throttled": []}
            for _ in range(args.runs):
                for mode in ("none", "throttled"):
                    nbytes = log_bytes(cluster, here, topic)
                    current = {(topic, p): [here] for p in range(args.partitions)}
                    wanted = {(topic, p): [there] for p in range(args.partitions)}
                    if mode == "throttled":
                        set_throttles(admin, wanted, current, args.throttle)
                    meter = CpuMeter(cluster)
                    seconds = wait_moved(admin, start_moves(admin, wanted))
                    cores = meter.cores()
                    if mode == "throttled":
                        clear_throttles(admin, [1, 2, 3, 4], topic)
                    rate = nbytes / seconds
                    results[mode].append((seconds, rate))
                    print(f"  {mode:9} {here} -> {there}: {nbytes / MIB:.0f} MiB in {seconds:.1f} s = "
                          f"{rate / 1e6:.1f} MB/s ({log_bytes(cluster, there, topic) / MIB:.0f} MiB there); "
                          f"cores: source {cores[f'b{here}']:.2f}, destination {cores[f'b{there}']:.2f}",
                          flush=True)
                    here, there = there, here
                    time.sleep(2)  # the leaving replica's deletion, before the next move reads the disk
    finally:
        stop_cluster(cluster)
    for mode, runs in results.items():
        label = "no throttle" if mode == "none" else f"throttle {args.throttle / 1e6:g} MB/s"
        secs = statistics.median(s for s, _ in runs)
        rate = statistics.median(r for _, r in runs)
        extra = f" = {rate / args.throttle:.2f} x the throttle" if mode == "throttled" else ""
        print(f"{label}: median {secs:.1f} s ({', '.join(f'{s:.1f}' for s, _ in runs)}), "
              f"{rate / 1e6:.1f} MB/s{extra}")
    print(f"load average {os.getloadavg()[0]:.2f}")


# -- rebalance -----------------------------------------------------------------------------------------


def latency_window(bootstrap: str, topic: str, args: argparse.Namespace) -> tuple[Latency, float]:
    """acks=all at ``--rate`` for ``--latency-s``: (send-to-acknowledgement latency, acks/s).
    The sender sleeps only when it is 2 ms ahead of the rate (kafka-producer-perf-test's way)."""
    value = os.urandom(args.value_size)
    latencies: list[float] = []
    lock = threading.Lock()
    total = int(args.rate * args.latency_s)
    with Producer(bootstrap, acks="all", linger_ms=1) as producer:
        producer.send(topic, value).result(30)  # metadata and connections first
        clock = time.perf_counter
        start = clock()
        for i in range(total):
            ahead = start + i / args.rate - clock()
            if ahead > 0.002:
                time.sleep(ahead)
            sent = clock()

            def done(f, sent=sent) -> None:
                if f.exception(0) is None:
                    with lock:
                        latencies.append((clock() - sent) * 1000)
            producer.send(topic, value).add_done_callback(done)
        producer.flush(120)
        elapsed = clock() - start
    return Latency.of(latencies), len(latencies) / elapsed


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Cores each broker and this process used over a window."""

    def __init__(self, cluster: DevCluster):
        self.pids = {f"b{i}": b.proc.pid for i, b in cluster.brokers.items() if b.proc} | {"client": os.getpid()}
        self.start = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self.t0 = time.monotonic()

    def cores(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        return {k: (cpu_seconds(p) - self.start[k]) / wall for k, p in self.pids.items()}


def throughput_window(bootstrap: str, topic: str, args: argparse.Namespace) -> float:
    """acks=all, as fast as the producer takes records for ``--throughput-s``, then flush:
    records/s to the last acknowledgement. A small buffer keeps the flush short."""
    values = [os.urandom(args.value_size)] * 100
    sent = 0
    with Producer(bootstrap, acks="all", buffer_memory=4 * MIB, max_block_ms=60000) as producer:
        producer.send(topic, values[0]).result(30)
        start = time.perf_counter()
        while time.perf_counter() - start < args.throughput_s:
            producer.send_many(topic, values)
            sent += len(values)
        producer.flush(120)
        return sent / (time.perf_counter() - start)


def rebalance_once(cluster: DevCluster, admin: Admin, run: int, args: argparse.Namespace) -> dict:
    topic = f"rebalance-{run}"
    admin.create_topics([NewTopic(topic, replica_assignment=assign_replicas([1, 2, 3], 12, 3),
                                  config={"min.insync.replicas": "2"})])
    wait_leaders(admin, topic)
    fill(cluster.bootstrap, topic, 12, args.fill_mib * MIB, 64 * 1024, acks="all")
    wait_leaders(admin, topic)
    out: dict = {}
    out["lat_before"], out["lat_rate_before"] = latency_window(cluster.bootstrap, topic, args)
    meter = CpuMeter(cluster)
    out["tp_before"] = throughput_window(cluster.bootstrap, topic, args)
    out["cpu_before"] = meter.cores()
    current = assignment(admin, topic)
    wanted = generate(current, [1, 2, 3, 4], None)
    out["copies"] = sum(len(set(wanted[tp]) - set(current[tp])) for tp in wanted)
    set_throttles(admin, wanted, current, args.throttle)
    started = start_moves(admin, wanted)
    meter = CpuMeter(cluster)
    out["tp_during"] = throughput_window(cluster.bootstrap, topic, args)
    out["cpu_during"] = meter.cores()
    out["moving_after_tp"] = moving(admin)
    out["lat_during"], out["lat_rate_during"] = latency_window(cluster.bootstrap, topic, args)
    out["moving_after_lat"] = moving(admin)
    out["move_s"] = wait_moved(admin, started)
    clear_throttles(admin, [1, 2, 3, 4], topic)
    admin.delete_topics([topic])
    return out


def run_rebalance(args: argparse.Namespace) -> None:
    cluster = start_cluster()
    runs = []
    try:
        cluster.add_broker()
        with Admin(cluster.bootstrap) as admin:
            for run in range(args.runs):
                r = rebalance_once(cluster, admin, run, args)
                runs.append(r)
                print(f"  run {run + 1}: throughput {r['tp_before']:,.0f} -> {r['tp_during']:,.0f} records/s "
                      f"({r['tp_during'] / r['tp_before']:.2f}); p99 {r['lat_before'].p99:.1f} -> "
                      f"{r['lat_during'].p99:.1f} ms, p50 {r['lat_before'].p50:.1f} -> {r['lat_during'].p50:.1f} ms "
                      f"at {r['lat_rate_before']:,.0f} / {r['lat_rate_during']:,.0f} acks/s; move {r['move_s']:.1f} s "
                      f"({r['copies']} replicas copied), still moving after the windows: "
                      f"{r['moving_after_tp']}/{r['moving_after_lat']}", flush=True)
                for when in ("before", "during"):
                    print(f"    cores in the throughput window {when}: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in r[f"cpu_{when}"].items()), flush=True)
                time.sleep(3)  # the deleted topic's files go
    finally:
        stop_cluster(cluster)

    def med(key, f=lambda v: v):
        return statistics.median(f(r[key]) for r in runs)
    ratios = [r["tp_during"] / r["tp_before"] for r in runs]
    print(f"throughput before: median {med('tp_before'):,.0f} records/s "
          f"({med('tp_before') * args.value_size / 1e6:.1f} MB/s)")
    print(f"throughput during: median {med('tp_during'):,.0f} records/s "
          f"({med('tp_during') * args.value_size / 1e6:.1f} MB/s)")
    print(f"during / before: median {statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"p99 before {med('lat_before', lambda v: v.p99):.1f} ms, during {med('lat_during', lambda v: v.p99):.1f} ms; "
          f"p50 before {med('lat_before', lambda v: v.p50):.1f} ms, during {med('lat_during', lambda v: v.p50):.1f} ms")
    print(f"move: median {med('move_s'):.1f} s; throttle {args.throttle / 1e6:g} MB/s; "
          f"load average {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    move = sub.add_parser("move", help="time moving --gib GiB to a new broker, with and without a throttle")
    move.add_argument("--gib", type=float, default=1.0)
    move.add_argument("--partitions", type=int, default=1)
    move.add_argument("--throttle", type=int, default=50_000_000, help="bytes/s")
    move.add_argument("--runs", type=int, default=3)
    reb = sub.add_parser("rebalance", help="producers before and during a throttled 12-partition 3->4 rebalance")
    reb.add_argument("--throttle", type=int, default=10_000_000, help="bytes/s")
    reb.add_argument("--fill-mib", type=int, default=16, help="MiB per partition before the move")
    reb.add_argument("--value-size", type=int, default=1000)
    reb.add_argument("--rate", type=int, default=2000, help="records/s of the latency window")
    reb.add_argument("--latency-s", type=float, default=8.0)
    reb.add_argument("--throughput-s", type=float, default=8.0)
    reb.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    (run_move if args.what == "move" else run_rebalance)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
