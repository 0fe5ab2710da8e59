"""Topic deletion (Kafka's ZooKeeper-era TopicDeletionManager), as pure decisions.

The rules
---------
* DeleteTopics writes the marker ``/admin/delete_topics/<topic>``. The controller then
  *queues* the topic: it stops managing it (no election, LeaderAndIsr or metadata names it
  again; every broker is told to drop it from its metadata) and sends StopReplica with
  deletion to each replica on a registered broker.
* The topic's znodes (assignment, partition states, config, and last the marker) are removed
  only once every replica has been reported deleted by its broker: a StopReplica answer
  without error for that partition (``deleted_replicas``). Until then the topic is *marked for
  deletion*, and its name cannot be taken again (TOPIC_ALREADY_EXISTS, "marked for
  deletion"): a broker that was down keeps the old log, and if a new topic of the name put a
  replica of the same partition on it, the broker would keep that log and serve its old
  records (the new topic's leader epochs start at 0 again, so the epoch-based truncation
  does not notice).
* A broker that joins (registers, or registers again) is sent StopReplica with deletion for
  its replicas not yet reported deleted. A request dropped (the broker left before it was
  delivered) or answered with an error leaves them for its next registration.
* A controller that takes over queues the marked topics again, every replica not yet deleted
  (deleting a replica twice is harmless), so a deletion survives failovers.

Nothing here does I/O: the controller sends the requests and writes ZooKeeper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import StopReplicaResponse

# Kafka's LeaderAndIsr.EpochDuringDelete: a replica's deletion is not fenced by leader epoch
EPOCH_DURING_DELETE = -2


@dataclass
class TopicDeletion:
    """A topic marked for deletion: per broker, the partitions whose replica on it has not
    been reported deleted yet."""

    undeleted: dict[int, set[int]]

    @classmethod
    def of(cls, assignment: Mapping[int, Iterable[int]]) -> TopicDeletion:
        undeleted: dict[int, set[int]] = {}
        for partition, replicas in assignment.items():
            for broker in replicas:
                undeleted.setdefault(broker, set()).add(partition)
        return cls(undeleted)

    def confirm(self, broker: int, partitions: Iterable[int]) -> None:
        left = self.undeleted.get(broker, set()) - set(partitions)
        if left:
            self.undeleted[broker] = left
        else:
            self.undeleted.pop(broker, None)

    @property
    def complete(self) -> bool:
        return not self.undeleted

    def waiting_for(self, registered: set[int]) -> list[int]:
        """The brokers holding a replica not yet deleted that are not registered."""
        return sorted(b for b in self.undeleted if b not in registered)


def deleted_replicas(response: StopReplicaResponse) -> dict[str, set[int]]:
    """The partitions, by topic, that a StopReplica answer reports deleted (none when the
    request was refused as a whole)."""
    if response.error_code != NONE.code:
        return {}
    out: dict[str, set[int]] = {}
    for e in response.partition_errors:
        if e.error_code == NONE.code:
            out.setdefault(e.topic_name, set()).add(e.partition_index)
    return out
