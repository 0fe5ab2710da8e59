"""Consumer groups: rebalance time from 3 members to 2, and commit throughput.

    .venv/bin/python bench/group_bench.py [--runs 3] [--session-timeout-ms 6000]
        [--heartbeat-interval-ms 500] [--commits 2000] [--json]
    .venv/bin/python bench/group_bench.py --runs 1 --commits 200     # a quick check that it works

A local 3-broker cluster (``DevCluster``: real ZooKeeper and broker processes in a temporary
directory; ``__consumer_offsets`` with replication factor 3, so every commit is written with
acks=all to three replicas) and a topic of 6 partitions (RF 3).

Rebalance 3 -> 2 (median of ``--runs``, each run with a fresh group): three members, each a
process of its own (a blocking ``Consumer`` subscribed to the topic; PR_SET_PDEATHSIG), share
the 6 partitions (range assignor: eager rebalances). Then one member goes away, and the time is
measured until *both* remaining members have their new assignment, which is the latest of
their ``on_partitions_assigned`` callbacks for the new generation (3 partitions each):

* ``leave``: from the moment the member calls ``close()`` (which sends LeaveGroup);
* ``kill``: the member is SIGKILLed; the coordinator notices only when its session expires. The
  figure is measured from the moment the coordinator expired it, which is when DescribeGroups
  (asked every 20 ms from shortly before the session can expire) first shows the group out of
  Stable; the time from the SIGKILL (which includes the session timeout) is reported too.

Both depend on ``--heartbeat-interval-ms``: the remaining members hear of the rebalance from
their next heartbeat's REBALANCE_IN_PROGRESS (Kafka's default, 3000 ms, would add up to 3 s).

Commit throughput (median of ``--runs``): one member of a group of its own, owning a 1-partition
topic, sends ``--commits`` synchronous ``commit({partition: offset})`` calls one after the other
(each waits for the coordinator's acks=all write): commits per second; then ``--commits``
``commit_async`` calls at once, timed until every callback ran (they run in ``poll``; the
client sends them one at a time, in order, so that committed offsets never go backwards).

Run it on an idle machine (it prints the 1-minute load average); the members, the brokers and
ZooKeeper share its cores. ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tidelog import Admin, Consumer, ConsumerRebalanceListener, NewTopic, TopicPartition
from tidelog.broker.devcluster import DevCluster

ROOT = Path(__file__).resolve().parents[1]

TOPIC = "rebalance"
COMMIT_TOPIC = "commits"
PARTITIONS = 6
WAIT_S = 120.0  # bound on every wait


# -- a member process ----------------------------------------------------------------------------


def member_main(bootstrap: str, group: str, topic: str, options: dict[str, Any]) -> None:
    """A group member: JSON lines on stdout for each assignment; ``close`` on stdin closes it."""
    parent = os.getppid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)

    def emit(e: str, **fields: Any) -> None:
        print(json.dumps({"e": e, "t": time.time(), **fields}), flush=True)

    class Listener(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            emit("assigned", tps=sorted(tp.partition for tp in assigned), generation=consumer.group_generation[0])

    consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False, **options)
    consumer.subscribe([topic], listener=Listener())
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        consumer.poll(timeout_ms=100)
        if select.select([sys.stdin], [], [], 0)[0] and sys.stdin.readline().strip() == "close":
            break
    emit("closing")
    consumer.close()
    emit("closed")


class Member:
    """The parent's handle on a member process: its events, read by a thread."""

    def __init__(self, bootstrap: str, group: str, options: dict[str, Any]):
        self.proc = subprocess.Popen([sys.executable, __file__, "member", bootstrap, group, TOPIC, json.dumps(options)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=ROOT, text=True)
        self.events: list[dict] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def assignment(self) -> tuple[int | None, list[int], float]:
        """(generation, partitions, time) of its last assignment."""
        last = next((e for e in reversed(self.events) if e["e"] == "assigned"), None)
        return (None, [], 0.0) if last is None else (last["generation"], last["tps"], last["t"])

    def event(self, kind: str) -> dict | None:
        return next((e for e in self.events if e["e"] == kind), None)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("close\n")
                self.proc.stdin.flush()
            except OSError:  # it exited meanwhile
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def wait_for(condition, what: str, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {WAIT_S} s")
        time.sleep(interval)
    return value


def balanced(members: list[Member], newer_than: int = -1) -> tuple[int, float] | None:
    """(generation, time of the last assignment) once ``members`` share every partition in one
    generation newer than ``newer_than``."""
    views = [m.assignment() for m in members]
    generations = {g for g, _, _ in views}
    owned = sorted(p for _, tps, _ in views for p in tps)
    if len(generations) != 1 or None in generations or owned != list(range(PARTITIONS)):
        return None
    generation = generations.pop()
    return (generation, max(t for _, _, t in views)) if generation > newer_than else None


# -- rebalance 3 -> 2 ----------------------------------------------------------------------------


def rebalance_once(cluster: DevCluster, admin: Admin, how: str, run: int, options: dict[str, Any]) -> dict:
    group = f"bench-{how}-{run}"
    members = [Member(cluster.bootstrap, group, options) for _ in range(3)]
    try:
        generation, _ = wait_for(lambda: balanced(members), f"{group}: three members balanced")
        gone, rest = members[0], members[1:]
        if how == "leave":
            gone.close()
            start = wait_for(lambda: gone.event("closing"), f"{group}: the member closing")["t"]
            from_kill = None
        else:
            killed_at = time.time()
            gone.kill()
            start = coordinator_expired(admin, group, generation, killed_at, options)
            from_kill = killed_at
        _, done = wait_for(lambda: balanced(rest, newer_than=generation), f"{group}: two members balanced")
        result = {"rebalance_s": done - start}
        if from_kill is not None:
            result["from_sigkill_s"] = done - from_kill
        return result
    finally:
        for m in members:
            m.close()
        for m in members:
            try:
                m.proc.wait(30)
            except subprocess.TimeoutExpired:
                m.kill()


def coordinator_expired(admin: Admin, group: str, generation: int, killed_at: float, options: dict[str, Any]) -> float:
    """When the coordinator expired the killed member: the first DescribeGroups showing the
    group out of Stable (or in a newer generation), asked every 20 ms from one heartbeat
    interval before the session can expire."""
    earliest = killed_at + (options["session_timeout_ms"] - options["heartbeat_interval_ms"]) / 1000 - 0.2
    time.sleep(max(0.0, earliest - time.time()))

    def expired() -> float | None:
        (d,) = admin.describe_groups([group], timeout_ms=5000)
        return time.time() if d.state != "Stable" or d.generation != generation else None
    return wait_for(expired, f"{group}: the coordinator expiring the killed member", interval=0.02)


# -- commit throughput ---------------------------------------------------------------------------


def commit_throughput(cluster: DevCluster, run: int, commits: int, options: dict[str, Any]) -> dict:
    tp = TopicPartition(COMMIT_TOPIC, 0)
    with Consumer(cluster.bootstrap, group_id=f"bench-commits-{run}", enable_auto_commit=False, **options) as c:
        c.subscribe([COMMIT_TOPIC])
        wait_for(lambda: c.poll(timeout_ms=100) is not None and c.assignment() == {tp}, "the commit member's assignment")
        start = time.perf_counter()
        for i in range(commits):
            c.commit({tp: i + 1})
        sync_s = time.perf_counter() - start
        done: list = []
        start = time.perf_counter()
        for i in range(commits):
            c.commit_async({tp: commits + i + 1}, callback=lambda offsets, error: done.append(error))
        wait_for(lambda: c.poll(timeout_ms=10) is not None and len(done) == commits, "every commit_async callback",
                 interval=0)
        async_s = time.perf_counter() - start
        errors = [e for e in done if e is not None]
        if errors:
            raise RuntimeError(f"{len(errors)} asynchronous commits failed, first: {errors[0]!r}")
        if c.committed(tp) != 2 * commits:
            raise RuntimeError(f"committed offset {c.committed(tp)}, expected {2 * commits}")
    return {"sync_per_s": commits / sync_s, "async_per_s": commits / async_s}


# -- main ----------------------------------------------------------------------------------------


def median_of(runs: list[dict], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--heartbeat-interval-ms", type=int, default=500)
    p.add_argument("--commits", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    options = {"session_timeout_ms": args.session_timeout_ms, "heartbeat_interval_ms": args.heartbeat_interval_ms,
               "fetch_max_wait_ms": 100}
    d = tempfile.mkdtemp(prefix="tidelog-group-bench-")
    cluster = DevCluster(d, 3, zk_port=0, base_port=0, extra_config={
        "group.initial.rebalance.delay.ms": 300, "group.min.session.timeout.ms": min(6000, args.session_timeout_ms),
        "offsets.topic.replication.factor": 3, "auto.leader.rebalance.enable": False})
    results: dict[str, list[dict]] = {"leave": [], "kill": [], "commits": []}
    try:
        cluster.start()
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3), NewTopic(COMMIT_TOPIC, 1, 3)])
            time.sleep(1)
            for run in range(args.runs):
                for how in ("leave", "kill"):
                    results[how].append(rebalance_once(cluster, admin, how, run, options))
                results["commits"].append(commit_throughput(cluster, run, args.commits, options))
    finally:
        cluster.stop()
    summary = {
        "rebalance_after_leave_s": {"median": median_of(results["leave"], "rebalance_s"),
                                    "runs": [round(r["rebalance_s"], 3) for r in results["leave"]]},
        "rebalance_after_session_expiry_s": {"median": median_of(results["kill"], "rebalance_s"),
                                             "runs": [round(r["rebalance_s"], 3) for r in results["kill"]]},
        "rebalance_from_sigkill_s": {"median": median_of(results["kill"], "from_sigkill_s"),
                                     "runs": [round(r["from_sigkill_s"], 3) for r in results["kill"]]},
        "commits_per_s": {"median": median_of(results["commits"], "sync_per_s"),
                          "runs": [round(r["sync_per_s"], 1) for r in results["commits"]]},
        "commit_async_per_s": {"median": median_of(results["commits"], "async_per_s"),
                               "runs": [round(r["async_per_s"], 1) for r in results["commits"]]},
        "session_timeout_ms": args.session_timeout_ms, "heartbeat_interval_ms": args.heartbeat_interval_ms,
        "commits": args.commits, "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for key in ("rebalance_after_leave_s", "rebalance_after_session_expiry_s", "rebalance_from_sigkill_s",
                    "commits_per_s", "commit_async_per_s"):
            print(f"{key}: median {summary[key]['median']} {summary[key]['runs']}")
        print(f"session_timeout_ms {args.session_timeout_ms}, heartbeat_interval_ms {args.heartbeat_interval_ms}, "
              f"{args.commits} commits per run, load {summary['load_avg_1m']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "member":
        member_main(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))
    else:
        sys.exit(main())
