"""ZooKeeper ACLs (zookeeper.set.acl) against a real ZooKeeper: what a process that reaches
ZooKeeper without the brokers' digest identity can still do (read what tools read) and what
it cannot (rewrite a partition's ISR, add topics or brokers, read SCRAM credentials); the
start-up securing of open containers, the security migration, ``tidelog configs
--zookeeper`` with the identity, and a whole cluster with ACLs through a leader failover.

The outsider is a plain kazoo client, as an attacker would use; the ZooKeeper server is
the oracle (it checks the ACLs, and computes the digest identity itself).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, Id

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.integration.test_zk import next_item
from tests.support.cluster import (
    broker_metadata,
    consume_range,
    controller_id,
    end_offsets,
    partitions_of,
    running,
    started_cluster,
    wait_topic_ready,
)
from tests.support.waiting import wait_until
from tests.support.zk_proxy import TcpProxy
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.cli import main
from tidelog.broker.zookeeper.layout import (
    ALL,
    DIGEST,
    WORLD_ALL,
    WORLD_READ,
    BrokerInfo,
    DigestCredentials,
    LeaderAndIsr,
    ZkAcl,
    ZkNoAuthError,
    ZkPaths,
    decode_partition_state,
    encode_partition_state,
)
from tidelog.broker.zookeeper.zk import LOST, SUSPENDED, ZkClient, ZkConnectionError, ZkTimeoutError

CREDENTIALS = DigestCredentials("tidelog", "zk-secret")
OWNED = frozenset({ZkAcl(ALL, DIGEST, CREDENTIALS.identity), WORLD_READ})
SECRET = frozenset({ZkAcl(ALL, DIGEST, CREDENTIALS.identity)})
FORGED = encode_partition_state(LeaderAndIsr(leader=3, leader_epoch=99, isr=(3,), controller_epoch=99))


@contextlib.contextmanager
def outsider(zookeeper, credentials: DigestCredentials | None = None) -> Iterator[KazooClient]:
    """A plain kazoo session, with ``credentials`` added or none."""
    kz = KazooClient(hosts=zookeeper.connect_string, timeout=5,
                     auth_data=[credentials.auth] if credentials else None)
    kz.start(timeout=10)
    try:
        yield kz
    finally:
        kz.stop()
        kz.close()


def secured(zookeeper, chroot: str) -> ZkClient:
    return ZkClient(zookeeper.connect_string, chroot=chroot, auth=CREDENTIALS, set_acl=True)


async def populate(zk: ZkClient) -> None:
    """A topic with a partition state, a user with a credential, a registered broker, an ISR
    change notification and the cluster id: znodes of every kind."""
    await zk.get_or_create_cluster_id("cluster-1")
    await zk.create_topic("orders", {0: [1, 2]}, {"retention.ms": "1000"})
    epoch, version = await zk.controller_epoch()
    await zk.create_partition_state("orders", 0, LeaderAndIsr.initial(1, [1, 2], epoch), version)
    await zk.change_entity_config("users/alice", lambda c: {"SCRAM-SHA-256": "salt=c2FsdA==,iterations=4096"})
    await zk.change_entity_config("users/alice/clients/app", lambda c: {"producer_byte_rate": "1024"})
    await zk.register_broker(BrokerInfo(1, "127.0.0.1", 9091))
    await zk.notify_isr_change([("orders", 0)])


def assert_locked_out(kz: KazooClient, paths: ZkPaths) -> None:
    """What a session without the brokers' identity may not do on a secured cluster."""
    state = paths.partition_state("orders", 0)
    attempts = {
        "rewrite the ISR": lambda: kz.set(state, FORGED),
        "delete the partition state": lambda: kz.delete(state),
        "add a partition": lambda: kz.create(paths.partition("orders", 1), b""),
        "add a topic": lambda: kz.create(paths.topic("evil"), b"{}"),
        "claim the controller": lambda: kz.create(paths.controller, b'{"version":1,"brokerid":3}'),
        "register a broker": lambda: kz.create(paths.broker(3), b"{}", ephemeral=True),
        "change a topic config": lambda: kz.set(paths.topic_config("orders"), b"{}"),
        "read a SCRAM credential": lambda: kz.get(paths.entity_config("users/alice")),
        "list the users": lambda: kz.get_children(paths.entity_type("users")),
        "read a user's client quota": lambda: kz.get(paths.entity_config("users/alice/clients/app")),
        "create a user": lambda: kz.create(paths.entity_config("users/mallory"), b"{}"),
        "open the ACL again": lambda: kz.set_acls(state, OPEN_ACL_UNSAFE),
    }
    allowed = []
    for what, attempt in attempts.items():
        try:
            attempt()
            allowed.append(what)
        except NoAuthError:
            pass
    assert not allowed, f"a session without the brokers' identity could {allowed}"


def as_kazoo(acl: ZkAcl) -> ACL:
    return ACL(acl.perms, Id(acl.scheme, acl.id))


async def test_secured_znodes_are_read_only_to_others_and_credentials_hidden(zookeeper, chroot):
    async with secured(zookeeper, chroot) as zk:
        await populate(zk)
        assert await zk.try_elect_controller(1) == 1
        paths = zk.paths
        state = paths.partition_state("orders", 0)

        # the ACL of each kind of znode, parents created on the way included
        for path in (chroot, paths.cluster_id, paths.cluster_id.rsplit("/", 1)[0], paths.topic("orders"),
                     paths.partitions("orders"), state, paths.topic_config("orders"), paths.broker(1),
                     paths.controller, paths.controller_epoch, paths.isr_change_notification,
                     paths.config_changes, paths.delete_topics):
            assert await zk.get_znode_acl(path) == OWNED, path
        for path in (paths.entity_type("users"), paths.entity_config("users/alice"),
                     paths.user_clients("alice"), paths.entity_config("users/alice/clients/app")):
            assert await zk.get_znode_acl(path) == SECRET, path
        notifications = await zk.isr_change_notifications()
        assert await zk.get_znode_acl(notifications[0][0]) == OWNED

        with outsider(zookeeper) as kz:
            # what tools and clients read stays readable
            assert decode_partition_state(kz.get(state)[0]).isr == (1, 2)
            assert sorted(kz.get_children(paths.broker_ids)) == ["1"]
            assert_locked_out(kz, paths)
            assert decode_partition_state(kz.get(state)[0]).isr == (1, 2)
        with outsider(zookeeper, DigestCredentials("tidelog", "a-guess")) as kz:  # another identity
            assert_locked_out(kz, paths)

    # the same identity in another session (another broker, a tool) may do everything
    async with secured(zookeeper, chroot) as other:
        current, version = await other.get_partition_state("orders", 0)
        await other.update_partition_state("orders", 0, current.with_isr([1]), version)
        assert (await other.get_entity_config("users/alice"))[0]["SCRAM-SHA-256"].startswith("salt=")
        await other.delete_topic("orders", controller_epoch_zk_version=(await other.controller_epoch())[1])


async def test_the_digest_identity_is_the_one_zookeeper_computes(zookeeper, chroot):
    async with secured(zookeeper, chroot):
        pass
    with outsider(zookeeper, CREDENTIALS) as kz:
        kz.create(f"{chroot}/probe", b"", acl=CREATOR_ALL_ACL)  # "auth": ZooKeeper names the session's identity
        (acl,), _ = kz.get_acls(f"{chroot}/probe")
        assert (acl.id.scheme, acl.id.id) == (DIGEST, CREDENTIALS.identity)
        kz.delete(f"{chroot}/probe")


async def test_a_chroot_made_by_an_operator_under_a_parent_the_brokers_may_not_write(zookeeper, chroot):
    """Only missing znodes are created: the brokers never try to create the chroot's parent
    (where ZooKeeper would refuse the create before finding it exists)."""
    operator = DigestCredentials("ops", "ops-secret")
    ops = ZkAcl(ALL, DIGEST, operator.identity)
    with outsider(zookeeper, operator) as kz:
        kz.create(chroot, b"", acl=[as_kazoo(ops), as_kazoo(WORLD_READ)])
        kz.create(f"{chroot}/tidelog", b"", acl=[as_kazoo(a) for a in OWNED])
    async with ZkClient(zookeeper.connect_string, chroot=f"{chroot}/tidelog", auth=CREDENTIALS, set_acl=True) as zk:
        await populate(zk)
        assert await zk.get_znode_acl(zk.paths.partition_state("orders", 0)) == OWNED
    with outsider(zookeeper, operator) as kz:
        assert kz.get_acls(chroot)[0] == [as_kazoo(ops), as_kazoo(WORLD_READ)]  # not the brokers' to change


async def test_a_new_session_after_a_lost_one_has_the_identity_again(zookeeper, chroot):
    """kazoo adds the identity to every connection: after ZooKeeper expired the session, the
    broker's writes (its registration again, an ISR change) are still its own."""
    proxy = TcpProxy(zookeeper.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        zk = ZkClient(f"127.0.0.1:{proxy.port}", chroot=chroot, session_timeout_ms=2000, op_timeout_s=3,
                      auth=CREDENTIALS, set_acl=True)
        async with zk:
            assert (await next_item(zk.session_events))[0] == "CONNECTED"
            await populate(zk)
            proxy.cut()
            assert (await next_item(zk.session_events))[0] == SUSPENDED
            with pytest.raises((ZkConnectionError, ZkTimeoutError)):
                await zk.get_broker(1)
            proxy.restore()
            assert [(await next_item(zk.session_events, timeout=15))[0] for _ in range(2)] == [LOST, "CONNECTED"]
            await zk.register_broker(BrokerInfo(1, "127.0.0.1", 9091))
            assert await zk.get_znode_acl(zk.paths.broker(1)) == OWNED
            current, version = await zk.get_partition_state("orders", 0)
            await zk.update_partition_state("orders", 0, current.with_isr([1]), version)
        nursery.cancel_scope.cancel()


async def test_without_set_acl_znodes_stay_open(zookeeper, chroot):
    async with ZkClient(zookeeper.connect_string, chroot=chroot, auth=CREDENTIALS) as zk:  # authenticated only
        await populate(zk)
        assert await zk.get_znode_acl(zk.paths.partition_state("orders", 0)) == {WORLD_ALL}
        assert await zk.get_znode_acl(zk.paths.entity_config("users/alice")) == {WORLD_ALL}


async def test_a_broker_cannot_work_on_znodes_of_another_identity(zookeeper, chroot):
    async with secured(zookeeper, chroot) as zk:
        await populate(zk)
    intruder = ZkClient(zookeeper.connect_string, chroot=chroot, auth=DigestCredentials("other", "x"), set_acl=True)
    with pytest.raises(ZkNoAuthError, match="zookeeper.digest.username"):
        async with intruder as zk:  # /config/users is not even readable to it
            pass


def run_cli(*argv: str) -> int:
    return main(list(argv))


def auth_file(tmp_path: Path, credentials: DigestCredentials = CREDENTIALS) -> str:
    """A broker config file: the tools read its ZooKeeper identity and ignore the rest."""
    path = tmp_path / "broker.toml"
    path.write_text(f'"broker.id" = 1\nlisteners = "PLAINTEXT://127.0.0.1:9092"\n'
                    f'"zookeeper.set.acl" = true\n"zookeeper.digest.username" = "{credentials.username}"\n'
                    f'"zookeeper.digest.password" = "{credentials.password}"\n')
    return str(path)


def test_start_secures_open_containers_and_the_migration_the_rest(zookeeper, chroot, tmp_path, capsys):
    async def before_set_acl() -> None:
        async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk:
            await populate(zk)

    async def restart_with_set_acl() -> None:
        async with secured(zookeeper, chroot) as zk:
            for path in zk.paths.container_paths():
                assert await zk.get_znode_acl(path) in (None, OWNED, SECRET), path
            assert await zk.get_znode_acl(zk.paths.partition_state("orders", 0)) == {WORLD_ALL}  # not its job

    trio.run(before_set_acl)
    trio.run(restart_with_set_acl)
    paths = ZkPaths(chroot)
    with outsider(zookeeper) as kz:
        kz.set(paths.partition_state("orders", 0), kz.get(paths.partition_state("orders", 0))[0])  # still open

    connect = zookeeper.connect_string + chroot
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect", connect,
                   "--zk-auth-file", auth_file(tmp_path)) == 0
    assert "ACLs changed" in capsys.readouterr().out
    with outsider(zookeeper) as kz:
        assert_locked_out(kz, paths)
    with outsider(zookeeper, CREDENTIALS) as kz:
        assert kz.get_acls(paths.entity_config("users/alice/clients/app"))[0] == [as_kazoo(a) for a in SECRET]

    # again: nothing left to change
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect", connect,
                   "--zk-auth-file", auth_file(tmp_path)) == 0
    assert ", 0 ACLs changed" in capsys.readouterr().out

    # without the identity, unsecure is refused by ZooKeeper; with it, everything is open again
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "unsecure", "--zookeeper.connect", connect) == 1
    assert "NoAuthError" in capsys.readouterr().err
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "unsecure", "--zookeeper.connect", connect,
                   "--zk-auth-file", auth_file(tmp_path)) == 0
    with outsider(zookeeper) as kz:
        kz.set(paths.partition_state("orders", 0), kz.get(paths.partition_state("orders", 0))[0])
        kz.get(paths.entity_config("users/alice"))


def test_the_migration_refuses_what_it_cannot_do(zookeeper, chroot, tmp_path, capsys):
    connect = zookeeper.connect_string + chroot
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect", connect) == 2
    assert "needs the brokers' ZooKeeper identity" in capsys.readouterr().err
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect", connect,
                   "--zk-auth-file", auth_file(tmp_path)) == 1
    assert "no Tidelog cluster" in capsys.readouterr().err
    with outsider(zookeeper) as kz:
        assert not kz.exists(chroot)  # it created nothing
    empty = tmp_path / "empty.toml"
    empty.write_text('"broker.id" = 1\n')
    assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect", connect,
                   "--zk-auth-file", str(empty)) == 2
    assert "zookeeper.digest.username and zookeeper.digest.password not found" in capsys.readouterr().err


def test_configs_through_zookeeper_with_the_brokers_identity(zookeeper, chroot, tmp_path, capsys):
    async def create_cluster() -> None:
        async with secured(zookeeper, chroot):
            pass

    trio.run(create_cluster)
    connect = zookeeper.connect_string + chroot
    alter = ["configs", "--zookeeper", connect, "--alter", "--entity-type", "users", "--entity-name", "bob",
             "--add-config", "SCRAM-SHA-256=[password=bob-secret]"]
    assert run_cli(*alter) == 1  # without the identity: refused, and said why
    assert "zookeeper.digest.username" in capsys.readouterr().err
    assert run_cli(*alter, "--zk-auth-file", auth_file(tmp_path)) == 0
    capsys.readouterr()
    assert run_cli("configs", "--zookeeper", connect, "--zk-auth-file", auth_file(tmp_path), "--describe",
                   "--entity-type", "users", "--entity-name", "bob") == 0
    assert "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-256=iterations=4096" in \
        capsys.readouterr().out
    paths = ZkPaths(chroot)
    with outsider(zookeeper) as kz:
        with pytest.raises(NoAuthError):
            kz.get(paths.entity_config("users/bob"))
    assert run_cli("configs", "--bootstrap", "127.0.0.1:1", "--zk-auth-file", auth_file(tmp_path), "--describe",
                   "--entity-type", "users") == 2  # the file goes with --zookeeper


SECURED_CLUSTER = {**FAST_FAILOVER, "zookeeper.set.acl": True,
                   "zookeeper.digest.username": CREDENTIALS.username,
                   "zookeeper.digest.password": CREDENTIALS.password}


def test_a_cluster_with_zookeeper_acls_serves_and_fails_over(tmp_path):
    topic, partitions = "secured", 3
    with started_cluster(tmp_path / "cluster", 3, SECURED_CLUSTER) as cluster:
        with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
            admin.create_topics([NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})])
        wait_topic_ready(cluster, topic, partitions, 3)
        acked = []
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=90000, request_timeout_ms=15000) as p:
            acked += [(v, f.result(30)) for v, f in [(b"a-%d" % i, p.send(topic, b"a-%d" % i)) for i in range(300)]]

        # nobody else can rewrite a partition's ISR, or read what the brokers keep secret
        paths = ZkPaths("/tidelog")
        kz = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=5)
        kz.start(timeout=10)
        try:
            state = paths.partition_state(topic, 0)
            with pytest.raises(NoAuthError):
                kz.set(state, FORGED)
            assert len(decode_partition_state(kz.get(state)[0]).isr) == 3
        finally:
            kz.stop()
            kz.close()
        assert run_cli("configs", "--zookeeper", cluster.zookeeper.connect_string + "/tidelog",
                       "--zk-auth-file", str(cluster.brokers[1].config_path), "--alter", "--entity-type", "users",
                       "--entity-name", "carol", "--add-config", "SCRAM-SHA-512=[password=carol-secret]") == 0

        # a leader that is not the controller dies: the controller elects another and writes it
        ctrl = controller_id(cluster, via=1)
        part, before = next((p, pm) for p, pm in sorted(partitions_of(broker_metadata(cluster, ctrl), topic).items())
                            if pm.leader_id != ctrl)
        cluster.brokers[before.leader_id].kill()

        def moved():
            pm = partitions_of(broker_metadata(cluster, ctrl), topic)[part]
            return pm.leader_id not in (before.leader_id, -1) and before.leader_id not in pm.isr_nodes
        wait_until(moved, FAST_FAILOVER["zookeeper.session.timeout.ms"] / 1000 + 30,
                   f"a new leader of {topic}-{part} and an ISR without broker {before.leader_id}")
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=90000, request_timeout_ms=15000) as p:
            acked += [(v, f.result(60)) for v, f in [(b"b-%d" % i, p.send(topic, b"b-%d" % i)) for i in range(300)]]
        assert before.leader_id not in running(cluster)

        tps = [TopicPartition(topic, i) for i in range(partitions)]
        records = consume_range(cluster.bootstrap, end_offsets(cluster.bootstrap, tps), timeout=90)
        found = {(r.partition, r.offset): r.value for rs in records.values() for r in rs}
        lost = [(m.partition, m.offset) for v, m in acked if found.get((m.partition, m.offset)) != v]
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost"


def test_a_sasl_ssl_cluster_with_zookeeper_acls(tmp_path):
    """Everything secured at once, as an operator would run it: the super user's credential
    goes into a secured ZooKeeper with the brokers' identity, and only they can read it."""
    identity = {k: v for k, v in SECURED_CLUSTER.items() if k.startswith("zookeeper.")}
    with started_cluster(tmp_path / "cluster", 3, identity, security="SASL_SSL") as cluster:
        options = cluster.client_security().options()
        with Admin(cluster.bootstrap, default_api_timeout_ms=30000, **options) as admin:
            admin.create_topics([NewTopic("secured", 1, 3)])
        wait_topic_ready(cluster, "secured", 1, 3)
        with Producer(cluster.bootstrap, acks="all", **options) as p:
            sent = [p.send("secured", b"s-%d" % i) for i in range(50)]
            assert [f.result(30).offset for f in sent] == list(range(50))
        got: list[bytes] = []
        with Consumer(cluster.bootstrap, auto_offset_reset="earliest", **options) as consumer:
            consumer.assign([TopicPartition("secured", 0)])
            wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=500)) or len(got) >= 50,
                       60, "the 50 records consumed")
        assert got == [b"s-%d" % i for i in range(50)]
        kz = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=5)
        kz.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                kz.get(ZkPaths("/tidelog").entity_config("users/admin"))
            with pytest.raises(NoAuthError):
                kz.set(ZkPaths("/tidelog").partition_state("secured", 0), FORGED)
        finally:
            kz.stop()
            kz.close()


def test_turning_acls_on_in_a_running_cluster_as_documented(tmp_path, capsys):
    """docs/operations.md's three steps on a cluster that keeps serving: a rolling restart
    with the identity, one with zookeeper.set.acl, then the migration. Every acknowledged
    record is there at the end, and an outsider is locked out only once all is done."""
    topic, acked = "rolling", []

    def produce(prefix: bytes) -> None:
        with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=90000, request_timeout_ms=15000) as p:
            futures = [(prefix + b"-%d" % i, p.send(topic, prefix + b"-%d" % i)) for i in range(100)]
            acked.extend((v, f.result(60)) for v, f in futures)

    def rolling_restart(settings: str) -> None:
        for b in cluster.brokers.values():
            assert b.stop(60) == 0
            with open(b.config_path, "a") as f:
                f.write(settings)
            b.start()
            cluster.wait_ready(60)
            wait_topic_ready(cluster, topic, 3, 3, timeout=60)  # all in sync before the next one goes

    paths = ZkPaths("/tidelog")
    with started_cluster(tmp_path / "cluster", 3, FAST_FAILOVER) as cluster:
        with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
            admin.create_topics([NewTopic(topic, 3, 3, config={"min.insync.replicas": "2"})])
        wait_topic_ready(cluster, topic, 3, 3)
        produce(b"open")
        rolling_restart(f'"zookeeper.digest.username" = "{CREDENTIALS.username}"\n'
                        f'"zookeeper.digest.password" = "{CREDENTIALS.password}"\n')
        produce(b"identity")
        rolling_restart('"zookeeper.set.acl" = true\n')
        produce(b"set-acl")
        kz = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=5)
        kz.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):  # the containers are secured at start...
                kz.create(paths.topic("evil"), b"{}")
            assert kz.get_acls(paths.partition_state(topic, 0))[0] == OPEN_ACL_UNSAFE  # ...their content is not
            assert run_cli("zookeeper-security-migration", "--zookeeper.acl", "secure", "--zookeeper.connect",
                           cluster.zookeeper.connect_string + "/tidelog",
                           "--zk-auth-file", str(cluster.brokers[2].config_path)) == 0
            assert "ACLs changed" in capsys.readouterr().out
            with pytest.raises(NoAuthError):
                kz.set(paths.partition_state(topic, 0), FORGED)
        finally:
            kz.stop()
            kz.close()
        produce(b"migrated")

        tps = [TopicPartition(topic, i) for i in range(3)]
        records = consume_range(cluster.bootstrap, end_offsets(cluster.bootstrap, tps), timeout=90)
        found = {(r.partition, r.offset): r.value for rs in records.values() for r in rs}
        lost = [(m.partition, m.offset) for v, m in acked if found.get((m.partition, m.offset)) != v]
        assert len(acked) == 400 and not lost, f"{len(lost)} of {len(acked)} acknowledged records lost"
