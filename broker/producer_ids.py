"""Producer ids for idempotent producers (InitProducerId), handed out by any broker.

Ids come in blocks of ``PRODUCER_ID_BLOCK_SIZE`` claimed in ZooKeeper: the broker reads
``/latest_producer_id_block``, writes the next block with the version it read (check-and-set,
see ``ZkClient.allocate_producer_id_block``) and retries on a conflict, so two brokers never
hand out the same id (Kafka's ZK-era ProducerIdManager). A broker serves ids from its block
in memory and claims a new block when it is used up; ids of a block lost in a restart are
simply never used.

A new producer gets a new id at epoch 0. A producer that presents its id and epoch gets the
next epoch of the same id (the idempotent producer's bump after a fatal sequence error:
its old epoch's sequences are abandoned, the new epoch starts at sequence 0 everywhere);
when the epoch would overflow it gets a new id instead. Idempotent producers keep no state
on the coordinator side (there are no transactions), so the bump is decided from the
request alone; the partitions fence the old epoch as soon as the new one appends.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import trio

from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, TidelogError

PRODUCER_ID_BLOCK_SIZE = 1000
MAX_PRODUCER_EPOCH = 2**15 - 1  # int16

BlockAllocator = Callable[[], Awaitable[tuple[int, int]]]


def bumped_epoch(producer_id: int, producer_epoch: int) -> int | None:
    """The next epoch of an existing producer id, or None when a new id is needed (the
    request names no id, or its epoch is exhausted). Raises on an inconsistent request."""
    if producer_id < 0 and producer_epoch < 0:
        return None
    if producer_id < 0 or not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise TidelogError(f"InitProducerId with producer id {producer_id} and epoch {producer_epoch}: give "
                           "both (to bump the epoch) or neither (for a new id)", error=INVALID_REQUEST)
    if producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
        return None
    return producer_epoch + 1


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
        """``(producer_id, epoch)`` for an InitProducerId request (see the module docstring)."""
        epoch = bumped_epoch(producer_id, producer_epoch)
        if epoch is not None:
            return producer_id, epoch
        return await self.generate_producer_id(), 0
