"""``tidelog dev up`` (run_dev_up) with a stand-in for the cluster: what signals do to it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tidelog.broker import devcluster


class PreviousHandlerReached(Exception):
    pass


@pytest.fixture(autouse=True)
def own_handlers():
    """Handlers of our own while a test runs, so inherited dispositions play no part: a signal
    that run_dev_up did not take raises instead of ending the test process."""
    def reached(sig, frame):
        raise PreviousHandlerReached(signal.Signals(sig).name)
    kept = {sig: signal.signal(sig, reached) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


class FakeCluster:
    """Starts at once; ``on_start`` runs when it has started."""

    on_start = staticmethod(lambda cluster: None)

    def __init__(self, directory, brokers, **kwargs):
        self.dir = Path(directory)
        self.brokers: dict = {}
        self.security = None
        self.bootstrap = "127.0.0.1:9092"
        self.kafka_bootstrap = "127.0.0.1:9192"
        self.zookeeper = type("Zk", (), {"port": 2181})()
        self.calls: list[str] = []
        made.append(self)

    def start(self):
        self.calls.append("start")
        self.on_start(self)

    def stop(self):
        self.calls.append("stop")

    def kill(self):
        self.calls.append("kill")


made: list[FakeCluster] = []


@pytest.fixture
def fake_cluster(monkeypatch):
    made.clear()
    monkeypatch.setattr(devcluster, "DevCluster", FakeCluster)
    return made


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_the_cluster_cleanly(fake_cluster, monkeypatch, tmp_path, sig):
    """A closed terminal (SIGHUP) must stop the brokers cleanly, as SIGTERM does, rather than
    end dev up and leave PR_SET_PDEATHSIG to SIGKILL every broker."""
    monkeypatch.setattr(FakeCluster, "on_start", staticmethod(lambda cluster: os.kill(os.getpid(), sig)))
    assert devcluster.run_dev_up(str(tmp_path), 3, 2181, 9092) == 0
    assert fake_cluster[0].calls == ["start", "stop"]


def test_a_second_dev_up_on_a_running_cluster_is_refused(fake_cluster, monkeypatch, tmp_path, capsys):
    """Its brokers would run with the same configs on the running cluster's dirs."""
    second = []

    def start_another(cluster):
        second.append(devcluster.run_dev_up(str(tmp_path), 3, 2181, 9092))
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(FakeCluster, "on_start", staticmethod(start_another))
    assert devcluster.run_dev_up(str(tmp_path), 3, 2181, 9092) == 0
    assert second == [1] and len(fake_cluster) == 1  # the second made no cluster
    assert (f"tidelog dev up: the cluster in {tmp_path} is already running (tidelog dev up, pid "
            f"{os.getpid()})") in capsys.readouterr().err
    # once the first has ended, the directory is free again
    monkeypatch.setattr(FakeCluster, "on_start", staticmethod(lambda cluster: os.kill(os.getpid(), signal.SIGTERM)))
    assert devcluster.run_dev_up(str(tmp_path), 3, 2181, 9092) == 0


class ExitedBroker:
    def __init__(self, broker_id: int, directory: Path, status: int | None):
        self.config_path = directory / f"broker-{broker_id}.toml"
        self.log_path = directory / f"broker-{broker_id}.log"
        self.proc = type("Proc", (), {"returncode": status, "pid": 4000 + broker_id})()
        self.running = status is None


def test_a_broker_that_exits_is_reported_and_the_cluster_stays_up(fake_cluster, monkeypatch, tmp_path, capsys):
    """So that a broker can be stopped and started by hand (README): dev up ends only on its
    own signal."""
    def one_exits(cluster):
        cluster.brokers = {1: ExitedBroker(1, cluster.dir, None), 2: ExitedBroker(2, cluster.dir, 143)}
    seen_at_sleep = []

    def sleep(seconds):  # the watch loop's pause: the cluster is checked, then stopped by a signal
        seen_at_sleep.append(list(fake_cluster[0].calls))
        if len(seen_at_sleep) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(FakeCluster, "on_start", staticmethod(one_exits))
    monkeypatch.setattr(devcluster.time, "sleep", sleep)
    assert devcluster.run_dev_up(str(tmp_path), 2, 2181, 9092) == 0
    assert seen_at_sleep == [["start"], ["start"]] and fake_cluster[0].calls == ["start", "stop"]
    out = capsys.readouterr().out
    assert "broker pids (kill PID: a controlled shutdown of that broker): 1: 4001\n" in out
    assert out.count("broker 2 exited") == 1  # reported once
    assert (f"broker 2 exited (status 143); start it again with: tidelog broker --config "
            f"{tmp_path / 'broker-2.toml'}") in out
