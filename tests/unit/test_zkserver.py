"""ZooKeeperServer (broker/zookeeper/zkserver.py) without a JVM: that it serves means *its*
process serves, not whatever answers on its port."""

from __future__ import annotations

import socket

import pytest

from tidelog.broker.zookeeper import zkserver
from tidelog.broker.zookeeper.zkserver import ZooKeeperServer, ZooKeeperStartError


class ExitingProcess:
    """A child that is alive when first asked, then has exited (its port was taken)."""

    def __init__(self):
        self.answers = [None]
        self.returncode = None

    def poll(self):
        if self.answers:
            return self.answers.pop(0)
        self.returncode = 1
        return 1


def test_an_answer_on_the_port_counts_only_while_its_own_process_lives(tmp_path, monkeypatch):
    monkeypatch.setattr(zkserver, "four_letter_word", lambda *a, **k: "Zookeeper version: 3.8\nMode: standalone\n")
    server = ZooKeeperServer(tmp_path, port=2181)
    server._proc = ExitingProcess()
    with pytest.raises(ZooKeeperStartError, match="another cluster"):
        server.wait_serving(timeout=5)


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ZooKeeperServer(tmp_path, port=port)
        with pytest.raises(ZooKeeperStartError, match=f"port {port} is in use: is another cluster running"):
            server.start()
    assert server.pid is None
