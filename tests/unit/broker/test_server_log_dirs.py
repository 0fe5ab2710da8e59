"""A broker started on log dirs another broker runs on (the same config started twice): it
stops at the dirs' lock, before reading them, and leaves them as the running broker has them
(no recovery, no checkpoint, no clean-shutdown marker)."""

from __future__ import annotations

import os

import pytest

from tests.unit.log.helpers import make_batch
from tidelog.broker.config import BrokerConfig
from tidelog.broker.log.manager import CLEAN_SHUTDOWN_MARKER, LogDirInUse, LogManager
from tidelog.broker.server import BrokerServer
from tidelog.protocol.topics import TopicPartition


def files_of(d: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(d):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), d)] = f.read()
    return out


async def test_a_second_broker_on_the_same_log_dirs_does_not_start_and_writes_nothing(tmp_path):
    dirs = [str(tmp_path / "d1"), str(tmp_path / "d2")]
    running = LogManager(dirs, broker_id=1)  # the first broker's storage, appending
    running.startup()
    log = running.get_or_create_log(TopicPartition("orders", 0))
    for _ in range(3):
        log.append_as_leader(make_batch(5), 0)
    before = {d: files_of(d) for d in dirs}
    config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "127.0.0.1:1", "log.dirs": dirs})
    second = BrokerServer(config)
    with pytest.raises(LogDirInUse, match="Failed to acquire lock on file .lock in "):
        await second.run()  # ZooKeeper is never reached: the dirs' lock refuses it first
    assert not second.logs_loaded
    assert {d: files_of(d) for d in dirs} == before
    assert not any(os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_MARKER)) for d in dirs)
    log.append_as_leader(make_batch(5), 0)  # the first broker carries on
    assert log.log_end_offset == 20
    running.shutdown()
