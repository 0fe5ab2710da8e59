"""Cluster: bootstrap fallback, metadata refresh (on demand, coalesced, by age), the
connection pool and the controller."""

from __future__ import annotations

import pytest
import trio

from tidelog.aio.cluster import Cluster
from tidelog.errors import BrokerConnectionError, NoBrokersAvailable
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.topics import TopicPartition


async def dead_address() -> str:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    return f"127.0.0.1:{port}"


async def start(nursery, bootstrap, **kw) -> Cluster:
    cluster = Cluster(bootstrap, retry_backoff_ms=10, **kw)
    await nursery.start(cluster.run)
    return cluster


async def test_refresh_falls_back_to_the_next_bootstrap_server(fake, nursery):
    fake.create_topic("t", 2, leaders=[1, 0])
    cluster = await start(nursery, f"{await dead_address()},{fake.bootstrap}")
    metadata = await cluster.refresh(["t"])
    assert metadata.leader_for(TopicPartition("t", 0)) == 1
    assert metadata.controller_id == 0 and metadata.cluster_id == "fake-cluster"
    await cluster.aclose()


async def test_refresh_gives_up_with_no_brokers_available(nursery):
    cluster = await start(nursery, await dead_address())
    with trio.fail_after(5):
        with pytest.raises(NoBrokersAvailable, match="cannot connect"):
            await cluster.refresh(timeout=0.3)


async def test_concurrent_refreshes_are_coalesced(fake, nursery):
    cluster = await start(nursery, fake.bootstrap)
    await cluster.refresh()
    before = len(fake.sent(ApiKey.METADATA))
    async with trio.open_nursery() as inner:
        for _ in range(5):
            inner.start_soon(cluster.refresh)
    assert len(fake.sent(ApiKey.METADATA)) - before <= 2


async def test_request_update_refreshes_in_the_background(fake, nursery):
    cluster = await start(nursery, fake.bootstrap)
    cluster.add_topics(["t"])
    await cluster.refresh()
    fake.create_topic("t", 1)
    updates = []
    cluster.add_listener(updates.append)
    cluster.request_update()
    with trio.fail_after(2):
        assert await cluster.wait_for_update(2)
    assert updates and updates[-1].partitions_for("t") == (0,)


async def test_metadata_is_refreshed_when_it_gets_old(fake, nursery):
    await start(nursery, fake.bootstrap, metadata_max_age_ms=50)
    await trio.sleep(0.3)
    assert len(fake.sent(ApiKey.METADATA)) >= 3


async def test_connections_are_pooled_and_replaced_after_a_failure(fake, nursery):
    cluster = await start(nursery, fake.bootstrap)
    await cluster.refresh()
    conn = await cluster.connection(1)
    assert await cluster.connection(1) is conn
    asked = []
    cluster.request_update = lambda: asked.append(True)
    fake.drop_all_connections()
    with trio.fail_after(2):
        await conn.closed_event.wait()
    fresh = await cluster.connection(1)
    assert fresh is not conn and not fresh.closed
    # a lost connection asks for the metadata again (leadership may have moved, or the broker
    # closed it to say a request with no response failed), as Kafka's client does; whoever
    # replaced it first (this call, or a background refresh)
    assert asked
    del cluster.request_update
    assert (await cluster.controller_connection()) is await cluster.connection(0)


async def test_unknown_nodes_and_reconnect_backoff(fake, nursery):
    cluster = await start(nursery, fake.bootstrap, reconnect_backoff_ms=10_000)
    await cluster.refresh()
    with pytest.raises(BrokerConnectionError, match="node 9"):
        await cluster.connection(9)
    fake.stop()
    await trio.sleep(0.05)
    with pytest.raises(BrokerConnectionError):  # cannot connect (or the background refresh already failed to)
        await cluster.connection(1)
    with pytest.raises(BrokerConnectionError, match="backoff"):  # no new attempt for a while
        await cluster.connection(1)
