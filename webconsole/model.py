"""What the console shows, decided from what the SDK answered: pure functions and small
value types, no I/O and no clock (``now_ms`` is passed in).

* A partition's replicas on one offset axis (``partition_view``): every replica with its log
  start offset and log end offset (LEO) as its own broker reports them (DescribeLogDirs), the
  partition's high watermark (the leader's), the leader and its epoch, and each replica in
  the ISR or set apart from it. A replica whose broker stopped answering keeps its last known
  figures, marked stale, so a dead follower is seen standing still while the leader moves on;
  one never heard from is drawn as unknown, never as empty. Its lag is the leader's LEO
  minus its own.
* Lists are paged (``page``): a page is at most ``MAX_PAGE_SIZE`` rows, so a cluster of
  10,000 partitions costs the browser one page at a time. A page number past the end answers
  the last page; a bad number is a ``BadRequest`` naming the parameter.
* History is a bounded window (``Window``): samples older than its span, or beyond its count,
  are dropped. Prometheus keeps the long history; the console keeps minutes.
* Rates (``rate``) come from the deltas of counters between two polls; a counter that went
  down (a deleted topic, a truncated log, a restarted broker) yields no rate rather than a
  negative one.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
UNKNOWN = -1


class BadRequest(ValueError):
    """Input the console refuses, with a message naming the problem (HTTP 400)."""


# -- paging -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    number: int  # 1-based
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    def to_json(self, render: Any = None) -> dict:
        items = [render(i) for i in self.items] if render else self.items
        return {"items": items, "page": self.number, "size": self.size, "total": self.total, "pages": self.pages}


def page(items: Sequence[T], number: int = 1, size: int = DEFAULT_PAGE_SIZE) -> Page[T]:
    """Rows ``(number - 1) * size`` to ``number * size`` of ``items``; past the end: the last page."""
    pages = max(1, -(-len(items) // size))
    number = min(max(1, number), pages)
    start = (number - 1) * size
    return Page(list(items[start:start + size]), number, size, len(items))


def int_param(query: Mapping[str, str], name: str, default: int | None, *, minimum: int = 0,
              maximum: int = (1 << 63) - 1) -> int | None:
    """An integer query parameter within ``[minimum, maximum]``; BadRequest naming it otherwise."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not minimum <= value <= maximum:
        raise BadRequest(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def page_params(query: Mapping[str, str]) -> tuple[int, int]:
    number = int_param(query, "page", 1, minimum=1, maximum=1 << 31)
    size = int_param(query, "size", DEFAULT_PAGE_SIZE, minimum=1, maximum=MAX_PAGE_SIZE)
    assert number is not None and size is not None
    return number, size


def matching(names: Iterable[str], query: str | None) -> list[str]:
    """Names containing ``query`` (case-insensitive), sorted; every name when it is empty."""
    q = (query or "").strip().lower()
    return sorted(n for n in names if q in n.lower())


# -- history ----------------------------------------------------------------------------------


class Window:
    """Samples ``(time_ms, value)`` of the last ``span_ms``, at most ``max_points`` of them."""

    def __init__(self, span_ms: int, max_points: int):
        if span_ms <= 0 or max_points <= 0:
            raise ValueError("a window needs a positive span and point count")
        self.span_ms = span_ms
        self._points: deque[tuple[int, float | None]] = deque(maxlen=max_points)

    def add(self, now_ms: int, value: float | None) -> None:
        self._points.append((now_ms, value))
        while self._points and self._points[0][0] < now_ms - self.span_ms:
            self._points.popleft()

    def points(self) -> list[tuple[int, float | None]]:
        return list(self._points)

    def __len__(self) -> int:
        return len(self._points)


def growth(before: tuple[int, dict], after: tuple[int, dict]) -> dict[tuple, float]:
    """Per second between two samples of ``counters`` (webconsole.watch), per rate: the sum of the positive
    growths (times their weight) of the subjects present in both. A rate none of whose
    subjects is in both samples is absent (unknown); a shrinking subject (retention, a
    truncation, an offset reset) adds nothing."""
    dt = after[0] - before[0]
    if dt <= 0:
        return {}
    totals: dict[tuple, float] = {}
    old = before[1]
    for key, (rate_of, value, weight) in after[1].items():
        prior = old.get(key)
        if prior is None:
            continue
        totals[rate_of] = totals.get(rate_of, 0.0) + max(0, value - prior[1]) * weight
    return {k: v * 1000 / dt for k, v in totals.items()}


# -- a partition's replicas -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaView:
    broker: int
    log_start_offset: int  # UNKNOWN when the broker did not answer
    log_end_offset: int
    size: int
    in_isr: bool
    is_leader: bool
    offline: bool
    lag: int | None  # the leader's LEO minus this replica's; None when either is unknown
    stale: bool = False  # its broker did not answer: the figures are the last it gave


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    high_watermark: int
    replicas: list[ReplicaView] = field(default_factory=list)

    @property
    def axis(self) -> tuple[int, int]:
        """The offsets the picture spans: the smallest log start to the largest LEO."""
        starts = [r.log_start_offset for r in self.replicas if r.log_start_offset >= 0]
        ends = [r.log_end_offset for r in self.replicas if r.log_end_offset >= 0]
        if self.high_watermark >= 0:
            ends.append(self.high_watermark)
        if not ends:
            return 0, 0
        return (min(starts) if starts else 0), max(ends)

    @property
    def under_replicated(self) -> bool:
        return sum(r.in_isr for r in self.replicas) < len(self.replicas)

    def to_json(self) -> dict:
        lo, hi = self.axis
        return {"topic": self.topic, "partition": self.partition, "leader": self.leader,
                "leader_epoch": self.leader_epoch, "high_watermark": self.high_watermark,
                "axis": [lo, hi], "under_replicated": self.under_replicated,
                "replicas": [{"broker": r.broker, "log_start_offset": r.log_start_offset,
                              "log_end_offset": r.log_end_offset, "size": r.size, "in_isr": r.in_isr,
                              "is_leader": r.is_leader, "offline": r.offline, "lag": r.lag,
                              "stale": r.stale}
                             for r in self.replicas]}


def partition_view(info: Any, replicas: Mapping[int, Any], stale: Container[int] = ()) -> PartitionView:
    """``info``: the partition's metadata (``PartitionInfo``); ``replicas``: broker -> its
    ``ReplicaInfo`` from DescribeLogDirs; ``stale``: the brokers whose figures are their last
    known ones (they did not answer this time)."""
    leader_replica = replicas.get(info.leader)
    leader_leo = leader_replica.log_end_offset if leader_replica is not None else UNKNOWN
    if leader_replica is not None:
        hw = leader_replica.high_watermark
    else:  # no leader answer: the best known HW of an ISR member
        hw = max((replicas[b].high_watermark for b in info.isr if b in replicas), default=UNKNOWN)
    views = []
    for broker in info.replicas:
        r = replicas.get(broker)
        start, leo, size = (r.log_start_offset, r.log_end_offset, r.size) if r is not None else (UNKNOWN,) * 3
        lag = leader_leo - leo if leader_leo >= 0 and leo >= 0 else None
        views.append(ReplicaView(broker, start, leo, size, broker in info.isr, broker == info.leader,
                                 broker in info.offline, lag, r is not None and broker in stale))
    return PartitionView(info.topic, info.partition, info.leader, info.leader_epoch, hw, views)


# -- what the cluster sums up to --------------------------------------------------------------


def partition_counts(partitions: Iterable[Any]) -> tuple[int, int, int]:
    """(partitions, under-replicated, offline): under-replicated has an ISR smaller than its
    replicas; offline has no leader."""
    total = under = offline = 0
    for p in partitions:
        total += 1
        if p.leader < 0:
            offline += 1
        if len(p.isr) < len(p.replicas):
            under += 1
    return total, under, offline


# -- input ------------------------------------------------------------------------------------

_CONFIG_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,248}$")


def config_changes(body: Any) -> dict[str, str | None]:
    """A config edit's body ``{"set": {key: value}, "delete": [key]}`` as AlterConfigs' map."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with 'set' and/or 'delete'")
    to_set, to_delete = body.get("set") or {}, body.get("delete") or []
    if not isinstance(to_set, dict) or not isinstance(to_delete, list):
        raise BadRequest("'set' must be an object of key to value and 'delete' a list of keys")
    changes: dict[str, str | None] = {}
    for key, value in to_set.items():
        _check_config_key(key)
        if not isinstance(value, (str, int, float, bool)):
            raise BadRequest(f"the value of {key!r} must be a string or a number")
        changes[key] = str(value).lower() if isinstance(value, bool) else str(value)
    for key in to_delete:
        _check_config_key(key)
        changes[key] = None
    if not changes:
        raise BadRequest("nothing to change: give 'set' or 'delete'")
    return changes


def _check_config_key(key: Any) -> None:
    if not isinstance(key, str) or not _CONFIG_KEY.match(key):
        raise BadRequest(f"{str(key)[:60]!r} is not a config name (lowercase letters, digits, '.', '-', '_')")


def preview_text(data: bytes, limit: int) -> tuple[str | None, bool]:
    """(the first ``limit`` bytes of ``data`` as UTF-8 text, whether it was cut): a character
    cut in two at the limit is left out; None when the bytes are not UTF-8."""
    cut = len(data) > limit
    head = data[:limit] if cut else data
    try:
        return head.decode("utf-8"), cut
    except UnicodeDecodeError as e:
        if cut and e.reason == "unexpected end of data" and e.start >= len(head) - 3:
            return decode_text(head[:e.start]), cut
        return None, cut


def decode_text(data: bytes | None) -> str | None:
    """The bytes as UTF-8 text, None when they are not (the page then offers hex)."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
