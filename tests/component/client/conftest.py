"""Fixtures for the client's component tests: the in-process fake cluster, in the test's
own Trio run (async tests) or on a background thread (blocking-facade tests)."""

from __future__ import annotations

import threading

import pytest
import trio

from tests.component.client.fake_broker import FakeCluster


@pytest.fixture
async def fake(nursery):
    """Two fake brokers (node 0 is the controller), serving until the test ends."""
    cluster = FakeCluster(2)
    await nursery.start(cluster.run)
    yield cluster
    cluster.stop()


class ThreadedFake:
    """A FakeCluster on its own thread and Trio run; ``call`` runs code on that thread."""

    def __init__(self, cluster: FakeCluster):
        self.cluster = cluster
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.cluster.run)
            self._ready.set()

    def start(self) -> "ThreadedFake":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def call(self, fn, *args):
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self) -> None:
        self.call(self.cluster.stop)
        self._thread.join(10)


@pytest.fixture
def threaded_fake():
    fake = ThreadedFake(FakeCluster(1)).start()
    yield fake
    fake.stop()


@pytest.fixture
def threaded_fake_two():
    """Two fake brokers on a background thread (node 0 is the controller)."""
    fake = ThreadedFake(FakeCluster(2)).start()
    yield fake
    fake.stop()
