"""Consumer groups end to end: real ZooKeeper, three broker processes, consumers as processes
where being killed matters (``group_member.py``) and as blocking Consumers otherwise.

Acceptance (issue 5): three members of a 6-partition topic get two partitions each; after one
is SIGKILLed the others take its partitions over and resume at the committed offsets, no record
below a committed offset is skipped and the group's committed offsets never go backwards; a
slow member within max_poll_interval_ms keeps its partitions; one past it leaves, and its
commit fails with CommitFailedError saying why; a restarted static member rejoins without a
rebalance; the ``tidelog groups`` commands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.waiting import wait_until
from tidelog import (
    Admin,
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    NewTopic,
    Producer,
    TidelogError,
    TopicPartition,
    WakeupError,
)
from tidelog.broker.cli import main as tidelog_main

GROUP_CONFIG = dict(FAST_FAILOVER, **{"group.initial.rebalance.delay.ms": 300,
                                      "group.min.session.timeout.ms": 1000})
FAST_MEMBER = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("groups"), 3, GROUP_CONFIG)


def create_topic(cluster, name: str, partitions: int, records: int = 0) -> dict[TopicPartition, int]:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 3)])
    wait_topic_ready(cluster, name, partitions, 3)
    if records:
        with Producer(cluster.bootstrap, linger_ms=5) as producer:
            for i in range(records):
                producer.send(name, b"value-%d" % i, key=b"key-%d" % i)
            producer.flush()
    with Consumer(cluster.bootstrap) as c:
        return c.end_offsets([TopicPartition(name, p) for p in range(partitions)])


class Recorder(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set]] = []
        self.threads: set[str] = set()

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", set(assigned)))
        self.threads.add(threading.current_thread().name)

    def on_partitions_revoked(self, revoked):
        self.events.append(("revoked", set(revoked)))

    def on_partitions_lost(self, lost):
        self.events.append(("lost", set(lost)))


def poll_until(consumers, condition, timeout: float, message: str):
    """Poll every consumer in turn (100 ms each) until ``condition()``; bounded."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{message}: not reached within {timeout} s")
        for c in consumers:
            c.poll(timeout_ms=100)


# -- members in processes -------------------------------------------------------------------------


class Member:
    def __init__(self, cluster, group: str, topic: str, path: Path, **options):
        self.path = path
        with open(path.with_suffix(".log"), "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.group_member", cluster.bootstrap, group, topic,
                 str(path), json.dumps(options)], cwd=ROOT, stdout=log, stderr=log,
                env={**os.environ, "PYTHONPATH": str(ROOT)})

    def events(self) -> list[dict]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def assignment(self) -> tuple[set, int | None]:
        """The partitions of the last assignment (and its generation) still held."""
        owned: set = set()
        generation = None
        for e in self.events():
            if e["e"] == "assigned":
                owned |= {tuple(tp) for tp in e["tps"]}
                generation = e["generation"][0] if e["generation"] else None
            elif e["e"] in ("revoked", "lost"):
                owned -= {tuple(tp) for tp in e["tps"]}
        return owned, generation

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def test_three_members_share_six_partitions_and_survivors_take_over_a_killed_one(cluster, tmp_path):
    topic, group = "churn", "churn-group"
    ends = create_topic(cluster, topic, 6, records=9000)
    options = dict(FAST_MEMBER, max_poll_records=50, delay_per_batch_s=0.1, run_s=120)
    members = [Member(cluster, group, topic, tmp_path / f"m{i}.jsonl", **options) for i in range(3)]
    samples: dict[TopicPartition, list[int]] = {tp: [] for tp in ends}
    stop_sampling = threading.Event()

    def sample_commits():  # the group's committed offsets as the coordinator reports them
        with Admin(cluster.bootstrap) as admin:
            while not stop_sampling.wait(0.2):
                try:
                    for o in admin.list_group_offsets(group, timeout_ms=5000):
                        if o.committed is not None and (not samples[o.partition] or samples[o.partition][-1] != o.committed):
                            samples[o.partition].append(o.committed)
                except TidelogError:
                    pass

    sampler = threading.Thread(target=sample_commits, daemon=True)
    sampler.start()
    try:
        def balanced():
            views = [m.assignment() for m in members]
            parts = [v[0] for v in views]
            return (all(len(p) == 2 for p in parts) and len(set().union(*parts)) == 6
                    and len({v[1] for v in views}) == 1)

        wait_until(balanced, 60, "three members with two partitions each in one generation", interval=0.2)
        victim = members[0]
        victim_owned, _ = victim.assignment()
        wait_until(lambda: any(e["e"] == "committed" for e in victim.events()), 30, "a commit by the victim")
        killed_at = time.time()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        victim_events = victim.events()

        survivors = members[1:]
        wait_until(lambda: set().union(*(m.assignment()[0] for m in survivors)) == {(topic, p) for p in range(6)},
                   60, "the survivors own all six partitions", interval=0.2)
        with Admin(cluster.bootstrap) as admin:
            wait_until(lambda: {o.partition: o.committed for o in admin.list_group_offsets(group)} == ends,
                       120, "every record consumed and committed", interval=0.5)
    finally:
        stop_sampling.set()
        for m in members:
            m.stop()
        sampler.join(10)

    # each survivor ends with three partitions
    assert sorted(len(m.assignment()[0]) for m in survivors) == [3, 3]
    consumed: dict[tuple, set[int]] = {}
    for m in members:
        for e in m.events():
            if e["e"] == "records":
                consumed.setdefault(tuple(e["tp"]), set()).update(e["offsets"])
    # nothing skipped: every offset of every partition was consumed by somebody
    for tp, end in ends.items():
        assert consumed.get((tp.topic, tp.partition), set()) >= set(range(end)), f"a gap in {tp}"
    # the takers of the victim's partitions resumed at its committed offset: not below what it
    # had committed, not above what it had consumed (nothing skipped)
    victim_committed: dict[str, int] = {}
    victim_consumed: dict[tuple, int] = {}
    for e in victim_events:
        if e["e"] == "committed":
            victim_committed.update(e["offsets"])
        elif e["e"] == "records":
            victim_consumed[tuple(e["tp"])] = max(e["offsets"] + [victim_consumed.get(tuple(e["tp"]), -1)])
    for tp in victim_owned:
        committed = victim_committed.get(f"{tp[0]}:{tp[1]}", 0)
        firsts = []
        for m in survivors:
            taken = False
            for e in m.events():
                if e["e"] == "assigned" and list(tp) in e["tps"] and e["t"] > killed_at:
                    taken = True
                elif taken and e["e"] == "records" and tuple(e["tp"]) == tp:
                    firsts.append(e["offsets"][0])
                    break
        first = min(firsts)
        assert committed <= first <= victim_consumed.get(tp, -1) + 1, (tp, committed, first)
    # committed offsets never went backwards: per member, and as the coordinator reported them
    for m in members:
        last: dict[str, int] = {}
        for e in m.events():
            if e["e"] == "committed":
                for k, o in e["offsets"].items():
                    assert o >= last.get(k, 0), f"{k} went back from {last[k]} to {o}"
                    last[k] = o
    for tp, seen in samples.items():
        assert seen == sorted(seen), f"committed offsets of {tp} went backwards: {seen}"


# -- members in this process ----------------------------------------------------------------------


def group_consumer(cluster, group: str, **options) -> tuple[Consumer, Recorder]:
    consumer = Consumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest",
                        **{**FAST_MEMBER, **options})
    return consumer, Recorder()


def test_slow_member_within_max_poll_interval_keeps_its_partitions(cluster):
    topic, group = "slow", "slow-group"
    create_topic(cluster, topic, 2, records=20)
    a, a_events = group_consumer(cluster, group, session_timeout_ms=2000, max_poll_interval_ms=30000)
    b, b_events = group_consumer(cluster, group, session_timeout_ms=2000, max_poll_interval_ms=30000)
    with a, b:
        a.subscribe([topic], listener=a_events)
        b.subscribe([topic], listener=b_events)
        poll_until([a, b], lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1
                   and a.group_generation[0] == b.group_generation[0], 60, "one partition each")
        generation, assignment = a.group_generation, a.assignment()
        before = len(b_events.events)
        stop = time.monotonic() + 5.0  # no poll from a for 2.5 session timeouts: heartbeats go on
        while time.monotonic() < stop:
            b.poll(timeout_ms=200)
        a.poll(timeout_ms=200)
        b.poll(timeout_ms=200)
        assert a.group_generation == generation and a.assignment() == assignment
        assert b.group_generation[0] == generation[0] and b_events.events[before:] == []
        assert a_events.threads == {threading.current_thread().name}  # callbacks on the caller's thread


def test_member_past_max_poll_interval_leaves_and_its_commit_fails_saying_why(cluster):
    topic, group = "stale", "stale-group"
    create_topic(cluster, topic, 2, records=20)
    a, a_events = group_consumer(cluster, group, max_poll_interval_ms=2000)
    b, b_events = group_consumer(cluster, group)
    with a, b:
        a.subscribe([topic], listener=a_events)
        b.subscribe([topic], listener=b_events)
        poll_until([a, b], lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, 60, "one partition each")
        a.poll(timeout_ms=100)
        time.sleep(4.0)  # processing "takes" longer than max_poll_interval_ms: a leaves the group
        with pytest.raises(CommitFailedError) as info:
            a.commit()
        text = str(info.value)
        assert "rebalanced" in text and "reassigned" in text and "max_poll_interval_ms" in text
        poll_until([b], lambda: len(b.assignment()) == 2, 30, "b takes both partitions")
        poll_until([a, b], lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, 60,
                   "a rejoined at its next poll")
        assert [kind for kind, _ in a_events.events] == ["assigned", "lost", "assigned"]


def test_one_poll_longer_than_max_poll_interval_waiting_for_records_keeps_the_member(cluster):
    topic, group = "long-poll", "long-poll-group"
    create_topic(cluster, topic, 1)
    a, a_events = group_consumer(cluster, group, max_poll_interval_ms=2000)
    with a:
        a.subscribe([topic], listener=a_events)
        poll_until([a], lambda: len(a.assignment()) == 1, 60, "the partition assigned")
        generation = a.group_generation
        assert a.poll(timeout_ms=5000) == []  # 2.5 x max_poll_interval_ms, waiting inside poll
        a.commit({TopicPartition(topic, 0): 0})  # still a member: the commit is accepted
        assert a.group_generation == generation
        assert [kind for kind, _ in a_events.events] == ["assigned"]


def test_a_paused_member_stays_in_the_group_resumes_where_it_was_and_wakeup_ends_its_poll(cluster):
    topic, group = "paused", "paused-group"
    create_topic(cluster, topic, 1, records=10)
    tp = TopicPartition(topic, 0)
    a, a_events = group_consumer(cluster, group, max_poll_interval_ms=2000, max_poll_records=4,
                                 enable_auto_commit=False)

    def poll_records(count: int, timeout: float) -> list:
        got, deadline = [], time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            got += a.poll(timeout_ms=200)
        return got

    with a:
        a.subscribe([topic], listener=a_events)
        got = poll_records(1, 60)
        generation = a.group_generation
        a.pause(tp)
        paused_at = a.position(tp)
        stop = time.monotonic() + 4.0  # 2 x max_poll_interval_ms of polls that return nothing
        while time.monotonic() < stop:
            assert a.poll(timeout_ms=200) == []
        assert a.group_generation == generation and a.paused() == {tp} and a.position(tp) == paused_at
        a.commit()  # still a member: the commit of the position is accepted
        a.resume(tp)
        got += poll_records(10 - len(got), 30)
        assert [r.offset for r in got] == list(range(10))
        threading.Timer(0.3, a.wakeup).start()  # another thread ends the member's long poll
        with pytest.raises(WakeupError):
            a.poll(timeout_ms=20000)
        assert a.group_generation == generation
        assert [kind for kind, _ in a_events.events] == ["assigned"]


def test_restarted_static_member_rejoins_without_a_rebalance(cluster):
    topic, group = "static", "static-group"
    create_topic(cluster, topic, 4, records=40)
    static = {"session_timeout_ms": 10000}
    a, a_events = group_consumer(cluster, group, group_instance_id="a", **static)
    b, b_events = group_consumer(cluster, group, group_instance_id="b", **static)
    with b:
        b.subscribe([topic], listener=b_events)
        with a:
            a.subscribe([topic], listener=a_events)
            poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2
                       and a.group_generation[0] == b.group_generation[0], 60, "two partitions each")
            generation, a_partitions = a.group_generation[0], a.assignment()
            a.commit()
        # a is closed: a static member sends no LeaveGroup; a new process with its instance id
        b_before = len(b_events.events)
        a2, a2_events = group_consumer(cluster, group, group_instance_id="a", **static)
        with a2:
            a2.subscribe([topic], listener=a2_events)
            poll_until([a2, b], lambda: a2.assignment() == a_partitions, 30, "the restarted member's partitions")
            for _ in range(5):
                b.poll(timeout_ms=100)
            assert a2.group_generation[0] == generation and b.group_generation[0] == generation
            assert b_events.events[b_before:] == []  # b never saw a rebalance


def test_cooperative_sticky_moves_only_the_partitions_that_change_owner(cluster):
    topic, group = "coop", "coop-group"
    create_topic(cluster, topic, 4, records=40)
    strategy = {"partition_assignment_strategy": ["cooperative-sticky"]}
    a, a_events = group_consumer(cluster, group, **strategy)
    b, b_events = group_consumer(cluster, group, **strategy)
    with a, b:
        a.subscribe([topic], listener=a_events)
        poll_until([a], lambda: len(a.assignment()) == 4, 60, "a owns all four partitions")
        b.subscribe([topic], listener=b_events)
        poll_until([a, b], lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, 60, "two each")
        moved = b.assignment()
        revoked = set().union(*(tps for kind, tps in a_events.events if kind == "revoked"))
        assert revoked == moved  # a kept consuming the other two through both rebalances
        assert [tps for kind, tps in a_events.events if kind == "assigned"][1:] == \
            [set()] * (sum(kind == "assigned" for kind, _ in a_events.events) - 1)
        assert not any(kind == "lost" for kind, _ in a_events.events)


def test_pattern_subscription_picks_up_new_matching_topics(cluster):
    group = "pattern-group"
    create_topic(cluster, "pat-1", 1)
    create_topic(cluster, "unmatched-pat", 1)
    consumer, events = group_consumer(cluster, group, metadata_max_age_ms=500)
    with consumer:
        consumer.subscribe(pattern=r"pat-\d+", listener=events)
        poll_until([consumer], lambda: consumer.assignment() == {TopicPartition("pat-1", 0)}, 60, "pat-1")
        create_topic(cluster, "pat-2", 2)
        poll_until([consumer], lambda: consumer.assignment() == {TopicPartition("pat-1", 0), TopicPartition("pat-2", 0),
                                                                  TopicPartition("pat-2", 1)}, 60, "pat-2 added")
        assert consumer.subscription() == {"pat-1", "pat-2"}


async def test_async_consumer_group_with_async_listener_commit_async_and_committed(cluster):
    import trio

    from tidelog.aio import AsyncConsumer

    topic, group = "async-group", "async-group"
    ends = create_topic(cluster, topic, 2, records=20)
    calls: list = []

    class AsyncListener(ConsumerRebalanceListener):
        async def on_partitions_assigned(self, assigned):
            await trio.sleep(0)
            calls.append(("assigned", set(assigned)))

        async def on_partitions_revoked(self, revoked):
            calls.append(("revoked", set(revoked)))

    async with AsyncConsumer(cluster.bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, **FAST_MEMBER) as consumer:
        consumer.subscribe([topic], listener=AsyncListener())
        seen = 0
        with trio.fail_after(60):
            while seen < 20:
                seen += len(await consumer.poll(timeout_ms=500))
        assert calls == [("assigned", set(ends))]
        done: list = []
        consumer.commit_async(callback=lambda offsets, error: done.append((offsets, error)))
        with trio.fail_after(30):
            while not done:
                await consumer.poll(timeout_ms=100)  # the callback runs in a later poll
        assert done == [(ends, None)]
        assert await consumer.committed(list(ends)) == ends
        assert await consumer.committed(TopicPartition(topic, 0)) == ends[TopicPartition(topic, 0)]
        await consumer.commit({TopicPartition(topic, 0): 3})  # explicit: may move back
        assert await consumer.committed(TopicPartition(topic, 0)) == 3
        await consumer.unsubscribe()
        assert calls[-1] == ("revoked", set(ends)) and consumer.assignment() == set()


@pytest.fixture
def own_cluster(request, tmp_path_factory):
    """A cluster of the test's own (for a test that kills a broker)."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("groups-own"), 3, GROUP_CONFIG)


def test_members_follow_the_coordinator_when_its_broker_is_killed(own_cluster):
    cluster, topic, group = own_cluster, "coordinator-moves", "mover-group"
    before = create_topic(cluster, topic, 2, records=20)
    options = {"session_timeout_ms": 12000, "heartbeat_interval_ms": 500, "request_timeout_ms": 5000}
    a, _ = group_consumer(cluster, group, enable_auto_commit=False, **options)
    b, _ = group_consumer(cluster, group, enable_auto_commit=False, **options)
    consumed: dict[TopicPartition, set[int]] = {}

    def drain(consumer):
        for r in consumer.poll(timeout_ms=100):
            consumed.setdefault(TopicPartition(r.topic, r.partition), set()).add(r.offset)
        try:
            consumer.commit()
        except TidelogError:
            pass  # the coordinator is moving: the next commit covers it

    with a, b:
        a.subscribe([topic])
        b.subscribe([topic])
        poll_until([a, b], lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, 60, "one partition each")
        with Admin(cluster.bootstrap) as admin:
            (description,) = admin.describe_groups([group])
        cluster.brokers[description.coordinator].kill()
        with Producer(cluster.bootstrap, linger_ms=5) as producer:
            for i in range(20):
                producer.send(topic, b"after-%d" % i, key=b"k%d" % i)
            producer.flush(60)
        with Consumer(cluster.bootstrap) as c:
            ends = c.end_offsets([TopicPartition(topic, p) for p in range(2)], timeout_ms=30000)

        def all_committed():
            for c in (a, b):
                drain(c)
            with Admin(cluster.bootstrap, default_api_timeout_ms=5000) as admin:
                try:
                    return {o.partition: o.committed for o in admin.list_group_offsets(group)} == ends
                except TidelogError:
                    return False

        wait_until(all_committed, 90, "every record consumed and committed through the new coordinator",
                   interval=0.1)
        with Admin(cluster.bootstrap) as admin:
            (after,) = admin.describe_groups([group])
        assert after.coordinator != description.coordinator and len(after.members) == 2
    for tp, end in ends.items():  # what was produced after the kill was all consumed
        assert consumed.get(tp, set()) >= set(range(before[tp], end))


def test_groups_cli(cluster, capsys):
    topic, group = "cli-groups", "cli-group"
    ends = create_topic(cluster, topic, 3, records=30)

    def tidelog(*argv):
        capsys.readouterr()
        rc = tidelog_main([*argv, "--bootstrap", cluster.bootstrap])
        out, err = capsys.readouterr()
        return rc, out, err

    rc, out, err = tidelog("consume", topic, "--group", group, "--from-beginning", "--max-messages", "10",
                           "--timeout-ms", "30000", "--consumer-property", "session.timeout.ms=3000",
                           "--consumer-property", "heartbeat.interval.ms=300")
    assert rc == 0 and len(out.splitlines()) == 10, err
    with Admin(cluster.bootstrap) as admin:
        wait_until(lambda: any(g.group_id == group and g.state == "Empty" for g in admin.list_groups()),
                   30, "the console consumer left its group")
        assert sum(o.committed or 0 for o in admin.list_group_offsets(group)) == 10

    rc, out, _ = tidelog("groups", "list")
    assert rc == 0 and group in out.splitlines()

    rc, out, _ = tidelog("groups", "describe", "--group", group)
    lines = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("Consumer group")]
    assert lines[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                        "HOST", "CLIENT-ID"]
    rows = {int(r[2]): r for r in lines[1:]}
    for p, row in rows.items():
        assert row[0] == group and row[1] == topic and int(row[4]) == ends[TopicPartition(topic, p)]
        assert int(row[5]) == int(row[4]) - int(row[3]) and row[6:] == ["-", "-", "-"]

    rc, out, err = tidelog("groups", "reset-offsets", "--group", group, "--topic", topic, "--to-earliest")
    assert rc == 0 and "dry run" in err
    plan = [line.split() for line in out.splitlines()[1:]]
    assert sorted((int(r[2]), int(r[3])) for r in plan) == [(0, 0), (1, 0), (2, 0)]
    with Admin(cluster.bootstrap) as admin:  # nothing changed
        assert sum(o.committed or 0 for o in admin.list_group_offsets(group)) == 10
    shifted = min(rows)  # a partition the consumer committed (it printed 10 of 30 records)
    rc, out, _ = tidelog("groups", "reset-offsets", "--group", group, "--topic", f"{topic}:{shifted}",
                         "--shift-by", "-100", "--execute")
    assert rc == 0 and out.splitlines()[1].split()[2:] == [str(shifted), "0"]
    rc, out, _ = tidelog("groups", "reset-offsets", "--group", group, "--all-topics", "--to-latest", "--execute")
    with Admin(cluster.bootstrap) as admin:  # the partitions it committed, as kafka-consumer-groups
        assert {o.partition: o.committed for o in admin.list_group_offsets(group)} == {
            tp: end for tp, end in ends.items() if tp.partition in rows}

    # an active group's offsets are not reset
    member, _ = group_consumer(cluster, group)
    with member:
        member.subscribe([topic])
        poll_until([member], lambda: len(member.assignment()) == 3, 30, "the member joined")
        rc, out, err = tidelog("groups", "reset-offsets", "--group", group, "--all-topics", "--to-earliest",
                               "--execute")
        assert rc == 1 and "inactive" in err and "Stable" in err
        rc, out, _ = tidelog("groups", "describe", "--group", group, "--members")
        assert rc == 0 and member.group_generation[1] in out and " 3 " in out
        rc, out, err = tidelog("groups", "delete", "--group", group)
        assert rc == 1 and "active members" in err
    rc, out, _ = tidelog("groups", "delete", "--group", group)
    assert rc == 0 and "successful" in out
    rc, out, err = tidelog("groups", "describe", "--group", group)
    assert rc == 1 and "does not exist" in err


# -- the delivery semantics examples (docs/delivery-semantics.md) -------------------------------


def run_example(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("example", ["at_most_once.py", "at_least_once.py"])
def test_delivery_examples_consume_everything_once_and_commit(cluster, example):
    topic = example.removesuffix(".py").replace("_", "-")
    ends = create_topic(cluster, topic, 3, records=60)
    common = ("--bootstrap", cluster.bootstrap, "--topic", topic, "--group", topic, "--idle-ms", "3000")
    r = run_example(example, *common)
    assert r.returncode == 0, r.stderr
    seen = sorted(line.split(":")[0] for line in r.stdout.splitlines())
    assert seen == sorted(f"{tp.topic}-{tp.partition}@{o}" for tp, end in ends.items() for o in range(end))
    with Admin(cluster.bootstrap) as admin:
        assert {o.partition: o.committed for o in admin.list_group_offsets(topic)} == ends
    r = run_example(example, *common)  # a second run of the group finds nothing left
    assert r.returncode == 0 and r.stdout == "", r.stderr


def test_exactly_once_example_survives_a_crash_between_store_and_commit(cluster, tmp_path):
    import sqlite3

    topic = "exactly-once"
    ends = create_topic(cluster, topic, 3, records=300)
    db = tmp_path / "events.sqlite"
    args = ("--bootstrap", cluster.bootstrap, "--topic", topic, "--group", "loader", "--db", str(db),
            "--idle-ms", "3000", "--session-timeout-ms", "3000")
    crashed = run_example("exactly_once_sqlite.py", *args, "--crash-after", "100")
    assert crashed.returncode == 17, crashed.stderr
    done = run_example("exactly_once_sqlite.py", *args)
    assert done.returncode == 0 and "300 events stored" in done.stdout, done.stderr
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT topic, partition, offset FROM events").fetchall()
        positions = dict(((t, p), o) for t, p, o in conn.execute("SELECT * FROM positions"))
    assert sorted(rows) == sorted((tp.topic, tp.partition, o) for tp, end in ends.items() for o in range(end))
    assert positions == {(tp.topic, tp.partition): end for tp, end in ends.items()}
