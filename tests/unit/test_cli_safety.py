"""The admin commands never do more than they were asked: a partition named without its
topic is a usage error (not an election of every partition), a deletion naming one missing
topic or group deletes nothing, a shift of a partition without a committed offset is refused
(kafka-consumer-groups' rule), and one topic whose configs cannot be read does not end
``topics describe`` with a traceback."""

from __future__ import annotations

import argparse
import types

import pytest

from tidelog.broker.cli import EXIT_USAGE, main
from tidelog.commands import groups, topics
from tidelog.commands.common import EXIT_FAILED, CommandError
from tidelog.protocol.errors import TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PARTITION, TidelogError
from tidelog.records import TopicPartition


def test_a_partition_without_its_topic_is_a_usage_error(capsys):
    assert main(["topics", "elect-leaders", "--partition", "0", "--bootstrap", "127.0.0.1:9"]) == EXIT_USAGE
    assert "--partition needs the topic names" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--partitions", "0"), ("--partitions", "-2"),
                                         ("--replication-factor", "0"), ("--replication-factor", "-5")])
def test_a_count_that_is_neither_positive_nor_the_default_is_a_usage_error(capsys, flag, value):
    """Refused before the cluster is asked (the bootstrap here answers nothing)."""
    assert main(["topics", "create", "t", flag, value, "--bootstrap", "127.0.0.1:9"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{flag} must be positive (or -1 for the broker's default), got {value}" in err
    assert "Traceback" not in err


def test_a_replication_factor_the_request_cannot_carry_is_a_usage_error(capsys):
    assert main(["topics", "create", "t", "--replication-factor", "40000", "--bootstrap", "127.0.0.1:9"]) == EXIT_USAGE
    assert "replication_factor must be at most 32767, got 40000" in capsys.readouterr().err


class FakeTopicsAdmin:
    def __init__(self, topics_=("orders",)):
        self.topics, self.deleted, self.elected, self.altered = list(topics_), [], [], []
        self.vanished: set[str] = set()  # listed, but deleted by someone else before we ask

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def describe_cluster(self, timeout_ms=None):
        return types.SimpleNamespace(brokers=[])

    async def list_topics(self, include_internal=False, timeout_ms=None):
        return self.topics

    async def delete_topics(self, names, timeout_ms=None):
        results = {n: TidelogError(f"topic {n!r} vanished", error=UNKNOWN_TOPIC_OR_PARTITION)
                   if n in self.vanished else None for n in names}
        self.deleted += [n for n in names if results[n] is None]
        if self.vanished & set(names):
            error = next(e for e in results.values() if e is not None)
            error.results = results
            raise error

    async def create_partitions(self, counts, timeout_ms=None):
        self._alter(("partitions", counts))

    async def alter_configs(self, name, changes, timeout_ms=None):
        self._alter(("configs", name, changes))

    def _alter(self, what):
        name = next(iter(what[1])) if what[0] == "partitions" else what[1]
        if name not in self.topics or name in self.vanished:
            raise TidelogError(f"topic {name!r} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
        self.altered.append(what)

    async def describe_topics(self, names, timeout_ms=None):
        return [types.SimpleNamespace(name=n, partitions=[types.SimpleNamespace(partition=0)]) for n in names]

    async def list_partition_reassignments(self, timeout_ms=None):
        return {}

    async def elect_leaders(self, partitions, timeout_ms=None, election_type="preferred"):
        self.elected.append((partitions, election_type))
        return {tp: (0, None) for tp in partitions or ()}

    async def describe_configs(self, name, timeout_ms=None):
        if name == "secret":
            raise TidelogError("not allowed", error=TOPIC_AUTHORIZATION_FAILED)
        return {}


def args_for(**kw) -> argparse.Namespace:
    return argparse.Namespace(bootstrap="127.0.0.1:9", timeout_ms=1000, connect_timeout_ms=1000, **kw)


def test_deleting_a_missing_topic_with_others_deletes_nothing(monkeypatch):
    import trio

    fake = FakeTopicsAdmin()
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    with pytest.raises(CommandError, match="'ordrs'.*nothing was deleted"):
        trio.run(topics._delete, args_for(names=["orders", "ordrs"], if_exists=False))
    assert fake.deleted == []


def topics_cli(monkeypatch, fake, *argv):
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    return main(["topics", *argv, "--bootstrap", "127.0.0.1:9"])


def test_delete_if_exists_deletes_the_topics_that_exist(monkeypatch, capsys):
    """kafka-topics --delete --if-exists: a missing topic is no error (exit 0); the others
    named are deleted, and without --if-exists nothing is."""
    fake = FakeTopicsAdmin(["orders", "audit"])
    assert topics_cli(monkeypatch, fake, "delete", "ghost", "--if-exists") == 0
    assert fake.deleted == [] and capsys.readouterr().out == ""
    assert topics_cli(monkeypatch, fake, "delete", "orders", "ghost") == EXIT_FAILED
    assert fake.deleted == [] and "'ghost' do not exist: nothing was deleted" in capsys.readouterr().err
    assert topics_cli(monkeypatch, fake, "delete", "orders", "ghost", "audit", "--if-exists") == 0
    assert fake.deleted == ["orders", "audit"]
    assert capsys.readouterr().out == "Deleted topic orders.\nDeleted topic audit.\n"


def test_delete_if_exists_of_a_topic_deleted_meanwhile_succeeds(monkeypatch, capsys):
    fake = FakeTopicsAdmin(["orders", "audit"])
    fake.vanished = {"audit"}
    assert topics_cli(monkeypatch, fake, "delete", "orders", "audit", "--if-exists") == 0
    assert fake.deleted == ["orders"] and capsys.readouterr().out == "Deleted topic orders.\n"
    assert topics_cli(monkeypatch, fake, "delete", "audit") == EXIT_FAILED
    assert "vanished" in capsys.readouterr().err


def test_alter_if_exists_of_a_missing_topic_does_nothing(monkeypatch, capsys):
    fake = FakeTopicsAdmin(["orders"])
    assert topics_cli(monkeypatch, fake, "alter", "ghost", "--partitions", "3", "--if-exists") == 0
    assert topics_cli(monkeypatch, fake, "alter", "ghost", "--config", "retention.ms=1", "--if-exists") == 0
    assert fake.altered == [] and capsys.readouterr().out == ""
    assert topics_cli(monkeypatch, fake, "alter", "ghost", "--partitions", "3") == EXIT_FAILED
    assert "'ghost' does not exist" in capsys.readouterr().err
    assert topics_cli(monkeypatch, fake, "alter", "orders", "--partitions", "3", "--if-exists") == 0
    assert fake.altered == [("partitions", {"orders": 3})]
    fake.vanished = {"orders"}  # listed, then deleted before the alteration
    assert topics_cli(monkeypatch, fake, "alter", "orders", "--config", "retention.ms=1", "--if-exists") == 0


def test_describe_if_exists_leaves_out_missing_topics(monkeypatch, capsys):
    fake = FakeTopicsAdmin(["orders"])
    described = []

    async def describe_topics(names, timeout_ms=None):
        described.append(names)
        return []
    fake.describe_topics = describe_topics
    assert topics_cli(monkeypatch, fake, "describe", "ghost", "--if-exists") == 0
    assert topics_cli(monkeypatch, fake, "describe", "ghost", "orders", "--if-exists") == 0
    assert described == [["orders"]]  # never None: that would describe every topic


def test_electing_a_partition_that_does_not_exist_is_an_error(monkeypatch):
    import trio

    fake = FakeTopicsAdmin()
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    with pytest.raises(CommandError, match="partition 7 does not exist"):
        trio.run(topics._elect_leaders, args_for(names=["orders"], partition=7))
    assert fake.elected == []


def test_a_topic_whose_configs_cannot_be_read_still_leaves_the_others(capsys):
    import trio

    async def read():
        return await topics._topic_configs(FakeTopicsAdmin(), args_for(), ["orders", "secret"])

    assert trio.run(read) == {"orders": ({}, 1), "secret": ({}, 1)}
    assert "cannot read the configs of topic 'secret'" in capsys.readouterr().err


def test_deleting_groups_with_one_missing_deletes_none(monkeypatch):
    deleted = []

    class FakeAdmin:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def describe_groups(self, names):
            return [types.SimpleNamespace(group_id=n, state="Dead" if n == "gone" else "Empty") for n in names]

        def delete_groups(self, names):
            deleted.extend(names)

    monkeypatch.setattr(groups, "_admin", lambda args: FakeAdmin())
    monkeypatch.setattr(groups, "check_cluster", lambda args: None)
    with pytest.raises(CommandError, match="'gone'.*nothing was deleted"):
        groups._delete(argparse.Namespace(groups=["a", "gone", "b"]))
    assert deleted == []


def test_a_shift_needs_a_committed_offset():
    tp = TopicPartition("orders", 0)
    args = argparse.Namespace(to_earliest=False, to_latest=False, to_offset=None, shift_by=100)
    with pytest.raises(CommandError, match="orders-0: the group has no committed offset"):
        groups.reset_plan([tp], args, {}, {tp: 0}, {tp: 500}, None)
    assert groups.reset_plan([tp], args, {tp: 10}, {tp: 0}, {tp: 500}, None) == {tp: 110}


def test_an_unclean_election_is_asked_for_by_name(monkeypatch, capsys):
    import trio

    fake = FakeTopicsAdmin()
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    assert trio.run(topics._elect_leaders, args_for(names=["orders"], partition=None, election_type="unclean")) == 0
    assert fake.elected == [([TopicPartition("orders", 0)], "unclean")]
    assert "Successfully elected a replica (unclean election) as leader of orders-0." in capsys.readouterr().out


def test_an_unknown_election_type_is_a_usage_error(capsys):
    assert main(["topics", "elect-leaders", "--election-type", "random", "--bootstrap", "127.0.0.1:9"]) == EXIT_USAGE
    assert "--election-type" in capsys.readouterr().err


def test_the_sdk_names_the_election_types_it_takes():
    import trio

    from tidelog.aio import AsyncAdmin

    with pytest.raises(ValueError, match=r"\['preferred', 'unclean'\], not 'random'"):
        trio.run(lambda: AsyncAdmin("127.0.0.1:9").elect_leaders(election_type="random"))


def test_an_election_of_every_partition_that_none_needed_says_so(monkeypatch, capsys):
    """Of all partitions, those needing no election are not answered (KIP-460): no answer is
    not a silent success."""
    import trio

    fake = FakeTopicsAdmin()
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    assert trio.run(topics._elect_leaders, args_for(names=[], partition=None, election_type="preferred")) == 0
    assert fake.elected == [(None, "preferred")]
    assert capsys.readouterr().out == "No partition needed an election.\n"


def test_an_internal_topic_is_not_deleted_and_is_called_internal(monkeypatch):
    """As kafka-topics: __consumer_offsets is named internal (it exists), and nothing is deleted."""
    import trio

    fake = FakeTopicsAdmin()
    monkeypatch.setattr(topics, "_admin_session", lambda args: fake)
    with pytest.raises(CommandError, match="'__consumer_offsets' is an internal topic.*nothing was deleted"):
        trio.run(topics._delete, args_for(names=["orders", "__consumer_offsets"], if_exists=True))
    assert fake.deleted == []


def test_configs_of_an_unreachable_cluster_fail_as_every_command_does(capsys):
    assert main(["configs", "--bootstrap", "127.0.0.1:1", "--connect-timeout-ms", "300",
                 "--entity-type", "users", "--describe"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "cannot reach the cluster at 127.0.0.1:1" in err and "usage:" not in err


def test_broker_configs_say_which_can_be_altered(capsys):
    assert main(["configs", "--bootstrap", "127.0.0.1:1", "--entity-type", "brokers", "--describe"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "leader.replication.throttled.rate" in err and "tidelog reassign --throttle" in err


def test_all_topics_resets_only_the_partitions_the_group_committed():
    """kafka-consumer-groups --all-topics: the committed partitions, not every partition of
    their topics (so a shift does not fail on a partition the group never committed)."""
    class NoTopicLookups:
        def describe_topics(self, names):
            raise AssertionError("--all-topics needs no topic description")

    t0, t1, u2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 2)
    args = argparse.Namespace(all_topics=True, topics=None)
    tps = groups._reset_partitions(NoTopicLookups(), args, {t0: 10, t1: None, u2: 4}, TopicPartition)
    assert tps == [t0, u2]
    shift = argparse.Namespace(to_earliest=False, to_latest=False, to_offset=None, shift_by=-3)
    assert groups.reset_plan(tps, shift, {t0: 10, u2: 4}, {t0: 0, u2: 0}, {t0: 50, u2: 50}, None) == {t0: 7, u2: 1}


def test_describe_gives_the_log_end_offset_of_an_assigned_partition_without_a_commit(monkeypatch, capsys):
    from tidelog.aio import GroupOffsets

    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    member = types.SimpleNamespace(member_id="m-1", host="/10.0.0.1", client_id="c", assignment=(t0, t1))
    asked = []

    class FakeAdmin:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def describe_groups(self, names):
            return [types.SimpleNamespace(group_id="g", state="Stable", members=[member])]

        def list_group_offsets(self, group_id, partitions=None):
            asked.append(partitions)
            if partitions is None:
                return [GroupOffsets(t0, 5, 9, 4)]
            return [GroupOffsets(tp, None, 20, None) for tp in partitions]

    monkeypatch.setattr(groups, "_admin", lambda args: FakeAdmin())
    monkeypatch.setattr(groups, "check_cluster", lambda args: None)
    args = argparse.Namespace(groups=["g"], all_groups=False, state=False, members=False)
    assert groups._describe(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("g ")]
    assert [r[:6] for r in rows] == [["g", "t", "0", "5", "9", "4"], ["g", "t", "1", "-", "20", "-"]]
    assert asked == [None, [t1]]
