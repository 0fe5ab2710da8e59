"""Authorization on the produce path: 1,000 ACLs loaded against no authorizer, in one process.

    .venv/bin/python bench/authorizer_bench.py [--rounds 7] [--produces 5000]

1. The decision alone: ``Authorizer.authorize`` (what the handlers call) for a producer's
   Write on its topic, remembered (the steady state) and computed (the first request after any ACL change), with 1,000 ACLs
   of 1,000 principals loaded: 500 LITERAL topic ACLs, 300 PREFIXED topic ACLs of 30 prefix
   lengths, 150 group ACLs, 50 Deny entries; the producer's own ACL is a PREFIXED one, so a
   computed decision walks every prefix length.
2. The produce handler: ``Apis.produce`` (acks=1, a real ReplicaManager and LogManager in a
   temporary directory, the append included) of a 1-record batch (~170 bytes: the worst case for
   the relative cost) and of a 16 KiB batch, from a SASL-authenticated client context, with no
   authorizer, with the authorizer and 1,000 ACLs, and with the authorizer whose remembered
   decisions are dropped before every request (as after an ACL change). The modes run
   interleaved, each round starting with another mode, ``--rounds`` times; each round times
   ``--produces`` produces. Reported: the median and the fastest round's microseconds per
   produce, each with its cost over "no authorizer" (on a machine shared with other work the
   fastest round is the steadier measure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from tidelog.broker.apis import Apis
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import RequestContext
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.security.authorizer import Authorizer
from tidelog.protocol.acls import AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.messages import (
    LeaderAndIsrRequest,
    LiveBroker,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    TopicProduceData,
    UpdateMetadataRequest,
)
from tidelog.protocol.records import build_batch

TOPIC = "payments-eu-orders"
PRINCIPAL = "User:producer-7"
CTX = RequestContext(RequestHeader(ApiKey.PRODUCE, 0, 1, "bench"), "10.0.0.7:51515", "CLIENT", PRINCIPAL,
                     "SASL_PLAINTEXT", False, host="10.0.0.7")  # as the network layer builds it
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED


def thousand_acls() -> Authorizer:
    a = Authorizer({"User:admin"})
    acls: dict = {}

    def add(rtype, name, ptype, principal, op, perm=ALLOW):
        acls.setdefault((rtype, name, ptype), set()).add((principal, "*", op, perm))

    for i in range(500):
        add(ResourceType.TOPIC, f"topic-{i}", LIT, f"User:app-{i}", AclOperation.WRITE)
    for i in range(300):  # 30 prefix lengths
        add(ResourceType.TOPIC, f"p{'x' * (i % 30)}-{i}-", PRE, f"User:team-{i}", AclOperation.READ)
    for i in range(150):
        add(ResourceType.GROUP, f"group-{i}", LIT, f"User:app-{i}", AclOperation.READ)
    for i in range(49):
        add(ResourceType.TOPIC, f"topic-{i}", LIT, f"User:app-{i + 1}", AclOperation.WRITE, DENY)
    add(ResourceType.TOPIC, "payments-", PRE, PRINCIPAL, AclOperation.WRITE)  # the producer's: 1,000th
    for pattern, entries in acls.items():
        a.set_acls(*pattern, frozenset(entries))
    assert len(a.acls) == 1000, len(a.acls)
    return a


def decision_times(a: Authorizer, n: int = 200_000) -> tuple[float, float]:
    """``authorize`` (what the handlers call), remembered and computed, in seconds."""
    authorize, peer, write, topic = a.authorize, CTX.peer_host, AclOperation.WRITE, ResourceType.TOPIC
    t0 = time.perf_counter()
    for _ in range(n):
        authorize(PRINCIPAL, peer, write, topic, TOPIC)
    cached = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n // 10):
        forget(a)
        authorize(PRINCIPAL, peer, write, topic, TOPIC)
    computed = (time.perf_counter() - t0) / (n // 10)
    assert authorize(PRINCIPAL, peer, write, topic, TOPIC)
    return cached, computed


def forget(a: Authorizer) -> None:
    """What an ACL change does to the remembered decisions."""
    a._decisions.clear()


class _State:
    broker_epoch = 1
    log_defaults = LogConfig()
    topic_overrides: dict = {}

    def update_topic_overrides(self, configs) -> None:
        pass

    def metadata_updated(self) -> None:
        pass


def broker(directory: str, authorizer: Authorizer | None) -> tuple[Apis, LogManager]:
    logs = LogManager([directory], LogConfig(), broker_id=1)
    logs.startup()
    rm = ReplicaManager(ReplicaConfig(1), logs, lambda t: LogConfig(), lambda leader, fetcher=0: None)
    states = [PartitionState(TOPIC, 0, 1, 1, 0, [1], 0, [1])]
    rm.become_leader_or_follower(LeaderAndIsrRequest(1, 1, 1, states))
    metadata = MetadataCache(1)
    metadata.update(UpdateMetadataRequest(1, 1, 1, states, [LiveBroker(1, "h", 1)]))
    apis = Apis(BrokerConfig(broker_id=1, zookeeper_connect="127.0.0.1:1"), rm, metadata, broker=_State(),
                authorizer=authorizer, broker_principals=frozenset({"User:admin"}))
    return apis, logs


def produce_time(apis: Apis, request: ProduceRequest, n: int, forget_in: Authorizer | None) -> float:
    produce = apis.produce
    t0 = time.perf_counter()
    if forget_in is None:
        for _ in range(n):
            produce(request, CTX)
    else:
        for _ in range(n):
            forget(forget_in)
            produce(request, CTX)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--produces", type=int, default=5000)
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cpus: {os.cpu_count()}")

    cached, computed = decision_times(thousand_acls())
    print(f"decision with 1,000 ACLs: remembered {cached * 1e9:.0f} ns, computed {computed * 1e9:.0f} ns")

    sizes = {"1 record (~170 B)": build_batch([b"v" * 100]), "16 KiB batch": build_batch([b"v" * 100] * 148)}
    with tempfile.TemporaryDirectory() as d:
        for label, batch in sizes.items():
            request = ProduceRequest(1, 30000, [TopicProduceData(TOPIC, [PartitionProduceData(0, batch)])])
            authorizer, cold = thousand_acls(), thousand_acls()
            modes = {"no authorizer": (broker(os.path.join(d, f"{label}-none"), None), None),
                     "1,000 ACLs": (broker(os.path.join(d, f"{label}-acls"), authorizer), None),
                     "1,000 ACLs, decisions dropped each request": (
                         broker(os.path.join(d, f"{label}-cold"), cold), cold)}
            for (apis, _), _ in modes.values():  # warm up
                produce_time(apis, request, 200, None)
            times: dict[str, list[float]] = {m: [] for m in modes}
            order = list(modes)
            for r in range(args.rounds):  # each round starts with another mode
                for mode in order[r % 3:] + order[:r % 3]:
                    (apis, _), forget = modes[mode]
                    times[mode].append(produce_time(apis, request, args.produces, forget))
            base, fastest = statistics.median(times["no authorizer"]), min(times["no authorizer"])
            print(f"\nApis.produce, acks=1, {label}: {args.rounds} rounds of {args.produces}, us per produce")
            for mode, samples in times.items():
                m, f = statistics.median(samples), min(samples)
                print(f"  {mode:45s} median {m * 1e6:7.2f} ({100 * (m - base) / base:+5.1f} %)   "
                      f"fastest {f * 1e6:7.2f} ({100 * (f - fastest) / fastest:+5.1f} %)")
            for (apis, logs), _ in modes.values():
                logs.shutdown()
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
