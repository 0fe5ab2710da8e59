"""ZooKeeper ACLs as pure decisions: the ACL of each znode, which znodes a broker secures at
start, when an ACL is too open, the digest identity, and the settings that turn it on
(their checks, the tools' reader, DescribeConfigs keeping the password to itself)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tidelog.broker.apis import Apis
from tidelog.broker.config import SENSITIVE, BrokerConfig, ConfigError, read_zookeeper_credentials
from tidelog.broker.zookeeper.layout import (
    ALL,
    DIGEST,
    READ,
    WORLD_ALL,
    WORLD_READ,
    DigestCredentials,
    ZkAcl,
    ZkPaths,
    lineage,
    more_open_than,
)
from tidelog.protocol.acls import ResourcePatternType
from tidelog.protocol.messages import BROKER_RESOURCE

OWNER = DigestCredentials("tidelog", "secret").identity
MINE = ZkAcl(ALL, DIGEST, OWNER)


@pytest.mark.parametrize("chroot", ["/tidelog", "", "/a/b"])
def test_every_znode_is_the_owners_and_readable_but_the_users_configs(chroot):
    p = ZkPaths(chroot)
    readable = [p.root, p.cluster_id, p.broker(1), p.topic("t"), p.partition_state("t", 0), p.controller,
                p.controller_epoch, p.topic_config("t"), p.entity_config("clients/app"), p.config_changes,
                p.config_change_prefix, p.isr_change_prefix, p.delete_topic_marker("t"),
                p.latest_producer_id_block, p.acl_root(ResourcePatternType.LITERAL),
                p.root.rstrip("/") + "/config/usersx"]
    for path in readable:
        assert p.znode_acl(path, OWNER) == (MINE, WORLD_READ), path
        assert p.znode_acl(path, None) == (WORLD_ALL,), path
    for path in (p.entity_type("users"), p.entity_config("users/alice"), p.user_clients("alice"),
                 p.entity_config("users/alice/clients/app"), p.entity_config("users/<default>")):
        assert p.sensitive(path)
        assert p.znode_acl(path, OWNER) == (MINE,), path  # SCRAM credentials: no one else reads them
        assert p.znode_acl(path, None) == (WORLD_ALL,), path


def test_parents_are_created_top_down_each_with_its_own_acl():
    assert lineage("/tidelog/config/users/alice") == (
        "/tidelog", "/tidelog/config", "/tidelog/config/users", "/tidelog/config/users/alice")
    assert lineage("/") == ()
    p = ZkPaths("/tidelog")
    # the parent of a secret is not secret
    assert [p.sensitive(x) for x in lineage(p.entity_config("users/alice"))] == [False, False, True, True]


@pytest.mark.parametrize("chroot", ["/tidelog", "", "/a/b"])
def test_the_containers_a_broker_secures_are_its_own_top_down(chroot):
    p = ZkPaths(chroot)
    containers = p.container_paths()
    assert containers[0] == (chroot or "/brokers")
    assert set(p.persistent_paths()) | {p.controller_epoch, *p.acl_paths()} <= set(containers)
    for i, path in enumerate(containers):
        assert path == chroot or path.startswith(chroot + "/"), f"{path} is outside the chroot"
        assert all(parent in containers[:i] for parent in lineage(path)[:-1] if parent.startswith(chroot + "/")), path
    assert p.controller not in containers and p.broker_ids + "/1" not in containers  # ephemerals: never open
    assert set(p.secure_root_paths()) >= {x for x in containers if x.count("/") == chroot.count("/") + 1}


def test_an_acl_is_too_open_when_the_world_may_do_more_than_the_rule_says():
    p = ZkPaths("/tidelog")
    state, users = p.partition_state("t", 0), p.entity_type("users")
    assert more_open_than({WORLD_ALL}, p.znode_acl(state, OWNER))  # created before zookeeper.set.acl
    assert more_open_than({MINE, WORLD_READ}, p.znode_acl(users, OWNER))  # a secret readable by all
    assert not more_open_than({MINE, WORLD_READ}, p.znode_acl(state, OWNER))
    assert not more_open_than({MINE}, p.znode_acl(state, OWNER))
    other_admin = ZkAcl(ALL, DIGEST, "ops:xyz")
    assert not more_open_than({MINE, other_admin, WORLD_READ}, p.znode_acl(state, OWNER))  # an operator's own
    assert not more_open_than({ZkAcl(READ, "ip", "10.0.0.0/8")}, p.znode_acl(users, OWNER))


def test_the_digest_identity_and_its_checks():
    c = DigestCredentials("tidelog", "secret")
    assert c.auth == ("digest", "tidelog:secret")
    user, digest = c.identity.split(":")
    assert user == "tidelog" and len(digest) == 28  # base64 of 20 bytes of SHA-1
    assert DigestCredentials("tidelog", "other").identity != c.identity
    assert "secret" not in repr(c)
    for bad in (("", "p"), ("a:b", "p"), ("a", "")):
        with pytest.raises(ValueError):
            DigestCredentials(*bad)


BASE = {"broker.id": 1, "zookeeper.connect": "127.0.0.1:2181"}


def test_set_acl_needs_the_identity_and_the_two_settings_go_together():
    c = BrokerConfig.from_props({**BASE, "zookeeper.set.acl": "true", "zookeeper.digest.username": "tidelog",
                                 "zookeeper.digest.password": "secret"})
    assert c.zookeeper_set_acl and c.zookeeper_credentials == DigestCredentials("tidelog", "secret")
    assert BrokerConfig.from_props(BASE).zookeeper_credentials is None
    with pytest.raises(ConfigError, match="zookeeper.set.acl = True .*needs zookeeper.digest.username"):
        BrokerConfig.from_props({**BASE, "zookeeper.set.acl": True})
    with pytest.raises(ConfigError, match="zookeeper.digest.username = 'tidelog'.*set zookeeper.digest.password"):
        BrokerConfig.from_props({**BASE, "zookeeper.digest.username": "tidelog"})
    with pytest.raises(ConfigError, match=r"zookeeper.digest.password = \*\*\* ") as e:
        BrokerConfig.from_props({**BASE, "zookeeper.digest.password": "hunter2"})
    assert "hunter2" not in str(e.value)
    with pytest.raises(ConfigError, match="expected a name of ASCII letters"):
        BrokerConfig.from_props({**BASE, "zookeeper.digest.username": "a:b", "zookeeper.digest.password": "p"})


def test_tools_read_the_identity_from_a_broker_config_and_the_environment(tmp_path):
    broker = tmp_path / "broker.toml"
    broker.write_text('"broker.id" = 2\nlog.dirs = ["/x"]\n[zookeeper]\nconnect = "zk:2181"\n'
                      'digest.username = "tidelog"\ndigest.password = "from-file"\n')
    assert read_zookeeper_credentials(str(broker), env={}) == DigestCredentials("tidelog", "from-file")
    env = {"TIDELOG_ZOOKEEPER_DIGEST_PASSWORD": "from-env", "TIDELOG_BOOTSTRAP": "x:1"}
    assert read_zookeeper_credentials(str(broker), env=env) == DigestCredentials("tidelog", "from-env")
    assert read_zookeeper_credentials(None, env={}) is None
    with pytest.raises(ConfigError, match="zookeeper.digest.username not found in the environment"):
        read_zookeeper_credentials(None, env={"TIDELOG_ZOOKEEPER_DIGEST_PASSWORD": "p"})
    empty = tmp_path / "empty.toml"
    empty.write_text('"broker.id" = 2\n')
    with pytest.raises(ConfigError, match=f"not found in {empty}"):
        read_zookeeper_credentials(str(empty), env={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_zookeeper_credentials(str(tmp_path / "missing.toml"), env={})


def test_describe_configs_never_shows_a_secret():
    assert {"zookeeper.digest.password", "ssl.key.password", "sasl.jaas.config"} <= SENSITIVE
    config = BrokerConfig.from_props({**BASE, "zookeeper.digest.username": "tidelog",
                                      "zookeeper.digest.password": "hunter2"})
    apis = SimpleNamespace(config=config, broker=None)
    apis._dynamic_broker_entries = lambda name: Apis._dynamic_broker_entries(apis, name)
    entries = {e.name: e for e in Apis._describe(apis, BROKER_RESOURCE, str(config.broker_id), None)}
    password = entries["zookeeper.digest.password"]
    assert password.value is None and password.is_sensitive
    assert entries["zookeeper.digest.username"].value == "tidelog"
    assert not entries["zookeeper.digest.username"].is_sensitive
    assert all("hunter2" not in (e.value or "") for e in entries.values())
