"""Partition reassignment (Kafka's KIP-455), as pure decisions.

The rules
---------
* A partition being moved from its *original* replicas to a *target* list has, in ZooKeeper,
  the replica set ``RS = target + (original - target)`` with the replicas being *added*
  (target - original) and *removed* (original - target) named beside it, so a controller that
  takes over mid-move sees both ends of it (``ReplicaAssignment``). The target comes first in
  RS: its first replica is the preferred leader once the move completes.
* Phase 1 (``Step.CATCH_UP``): RS is written and every replica of RS is told of the partition
  (a LeaderAndIsr with a new leader epoch), so the added replicas start fetching. Nothing
  else happens until every target replica is in the ISR.
* Phase 2, once the whole target is in the ISR: if the leader is not a live target replica,
  leadership moves to the first live target replica in the ISR (``Step.ELECT``); then the
  removed replicas leave the ISR and are stopped with their logs deleted, and the final
  assignment (the target) is written and the partition leaves the reassignment znode
  (``Step.COMPLETE``). A removed replica on a broker that is down is deleted when it comes
  back (the controller sends StopReplica with deletion to brokers that host a partition they
  are no longer assigned).
* A new target for a partition already moving replaces the old one, measured from the
  original replicas: replicas added by the old move that the new target does not want are
  removed again (``ReplicaAssignment.reassign_to``). Cancelling is reassigning to the
  original replicas (``cancel``).
* A target must be non-empty and without duplicates, and the replicas it adds (not among the
  original replicas) must be on registered brokers; as Kafka, it may keep a replica on a
  broker that is down (the move waits for that broker to return and catch up). A move to the
  replicas already assigned is a no-op (Kafka completes it at once).

Changing the replication factor is a reassignment whose target is longer or shorter.
Nothing here does I/O: the controller writes ZooKeeper and sends the requests the step names.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tidelog.protocol.errors import INVALID_REPLICA_ASSIGNMENT, TidelogError


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    """A partition's replicas as ZooKeeper holds them: during a move, RS with the replicas
    being added and removed; otherwise just the replicas."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @classmethod
    def of(cls, replicas: Iterable[int]) -> ReplicaAssignment:
        return cls(tuple(replicas))

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the move (RS without those being added)."""
        return tuple(r for r in self.replicas if r not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        """The replicas after the move (RS without those being removed)."""
        return tuple(r for r in self.replicas if r not in self.removing)

    def reassign_to(self, target: Sequence[int]) -> ReplicaAssignment:
        """The assignment while moving to ``target``, measured from the original replicas
        (a move in progress is replaced, not stacked)."""
        original = self.original
        target = tuple(target)
        if target == original:
            return ReplicaAssignment(original)
        adding = tuple(r for r in target if r not in original)
        removing = tuple(r for r in original if r not in target)
        return ReplicaAssignment(target + removing, adding, removing)

    def cancel(self) -> ReplicaAssignment:
        """Back to the original replicas: a cancelled move removes what it added."""
        return self.reassign_to(self.original)

    def completed(self) -> ReplicaAssignment:
        """The assignment once the move is done: the target alone."""
        return ReplicaAssignment(self.target)


def check_target(target: Sequence[int], *, original: Iterable[int], registered: Iterable[int]) -> None:
    """INVALID_REPLICA_ASSIGNMENT unless ``target`` is a non-empty list of distinct brokers
    whose replicas being added (not in ``original``) are on registered brokers. As Kafka's
    controller, a replica kept on a broker that is down is allowed: the move waits for it."""
    if not target:
        raise TidelogError("a reassignment needs at least one replica", error=INVALID_REPLICA_ASSIGNMENT)
    if len(set(target)) != len(target):
        raise TidelogError(f"the target replicas {list(target)[:20]} name a broker more than once",
                           error=INVALID_REPLICA_ASSIGNMENT)
    unknown = sorted(set(target) - set(original) - set(registered))
    if unknown:
        raise TidelogError(f"the target replicas add replicas on brokers that are not registered: {unknown[:20]}",
                           error=INVALID_REPLICA_ASSIGNMENT)


class Step(enum.Enum):
    CATCH_UP = "catch-up"  # phase 1: RS written and told; wait for the target to join the ISR
    ELECT = "elect"  # phase 2: leadership moves to a live target replica first
    COMPLETE = "complete"  # phase 2: removed replicas stopped and deleted, target written


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    leader: int = -1  # ELECT: the new leader
    isr: tuple[int, ...] = ()  # ELECT and COMPLETE: the new ISR (without removed replicas)
    waiting_for: tuple[int, ...] = ()  # CATCH_UP: target replicas not in the ISR yet


def next_step(assignment: ReplicaAssignment, leader: int, isr: Sequence[int], live: Iterable[int]) -> Decision:
    """What the controller does next for a moving partition, from its assignment, its
    current leader and ISR (ZooKeeper's) and the live brokers."""
    live = set(live)
    target = assignment.target
    # a replica counts once it is live and in the ISR: a leader may have taken a broker into
    # its ISR just before the broker died, and a move must not complete onto it
    missing = tuple(r for r in target if r not in isr or r not in live)
    if missing:
        return Decision(Step.CATCH_UP, waiting_for=missing)
    new_isr = tuple(r for r in isr if r not in assignment.removing)
    if leader not in target or leader not in live:
        return Decision(Step.ELECT, leader=target[0], isr=new_isr)
    return Decision(Step.COMPLETE, leader=leader, isr=new_isr)


def restate(before: ReplicaAssignment, after: ReplicaAssignment, leader: int, isr: Sequence[int],
            live: Iterable[int]) -> tuple[int, list[int]] | None:
    """The (leader, ISR) written when a move starts, is replaced or is cancelled (``before`` ->
    ``after``): the replicas of ``before`` that ``after`` no longer holds leave the ISR at once,
    and a leader among them hands over to the first live replica of ``after`` in the ISR. None
    if that leaves no leader or an empty ISR: the change is refused (the partition would go
    offline). The state is written even when unchanged: the new leader epoch tells every
    replica of ``after`` (the added ones start fetching)."""
    live = set(live)
    dropped = set(before.replicas) - set(after.replicas)
    new_isr = [r for r in isr if r not in dropped]
    if not new_isr:
        return None
    if leader in dropped:
        leader = next((r for r in after.replicas if r in live and r in new_isr), -1)
        if leader == -1:
            return None
    return leader, new_isr
