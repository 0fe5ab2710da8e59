"""Leader election rules, as pure functions (Kafka's PartitionLeaderElectionAlgorithms).

Each returns ``(leader, isr)`` for the new state, or ``None`` when no replica may lead (the
partition stays offline). The assignment order is the preference order: the first replica
of the assignment is the *preferred* leader.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple


class Election(NamedTuple):
    leader: int
    isr: list[int]
    unclean: bool = False


def offline_partition_leader(assignment: list[int], isr: Iterable[int], live: set[int],
                             unclean_allowed: bool) -> Election | None:
    """The first live replica, in assignment order, that is in the ISR. With none, and only
    when unclean election is allowed, the first live replica at all (acknowledged records
    it does not have are lost: the caller must report it)."""
    isr = list(isr)  # iterated twice: a one-shot iterable would leave the new ISR empty
    in_isr = set(isr)
    live_isr = [r for r in isr if r in live]
    for r in assignment:
        if r in live and r in in_isr:
            return Election(r, live_isr)
    if unclean_allowed:
        for r in assignment:
            if r in live:
                return Election(r, [r], unclean=True)
    return None


def controlled_shutdown_leader(assignment: list[int], isr: Iterable[int], live: set[int],
                               shutting_down: set[int]) -> Election | None:
    """Move leadership off brokers that are shutting down, to a live ISR member."""
    remaining_isr = [r for r in isr if r not in shutting_down]
    for r in assignment:
        if r in live and r not in shutting_down and r in remaining_isr:
            return Election(r, remaining_isr)
    return None


def without_damaged_replica(assignment: list[int], leader: int, isr: Iterable[int], live: set[int],
                            damaged: int) -> Election | None:
    """Take a replica found damaged on disk out of the ISR, and leadership off it to a live
    in-sync replica. For a follower that is a new state even when it is out of the ISR
    already: written, it moves the leader epoch on, which fences the fetches the replica sent
    before it drops its damaged records and makes a leader's ISR write based on an older
    state fail its version check; so the replica never rejoins the ISR on what it held before.
    None when it leads and no other live replica is in sync (it stays, the only copy of the
    committed records there is), or when it is the last member of the ISR."""
    isr = list(isr)
    if leader == damaged:
        return controlled_shutdown_leader(assignment, isr, live, {damaged})
    rest = [r for r in isr if r != damaged]
    return Election(leader, rest) if rest else None


def preferred_replica_leader(assignment: list[int], isr: Iterable[int], live: set[int]) -> Election | None:
    """The preferred (first assigned) replica, if it is live and in the ISR."""
    isr = list(isr)
    if assignment and assignment[0] in live and assignment[0] in isr:
        return Election(assignment[0], isr)
    return None


def remove_from_isr(leader: int, isr: Iterable[int], gone: set[int]) -> tuple[int, list[int]]:
    """The ISR without ``gone`` brokers; a gone leader becomes -1 (no leader)."""
    new_isr = [r for r in isr if r not in gone]
    return (-1 if leader in gone else leader), new_isr
