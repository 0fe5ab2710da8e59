"""Producer ids for idempotent producers (InitProducerId), handed out by any broker.

Ids come in blocks of ``producer.id.block.size`` (1000) claimed in ZooKeeper: the broker reads
``/latest_producer_id_block``, writes the next block with the version it read (check-and-set,
see ``ZkClient.allocate_producer_id_block``) and retries on a conflict, so two brokers never
hand out the same id (Kafka's ZK-era ProducerIdManager). A broker serves ids from its block
in memory and claims a new block when it is used up; ids of a block lost in a restart are
simply never used.

A producer gets a new id at epoch 0, also when its request names an id and epoch (as Kafka's
TransactionCoordinator.handleInitProducerId does without a transactional id, KIP-360): only
a transactional producer may get the next epoch of an id, through its transactional id, and
Tidelog has no transactions. Idempotent producers keep no state on the coordinator side, so
the broker could not tell a producer's own bump from a request that names someone else's id
to fence it. An idempotent producer bumps its epoch itself instead (KIP-360, as Kafka's
producer does; the partitions fence the old epoch as soon as the new one appends) and asks
for a new id when the epoch is used up. A request naming one of id and epoch without the
other is refused (INVALID_REQUEST), as Kafka's KafkaApis does.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, TidelogError

BlockAllocator = Callable[[], Awaitable[tuple[int, int]]]


def check_init_request(producer_id: int, producer_epoch: int) -> None:
    """Refuse an InitProducerId naming one of producer id and epoch without the other."""
    if (producer_id, producer_epoch) != (-1, -1) and (producer_id < 0 or producer_epoch < 0):
        raise TidelogError(
            f"InitProducerId with producer id {producer_id} and epoch {producer_epoch}: give both (an id and "
            "epoch of 0 or more) or neither (-1 and -1)", error=INVALID_REQUEST)


class ProducerIdManager:
    def __init__(self, allocate_block: BlockAllocator):
        self._allocate_block = allocate_block
        self._next = 0
        self._last = -1  # no block yet
        self._lock = trio.Lock()

    async def generate_producer_id(self) -> int:
        async with self._lock:
            if self._next > self._last:
                try:
                    self._next, self._last = await self._allocate_block()
                except TidelogError as e:
                    raise TidelogError(f"cannot claim a block of producer ids in ZooKeeper: {e}",
                                       error=COORDINATOR_NOT_AVAILABLE) from e
            pid = self._next
            self._next += 1
            return pid

    async def init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """``(producer_id, epoch)`` for an InitProducerId request: a new id at epoch 0 (a
        named id and epoch are not continued: see the module docstring)."""
        check_init_request(producer_id, producer_epoch)
        return await self.generate_producer_id(), 0
