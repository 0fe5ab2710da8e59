"""Integration fixtures: one real ZooKeeper per test session, always stopped by PID.

Fixtures that start processes are sync (pytest-trio allows only function-scoped async
fixtures) and start them from the main thread (PR_SET_PDEATHSIG, see zkserver).
Each test gets its own chroot, so tests sharing the server are independent.
"""

from __future__ import annotations

import uuid

import pytest

from tidelog.broker.zookeeper.zkserver import ZooKeeperServer


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A standalone ZooKeeper (tickTime 500 ms: session timeouts 1-10 s) for the whole session."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    try:
        server.start()
        server.wait_serving(30)
        yield server
    finally:
        server.stop()


@pytest.fixture
def chroot() -> str:
    """A fresh ZooKeeper chroot for one test."""
    return f"/test-{uuid.uuid4().hex[:12]}"
