"""Replication throttles (Kafka's KIP-73): a reassignment's catching-up replicas copy at a
bounded rate, so a big move does not starve producers.

The rules
---------
* Which replicas: a topic's ``leader.replication.throttled.replicas`` lists the replicas that
  serve a move as its source (``partition:broker``: that broker's copy, when it leads),
  ``follower.replication.throttled.replicas`` the replicas that fetch under a throttle (that
  broker's copy, as a follower), entries separated by commas, or ``*`` for every replica of
  the topic. ``tidelog reassign --execute --throttle`` sets them (the leader list names a
  moving partition's current replicas, the follower list the ones being added) and
  ``--verify`` clears them once the moves are done.
* How fast: a broker's ``leader.replication.throttled.rate`` bounds the bytes per second its
  leaders send to throttled replicas, ``follower.replication.throttled.rate`` the bytes per
  second its fetchers take for them (dynamic broker configs, per broker or the cluster
  default; unset means no bound).
* Replicas that keep up are not held, as in Kafka: a leader holds back only a follower that is
  out of its ISR, and a follower only a partition it lags on (its lag after its last fetch;
  unknown, so held, until its first answer). A listed replica that keeps up copies at full
  speed; a listed in-sync follower that falls behind (one answer cut at the fetch size) waits
  for its own bucket, so keep the rate well above what the topic takes in, and let
  ``--verify`` remove the lists once the moves are done.
* The measure is a token bucket (``ReplicationQuota``): the rate refills it, one second's
  worth at most; the bytes copied drain it. While it is empty the leader answers a throttled
  replica's partition with no records, and the follower leaves it out of its fetches, so
  the replica waits without an error and resumes when the bucket refills.

Nothing here does I/O; time is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ReplicationQuota:
    """One direction's byte-rate bound (the module docstring). ``rate_of`` gives the rate in
    force (bytes/s, None: unbounded), read at each decision so a config change applies at once."""

    rate_of: Callable[[], int | None]
    tokens: float = 0.0
    last_s: float | None = None
    throttled_bytes: int = 0  # bytes copied for throttled replicas, for the metrics
    _rate: int | None = field(default=None, repr=False)

    def _refill(self, now_s: float) -> int | None:
        rate = self.rate_of()
        if rate != self._rate:  # a new rate starts with a full second's worth
            self._rate, self.tokens, self.last_s = rate, float(rate or 0), now_s
        if rate is None:
            return None
        if self.last_s is not None:
            self.tokens = min(float(rate), self.tokens + (now_s - self.last_s) * rate)
        self.last_s = now_s
        return rate

    def exceeded(self, now_s: float, pending: int = 0) -> bool:
        """Whether throttled replicas must wait now, ``pending`` bytes read for them but not
        yet ``record``-ed (the earlier partitions of an answer being built) counted as spent."""
        return self._refill(now_s) is not None and self.tokens - pending <= 0

    def record(self, nbytes: int, now_s: float) -> None:
        """Bytes copied for throttled replicas."""
        self.throttled_bytes += nbytes
        if self._refill(now_s) is not None:
            self.tokens -= nbytes

    @property
    def rate(self) -> int | None:
        return self.rate_of()
