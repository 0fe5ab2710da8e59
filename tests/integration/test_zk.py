"""ZkClient and the ZooKeeper harness against real ZooKeeper processes.

Each test uses its own chroot on the session's server (see conftest), so tests are
independent. Session loss is produced the only way ZooKeeper produces it: a TCP proxy
(served by the test's own Trio loop, which also proves ZkClient never blocks that loop) is
cut for longer than the session timeout while the server keeps running, then restored.
"""

from __future__ import annotations

import functools
import threading

import pytest
import trio

from tests.support.zk_proxy import TcpProxy
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, decode_controller
from tidelog.broker.zookeeper.zk import (
    LOST,
    SUSPENDED,
    BrokerIdInUseError,
    ControllerMovedError,
    TopicExistsError,
    ZkClient,
    ZkConnectionError,
    ZkError,
    ZkNodeExistsError,
    ZkTimeoutError,
    ZkVersionConflict,
)
from tidelog.broker.zookeeper.zkserver import (
    ZooKeeperEnsemble,
    ZooKeeperNotInstalledError,
    ZooKeeperServer,
    find_free_port,
)
from tidelog.protocol.errors import TidelogError

B1 = BrokerInfo(1, "127.0.0.1", 9091)
B2 = BrokerInfo(2, "127.0.0.1", 9092, rack="r2")


async def next_item(channel, timeout: float = 5.0):
    with trio.fail_after(timeout):
        return await channel.receive()


def client(zookeeper, chroot, **kwargs) -> ZkClient:
    return ZkClient(zookeeper.connect_string, chroot=chroot, **kwargs)


# ----------------------------------------------------------------------------- brokers

async def test_register_broker_and_ephemeral_disappears_after_close(zookeeper, chroot):
    async with client(zookeeper, chroot) as observer:
        async with client(zookeeper, chroot) as zk:
            epoch = await zk.register_broker(B1)
            assert epoch > 0
            assert await observer.get_broker(1) == B1
            assert await observer.live_brokers_and_epochs() == {1: (B1, epoch)}
        assert await observer.get_broker(1) is None
        assert await observer.live_brokers() == {}


async def test_duplicate_broker_id_refused(zookeeper, chroot):
    async with client(zookeeper, chroot) as a, client(zookeeper, chroot) as b:
        epoch = await a.register_broker(B1)
        assert await a.register_broker(B1) == epoch          # same session: reused
        with pytest.raises(BrokerIdInUseError, match="broker.id 1 is already registered"):
            await b.register_broker(B1)
        await a.close()
        assert await b.register_broker(B1) > epoch           # a new registration, a new epoch


async def test_watch_children_delivers_broker_joins_and_leaves(zookeeper, chroot):
    async with client(zookeeper, chroot) as watcher:
        members = await watcher.watch_children(watcher.paths.broker_ids)
        assert await next_item(members) == []
        async with client(zookeeper, chroot) as one, client(zookeeper, chroot) as two:
            await one.register_broker(B1)
            assert await next_item(members) == ["1"]
            await two.register_broker(B2)
            assert await next_item(members) == ["1", "2"]
            assert await watcher.live_brokers() == {1: B1, 2: B2}
            await one.close()
            assert await next_item(members) == ["2"]
        assert await next_item(members) == []
        members.close()                 # the consumer leaves: the watch stops at its next event
        async with client(zookeeper, chroot) as three:
            await three.register_broker(B1)


# ----------------------------------------------------------------------------- controller

async def test_controller_election_race_failover_and_epochs(zookeeper, chroot):
    async with client(zookeeper, chroot) as a, client(zookeeper, chroot) as b:
        clients = {1: a, 2: b}
        results: dict[int, int | None] = {}

        async def elect(broker_id):
            results[broker_id] = await clients[broker_id].try_elect_controller(broker_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(elect, 1)
            nursery.start_soon(elect, 2)
        winners = [i for i, epoch in results.items() if epoch is not None]
        assert len(winners) == 1 and results[winners[0]] == 1
        winner, loser = winners[0], 3 - winners[0]
        assert await clients[loser].get_controller_id() == winner
        assert await clients[winner].try_elect_controller(winner) == 1    # a retry by the winner

        changes = await clients[loser].watch_data(b.paths.controller)
        data, _ = await next_item(changes)
        assert decode_controller(data) == winner
        await clients[loser].resign_controller(loser)                     # not ours: no-op
        await clients[winner].close()
        assert await next_item(changes) == (None, None)
        assert await clients[loser].try_elect_controller(loser) == 2
        assert (await clients[loser].controller_epoch())[0] == 2
        data, _ = await next_item(changes)
        assert decode_controller(data) == loser
        await clients[loser].resign_controller(loser)
        assert await next_item(changes) == (None, None)
        assert await clients[loser].get_controller_id() is None


# ----------------------------------------------------------------------------- topics

async def test_topic_creation_config_assignment_and_deletion(zookeeper, chroot):
    async with client(zookeeper, chroot) as zk:
        assert await zk.try_elect_controller(1) == 1  # the controller's writes below
        _, fence = await zk.controller_epoch()
        await zk.create_topic("orders", {0: [1, 2], 1: [2, 1]}, {"retention.ms": "1000"})
        assert await zk.get_topics() == ["orders"]
        assert await zk.get_assignment("orders") == {0: [1, 2], 1: [2, 1]}
        assert await zk.get_topic_config("orders") == {"retention.ms": "1000"}
        with pytest.raises(TopicExistsError, match="already exists"):
            await zk.create_topic("orders", {0: [1]}, {"retention.ms": "5"})
        assert await zk.get_topic_config("orders") == {"retention.ms": "1000"}   # rolled back

        assignment, version = await zk.get_assignment_with_version("orders")
        new_version = await zk.set_assignment("orders", {**assignment, 2: [1, 2]}, version,
                                              controller_epoch_zk_version=fence)
        assert new_version == version + 1
        with pytest.raises(ZkVersionConflict):
            await zk.set_assignment("orders", {0: [1]}, version, controller_epoch_zk_version=fence)
        await zk.set_topic_config("orders", {"cleanup.policy": "delete"}, controller_epoch_zk_version=fence)
        assert await zk.get_topic_config("orders") == {"cleanup.policy": "delete"}
        with pytest.raises(TidelogError, match="characters"):
            await zk.create_topic("bad name", {0: [1]}, {})
        assert await zk.get_assignment("missing") is None

        await zk.mark_topic_for_deletion("orders")
        await zk.mark_topic_for_deletion("orders")
        assert await zk.topics_marked_for_deletion() == ["orders"]
        await zk.delete_topic("orders", controller_epoch_zk_version=fence)
        assert await zk.get_topics() == []
        assert await zk.get_topic_config("orders") == {}
        assert await zk.topics_marked_for_deletion() == []
        await zk.create_topic("orders", {0: [2]}, {})       # the name is free again
        assert await zk.get_topic_config("orders") == {}


# ----------------------------------------------------------------------------- partition state

async def test_partition_state_check_and_set_and_controller_fencing(zookeeper, chroot):
    async with client(zookeeper, chroot) as a, client(zookeeper, chroot) as b:
        assert await a.try_elect_controller(1) == 1
        epoch, epoch_version = await a.controller_epoch()
        await a.create_topic("t", {0: [1, 2], 1: [2, 1]}, {})
        state = LeaderAndIsr.initial(1, [1, 2], epoch)
        assert await a.create_partition_state("t", 0, state, epoch_version) == 0
        assert await a.create_partition_state("t", 1, state.new_leader_and_isr(2, [2, 1]), epoch_version) == 0
        with pytest.raises(ZkNodeExistsError):
            await a.create_partition_state("t", 0, state, epoch_version)
        assert await a.get_partition_state("t", 0) == (state, 0)
        assert await a.get_partition_state("t", 7) is None

        # A leader's ISR change: plain check-and-set on the znode version.
        shrunk = state.with_isr([1])
        assert await a.update_partition_state("t", 0, shrunk, 0) == 1
        with pytest.raises(ZkVersionConflict):
            await b.update_partition_state("t", 0, state, 0)
        # A controller's write: also fenced by /controller_epoch.
        moved = shrunk.new_leader_and_isr(2, [2])
        assert await a.update_partition_state("t", 0, moved, 1, epoch_version) == 2
        with pytest.raises(ZkVersionConflict):
            await a.update_partition_state("t", 0, moved, 1, epoch_version)

        await a.resign_controller(1)
        assert await b.try_elect_controller(2) == 2
        with pytest.raises(ControllerMovedError):
            await a.update_partition_state("t", 0, state, 2, epoch_version)
        with pytest.raises(ControllerMovedError):
            await a.create_partition_state("t", 2, state, epoch_version)
        states = await b.get_partition_states("t")
        assert states == {0: (moved, 2), 1: (state.new_leader_and_isr(2, [2, 1]), 0)}
        # so are its writes of assignments and configs: a deposed controller's queued event
        # must not change a topic its successor has read
        with pytest.raises(ControllerMovedError):
            await a.set_assignment("t", {0: [1, 2], 1: [2, 1], 2: [1, 2]}, controller_epoch_zk_version=epoch_version)
        with pytest.raises(ControllerMovedError):
            await a.set_topic_config("t", {"retention.ms": "1"}, controller_epoch_zk_version=epoch_version)
        assert await b.get_assignment("t") == {0: [1, 2], 1: [2, 1]}
        assert await b.get_topic_config("t") == {}
        _, current = await b.controller_epoch()
        _, version = await b.get_assignment_with_version("t")
        assert await b.set_assignment("t", {0: [1, 2], 1: [2, 1], 2: [1, 2]},
                                      controller_epoch_zk_version=current) == version + 1
        await b.set_topic_config("t", {"retention.ms": "1"}, controller_epoch_zk_version=current)
        assert len(await b.get_assignment("t")) == 3 and await b.get_topic_config("t") == {"retention.ms": "1"}
        # and its deletions of the notifications it handled: the successor has not seen them
        path = await b.notify_isr_change([("t", 0)])
        with pytest.raises(ControllerMovedError):
            await a.delete_isr_change_notifications([path], controller_epoch_zk_version=epoch_version)
        assert [p for p, _ in await b.isr_change_notifications()] == [path]
        await b.delete_isr_change_notifications([path + "0", path], controller_epoch_zk_version=current)
        assert await b.isr_change_notifications() == []
        # and its removal of a deleted topic's znodes (the successor may have created it again)
        await b.mark_topic_for_deletion("t")
        with pytest.raises(ControllerMovedError):
            await a.delete_topic("t", controller_epoch_zk_version=epoch_version)
        assert await b.get_assignment("t") is not None and await b.topics_marked_for_deletion() == ["t"]
        await b.delete_topic("t", controller_epoch_zk_version=current)
        assert await b.get_topics() == [] and await b.topics_marked_for_deletion() == []
        assert await b.get_topic_config("t") == {} and await b.get_partition_states("t") == {}


async def test_a_leaders_isr_write_applied_but_unanswered_counts_as_written(zookeeper, chroot):
    """The leader's retry of an ISR write ZooKeeper applied (the answer lost to a timeout)
    conflicts with it: the state read back is the one written, so the leader takes its
    version. A state someone else wrote is still a conflict."""
    async with client(zookeeper, chroot) as zk:
        assert await zk.try_elect_controller(1) == 1
        epoch, epoch_version = await zk.controller_epoch()
        await zk.create_topic("t", {0: [1, 2, 3]}, {})
        state = LeaderAndIsr.initial(1, [1, 2, 3], epoch)
        await zk.create_partition_state("t", 0, state, epoch_version)
        shrunk = state.with_isr([1, 2])
        assert await zk.update_partition_state("t", 0, shrunk, 0) == 1    # applied, answer lost
        assert await zk.write_leader_isr("t", 0, shrunk, 0) == 1          # the retry
        with pytest.raises(ZkVersionConflict):                             # not ours: a conflict
            await zk.write_leader_isr("t", 0, shrunk.with_isr([1]), 0)
        assert await zk.write_leader_isr("t", 0, shrunk.with_isr([1]), 1) == 2


# ----------------------------------------------------------------------------- small things

async def test_cluster_id_isr_notifications_and_producer_id_blocks(zookeeper, chroot):
    async with client(zookeeper, chroot) as a, client(zookeeper, chroot) as b:
        assert await a.get_or_create_cluster_id("first") == "first"
        assert await b.get_or_create_cluster_id("second") == "first"

        p1 = await a.notify_isr_change([("t", 0), ("t", 1)])
        p2 = await b.notify_isr_change([("u", 3)])
        assert p1 < p2
        assert await a.isr_change_notifications() == [(p1, [("t", 0), ("t", 1)]), (p2, [("u", 3)])]
        await a.delete_isr_change_notifications([p1, p2, p1])
        assert await a.isr_change_notifications() == []

        blocks = []

        async def allocate(zk, broker_id):
            for _ in range(5):
                blocks.append(await zk.allocate_producer_id_block(broker_id, size=10))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(allocate, a, 1)
            nursery.start_soon(allocate, b, 2)
        assert sorted(blocks) == [(i * 10, i * 10 + 9) for i in range(10)]


async def test_unreachable_zookeeper_times_out_clearly():
    zk = ZkClient(f"127.0.0.1:{find_free_port()}", op_timeout_s=1)
    with pytest.raises(ZkTimeoutError, match="ZooKeeper connect"):
        await zk.start()
    with pytest.raises(Exception, match="not started"):
        await zk.get_topics()


# ----------------------------------------------------------------------------- session loss

async def test_session_loss_then_new_session(zookeeper, chroot):
    """SUSPENDED at the cut, LOST + CONNECTED (a new session) after it; ephemerals gone,
    re-registration works, and watches survive the new session."""
    proxy = TcpProxy(zookeeper.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        zk = ZkClient(f"127.0.0.1:{proxy.port}", chroot=chroot, session_timeout_ms=2000, op_timeout_s=3)
        async with client(zookeeper, chroot) as observer, zk:
            assert (await next_item(zk.session_events))[0] == "CONNECTED"
            epoch = await zk.register_broker(B1)
            members = await observer.watch_children(observer.paths.broker_ids)
            assert await next_item(members) == ["1"]
            controller = await zk.watch_data(zk.paths.controller)
            assert await next_item(controller) == (None, None)
            old_session = zk.session_id

            proxy.cut()
            assert (await next_item(zk.session_events))[0] == SUSPENDED
            with pytest.raises((ZkConnectionError, ZkTimeoutError)):
                await zk.get_broker(1)
            assert await next_item(members, timeout=15) == []     # ZooKeeper expired the session
            proxy.restore()
            events = [(await next_item(zk.session_events, timeout=15))[0] for _ in range(2)]
            assert events == [LOST, "CONNECTED"]
            assert zk.session_id not in (None, old_session)

            assert await zk.register_broker(B1) > epoch
            assert await next_item(members) == ["1"]
            assert await observer.try_elect_controller(9) == 1
            data, _ = await next_item(controller)                # re-armed in the new session
            assert decode_controller(data) == 9
        with pytest.raises(trio.EndOfChannel):                    # close ends the channel, no LOST
            await next_item(zk.session_events)
        nursery.cancel_scope.cancel()


async def test_watches_and_registration_wait_out_an_unreachable_zookeeper(zookeeper, chroot):
    """What a joined broker must hold (its registration, its watches) is tried again until
    ZooKeeper answers, however many op timeouts pass meanwhile; a close ends the wait."""
    proxy = TcpProxy(zookeeper.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        zk = ZkClient(f"127.0.0.1:{proxy.port}", chroot=chroot, session_timeout_ms=2000, op_timeout_s=0.5)
        async with client(zookeeper, chroot) as observer, zk:
            proxy.cut()
            with pytest.raises((ZkConnectionError, ZkTimeoutError)):   # a plain call still fails
                await zk.get_broker(1)
            got: dict[str, object] = {}

            async def start() -> None:
                got["members"] = await zk.watch_children(zk.paths.broker_ids)
                got["controller"] = await zk.watch_data(zk.paths.controller)
                got["epoch"] = await zk.until_answered(functools.partial(zk.register_broker, B1))
            with trio.fail_after(30):
                async with trio.open_nursery() as waiting:
                    waiting.start_soon(start)
                    await trio.sleep(3 * zk.op_timeout_s + 1)       # several timeouts, still waiting
                    assert got == {}
                    proxy.restore()
            assert await observer.get_broker(1) == B1
            assert await next_item(got["members"], timeout=15) in ([], ["1"])
            assert await next_item(got["controller"]) == (None, None)

            proxy.cut()                                              # a close ends a wait
            with trio.fail_after(15):
                async with trio.open_nursery() as waiting:
                    async def watch_then_fail() -> None:
                        with pytest.raises(ZkError):
                            await zk.watch_data("/elsewhere")
                    waiting.start_soon(watch_then_fail)
                    await trio.sleep(2 * zk.op_timeout_s)
                    await zk.close()
            proxy.restore()
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------- the harness

def test_server_restart_reuses_its_data(tmp_path):
    server = ZooKeeperServer(tmp_path / "zk")
    try:
        server.start()
        assert server.wait_serving(30) == "standalone"
        first_pid = server.pid
        assert trio.run(_cluster_id, server.connect_string, "original") == "original"
        assert server.stop() is not None and not server.running

        again = ZooKeeperServer(tmp_path / "zk")            # a second `dev up` on the same dir
        assert again.port == server.port                     # zookeeper.connect stays valid
        server = again
        server.start()
        server.wait_serving(30)
        assert server.pid != first_pid
        assert trio.run(_cluster_id, server.connect_string, "another") == "original"
    finally:
        server.stop()
    assert (tmp_path / "zk" / "zookeeper.log").exists()


async def _cluster_id(connect: str, proposed: str) -> str:
    async with ZkClient(connect, chroot="/restart") as zk:
        return await zk.get_or_create_cluster_id(proposed)


def test_ensemble_of_three_serves_and_survives_a_killed_node(tmp_path):
    ensemble = ZooKeeperEnsemble(tmp_path, size=3)
    try:
        ensemble.start()
        modes = ensemble.wait_serving()
        assert sorted(modes.values()) == ["follower", "follower", "leader"]
        leader = next(n for n, mode in modes.items() if mode == "leader")
        assert trio.run(_cluster_id, ensemble.connect_string, "ensemble") == "ensemble"
        ensemble.kill_node(leader)
        survivor = ensemble.node(next(n for n in modes if n != leader))
        survivor.wait_serving(30)                            # a new leader among the two left
        assert trio.run(_cluster_id, survivor.connect_string, "other") == "ensemble"
    finally:
        ensemble.stop()
    assert not any(node.running for node in ensemble.nodes.values())


def test_missing_java_or_jar_says_what_to_install(tmp_path):
    with pytest.raises(ZooKeeperNotInstalledError, match="apt-get install zookeeper"):
        ZooKeeperServer(tmp_path, java="no-such-java").start()
    with pytest.raises(ZooKeeperNotInstalledError, match="apt-get install zookeeper"):
        ZooKeeperServer(tmp_path, jar=str(tmp_path / "missing.jar")).start()


def test_start_refuses_a_worker_thread(tmp_path):
    errors = []

    def start():
        try:
            ZooKeeperServer(tmp_path).start()
        except RuntimeError as exc:
            errors.append(exc)
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


# ----------------------------------------------------------------------------- the controller's watches

async def test_the_controller_sees_a_registration_rewritten_in_place(zookeeper, chroot):
    """A broker registering again in its own session rewrites ``/brokers/ids/<id>`` in place
    (no child of ``/brokers/ids`` changes): the controller's data watch on it picks up the
    new address, with the broker epoch unchanged."""
    moved = BrokerInfo(2, "127.0.0.1", 9192, rack="r3")
    async with client(zookeeper, chroot) as one, client(zookeeper, chroot) as two:
        await one.register_broker(B1)
        epoch = await two.register_broker(B2)
        c = Controller(ControllerConfig(broker_id=1, auto_leader_rebalance_enable=False), one)
        async with trio.open_nursery() as nursery:
            await nursery.start(c.run)
            with trio.fail_after(10):
                while not (c.is_active and c.ctx.brokers.get(2) == B2):
                    await trio.sleep(0.05)
            assert await two.register_broker(moved) == epoch  # the same session: in place
            with trio.fail_after(10):
                while c.ctx.brokers.get(2) != moved:
                    await trio.sleep(0.05)
            assert c.ctx.broker_epochs[2] == epoch
            nursery.cancel_scope.cancel()
