"""``tidelog broker``'s lifecycle (broker/main.py): what stop signals do before and after the
broker has started, with a stand-in for the broker server. Signals are sent to this process
while ``serve`` has its own handlers installed, so inherited dispositions play no part."""

from __future__ import annotations

import os
import signal
import threading
import types

import pytest
import trio

from tidelog.broker import cli, main
from tidelog.broker.config import BrokerConfig
from tidelog.broker.main import Reaction, reaction
from tidelog.broker.server import BrokerServer
from tidelog.broker.zookeeper.layout import BrokerIdInUseError
from tidelog.protocol.errors import StorageError

HANG_GUARD_S = 60  # only turns a hang into a failure


class FakeServer:
    """Starts once ``may_start`` is set; records its cleanup and any shutdown request."""

    def __init__(self, config) -> None:
        self.port = None
        self.stopped_because = None
        self.entered = trio.Event()
        self.may_start = trio.Event()
        self.events: list[str] = []

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._cancel = trio.CancelScope()
        try:
            self.entered.set()
            await self.may_start.wait()
            self.port = 9092
            task_status.started(self.port)
            with self._cancel:
                await trio.sleep_forever()
        finally:
            self.events.append("cleanup")

    async def shutdown(self) -> None:
        self.events.append("controlled shutdown")
        self._cancel.cancel()


@pytest.fixture(autouse=True)
def stray_signals():
    """Handlers of our own while a test runs: a signal that ``serve`` did not take (Trio
    delivers the ones left in a receiver again when it closes) is recorded, not fatal."""
    seen: list[int] = []
    kept = {sig: signal.signal(sig, lambda sig, frame: seen.append(sig))
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield seen
    for sig, handler in kept.items():
        signal.signal(sig, handler)


@pytest.fixture
def fake(monkeypatch):
    made: list[FakeServer] = []

    def make(config):
        made.append(FakeServer(config))
        return made[-1]
    monkeypatch.setattr(main, "BrokerServer", make)
    return made


async def _serve_and_signal(made, signals, *, start: bool) -> int:
    result = []
    with trio.fail_after(HANG_GUARD_S):
        async with trio.open_nursery() as nursery:
            async def serve():
                result.append(await main.serve(types.SimpleNamespace(broker_id=1)))
            nursery.start_soon(serve)
            while not made:
                await trio.sleep(0)
            await made[0].entered.wait()
            if start:
                made[0].may_start.set()
                while made[0].port is None:
                    await trio.sleep(0)
            for sig in signals:
                os.kill(os.getpid(), sig)
                await trio.sleep(0)
    return result[0]


def test_the_first_signal_cancels_a_start_then_begins_a_controlled_shutdown_later_ones_stop_now():
    assert reaction(started=False, earlier_signals=0) is Reaction.CANCEL_START
    assert reaction(started=True, earlier_signals=0) is Reaction.CONTROLLED_SHUTDOWN
    assert reaction(started=True, earlier_signals=1) is Reaction.STOP_NOW
    assert reaction(started=False, earlier_signals=1) is Reaction.STOP_NOW


async def test_sigterm_while_the_broker_starts_cancels_the_start(fake, capsys):
    status = await _serve_and_signal(fake, [signal.SIGTERM], start=False)
    assert status == 128 + signal.SIGTERM
    assert fake[0].events == ["cleanup"]  # what was opened is closed; no controlled shutdown
    assert "tidelog broker: broker 1 stopped by SIGTERM before it had started" in capsys.readouterr().err


async def test_sigterm_once_started_is_a_controlled_shutdown(fake):
    status = await _serve_and_signal(fake, [signal.SIGTERM], start=True)
    assert status == 0
    assert fake[0].events == ["controlled shutdown", "cleanup"]


async def test_sighup_is_taken_as_sigterm(fake, stray_signals):
    """A closed terminal must not end a foreground broker without its controlled shutdown
    (the JVM runs Kafka's shutdown hook on SIGHUP too)."""
    assert await _serve_and_signal(fake, [signal.SIGHUP], start=True) == 0
    assert fake[0].events == ["controlled shutdown", "cleanup"] and stray_signals == []


async def test_a_stop_while_the_logs_load_does_not_wait_for_them_nor_close_them(tmp_path, monkeypatch):
    """Log recovery can take minutes: a cancelled start leaves the loading thread behind and
    neither closes the logs nor writes the clean-shutdown marker (the next start recovers)."""
    config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "127.0.0.1:1",
                                      "log.dirs": str(tmp_path)})
    server = BrokerServer(config)
    loading, release = threading.Event(), threading.Event()
    shut = []

    def slow_startup(*args):
        loading.set()
        release.wait(HANG_GUARD_S)  # bounded: without abandoning, the start waits for it
    monkeypatch.setattr(server.log_manager, "startup", slow_startup)
    monkeypatch.setattr(server.log_manager, "shutdown", lambda: shut.append(1))
    try:
        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.run)
                await trio.to_thread.run_sync(loading.wait)
                nursery.cancel_scope.cancel()
        assert not server.logs_loaded and shut == []
    finally:
        release.set()


class FailingServer(FakeServer):
    failure: BaseException = RuntimeError()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        raise self.failure


@pytest.mark.parametrize("failure", [
    StorageError("/data/logs/meta.properties belongs to broker.id 2, but this broker is 1"),
    ExceptionGroup("Exceptions from Trio nursery",  # how a listener's failure comes out
                   [OSError(98, "error while attempting to bind on address ('127.0.0.1', 9092): "
                                "address already in use")]),
    BrokerIdInUseError("broker.id 1 is already registered by another live broker"),
], ids=["meta.properties", "port in use", "broker.id in use"])
def test_a_start_failing_on_a_named_problem_says_so_in_one_line(monkeypatch, capsys, failure):
    monkeypatch.setattr(FailingServer, "failure", failure)
    monkeypatch.setattr(main, "BrokerServer", FailingServer)
    monkeypatch.setattr(main.BrokerConfig, "load", classmethod(lambda cls, *a: types.SimpleNamespace(broker_id=1)))
    monkeypatch.setattr(main, "setup_logging", lambda level: None)
    assert cli.main(["broker"]) == 1
    leaf = failure.exceptions[0] if isinstance(failure, ExceptionGroup) else failure
    assert capsys.readouterr().err == f"tidelog broker: {leaf}\n"


def test_a_start_failing_on_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr(FailingServer, "failure", KeyError("oops"))
    monkeypatch.setattr(main, "BrokerServer", FailingServer)
    with pytest.raises(BaseExceptionGroup) as raised:
        trio.run(main.serve, types.SimpleNamespace(broker_id=1))
    assert raised.group_contains(KeyError)
