"""InitProducerId on the broker: ids from ZooKeeper blocks, always a new one at epoch 0."""

from __future__ import annotations

import types

import pytest

from tidelog.broker.config import BrokerConfig
from tidelog.broker.producer_ids import ProducerIdManager
from tidelog.broker.server import BrokerServer
from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, TidelogError


class Blocks:
    """Hands out blocks of 3 ids, as successive check-and-set writes would."""

    def __init__(self, fail: int = 0):
        self.calls, self.fail = 0, fail

    async def __call__(self) -> tuple[int, int]:
        self.calls += 1
        if self.calls <= self.fail:
            raise TidelogError("zookeeper unreachable")
        first = (self.calls - self.fail - 1) * 3
        return first, first + 2


async def test_new_producers_get_ids_from_blocks_at_epoch_zero():
    blocks = Blocks()
    manager = ProducerIdManager(blocks)
    got = [await manager.init_producer_id(-1, -1) for _ in range(7)]
    assert got == [(i, 0) for i in range(7)]
    assert blocks.calls == 3  # a block is claimed only when the last one is used up


@pytest.mark.parametrize("pid, epoch", [(42, 3), (42, 32766), (0, 0)])
async def test_a_request_that_names_a_producer_id_and_epoch_gets_a_new_id(pid, epoch):
    # Kafka (KIP-360, TransactionCoordinator.handleInitProducerId): without a transactional id
    # the named id and epoch are ignored and a new id is handed out at epoch 0; nobody gets
    # another epoch of an existing id, which would fence its producer
    manager = ProducerIdManager(Blocks())
    assert await manager.init_producer_id(-1, -1) == (0, 0)
    assert await manager.init_producer_id(pid, epoch) == (1, 0)


@pytest.mark.parametrize("pid, epoch", [(5, -1), (-1, 2), (-2, -1), (-2, 3)])
async def test_a_request_with_only_one_of_id_and_epoch_is_refused(pid, epoch):
    blocks = Blocks()
    manager = ProducerIdManager(blocks)
    with pytest.raises(TidelogError) as e:
        await manager.init_producer_id(pid, epoch)
    assert e.value.error is INVALID_REQUEST and "both" in str(e.value)
    assert blocks.calls == 0


async def test_a_zookeeper_failure_is_retriable_for_the_client():
    manager = ProducerIdManager(Blocks(fail=1))
    with pytest.raises(TidelogError) as e:
        await manager.generate_producer_id()
    assert e.value.error is COORDINATOR_NOT_AVAILABLE and e.value.error.retriable
    assert await manager.generate_producer_id() == 0


async def test_the_broker_claims_blocks_of_producer_id_block_size(tmp_path):
    config = BrokerConfig.from_props({"broker.id": 4, "zookeeper.connect": "zk1:2181", "log.dirs": str(tmp_path),
                                      "producer.id.block.size": 7})
    server = BrokerServer(config)
    claims = []

    async def allocate_producer_id_block(broker_id: int, size: int) -> tuple[int, int]:
        claims.append((broker_id, size))
        return 0, size - 1
    server.zk = types.SimpleNamespace(allocate_producer_id_block=allocate_producer_id_block)
    assert [await server.producer_ids.generate_producer_id() for _ in range(8)] == [0, 1, 2, 3, 4, 5, 6, 0]
    assert claims == [(4, 7), (4, 7)]
