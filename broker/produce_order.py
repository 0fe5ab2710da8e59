"""Produce requests that must wait keep their order: per connection and per partition.

The produce handler is ORDERED (``broker.apis``): the network layer calls it in request order
and it appends before it returns, which is what keeps pipelined produces of a connection in
the order sent. A produce whose records are expensive to validate (large, or compressed: see
``needs_worker``) cannot do that without holding the event loop, so it validates in a worker
thread and appends afterwards. While it waits, everything that must come after it waits too:

* every later produce on the same connection (Kafka serves a connection's requests one at a
  time), and
* every later produce to one of its partitions, from any connection (a partition's log is
  appended in the order its produces were read).

``ProduceOrder`` keeps, per key (a connection or a partition), the event of the last produce
that is still waiting. A produce reads the events of its keys (its predecessors) and, when it
has any or must validate in a worker, registers its own event under its keys and becomes a
task that waits for its predecessors, validates, appends and then sets its event. The
registration happens in the handler, synchronously, in request order, so each key's waiting
produces form a chain in arrival order and no produce overtakes one it must follow. A
produce with no predecessor and cheap records appends at once, as before. The replication
wait (acks=all) comes after the event is set: only the append is ordered.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

import trio

from tidelog.protocol.records import any_compressed

# A produce carrying at least this many bytes is validated in a worker thread
WORKER_THRESHOLD_BYTES = 256 * 1024
# ... and so is one with a compressed batch of at least this size: any, by default. A few
# hundred bytes of zstd inflate to the 8 MiB bound, and decoding those records can take as
# long as decoding a batch of that size, whatever the batch's header says.
WORKER_COMPRESSED_BYTES = 0
# ... and so is one of this many bytes with records in Kafka's encoding (a Kafka client's,
# through the Kafka listener): decoding them takes ~5 times msgpack's time, ~45 ms for
# 256 KiB of small records
WORKER_KAFKA_ENCODED_BYTES = 32 * 1024


def needs_worker(entries: Mapping[object, bytes], threshold_bytes: int = WORKER_THRESHOLD_BYTES,
                 compressed_bytes: int = WORKER_COMPRESSED_BYTES,
                 kafka_encoded_bytes: int = WORKER_KAFKA_ENCODED_BYTES) -> bool:
    """True if validating these records could hold the event loop for more than a few
    milliseconds: many bytes in all (fewer in Kafka's encoding), or a compressed batch (its
    size says nothing about what it inflates to)."""
    total = sum(map(len, entries.values()))
    if total >= threshold_bytes:
        return True
    kafka_encoded = total >= kafka_encoded_bytes
    for records in entries.values():
        if len(records) >= compressed_bytes and any_compressed(records, kafka_encoded):
            return True
    return False


class ProduceOrder:
    """The last waiting produce per key (see the module docstring)."""

    def __init__(self) -> None:
        self._tails: dict[Hashable, trio.Event] = {}

    def __len__(self) -> int:
        return len(self._tails)

    def predecessors(self, keys: Iterable[Hashable]) -> list[trio.Event]:
        """The events of the waiting produces that one with these keys must follow."""
        tails = self._tails
        if not tails:  # nothing waits (the usual case)
            return []
        return list({id(e): e for k in keys if (e := tails.get(k)) is not None}.values())

    def enter(self, keys: Iterable[Hashable]) -> trio.Event:
        """Register a waiting produce under ``keys``; later ones with any of them follow it."""
        done = trio.Event()
        for k in keys:
            self._tails[k] = done
        return done

    def leave(self, keys: Iterable[Hashable], done: trio.Event) -> None:
        """The produce registered with ``done`` has appended (or failed): its followers go on."""
        done.set()
        for k in keys:
            if self._tails.get(k) is done:
                del self._tails[k]
