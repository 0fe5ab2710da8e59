"""Heartbeats, independent of poll, and the timer that decides them.

A background task heartbeats every ``heartbeat_interval_ms`` from the JoinGroup answer on:
while COMPLETING_REBALANCE (the leader may refresh metadata for up to ``request_timeout_ms``
to compute the assignment, longer than a session; REBALANCE_IN_PROGRESS is then ignored, the
SyncGroup's answer decides, as in Kafka), but not while the SyncGroup is in flight (the
coordinator keeps a member awaiting it alive, and a heartbeat's answer would wait behind the
SyncGroup's: responses come in request order), and while STABLE (including after a heartbeat
said REBALANCE_IN_PROGRESS, until poll rejoins: the coordinator waits up to the rebalance
timeout, ``max_poll_interval_ms`` by default). A handler slower than the session timeout
therefore keeps its partitions; one slower than ``max_poll_interval_ms`` does not: the
heartbeat task then leaves the group (``leave_for_poll_timeout``) so the next poll reports
the partitions lost and rejoins. No successful heartbeat for ``session_timeout_ms`` marks
the coordinator unknown. A failed heartbeat (no answer, or a code other than the few the
group protocol names there) is sent again after ``retry_backoff_ms``, doubling while they
fail, as Kafka's ``failHeartbeat``; only a fenced static member or a group the member may not
read is fatal.

Timing decisions live in ``HeartbeatTimer`` (time passed in); what an answer asks for is
``heartbeat_verdict`` (pure); ``Heartbeat`` is the task, and carries verdicts out through
the callbacks given to its constructor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import trio

from tidelog.aio.cluster import Backoff
from tidelog.aio.discovery import CoordinatorLink, GroupRetry
from tidelog.aio.membership import (
    FATAL,
    OK,
    REDISCOVER,
    REJOIN,
    RESET_MEMBER,
    RETRY,
    Membership,
    MemberState,
    heartbeat_action,
)
from tidelog.aio.subscription import ConsumerConfig
from tidelog.errors import TidelogError, broker_error
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import ILLEGAL_GENERATION, for_code
from tidelog.protocol.messages import HeartbeatRequest, HeartbeatResponse

__all__ = ["HeartbeatTimer", "heartbeats_due", "heartbeat_verdict", "Heartbeat"]

log = logging.getLogger(__name__)


class HeartbeatTimer:
    """Kafka's Heartbeat: when to send the next heartbeat, whether the session or the poll
    interval expired. Times are monotonic seconds passed in."""

    def __init__(self, session_timeout_s: float, heartbeat_interval_s: float, max_poll_interval_s: float,
                 now: float):
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.last_sent = -float("inf")
        self.next_due = -float("inf")  # when the next heartbeat is due
        self.last_received = now
        self.last_poll = now
        self.in_flight = False

    def polled(self, now: float) -> None:
        self.last_poll = now

    def sent(self, now: float) -> None:
        self.last_sent = now
        self.next_due = now + self.heartbeat_interval_s
        self.in_flight = True

    def received(self, now: float) -> None:
        self.last_received = now
        self.in_flight = False

    def failed(self, now: float, backoff_s: float) -> None:
        """No answer, or one that is no heartbeat of a live session: the next one is due
        after ``backoff_s``, not a whole interval (Kafka's failHeartbeat)."""
        self.in_flight = False
        self.next_due = now + backoff_s

    def reset_session(self, now: float) -> None:
        """A rebalance completed: the session starts now; the first heartbeat follows an interval."""
        self.last_received = self.last_sent = now
        self.next_due = now + self.heartbeat_interval_s
        self.in_flight = False

    def joined(self, now: float) -> None:
        """JoinGroup answered (Kafka's resetTimeouts when the heartbeat thread is enabled):
        session and poll interval start now; the first heartbeat follows an interval."""
        self.reset_session(now)
        self.last_poll = now

    def coordinator_found(self, now: float) -> None:
        """Kafka's resetSessionTimeout when FindCoordinator answers: the session is judged
        from now, so a member whose coordinator was away longer than the session timeout
        heartbeats the new one (due at once) instead of finding the session expired again and
        dropping the coordinator it just found, which would never let it hear of a rebalance."""
        self.last_received = now

    def time_to_next_heartbeat(self, now: float) -> float:
        if self.in_flight:
            return self.heartbeat_interval_s
        return max(0.0, self.next_due - now)

    def session_expired(self, now: float) -> bool:
        return now - self.last_received > self.session_timeout_s

    def poll_timeout_expired(self, now: float) -> bool:
        return now - self.last_poll > self.max_poll_interval_s

    def time_to_poll_timeout(self, now: float) -> float:
        return max(0.0, self.last_poll + self.max_poll_interval_s - now)


def heartbeats_due(state: MemberState, generation_valid: bool, sync_in_flight: bool) -> bool:
    """Whether the heartbeat task heartbeats: from the JoinGroup answer on (STABLE and
    COMPLETING_REBALANCE, as Kafka's heartbeat thread: the leader computing the assignment may
    take longer than the session timeout), except while the SyncGroup is in flight (the
    coordinator keeps a member awaiting its SyncGroup answer alive, and with responses in
    request order a heartbeat's answer would wait behind the SyncGroup's)."""
    if not generation_valid:
        return False
    if state is MemberState.COMPLETING_REBALANCE:
        return not sync_in_flight
    return state is MemberState.STABLE



def heartbeat_verdict(action: str, state: MemberState) -> str:
    """What a heartbeat's answer for the member's current generation asks: "none",
    "rejoin", "rediscover", "reset" or "fatal". REBALANCE_IN_PROGRESS while completing the
    rebalance is "none": the SyncGroup's answer decides."""
    if action == REJOIN:
        return "rejoin" if state is MemberState.STABLE else "none"
    return {REDISCOVER: "rediscover", RESET_MEMBER: "reset", FATAL: "fatal"}.get(action, "none")


class Heartbeat:
    """The heartbeat task of one member. ``sync_in_flight()`` says a SyncGroup awaits its
    answer; ``request_rejoin(reason)``, ``reset_generation(reason)``, ``on_fatal(error)``
    (raised by the next poll) and ``leave_for_poll_timeout()`` carry out what it finds."""

    def __init__(self, config: ConsumerConfig, link: CoordinatorLink, member: Membership, timer: HeartbeatTimer,
                 *, sync_in_flight: Callable[[], bool], request_rejoin: Callable[[str], None],
                 reset_generation: Callable[..., None], on_fatal: Callable[[TidelogError], None],
                 leave_for_poll_timeout: Callable[[], Awaitable[None]]):
        self._config = config
        self._link = link
        self._member = member
        self._timer = timer
        self._sync_in_flight = sync_in_flight
        self._request_rejoin = request_rejoin
        self._reset_generation = reset_generation
        self._on_fatal = on_fatal
        self._leave_for_poll_timeout = leave_for_poll_timeout
        self._idle_s = config.heartbeat_interval_ms / 1000
        self._backoff_s = config.retry_backoff_ms / 1000
        # after a failed heartbeat: retry_backoff_ms doubling, reset by an answer (Kafka's)
        self._retry = Backoff(self._backoff_s, config.retry_backoff_max_ms / 1000)
        self._wake = trio.Event()

    def wake(self) -> None:
        """Plan again now (the coordinator was found, the session started)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake = trio.Event()
            delay = await self.step(time.monotonic())
            with trio.move_on_after(delay):
                await self._wake.wait()

    async def step(self, now: float) -> float:
        """One round of the heartbeat task; returns how long to sleep."""
        timer, member = self._timer, self._member
        if not heartbeats_due(member.state, member.generation.valid, self._sync_in_flight()):
            return self._idle_s
        if timer.poll_timeout_expired(now):
            await self._leave_for_poll_timeout()
            return self._idle_s
        if not self._link.known:
            await self._link.ensure(trio.current_time() + self._idle_s, raise_errors=False)
            return 0.0 if self._link.known else self._backoff_s
        if timer.session_expired(now):
            self._link.mark_unknown("no heartbeat answered within the session timeout")
            return self._backoff_s
        wait = timer.time_to_next_heartbeat(now)
        if wait > 0:
            return min(wait, timer.time_to_poll_timeout(now) + 0.001)
        wait = await self._send()
        return min(wait, timer.time_to_poll_timeout(time.monotonic()) + 0.001)

    async def _send(self) -> float:
        """Heartbeat and carry out the answer; returns how long until the next heartbeat (an
        interval, or after a failure the backoff)."""
        generation = self._member.generation
        group_id = self._config.group_id
        self._timer.sent(time.monotonic())
        try:
            r: HeartbeatResponse = await self._link.request(
                HeartbeatRequest(group_id, generation.generation_id, generation.member_id,
                                 self._config.group_instance_id),
                ApiKey.HEARTBEAT, self._config.request_timeout_ms / 1000)
        except GroupRetry as e:
            log.debug("group %r: heartbeat failed: %s", group_id, e)
            return self._failed()
        except TidelogError as e:
            # the whole request refused (an error body) or authentication failed: as if that
            # code were answered in the body (for authentication, a failed heartbeat)
            r = HeartbeatResponse(e.code, str(e))
        action = heartbeat_action(r.error_code)
        if action in (OK, REJOIN):
            self._timer.received(time.monotonic())  # the session is alive either way
            self._retry.reset()
            wait = self._idle_s
        else:
            wait = self._failed()
        if action == RETRY:  # never the task's end: the next heartbeat follows the backoff
            log.warning("heartbeat failed: %s", broker_error(r.error_code, f"group {group_id!r} (Heartbeat)",
                                                             r.error_message))
            return wait
        if generation != self._member.generation:
            return wait  # the member rejoined meanwhile: this answer is about the old generation
        verdict = heartbeat_verdict(action, self._member.state)
        if verdict == "none" and action == REJOIN:
            log.debug("group %r: heartbeat answered REBALANCE_IN_PROGRESS while completing the "
                      "rebalance: the SyncGroup's answer decides", group_id)
        self._carry_out(verdict, r)
        return wait

    def _failed(self) -> float:
        """The next heartbeat follows the backoff (Kafka's failHeartbeat), not an interval;
        returns the backoff."""
        backoff = self._retry.next_delay()
        self._timer.failed(time.monotonic(), backoff)
        return backoff

    def _carry_out(self, verdict: str, r: HeartbeatResponse) -> None:
        group_id, name = self._config.group_id, for_code(r.error_code).name
        if verdict == "rejoin":
            self._request_rejoin("the coordinator started a rebalance")
        elif verdict == "rediscover":
            self._link.mark_unknown(f"heartbeat: {name}")
        elif verdict == "reset":  # ILLEGAL_GENERATION: the member id is still the coordinator's
            self._reset_generation(f"heartbeat: {name}", keep_member_id=r.error_code == ILLEGAL_GENERATION.code)
        elif verdict == "fatal":
            error = broker_error(r.error_code, f"group {group_id!r} (Heartbeat)", r.error_message)
            log.error("group %r: heartbeat failed: %s", group_id, error)
            self._reset_generation(f"heartbeat: {name}")
            self._on_fatal(error)  # e.g. FENCED_INSTANCE_ID
