"""num.replica.fetchers: a follower copies a source broker's partitions with that many
fetchers, each on an endpoint (a connection) of its own, partitions spread by Kafka's rule."""

from __future__ import annotations

import trio

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager, fetcher_id
from tidelog.protocol.messages import LeaderAndIsrRequest, PartitionState
from tidelog.protocol.topics import TopicPartition


class _SilentLeader:
    """An endpoint that never answers (the fetchers just wait)."""

    async def fetch(self, request):
        await trio.sleep_forever()

    async def offsets_for_leader_epoch(self, request):
        await trio.sleep_forever()


async def test_a_follower_runs_one_fetcher_per_fetcher_id_each_with_its_own_endpoint(tmp_path, nursery):
    lm = LogManager([str(tmp_path)], LogConfig(), broker_id=2)
    lm.startup()
    asked: list[tuple[int, int]] = []

    def endpoint_for(leader_id: int, fid: int):
        asked.append((leader_id, fid))
        return _SilentLeader()

    rm = ReplicaManager(ReplicaConfig(2, num_replica_fetchers=3), lm, lambda t: LogConfig(), endpoint_for)
    await nursery.start(rm.run)
    tps = [TopicPartition("events", p) for p in range(12)]
    rm.become_leader_or_follower(LeaderAndIsrRequest(1, 1, 0, [
        PartitionState(tp.topic, tp.partition, 1, 1, 0, [1, 2], 0, [1, 2]) for tp in tps]))
    expected = {(1, fetcher_id(tp, 3)) for tp in tps}
    assert set(rm.fetchers) == expected and sorted(asked) == sorted(expected)
    for (leader, fid), f in rm.fetchers.items():
        assert set(f.partitions) == {tp for tp in tps if fetcher_id(tp, 3) == fid}
    rm.shutdown()
    lm.shutdown()
