"""Consumer groups in the fault matrix: member processes, the coordinator's view, and the
oracle of I12 and I13 (docs/reliability.md).

A ``GroupWorkload`` (a context manager, used inside a ``harness.Scenario``) runs ``n`` members
of one group, each a ``group_worker`` process (PR_SET_PDEATHSIG) consuming the scenario's topic
at-least-once and writing every event to a JSON-lines file, one file per *incarnation* (a
member SIGKILLed and restarted is a new incarnation in the same *slot*). It injects the group
faults:

* ``kill_mid_batch(slot)``: the member is told to stop between processing a batch and
  committing it (a control file; it writes ``holding`` and waits), then SIGKILLed there, so
  what it processed last was never committed; ``restart(slot)`` starts a new incarnation;
* ``pause_past_session(slot)``: the same stop, then SIGSTOP for longer than the session
  timeout: the others take its partitions over in a newer generation; a commit with the
  paused member's generation and member id, sent straight to the coordinator, must be refused
  (UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION); then SIGCONT: the member's own pending commit must
  fail with CommitFailedError, never succeed (I12, fencing).

Throughout, a ``CommitSampler`` thread asks the group's coordinator (FindCoordinator, then
OffsetFetch, straight to the brokers, no retries) for the committed offsets a few times a
second. ``kept_acknowledged_commits(broker)`` asks a coordinator for the offsets and compares
them with every commit acknowledged to a member before the question was sent (the coordinator's
broker bounced: no acknowledged commit is lost when the coordinator moves).
``group_coordinated_by(s, broker, prefix)`` picks a group id that a given broker coordinates
(one per ``__consumer_offsets`` partition is asked about), so that a scenario can place the
group on the controller's broker before its members start.

``check_group`` is the oracle, run after the workload settled (every record consumed and
committed) and ``Scenario.check`` read the final log:

* I12 committed offsets are monotonic per partition: the acknowledged commits of every
  incarnation, merged in the order they were acknowledged, never go backwards, nor do the
  coordinator's answers sampled over time. The merge order is sound: a member writes
  ``committed`` as soon as the coordinator answered and before it polls again, and a newer
  generation (the only one whose commits the coordinator accepts next) needs that member's
  next JoinGroup, or its session to expire (a killed or paused member, which writes nothing
  after). In one generation, one member commits a partition (two members with acknowledged
  commits for one partition in one generation would mean the coordinator accepted a commit
  from a member that did not own it there, or assigned a partition twice).
* I13 after each assignment a member's first record of a partition is at the committed offset
  that the coordinator reported to it in ``on_partitions_assigned`` (its log start, 0, when
  nothing was committed); the union of what every incarnation processed covers every offset
  from 0 to the final committed offset of each partition, and the final committed offsets are
  the high watermarks (everything was consumed and committed).
* every record a member processed is in the final log at the same offset with the same value
  (I6, for group members).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from tests.support.cluster import log_tail
from tests.support.waiting import NotYet
from tests.system.harness import ELECTION_TIMEOUT_S, SETTLE_TIMEOUT_S, Scenario, wait_until
from tidelog import TidelogError
from tidelog.broker.groups.group_coordinator import partition_for
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import ILLEGAL_GENERATION, NONE, NOT_COORDINATOR, UNKNOWN_MEMBER_ID, for_code
from tidelog.protocol.messages import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
)
from tidelog.protocol.topics import OFFSETS_TOPIC

ROOT = Path(__file__).resolve().parents[2]

# Broker settings for the group scenarios (on top of harness.SYSTEM_CONFIG): short group
# timers, so that sessions expire and rebalances finish within a bounded scenario.
GROUP_BROKER_CONFIG: dict[str, object] = {
    "group.initial.rebalance.delay.ms": 300,
    "group.min.session.timeout.ms": 1000,
    "offsets.topic.num.partitions": 10,
}
SESSION_TIMEOUT_MS = 4000
MEMBER_OPTIONS: dict[str, Any] = {
    "session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 400, "max_poll_interval_ms": 60000,
    "max_poll_records": 100, "fetch_max_wait_ms": 100, "request_timeout_ms": 8000,
    "default_api_timeout_ms": 30000, "retry_backoff_ms": 100, "process_s": 0.02, "run_s": 600,
}
REBALANCE_TIMEOUT_S = 60.0  # members agree on a new generation (a session expiry included)
FENCED_CODES = (UNKNOWN_MEMBER_ID.code, ILLEGAL_GENERATION.code)


# -- one member process ------------------------------------------------------------------------


class Incarnation:
    """One ``group_worker`` process and its events file."""

    def __init__(self, slot: int, number: int, directory: Path):
        self.slot, self.number = slot, number
        self.name = f"member-{slot}.{number}"
        self.path = directory / f"{self.name}.jsonl"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self._events: list[dict] = []
        self._read_to = 0

    def start(self, bootstrap: str, group: str, topic: str, options: dict[str, Any]) -> None:
        with open(self.path.with_suffix(".log"), "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.system.group_worker", bootstrap, group, topic, str(self.path),
                 json.dumps(options)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def events(self) -> list[dict]:
        """Every complete event line so far (a line torn by SIGKILL is never complete)."""
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self._read_to)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._events += [json.loads(line) for line in data[:end].splitlines() if line]
            self._read_to += end
        return self._events

    def ownership(self) -> tuple[set[int], int | None]:
        """The partitions it holds after its last assignment, and that assignment's generation."""
        owned: set[int] = set()
        generation = None
        for e in self.events():
            if e["e"] == "assigned":
                owned |= set(e["tps"])
                generation = e["generation"][0] if e["generation"] else None
            elif e["e"] in ("revoked", "lost"):
                owned -= set(e["tps"])
        return owned, generation

    def signal(self, sig: signal.Signals) -> None:
        if self.running:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None:
            if self.paused:
                self.signal(signal.SIGCONT)
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.path.with_suffix(".log"), lines)


# -- the coordinator, asked directly -----------------------------------------------------------


def find_coordinator(s: Scenario, broker_id: int, group: str) -> int | None:
    r = FindCoordinatorResponse.from_body(s.ask(broker_id, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(group)))
    return r.node_id if r.error_code == NONE.code else None


def group_coordinated_by(s: Scenario, broker_id: int, prefix: str, candidates: int = 200,
                         timeout: float = ELECTION_TIMEOUT_S) -> str:
    """The first of ``prefix-0``, ``prefix-1``, ... that every running broker says (FindCoordinator)
    is coordinated by ``broker_id``: a group id placed on a ``__consumer_offsets`` partition that
    ``broker_id`` leads. Candidates are tried one per offsets partition (Kafka's placement,
    ``abs(hashCode) % offsets.topic.num.partitions``), so at most that many are asked about. The
    first FindCoordinator creates the topic; until its partitions have leaders the brokers answer
    COORDINATOR_NOT_AVAILABLE and the search starts again, within ``timeout``."""
    offsets_partitions = int(GROUP_BROKER_CONFIG["offsets.topic.num.partitions"])
    names: dict[int, str] = {}  # one candidate per offsets partition
    for i in range(candidates):
        names.setdefault(partition_for(f"{prefix}-{i}", offsets_partitions), f"{prefix}-{i}")
    if len(names) < offsets_partitions:
        raise AssertionError(f"{candidates} candidates {prefix}-N cover only offsets partitions {sorted(names)}")

    def pick():
        for group in names.values():
            named = {b: find_coordinator(s, b, group) for b in s.running}
            if None in named.values() or len(set(named.values())) != 1:
                return NotYet(f"FindCoordinator for {group} answers {named}")
            if set(named.values()) == {broker_id}:
                return group
        raise AssertionError(f"broker {broker_id} leads no partition of {OFFSETS_TOPIC}: no group id coordinated "
                             f"by it among {sorted(names.values())}")
    group = wait_until(pick, timeout, f"a group id {prefix}-N coordinated by broker {broker_id}")
    s.note(f"group {group} (offsets partition {partition_for(group, offsets_partitions)}) is coordinated by "
           f"broker {broker_id}")
    return group


def offset_fetch(s: Scenario, broker_id: int, group: str, topic: str, partitions: int) -> dict[int, int] | NotYet:
    """The committed offsets ``broker_id`` answers for the group (-1: none), or NotYet with the
    error (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...)."""
    r = OffsetFetchResponse.from_body(s.ask(broker_id, ApiKey.OFFSET_FETCH, OffsetFetchRequest(
        group, [OffsetFetchTopic(topic, list(range(partitions)))])))
    codes = [r.error_code] + [p.error_code for t in r.topics for p in t.partitions]
    bad = [c for c in codes if c != NONE.code]
    if bad:
        return NotYet(f"OffsetFetch from broker {broker_id}: {for_code(bad[0]).name}")
    return {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions}


def commit_straight(s: Scenario, broker_id: int, group: str, topic: str, offsets: dict[int, int],
                    generation: int, member_id: str) -> int:
    """An OffsetCommit straight to ``broker_id``: the first partition error code."""
    req = OffsetCommitRequest(group, [OffsetCommitTopic(topic, [OffsetCommitPartition(p, o)
                                                                for p, o in sorted(offsets.items())])],
                              generation, member_id)
    r = OffsetCommitResponse.from_body(s.ask(broker_id, ApiKey.OFFSET_COMMIT, req))
    return next((p.error_code for t in r.topics for p in t.partitions if p.error_code != NONE.code), NONE.code)


@dataclass(frozen=True, slots=True)
class Sample:
    at: float         # time.time() when the OffsetFetch was sent
    broker: int
    offset: int


class CommitSampler:
    """A thread asking the group's coordinator for its committed offsets, ``interval`` apart.
    Only successful answers are kept; questions are sequential, so their order is the
    coordinator's."""

    def __init__(self, s: Scenario, group: str, interval: float = 0.25):
        self.s, self.group, self.interval = s, group, interval
        self.samples: dict[int, list[Sample]] = {p: [] for p in range(s.partitions)}
        self.asked = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="system-commit-sampler", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._sample()
        except BaseException as e:  # noqa: BLE001 -- reported by check_group
            self.error = e

    def _sample(self) -> None:
        running = self.s.running
        if not running:
            return
        try:
            coordinator = find_coordinator(self.s, running[self.asked % len(running)], self.group)
            self.asked += 1
            if coordinator is None or coordinator not in self.s.running:
                return
            at = time.time()
            found = offset_fetch(self.s, coordinator, self.group, self.s.topic, self.s.partitions)
        except (OSError, TidelogError):
            return
        for p, offset in (found or {}).items():
            series = self.samples[p]
            if offset >= 0 and (not series or series[-1].offset != offset or series[-1].broker != coordinator):
                series.append(Sample(at, coordinator, offset))


# -- the workload --------------------------------------------------------------------------------


class GroupWorkload:
    """``members`` group_worker processes in one group over the scenario's topic, and a
    CommitSampler. Always kills what it started on exit."""

    def __init__(self, s: Scenario, group: str, members: int = 3, options: dict[str, Any] | None = None):
        self.s, self.group = s, group
        self.options = {**MEMBER_OPTIONS, **(options or {})}
        self.directory = s.cluster.dir / f"group-{group}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.slots: list[list[Incarnation]] = [[] for _ in range(members)]
        self.sampler = CommitSampler(s, group)
        self.kills = 0
        self.pauses: list[dict] = []          # what pause_past_session saw, for the report
        self.coordinator_checks: list[str] = []
        self.lost_commits: list[str] = []     # acknowledged, then missing from a coordinator
        self.fenced_accepted: list[str] = []  # a commit of a fenced generation accepted

    def __enter__(self) -> Self:
        try:
            for slot in range(len(self.slots)):
                self.restart(slot)
            self.sampler.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._print_diagnosis()
        self.close()

    def _print_diagnosis(self) -> None:
        for inc in self.incarnations:
            print(f"===== {inc.name} ({'running' if inc.running else 'exited'}) last lines =====")
            print(inc.log_tail())
            print(f"last events: {inc.events()[-5:]}")
        try:
            with self.s.admin() as admin:
                (d,) = admin.describe_groups([self.group], timeout_ms=10000)
            print(f"group {self.group}: {d}")
        except Exception as e:  # noqa: BLE001 -- diagnosis only, on the way out
            print(f"<cannot describe group {self.group}: {e!r}>")

    def close(self) -> None:
        self.sampler.stop()
        for inc in self.incarnations:
            inc.kill()

    @property
    def incarnations(self) -> list[Incarnation]:
        return [inc for slot in self.slots for inc in slot]

    def current(self, slot: int) -> Incarnation:
        return self.slots[slot][-1]

    def restart(self, slot: int) -> Incarnation:
        inc = Incarnation(slot, len(self.slots[slot]), self.directory)
        inc.start(self.s.bootstrap, self.group, self.s.topic, self.options)
        self.slots[slot].append(inc)
        self.s.note(f"started group member {inc.name} (pid {inc.proc.pid})")
        return inc

    # -- waiting on the group ------------------------------------------------------------------

    def wait_balanced(self, slots: Iterable[int] | None = None, newer_than: int = -1,
                      timeout: float = REBALANCE_TIMEOUT_S) -> int:
        """Until the current incarnations of ``slots`` (default: all) hold disjoint, non-empty
        assignments of one generation (newer than ``newer_than``) covering every partition.
        Returns the generation."""
        members = [self.current(i) for i in (range(len(self.slots)) if slots is None else slots)]
        every = set(range(self.s.partitions))

        def balanced():
            views = [m.ownership() for m in members]
            owned = [v[0] for v in views]
            generations = {v[1] for v in views}
            if len(generations) != 1 or None in generations or min(generations) <= newer_than:
                return NotYet(f"generations {[v[1] for v in views]}")
            if not all(owned) or sum(map(len, owned)) != len(every) or set().union(*owned) != every:
                return NotYet(f"assignments {owned}")
            return generations.pop()
        generation = wait_until(balanced, timeout, f"group {self.group}: {[m.name for m in members]} share "
                                                   f"every partition in one generation", interval=0.1)
        self.s.note(f"group {self.group}: generation {generation}, "
                    f"{ {m.name: sorted(m.ownership()[0]) for m in members} }")
        return generation

    def acked_commits(self) -> list[tuple[float, str, int | None, int, int]]:
        """Every acknowledged commit: (time, incarnation, generation, partition, offset), in
        the order acknowledged."""
        out = []
        for inc in self.incarnations:
            for e in inc.events():
                if e["e"] == "committed":
                    generation = e["generation"][0] if e["generation"] else None
                    out += [(e["t"], inc.name, generation, int(p), o) for p, o in e["offsets"].items()]
        return sorted(out)

    def wait_progress(self, since: float, timeout: float = ELECTION_TIMEOUT_S) -> None:
        """Until every partition has a commit acknowledged after ``since`` (time.time())."""
        def progressed():
            fresh = {p for t, _, _, p, _ in self.acked_commits() if t > since}
            missing = set(range(self.s.partitions)) - fresh
            return not missing or NotYet(f"no commit acknowledged since on partitions {sorted(missing)}")
        wait_until(progressed, timeout, f"group {self.group}: a commit acknowledged on every partition")

    def wait_event(self, inc: Incarnation, kinds: set[str], after: float, timeout: float) -> dict:
        return wait_until(lambda: next((e for e in inc.events() if e["e"] in kinds and e["t"] > after), None),
                          timeout, f"{inc.name}: one of {sorted(kinds)}", interval=0.02)

    # -- faults ----------------------------------------------------------------------------------

    def hold(self, slot: int, timeout: float = 30.0) -> dict:
        """Stop the member between processing a batch and committing it; its ``holding`` event."""
        inc = self.current(slot)
        since = time.time()
        hold = Path(str(inc.path) + ".hold")
        hold.touch()
        try:
            return self.wait_event(inc, {"holding"}, since, timeout)
        except BaseException:
            hold.unlink(missing_ok=True)
            raise

    def release(self, slot: int) -> None:
        Path(str(self.current(slot).path) + ".hold").unlink(missing_ok=True)

    def kill_mid_batch(self, slot: int) -> dict:
        return self.kill_held(slot, self.hold(slot))

    def kill_held(self, slot: int, held: dict) -> dict:
        """SIGKILL a member that ``hold`` stopped mid-batch."""
        inc = self.current(slot)
        inc.kill()
        self.release(slot)
        self.kills += 1
        self.s.note(f"SIGKILL group member {inc.name} mid-batch: processed, not committed {held['offsets']} "
                    f"(generation {held['generation']})")
        return held

    def pause_past_session(self, slot: int) -> None:
        """SIGSTOP a member mid-batch past its session timeout; check the coordinator fences its
        generation and that its pending commit fails once it is resumed (I12)."""
        inc = self.current(slot)
        held = self.hold(slot)
        generation, member_id = held["generation"]
        inc.signal(signal.SIGSTOP)
        inc.paused = True
        self.release(slot)  # it will commit as soon as it runs again
        self.s.note(f"SIGSTOP group member {inc.name} mid-batch (generation {generation}), "
                    f"pending commit {held['offsets']}")
        others = [i for i in range(len(self.slots)) if i != slot]
        newer = self.wait_balanced(others, newer_than=generation)
        coordinator = self.coordinator()
        offsets = {int(p): o for p, o in held["offsets"].items()}

        def answer():
            code = commit_straight(self.s, coordinator, self.group, self.s.topic, offsets, generation, member_id)
            return NotYet(for_code(code).name) if for_code(code).retriable or code == NOT_COORDINATOR.code else (code,)
        (code,) = wait_until(answer, ELECTION_TIMEOUT_S, "a final answer to the fenced member's commit")
        self.s.note(f"a commit as the paused member (generation {generation}) sent to coordinator {coordinator}: "
                    f"{for_code(code).name}")
        if code not in FENCED_CODES:
            self.fenced_accepted.append(f"coordinator {coordinator} answered {for_code(code).name} to a commit "
                                        f"of generation {generation} (group at {newer}) by {member_id}")
        resumed_at = time.time()
        inc.signal(signal.SIGCONT)
        inc.paused = False
        outcome = self.wait_event(inc, {"committed", "commit_failed", "commit_error"}, resumed_at, 60.0)
        self.s.note(f"SIGCONT {inc.name}: its pending commit -> {outcome['e']} {outcome.get('kind', '')}: "
                    f"{outcome.get('error', '')[:160]}")
        if outcome["e"] != "commit_failed":
            self.fenced_accepted.append(f"{inc.name}, resumed after its session expired: {outcome}")
        self.pauses.append({"member": inc.name, "generation": generation, "group_generation": newer,
                            "probe": for_code(code).name, "outcome": outcome["e"]})

    # -- the coordinator -------------------------------------------------------------------------

    def coordinator(self, not_in: Iterable[int] = (), timeout: float = ELECTION_TIMEOUT_S) -> int:
        """The group's coordinator once every running broker names the same running broker
        (not one of ``not_in``)."""
        excluded = set(not_in)

        def agreed():
            named = {b: find_coordinator(self.s, b, self.group) for b in self.s.running}
            values = set(named.values())
            if len(values) != 1 or (c := values.pop()) not in self.s.running or c in excluded:
                return NotYet(f"FindCoordinator answers {named}")
            return c
        return wait_until(agreed, timeout, f"the coordinator of {self.group} (not {sorted(excluded)})")

    def kept_acknowledged_commits(self, broker_id: int, timeout: float = ELECTION_TIMEOUT_S) -> dict[int, int]:
        """``broker_id`` (a new coordinator) answers OffsetFetch with at least every commit
        acknowledged to a member before the question was sent. Returns its answer."""
        def fetch():
            acked: dict[int, int] = {}
            for _, _, _, p, o in self.acked_commits():  # read before the question is sent
                acked[p] = max(o, acked.get(p, -1))
            found = offset_fetch(self.s, broker_id, self.group, self.s.topic, self.s.partitions)
            return found and (acked, found)
        acked, found = wait_until(fetch, timeout, f"broker {broker_id} answering OffsetFetch for {self.group}")
        behind = {p: (o, found.get(p, -1)) for p, o in acked.items() if found.get(p, -1) < o}
        self.coordinator_checks.append(f"broker {broker_id}: acknowledged {dict(sorted(acked.items()))}, "
                                       f"fetched {dict(sorted(found.items()))}")
        self.s.note(f"new coordinator {broker_id}: OffsetFetch {dict(sorted(found.items()))} >= acknowledged "
                    f"{dict(sorted(acked.items()))}: {not behind}")
        if behind:
            self.lost_commits.append(f"broker {broker_id} lost acknowledged commits (acked, fetched): {behind}")
        return found

    def wait_commits_through(self, broker_id: int, baseline: dict[int, int],
                             timeout: float = ELECTION_TIMEOUT_S) -> None:
        """Until ``broker_id``'s OffsetFetch is past ``baseline`` on every partition: the
        members found it and commit through it."""
        def advanced():
            found = offset_fetch(self.s, broker_id, self.group, self.s.topic, self.s.partitions)
            stuck = found and sorted(p for p, o in baseline.items() if found.get(p, -1) <= o)
            return found and (not stuck or NotYet(f"no new commit on partitions {stuck}: {found}"))
        wait_until(advanced, timeout, f"commits of {self.group} through broker {broker_id}")
        self.s.note(f"group {self.group} commits through broker {broker_id}")

    def wait_committed(self, ends: dict[int, int], timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Until the coordinator's committed offsets are ``ends`` (everything consumed)."""
        def done():
            found = offset_fetch(self.s, self.coordinator(timeout=10), self.group, self.s.topic, self.s.partitions)
            return found and (found == ends or NotYet(f"committed {found}"))
        wait_until(done, timeout, f"group {self.group} to commit {ends}", interval=0.5)
        self.s.note(f"group {self.group} committed {ends}")

    def finish(self, timeout: float = 30.0) -> None:
        """Close every member cleanly (a stop file), kill what does not exit; stop sampling."""
        self.sampler.stop()
        live = [inc for inc in self.incarnations if inc.running]
        for inc in live:
            Path(str(inc.path) + ".stop").touch()
        deadline = time.monotonic() + timeout
        for inc in live:
            try:
                inc.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                inc.kill()
        self.s.note(f"group members stopped: {[inc.name for inc in live]}")


# -- the oracle ----------------------------------------------------------------------------------


@dataclass
class GroupReport:
    EXAMPLES = 5

    name: str
    incarnations: int = 0
    kills: int = 0
    pauses: list = field(default_factory=list)
    records_processed: int = 0
    commits_acked: int = 0
    commits_failed: dict = field(default_factory=dict)
    samples: int = 0
    resumes_checked: int = 0
    resumes_unchecked: int = 0  # the committed offsets could not be asked in on_partitions_assigned
    final_committed: dict = field(default_factory=dict)
    coordinator_checks: list = field(default_factory=list)
    # violations
    backwards: list = field(default_factory=list)         # I12: acknowledged commits went back
    sampled_backwards: list = field(default_factory=list)  # I12: the coordinator's answers went back
    shared: list = field(default_factory=list)            # I12: two committers of a partition in one generation
    fenced_accepted: list = field(default_factory=list)   # I12: a fenced generation's commit accepted
    lost_commits: list = field(default_factory=list)      # an acknowledged commit missing after failover
    wrong_resume: list = field(default_factory=list)      # I13: first record after assignment not the committed one
    gaps: list = field(default_factory=list)              # I13: offsets below the final commit nobody processed
    phantom: list = field(default_factory=list)           # processed, not in the final log
    not_committed: list = field(default_factory=list)     # final committed offsets are not the HWs

    COUNTS = ("backwards", "sampled_backwards", "shared", "fenced_accepted", "lost_commits", "wrong_resume", "gaps",
              "phantom", "not_committed")

    def violations(self) -> dict[str, int]:
        return {k: len(getattr(self, k)) for k in self.COUNTS if getattr(self, k)}

    def summary(self) -> str:
        lines = [f"== {self.name} (group): {self.incarnations} member incarnations, {self.kills} SIGKILLed mid-batch, "
                 f"pauses {self.pauses}, {self.records_processed} records processed, {self.commits_acked} commits "
                 f"acknowledged, failed {self.commits_failed}, {self.samples} coordinator samples, "
                 f"{self.resumes_checked} resumes checked ({self.resumes_unchecked} unchecked), final committed "
                 f"{self.final_committed}",
                 "   " + ", ".join(f"{k} {len(getattr(self, k))}" for k in self.COUNTS)]
        lines += [f"   coordinator check: {c}" for c in self.coordinator_checks]
        for k in self.COUNTS:
            lines += [f"   {k}: {x}" for x in getattr(self, k)[:self.EXAMPLES]]
        return "\n".join(lines)

    def assert_ok(self) -> None:
        print(self.summary())
        bad = self.violations()
        assert not bad, f"group invariants violated: {bad}\n{self.summary()}"
        assert self.commits_acked > 0 and self.resumes_checked > 0, f"the group did nothing\n{self.summary()}"


def check_group(g: GroupWorkload, final_log: dict[int, dict[int, bytes | None]], ends: dict[int, int],
                name: str) -> GroupReport:
    """The oracle of I12 and I13 over every incarnation's events, the coordinator's samples and
    the final log (``Scenario.check``'s ``final_log``; ``ends``: the high watermarks)."""
    report = GroupReport(name, incarnations=len(g.incarnations), kills=g.kills, pauses=list(g.pauses),
                         coordinator_checks=list(g.coordinator_checks), lost_commits=list(g.lost_commits),
                         fenced_accepted=list(g.fenced_accepted))
    if g.sampler.error is not None:
        raise AssertionError(f"the commit sampler failed: {g.sampler.error!r}") from g.sampler.error
    acked = g.acked_commits()
    report.commits_acked = len(acked)
    check_commits_monotonic(acked, report)
    check_sampled_monotonic(g.sampler.samples, report)
    check_one_committer(acked, report)
    processed: dict[int, set[int]] = {p: set() for p in ends}
    failed: Counter = Counter()
    for inc in g.incarnations:
        events = inc.events()
        failed.update(e.get("kind", e["e"]) for e in events if e["e"] in ("commit_failed", "commit_error"))
        check_resumes(inc.name, events, report)
        for e in events:
            if e["e"] == "records":
                check_records(inc.name, e, final_log, processed, report)
    report.commits_failed = dict(failed)
    final = {p: max([o for _, _, _, q, o in acked if q == p], default=0) for p in ends}
    samples = g.sampler.samples
    report.samples = sum(len(v) for v in samples.values())
    report.final_committed = final
    check_coverage(processed, final, ends, report)
    return report


def check_coverage(processed: dict[int, set[int]], final: dict[int, int], ends: dict[int, int],
                   report: GroupReport) -> None:
    """I13 over the whole run: every offset below the final committed one was processed by
    some incarnation, and the final committed offsets are the high watermarks."""
    for p, end in ends.items():
        if final[p] != end:
            report.not_committed.append(f"partition {p}: last acknowledged commit {final[p]}, HW {end}")
        missing = sorted(set(range(final[p])) - processed[p])
        if missing:
            report.gaps.append(f"partition {p}: {len(missing)} offsets below the committed {final[p]} never "
                               f"processed, first {missing[:10]}")


def check_commits_monotonic(acked: list[tuple[float, str, int | None, int, int]], report: GroupReport) -> None:
    last: dict[int, tuple[int, str, float]] = {}
    for t, who, _generation, p, offset in acked:
        if p in last and offset < last[p][0]:
            report.backwards.append(f"partition {p}: {who} committed {offset} at {t:.3f} after {last[p][1]} "
                                    f"committed {last[p][0]} at {last[p][2]:.3f}")
        if p not in last or offset >= last[p][0]:
            last[p] = (offset, who, t)


def check_sampled_monotonic(samples: dict[int, list[Sample]], report: GroupReport) -> None:
    for p, series in samples.items():
        for a, b in zip(series, series[1:]):
            if b.offset < a.offset:
                report.sampled_backwards.append(f"partition {p}: coordinator {a.broker} answered {a.offset}, then "
                                                f"coordinator {b.broker} {b.offset} ({b.at - a.at:.2f} s later)")


def check_one_committer(acked: list[tuple[float, str, int | None, int, int]], report: GroupReport) -> None:
    committers: dict[tuple[int | None, int], set[str]] = {}
    for _, who, generation, p, _ in acked:
        committers.setdefault((generation, p), set()).add(who)
    for (generation, p), who in sorted(committers.items(), key=str):
        if len(who) > 1:
            report.shared.append(f"partition {p}, generation {generation}: commits acknowledged to {sorted(who)}")


def check_resumes(name: str, events: list[dict], report: GroupReport) -> None:
    """I13: after each assignment, the first record of each partition is at the committed offset
    the coordinator reported then (0 when none)."""
    expected: dict[int, int] = {}
    for e in events:
        if e["e"] == "assigned":
            for p in e["tps"]:
                if e["committed_error"] is not None:
                    report.resumes_unchecked += 1
                    expected.pop(p, None)
                else:
                    c = e["committed"].get(str(p))
                    expected[p] = c if c is not None and c >= 0 else 0  # nothing committed: the log start
        elif e["e"] in ("revoked", "lost"):
            for p in e["tps"]:
                expected.pop(p, None)
        elif e["e"] == "records" and e["p"] in expected:
            want = expected.pop(e["p"])
            report.resumes_checked += 1
            if e["offsets"][0] != want:
                report.wrong_resume.append(f"{name}: partition {e['p']} resumed at {e['offsets'][0]}, "
                                           f"the committed offset was {want}")


def check_records(name: str, e: dict, final_log: dict[int, dict[int, bytes | None]],
                  processed: dict[int, set[int]], report: GroupReport) -> None:
    p = e["p"]
    report.records_processed += len(e["offsets"])
    processed[p].update(e["offsets"])
    for offset, value in zip(e["offsets"], e["values"]):
        found = final_log.get(p, {}).get(offset, b"<missing>")
        if found != (value.encode() if value is not None else None):
            report.phantom.append(f"{name}: partition {p} offset {offset}: processed {value!r}, final log {found!r}")
