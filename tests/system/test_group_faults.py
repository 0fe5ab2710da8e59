"""The consumer-group rows of the fault matrix (docs/reliability.md): F14, and F1/F2/F3 against the
group coordinator's broker, checked by I12 and I13 (``group_harness``, which explains the
oracle) on top of the harness's I1, I2, I3, I4, I5, I11 for the topic the group consumes.

Every scenario runs the harness's 3-broker cluster with a 6-partition topic (RF 3, min ISR 2)
fed by its acks=all idempotent producer, and a group of three ``group_worker`` processes consuming it
at-least-once (commit after processing), with 4 s sessions:

* F14 consumer group churn: members SIGKILLed mid-batch (after processing a batch, before
  committing it) and restarted, one after the other, then two at once; then one member
  SIGSTOPped mid-batch past its session timeout: the coordinator refuses a commit of its
  generation and, resumed, its own pending commit fails with CommitFailedError; a client's
  Produce to ``__consumer_offsets`` is refused with INVALID_TOPIC_EXCEPTION meanwhile.
* The broker that is the group coordinator (leader of the group's ``__consumer_offsets``
  partition) bounced while the group consumes and commits, a member dying mid-batch with it:

  - F2, the leader hard bounce: SIGKILL, restart once its ZooKeeper session expired, 3 times;
  - F3, the controller hard kill: SIGKILL of the broker that is both the controller (holds
    ``/controller``) and the group coordinator, restarted once its session expired; so both
    move at once, the new controller electing the new leader of the group's offsets partition.
    The group id is chosen for it at scenario start (``group_coordinated_by``: the first
    candidate whose coordinator is the controller's broker). Once: after the restart the
    controller and the coordinator are, in general, different brokers;
  - F1's injection, the clean bounce: SIGTERM (controlled shutdown moves the offsets
    partition's leadership away first), restart, 3 times.

  Each time the members find the new coordinator and commit through it, and its OffsetFetch
  returns at least every commit acknowledged before (no acknowledged commit lost); the group
  rebalances on the new coordinator (a member was killed) and resumes at the offsets it
  serves (I13).

Each scenario ends by stopping the producer, letting the group consume and commit everything
(its committed offsets reach the high watermarks), closing the members, then both oracles.
``--soak`` multiplies the kills and bounces (F3's one bounce excepted). Every wait is bounded;
the members and the cluster are killed even when the scenario fails.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.system.group_harness import GROUP_BROKER_CONFIG, GroupWorkload, check_group, group_coordinated_by
from tests.system.harness import Scenario
from tidelog import Producer
from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION
from tidelog.protocol.topics import OFFSETS_TOPIC

PARTITIONS = 6
RATE = 300             # records/s from the harness's producer
KILLS = 3              # F14: members SIGKILLed mid-batch and restarted
COORDINATOR_BOUNCES = 3


def group_scenario(tmp_path: Path, name: str) -> Scenario:
    return Scenario(tmp_path, name, partitions=PARTITIONS, rate=RATE, consumers=0, extra_config=GROUP_BROKER_CONFIG,
                    idempotent=True)


def settle_and_check(s: Scenario, g: GroupWorkload):
    """Heal, stop producing, let the group commit everything, close it, run both oracles."""
    s.heal()
    ends = s.stop_workload()
    g.wait_committed(ends)
    g.finish()
    report = s.check()
    return report, check_group(g, s.final_log, ends, s.name)


def assert_internal_topic_refused(s: Scenario) -> None:
    """A client's Produce to __consumer_offsets fails with INVALID_TOPIC_EXCEPTION."""
    with Producer(s.bootstrap, acks="all", request_timeout_ms=10000, delivery_timeout_ms=30000,
                  client_id="system-probe") as probe:
        err = probe.send(OFFSETS_TOPIC, b"not an offset record", key=b"k", partition=0).exception(40)
    assert err is not None and getattr(err, "error", None) == INVALID_TOPIC_EXCEPTION, \
        f"a produce to {OFFSETS_TOPIC} answered {err!r}"
    assert OFFSETS_TOPIC in str(err), str(err)
    s.note(f"a client's produce to {OFFSETS_TOPIC}: {err.error.name}")


def test_f14_consumer_group_churn(tmp_path: Path, soak: int) -> None:
    with group_scenario(tmp_path, "F14 consumer group churn") as s, GroupWorkload(s, "churn") as g:
        g.wait_balanced()
        g.wait_progress(since=time.time())
        for i in range(KILLS * soak):
            slot = i % len(g.slots)
            g.kill_mid_batch(slot)
            restarted_at = time.time()
            g.restart(slot)
            g.wait_balanced()
            g.wait_progress(since=restarted_at)
        # two of the three die at once, both mid-batch: the survivor takes everything over,
        # then shares it again with their new incarnations
        held = {slot: g.hold(slot) for slot in (0, 1)}
        for slot, h in held.items():
            g.kill_held(slot, h)
        restarted_at = time.time()
        for slot in held:
            g.restart(slot)
        g.wait_balanced()
        g.wait_progress(since=restarted_at)
        g.pause_past_session(0)
        assert_internal_topic_refused(s)
        resumed_at = time.time()
        g.wait_balanced()
        g.wait_progress(since=resumed_at)
        report, group_report = settle_and_check(s, g)
    report.assert_ok()
    group_report.assert_ok()
    assert group_report.kills == KILLS * soak + 2 and group_report.pauses[0]["outcome"] == "commit_failed"


# fault id -> (scenario name, the broker's signal, bounces without --soak)
COORDINATOR_FAULTS = {
    "F2": ("F2 group coordinator hard bounce", "kill", COORDINATOR_BOUNCES),
    "F3": ("F3 controller and group coordinator hard kill", "kill", 1),
    "F1": ("F1 group coordinator controlled shutdown", "stop", COORDINATOR_BOUNCES),
}


@pytest.mark.parametrize("fault", list(COORDINATOR_FAULTS),
                         ids=["F2-coordinator-kill-9", "F3-controller-coordinator-kill-9", "F1-coordinator-sigterm"])
def test_group_coordinator_bounce(tmp_path: Path, soak: int, fault: str) -> None:
    name, how, bounces = COORDINATOR_FAULTS[fault]
    bounces = bounces if fault == "F3" else bounces * soak
    with group_scenario(tmp_path, name) as s:
        group = group_coordinated_by(s, s.controller(), "controller") if fault == "F3" else "bounce"
        with GroupWorkload(s, group) as g:
            generation = g.wait_balanced()
            g.wait_progress(since=time.time())
            for i in range(bounces):
                generation = bounce_coordinator(s, g, i, how, generation, with_controller=fault == "F3")
            report, group_report = settle_and_check(s, g)
    report.assert_ok()
    group_report.assert_ok()
    assert len(group_report.coordinator_checks) == bounces
    assert group_report.kills == bounces


def bounce_coordinator(s: Scenario, g: GroupWorkload, i: int, how: str, generation: int,
                       with_controller: bool) -> int:
    """SIGKILL (``how="kill"``) or SIGTERM the group coordinator's broker, a member dying
    mid-batch with it; check the new coordinator kept every acknowledged commit and the group
    rebalances and commits through it; restart the broker. ``with_controller``: the coordinator
    must also be the controller, and the controller moves too. Returns the new generation."""
    coordinator = g.coordinator()
    slot = i % len(g.slots)
    s.note(f"bounce {i + 1}: broker {coordinator} is the group coordinator")
    if with_controller:
        controller = s.controller()
        assert controller == coordinator, \
            f"broker {controller} is the controller, broker {coordinator} the coordinator of {g.group}"
        s.note(f"broker {controller} is also the controller")
    # a member dies mid-batch with the coordinator, so that the group rebalances on the new
    # coordinator and resumes at the offsets it serves (I13)
    held = g.hold(slot)
    if how == "kill":
        s.kill(coordinator)
    else:
        s.stop(coordinator)
    g.kill_held(slot, held)
    new = g.coordinator(not_in=[coordinator])
    s.note(f"broker {new} is the group coordinator")
    if with_controller:
        s.note(f"broker {s.controller(not_in=[coordinator])} is the controller")
    served = g.kept_acknowledged_commits(new)
    g.restart(slot)
    generation = g.wait_balanced(newer_than=generation)
    g.wait_commits_through(new, served)
    if how == "kill":
        s.wait_gone(coordinator)
    s.start(coordinator)
    s.wait_isr_full()
    return generation
