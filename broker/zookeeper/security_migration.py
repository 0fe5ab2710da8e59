"""``tidelog zookeeper-security-migration``: Kafka's tool of that name, for a Tidelog cluster.

    tidelog zookeeper-security-migration --zookeeper.acl secure \\
        --zookeeper.connect zk1:2181/tidelog --zk-auth-file /etc/tidelog/broker.toml

``secure`` gives the chroot and every znode of the cluster (the top-level paths of
``ZkPaths.secure_root_paths`` and everything below them) the ACL a broker with
``zookeeper.set.acl`` creates it with: ALL for the brokers' digest identity, READ for
anyone else except under ``/config/users``. ``unsecure`` opens them to all again (for
turning ``zookeeper.set.acl`` off). Either way the tool runs as the brokers' identity
(``--zk-auth-file``: a TOML file with ``zookeeper.digest.username`` and
``zookeeper.digest.password``, a broker's config file will do; or the
``TIDELOG_ZOOKEEPER_DIGEST_*`` variables), since only it may change secured znodes.

It creates nothing: a chroot without ``/brokers/ids`` is not a Tidelog cluster, and is
refused. Running it again changes nothing. Brokers may run meanwhile: what they create gets
their own ACL (so turn ``zookeeper.set.acl`` on before ``secure``, off before ``unsecure``).

Exit status: 0 done, 1 failed (ZooKeeper unreachable, or a znode this identity may not
change), 2 usage (``secure`` without an identity, an unreadable auth file).
"""

from __future__ import annotations

from typing import TextIO

import trio

from tidelog.broker.config import ConfigError, read_zookeeper_credentials
from tidelog.broker.zookeeper.layout import DigestCredentials, ZkError
from tidelog.broker.zookeeper.zk import ZkClient

PROG = "tidelog zookeeper-security-migration"
SECURE, UNSECURE = "secure", "unsecure"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def run(connect: str, acl: str, auth_file: str | None, out: TextIO, err: TextIO) -> int:
    """Set the ACLs of the cluster at ``connect`` (``host:port[/chroot]``, default chroot
    /tidelog) to ``acl`` (secure or unsecure); the exit status."""
    try:
        auth = read_zookeeper_credentials(auth_file)
    except ConfigError as e:
        print(f"{PROG}: error: --zk-auth-file: {e}", file=err)
        return EXIT_USAGE
    if acl == SECURE and auth is None:
        print(f"{PROG}: error: --zookeeper.acl secure needs the brokers' ZooKeeper identity: --zk-auth-file "
              "FILE (zookeeper.digest.username and zookeeper.digest.password, e.g. a broker's config file) "
              "or TIDELOG_ZOOKEEPER_DIGEST_USERNAME and TIDELOG_ZOOKEEPER_DIGEST_PASSWORD", file=err)
        return EXIT_USAGE
    try:
        chroot, found, changed = trio.run(migrate, connect, auth, acl == SECURE)
    except (ZkError, ValueError) as e:
        print(f"{PROG}: {e}", file=err)
        return EXIT_FAILED
    print(f"{acl}: {found} znodes under {chroot or '/'}, {changed} ACLs changed", file=out)
    return EXIT_OK


async def migrate(connect: str, auth: DigestCredentials | None, secure: bool) -> tuple[str, int, int]:
    """(chroot, znodes found, ACLs changed); ZkError when ``connect`` holds no cluster."""
    async with ZkClient(connect, auth=auth, set_acl=secure, create_paths=False) as zk:
        if await zk.get_znode_acl(zk.paths.broker_ids) is None:
            raise ZkError(f"no Tidelog cluster at {zk.hosts} under {zk.paths.root}: {zk.paths.broker_ids} does "
                          "not exist (the chroot is the suffix of --zookeeper.connect, default /tidelog)")
        found, changed = await zk.set_acls_recursively()
        return zk.paths.chroot, found, changed
