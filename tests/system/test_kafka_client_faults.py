"""The fault matrix's oracle driven by a third-party Kafka client: confluent-kafka
(librdkafka) produces with acks=all and idempotence on the brokers' Kafka listeners while the
leader of partition 0 is SIGKILLed, again and again; no acknowledged record may be lost (I1)
or appear twice (I4: librdkafka's retries after a failover are deduplicated by the brokers),
the consumers see every record in order, the replicas agree (I2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.harness import Scenario

pytest.importorskip("confluent_kafka")

KILLS = 3
WARMUP_ACKS = 300
BETWEEN_ACKS = 100


def test_leader_sigkill_under_a_confluent_kafka_producer_loses_no_acknowledged_record(tmp_path: Path,
                                                                                        soak: int) -> None:
    with Scenario(tmp_path, "F2 leader hard bounce, confluent-kafka producer", kafka_producer=True,
                  idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(KILLS * soak):
            victim = s.leader_of(0)
            s.note(f"kill {i + 1}: the leader of partition 0 is broker {victim}")
            s.kill(victim)
            s.wait_gone(victim)
            s.note(f"broker {s.leader_of(0, not_in=(victim,))} leads partition 0")
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
            s.start(victim)
            s.wait_isr_full()
        s.heal()
        s.stop_workload()
        report = s.check()
    report.assert_ok()  # I4 included: the producer is idempotent
    assert report.idempotent and report.duplicates == 0, report.summary()
    assert report.acked > WARMUP_ACKS + KILLS * BETWEEN_ACKS
