"""The idempotent producer's bookkeeping: producer id, epoch and per-partition sequences.

Theory of operation (the idempotent half of Kafka's TransactionManager).

The producer gets a producer id and epoch from any broker (InitProducerId) before it sends
anything. Each partition numbers its records from sequence 0 per (id, epoch): a batch gets
its base sequence when it is first drained (``assign``) and keeps it, and its encoded bytes,
across every retry, so a retry of a batch the broker already appended is recognised there
as a duplicate and answered with the original offsets. The broker accepts a batch only if it
continues the partition's sequence, so batches land in the order their sequences were
assigned, which is the order they were sent; the accumulator re-enqueues failed batches in
that order and sends a partition's retries one at a time.

Per partition the producer remembers the sequence for the next batch, the last acknowledged
sequence and offset, and the *unresolved* batches: those with a sequence that have not been
acknowledged or failed yet. What an OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID
answer means depends on them (``decide``):

* when it was sent, an earlier batch of the partition was still unresolved: that one may
  have failed, or reached the broker later (another connection after a leader change), and
  is resent first, so this one is simply retried after it;
* when it was sent, every earlier sequence had been acknowledged (``mark_sent``):
  - UNKNOWN_PRODUCER_ID: the broker has no state for the producer (retention removed all its
    batches, or producer id expiration forgot an idle producer). Nothing of the batch was
    written, so, as Kafka's producer does (KIP-360), the producer bumps its epoch and the
    batch is sent again from sequence 0 of the new epoch (``reset``): an idle producer's
    next records are not failed;
  - OUT_OF_ORDER_SEQUENCE_NUMBER: the broker lost what it had acknowledged (unclean leader
    election). The batch fails with an error that says so, and the producer bumps its epoch.

The epoch is bumped whenever a batch with a sequence fails for good (fatal sequence error,
fenced epoch, delivery timeout, retries exhausted, non-retriable error): the sequences after
it can never be accepted. The producer bumps it itself (``bump_epoch``), as Kafka's
idempotent producer does (KIP-360): brokers give an existing id a new epoch only to a
transactional producer, so that nobody can fence another producer by naming its id. When
the epoch is used up it asks for a new producer id instead (InitProducerId). A partition
moves to the new epoch (sequence 0) only once it has no unresolved batch of the old one, so
a retry whose first attempt may have been appended is still deduplicated under its old
epoch; an unresolved batch the broker refuses for its sequence after the bump is known not
to be in the log and is given a sequence of the new epoch (``clear_sequence``).

Pure, and used by one thread at a time: every change is made under the sender's lock
(``Sender._caller_lock``: its rounds and response handling on the Trio thread, the drain
of an application thread that writes its own request) or under the accumulator's lock
(``on_complete``). No I/O, no clock.
"""

from __future__ import annotations

from typing import NamedTuple

from tidelog.protocol.errors import (
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    PRODUCER_FENCED,
    UNKNOWN_PRODUCER_ID,
)
from tidelog.protocol.topics import TopicPartition

__all__ = ["IdempotenceState", "PartitionSequences", "next_sequence", "SEQUENCE_ERRORS", "FENCED_ERRORS"]

MAX_SEQUENCE = 2**31 - 1
MAX_EPOCH = 2**15 - 1  # int16: the last epoch is never used, a new producer id is taken instead
SEQUENCE_ERRORS = frozenset({OUT_OF_ORDER_SEQUENCE_NUMBER.code, UNKNOWN_PRODUCER_ID.code})
FENCED_ERRORS = frozenset({INVALID_PRODUCER_EPOCH.code, PRODUCER_FENCED.code})


def next_sequence(seq: int, increment: int = 1) -> int:
    """``seq + increment``, wrapping from 2**31 - 1 to 0 (as the broker does)."""
    return (seq + increment) & MAX_SEQUENCE


class ProducerIdAndEpoch(NamedTuple):
    producer_id: int
    epoch: int


NO_PRODUCER = ProducerIdAndEpoch(-1, -1)


class PartitionSequences:
    """One partition's sequences under one producer id and epoch."""

    __slots__ = ("producer", "next_sequence", "last_acked_sequence", "last_acked_offset", "unresolved")

    def __init__(self, producer: ProducerIdAndEpoch):
        self.producer = producer
        self.next_sequence = 0
        self.last_acked_sequence = -1
        self.last_acked_offset = -1
        self.unresolved: list = []  # ProducerBatch with a sequence of this partition, in order


class SequenceVerdict(NamedTuple):
    action: str  # "done" | "retry" | "resequence" | "reset" | "fatal" | "keep" (not a sequence matter)
    why: str = ""


class IdempotenceState:
    def __init__(self) -> None:
        self.producer = NO_PRODUCER
        self.bump_requested = False
        self.partitions: dict[TopicPartition, PartitionSequences] = {}

    @property
    def ready(self) -> bool:
        """Whether new batches may get sequences (an id is known and no bump is pending)."""
        return self.producer.producer_id >= 0 and not self.bump_requested

    def set_producer(self, producer_id: int, epoch: int) -> None:
        self.producer = ProducerIdAndEpoch(producer_id, epoch)
        self.bump_requested = False

    def request_bump(self) -> None:
        if self.producer.producer_id >= 0:
            self.bump_requested = True

    def bump_epoch(self) -> bool:
        """Carry out a requested bump: the next epoch of the same id. False when there is no
        bump to make, or the epoch is used up: then the producer has no id until it gets a
        new one (InitProducerId)."""
        if not self.bump_requested:
            return False
        producer_id, epoch = self.producer
        if epoch + 1 >= MAX_EPOCH:
            self.producer, self.bump_requested = NO_PRODUCER, False
            return False
        self.set_producer(producer_id, epoch + 1)
        return True

    # -- assigning (drain) ----------------------------------------------------------------------

    def may_assign(self, tp: TopicPartition) -> bool:
        """Whether a new batch of ``tp`` may get a sequence now: the producer is ready, and the
        partition is on the current epoch or has nothing unresolved of an older one."""
        if not self.ready:
            return False
        entry = self.partitions.get(tp)
        return entry is None or entry.producer == self.producer or not entry.unresolved

    def assign(self, batch) -> None:
        """Give ``batch`` the partition's next sequence (call after ``may_assign``)."""
        tp = batch.tp
        entry = self.partitions.get(tp)
        if entry is None or entry.producer != self.producer:
            entry = self.partitions[tp] = PartitionSequences(self.producer)
        batch.set_producer_state(self.producer.producer_id, self.producer.epoch, entry.next_sequence)
        entry.next_sequence = next_sequence(entry.next_sequence, len(batch))
        entry.unresolved.append(batch)

    def split(self, batch, pieces) -> None:
        """``batch`` was refused as too large and split into ``pieces`` (its records in
        order): they take its sequences in order, as Kafka's ``ProducerBatch.split`` does,
        and its place among the partition's unresolved batches. The broker refused the batch
        whole, so the partition's sequence goes on without a gap, and the batches sent behind
        it, refused for their sequence, are retried after the pieces (``decide``)."""
        entry = self.partitions.get(batch.tp)
        if entry is None or batch not in entry.unresolved:
            return  # not the partition's to track: the pieces get sequences when drained
        sequence = batch.base_sequence
        for piece in pieces:
            piece.set_producer_state(batch.producer_id, batch.producer_epoch, sequence)
            sequence = next_sequence(sequence, len(piece))
        i = entry.unresolved.index(batch)
        entry.unresolved[i:i + 1] = pieces

    # -- outcomes -------------------------------------------------------------------------------

    def mark_sent(self, batches) -> None:
        """Before a request goes out: note which batches follow only acknowledged sequences."""
        for b in batches:
            entry = self.partitions.get(b.tp)
            b.sent_in_line = entry is not None and bool(entry.unresolved) and entry.unresolved[0] is b

    def decide(self, batch, error_code: int) -> SequenceVerdict:
        """What a response's error code means for a batch with a sequence (see module doc)."""
        if error_code == DUPLICATE_SEQUENCE_NUMBER.code:
            return SequenceVerdict("done")
        if error_code in FENCED_ERRORS:
            return SequenceVerdict("fatal", "this producer's epoch was fenced by a newer one; its records "
                                   "were not written, the producer takes a new epoch")
        if error_code not in SEQUENCE_ERRORS:
            return SequenceVerdict("keep")
        if self._stale(batch):
            return SequenceVerdict("resequence")
        if batch.sent_in_line and error_code == UNKNOWN_PRODUCER_ID.code:
            return SequenceVerdict("reset", "the broker has no state for this producer (its batches were "
                                   "removed by retention, or it was idle longer than producer.id.expiration.ms); "
                                   "the batch is sent again under a new epoch")
        if batch.sent_in_line:
            return SequenceVerdict("fatal", "the broker's sequence for this producer skipped: records it "
                                   "acknowledged earlier are gone (an unclean leader election?); these records "
                                   "were not written, the producer takes a new epoch")
        return SequenceVerdict("retry")

    def _stale(self, batch) -> bool:
        return self.bump_requested or (batch.producer_id, batch.producer_epoch) != self.producer

    def reset_sequence(self, batch) -> None:
        """The broker forgot the producer and refused ``batch`` (``reset``): a new epoch, and
        the batch gets a sequence of it when it is sent again."""
        self.request_bump()
        self.clear_sequence(batch)

    def clear_sequence(self, batch) -> None:
        """Take the sequence back from a batch known not to be in the log (after a bump)."""
        self._forget(batch)
        batch.set_producer_state(-1, -1, -1)

    def on_complete(self, batch, base_offset: int, failed: bool) -> None:
        """A batch with a sequence resolved: acknowledged, or failed for good (then the
        sequences after it can never be accepted: bump the epoch)."""
        entry = self._forget(batch)
        if failed:
            if not self._stale(batch):
                self.request_bump()
        elif entry is not None and entry.producer == (batch.producer_id, batch.producer_epoch):
            entry.last_acked_sequence = next_sequence(batch.base_sequence, len(batch) - 1)
            if base_offset >= 0:
                entry.last_acked_offset = base_offset + len(batch) - 1

    def _forget(self, batch) -> PartitionSequences | None:
        entry = self.partitions.get(batch.tp)
        if entry is not None:
            try:
                entry.unresolved.remove(batch)
            except ValueError:
                pass
        return entry
