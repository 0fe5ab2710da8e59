"""Client <-> broker benchmark: produce, bulk produce, consume, end-to-end latency.

One real broker process (``--brokers N`` for more, with ``--replication-factor``, ``--min-isr``
and ``--acks all``) and ZooKeeper from ``broker.devcluster.DevCluster`` in a temporary
directory; the client is this process. 100-byte values, acks=1, the clients' default options
unless given (``--batch-size``, ``--linger-ms``, ``--max-poll-records``, ...). Each run
reports the CPU the client and the broker used, per record.

* produce: ``Producer.send`` per record, then ``flush``.
* bulk: ``Producer.send_many`` with ``--chunk`` values per call, then ``flush``.
* consume: fill the topic (not timed), then one Consumer polls it from the start.
* e2e: a thread sends at ``--rate`` (one ``send`` per record, linger_ms 0 unless
  ``--linger-ms``) while the main thread long-polls a Consumer (fetch_max_wait_ms 500), or
  with ``--consumer-process`` a consumer in a process of its own, as a consuming application
  is; latency is from just before ``send`` to the ``poll`` that returned the record
  (monotonic clock in the value); the first 5 % are dropped. Also reports the produce (send to acknowledgement)
  latency of every 50th record and the number of produce and fetch requests.

    .venv/bin/python bench/cluster_bench.py produce [--records 1000000] [--runs 3]
    .venv/bin/python bench/cluster_bench.py bulk    [--records 3000000]
    .venv/bin/python bench/cluster_bench.py consume [--records 2000000]
    .venv/bin/python bench/cluster_bench.py e2e     [--rate 10000] [--seconds 10]

``--security SASL_SSL`` runs a SASL_SSL cluster (TLS, SCRAM-SHA-512 between brokers and
for the clients, as ``tidelog dev up --security SASL_SSL``).

``--acls N`` (with ``--security SASL_SSL``) turns the ACL authorizer on, loads N ACLs (the
client's own, PREFIXED on ``bench-``, and filler on other topics, prefixes and groups, some
of them Deny) and runs the clients as a user of their own, not the super user.

``--client kafka`` times confluent-kafka (librdkafka) on the brokers' Kafka listeners instead
of the Tidelog SDK on the native ones (produce: ``produce`` per record, ``poll(0)`` every
1,000, then ``flush``; consume: ``consume(500)`` in a loop), with the same acks, linger
(5 ms) and batch size (16 KiB) as the SDK's defaults. ``--fill tidelog|kafka`` chooses who
writes the records a consume run reads (default: the timed client), so a Kafka consumer can
read Tidelog-encoded batches (translated per record) or Kafka-encoded ones (one byte patched
per batch).

``--profile DIR`` records py-spy profiles (raw, 200 Hz) of the broker and of this process
during the last run. Each run uses a fresh topic; the figure reported is the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from tidelog.aio.admin import NewTopic  # noqa: E402
from tidelog.broker.devcluster import DevCluster  # noqa: E402

VALUE_SIZE = 100
PY_SPY = Path(sys.executable).parent / "py-spy"


SECURITY: dict = {}  # the clients' security options (--security)


def load_acls(bootstrap: str, count: int) -> None:
    """As the super user: a user ``bench`` allowed on ``bench-*`` topics and groups, ``count``
    ACLs in all; then the clients run as ``bench``."""
    from tidelog import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    from tidelog.aio.entity_configs import ScramCredentialInfo, UserScramCredentialUpsertion

    def acl(restype, name, pattern, operation, permission="ALLOW", principal="User:bench"):
        return AclBinding(restype, name, pattern, principal, "*", operation, AclPermissionType[permission])

    own = [acl(ResourceType.TOPIC, "bench-", ResourcePatternType.PREFIXED, op)
           for op in (AclOperation.WRITE, AclOperation.READ, AclOperation.DESCRIBE, AclOperation.CREATE)]
    own += [acl(ResourceType.GROUP, "bench-", ResourcePatternType.PREFIXED, AclOperation.READ),
            acl(ResourceType.CLUSTER, "kafka-cluster", ResourcePatternType.LITERAL, AclOperation.IDEMPOTENT_WRITE)]
    filler = []
    for i in range(max(0, count - len(own))):
        kind = i % 4
        if kind == 0:
            filler.append(acl(ResourceType.TOPIC, f"other-{i}", ResourcePatternType.LITERAL, AclOperation.WRITE,
                              principal=f"User:u{i % 37}"))
        elif kind == 1:
            filler.append(acl(ResourceType.TOPIC, f"p{i % 29}-{i}-", ResourcePatternType.PREFIXED, AclOperation.READ,
                              principal=f"User:u{i % 37}"))
        elif kind == 2:
            filler.append(acl(ResourceType.GROUP, f"g-{i}", ResourcePatternType.LITERAL, AclOperation.READ,
                              principal=f"User:u{i % 37}"))
        else:
            filler.append(acl(ResourceType.TOPIC, f"other-{i}", ResourcePatternType.LITERAL, AclOperation.WRITE,
                              "DENY", principal="User:bench"))
    with Admin(bootstrap, **SECURITY) as admin:
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "bench", ScramCredentialInfo("SCRAM-SHA-512"), "bench-secret")])
        bindings = own + filler
        for start in range(0, len(bindings), 200):
            admin.create_acls(bindings[start:start + 200])
    SECURITY.update(sasl_plain_username="bench", sasl_plain_password="bench-secret")


def create_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, min_isr: int = 1) -> None:
    with Admin(bootstrap, **SECURITY) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, config={"min.insync.replicas": str(min_isr)})])
    time.sleep(0.5)  # let the leader settle before timing


class Profiler:
    """py-spy on the broker and on this process while a run lasts."""

    def __init__(self, directory: str | None, broker_pid: int, label: str, seconds: float):
        self.procs = []
        if not directory:
            return
        os.makedirs(directory, exist_ok=True)
        for who, pid in (("broker", broker_pid), ("client", os.getpid())):
            out = os.path.join(directory, f"{label}-{who}.txt")
            self.procs.append(subprocess.Popen(
                [str(PY_SPY), "record", "-p", str(pid), "-f", "raw", "-o", out, "-d", str(int(seconds)),
                 "-r", "200", "--threads"] + (["--idle"] if os.environ.get("PYSPY_IDLE") else []),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # py-spy attaches

    def wait(self) -> None:
        for p in self.procs:
            p.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of a process so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.endswith("ctxt_switches:") or "ctxt_switches" in line:
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


class CpuMeter:
    """CPU use of the client (this process) and the broker over a run, in cores."""

    def __init__(self, broker_pid: int | dict[str, int]):
        brokers = broker_pid if isinstance(broker_pid, dict) else {"broker": broker_pid}
        self.pids = {"client": os.getpid(), **brokers}
        self.start = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self.switches = {k: context_switches(p) for k, p in self.pids.items()}
        self.t0 = time.perf_counter()

    def report(self, records: int = 0) -> str:
        wall = time.perf_counter() - self.t0
        out = []
        for k, p in self.pids.items():
            used = cpu_seconds(p) - self.start[k]
            per = f" = {used / records * 1e6:.2f} us/record" if records else ""
            if records and os.environ.get("BENCH_SWITCHES"):
                per += f", {(context_switches(p) - self.switches[k]) / records:.1f} switches/record"
            out.append(f"{k} {used / wall:.2f} cores{per}")
        return ", ".join(out)


def producer_options(args) -> dict:
    """acks (--acks, default 1) and the producer's defaults (batch_size 16384, linger_ms 5, buffer_memory 32 MiB)
    unless the command line says otherwise."""
    options: dict = dict(acks=args.acks)
    if args.linger_ms is not None:
        options["linger_ms"] = args.linger_ms
    if args.batch_size is not None:
        options["batch_size"] = args.batch_size
        options["max_request_size"] = max(1 << 20, args.batch_size + 1024)
    if args.buffer_memory is not None:
        options["buffer_memory"] = args.buffer_memory
    if args.idempotence != "default":
        options["enable_idempotence"] = args.idempotence == "on"
    return options


def run_produce(bootstrap: str, topic: str, args, bulk: bool) -> float:
    value = os.urandom(VALUE_SIZE)
    n = args.records
    with Producer(bootstrap, **producer_options(args), **SECURITY) as producer:
        producer.send(topic, value).result(30)  # metadata, connection
        sender = producer._aio._sender
        requests = {"n": 0}
        send_request = sender._send

        async def counting_send(*a):
            requests["n"] += 1
            return await send_request(*a)

        sender._send = counting_send
        t0 = time.perf_counter()
        if bulk:
            chunk = [value] * args.chunk
            send_many = producer.send_many
            for _ in range(n // args.chunk):
                send_many(topic, chunk)
        else:
            send = producer.send
            for _ in range(n):
                send(topic, value)
        producer.flush()
        elapsed = time.perf_counter() - t0
    print(f"  {requests['n']} produce requests, {n / max(1, requests['n']):.0f} records per request", flush=True)
    return n / elapsed


def kafka_producer(bootstrap: str, args):
    import confluent_kafka

    acks = {"all": "all", 1: "1", 0: "0"}[args.acks]
    config = {"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5 if args.linger_ms is None else args.linger_ms,
              "batch.size": args.batch_size or 16384, "queue.buffering.max.messages": 1_000_000,
              "enable.idempotence": args.idempotence == "on"}
    return confluent_kafka.Producer(config)


def run_kafka_produce(bootstrap: str, topic: str, args) -> float:
    value = os.urandom(VALUE_SIZE)
    n = args.records
    producer = kafka_producer(bootstrap, args)
    producer.produce(topic, value)
    producer.flush(30)  # metadata, connection
    produce, poll = producer.produce, producer.poll
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:
                poll(0.01)
        if not i % 1000:
            poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    assert left == 0, f"{left} records not delivered"
    return n / elapsed


def run_kafka_consume(bootstrap: str, topic: str, args) -> float:
    import confluent_kafka

    n = args.records
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                         "check.crcs": not args.no_crc})
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(args.partitions)])
    got = 0
    t0 = time.perf_counter()
    while got < n:
        for m in consumer.consume(500, 1.0):
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    return n / elapsed


def fill(bootstrap: str, topic: str, n: int, args) -> None:
    value = os.urandom(VALUE_SIZE)
    with Producer(bootstrap, **producer_options(args), **SECURITY) as producer:
        if hasattr(producer, "send_many"):
            for _ in range(n // 1000):
                producer.send_many(topic, [value] * 1000)
        else:
            for _ in range(n):
                producer.send(topic, value)
        producer.flush()


def run_consume(bootstrap: str, topic: str, args) -> float:
    n = args.records
    with Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=args.max_poll_records, **SECURITY,
                  check_crcs=not args.no_crc) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(args.partitions)])
        got = 0
        t0 = time.perf_counter()
        while got < n:
            got += len(consumer.poll(timeout_ms=1000))
        elapsed = time.perf_counter() - t0
        if os.environ.get("BENCH_THREADS"):
            print("  by thread:", thread_cpu(), flush=True)
    return n / elapsed


def run_e2e(bootstrap: str, topic: str, args, broker_pid) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, achieved rate): latencies from send() to the consumer's poll()."""
    total = int(args.rate * args.seconds)
    pad = b"x" * (VALUE_SIZE - 8)
    with Producer(bootstrap, acks=args.acks, linger_ms=args.linger_ms or 0, **SECURITY,
                  max_in_flight_requests_per_connection=args.max_in_flight) as producer:
        producer.send(topic, b"warm").result(30)
        stats: dict = {}
        done = threading.Event()

        def produce() -> None:
            clock = time.perf_counter_ns
            send = producer.send
            start = clock()
            interval = 1e9 / args.rate
            # kafka-producer-perf-test's ThroughputThrottler sleeps only once it is 2 ms ahead,
            # not before every record (a sleep and wake-up per record costs this process ~25 us
            # of CPU, a quarter of a core at 10,000 records/s); --min-sleep-ms 0: every record
            min_sleep_ns = args.min_sleep_ms * 1e6
            acks = stats["acks"] = []
            for i in range(total):
                target = start + i * interval
                now = clock()
                if target - now > min_sleep_ns:
                    time.sleep((target - now) / 1e9)
                sent = clock()
                future = send(topic, struct.pack(">q", sent) + pad)
                if not i % 50:  # the produce (send to acknowledgement) share of the latency
                    future.add_done_callback(lambda f, sent=sent: acks.append(clock() - sent))
            stats["rate"] = total / ((clock() - start) / 1e9)
            done.set()

        if args.consumer_process:
            latencies = _e2e_with_consumer_process(bootstrap, topic, args, total, produce, stats, broker_pid)
        else:
            latencies = _e2e_with_consumer_thread(bootstrap, topic, args, total, produce, done, stats,
                                                  broker_pid, producer)
    latencies.sort()
    # ignore the first 5%: connection warm-up
    steady = sorted(latencies[len(latencies) // 20:])
    q = lambda f: steady[min(len(steady) - 1, int(f * len(steady)))] / 1e6  # noqa: E731
    acks = sorted(stats["acks"])
    print(f"  {stats['cpu']}; requests: {stats.get('requests', '-')}; produce acks p50 "
          f"{acks[len(acks) // 2] / 1e6:.3f} ms, p99 {acks[int(len(acks) * 0.99)] / 1e6:.3f} ms", flush=True)
    return q(0.5), q(0.99), stats.get("rate", 0.0)


def _open_e2e_consumer(bootstrap: str, topic: str, partitions: int) -> Consumer:
    consumer = Consumer(bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=500, **SECURITY)
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    for p in range(partitions):
        consumer.position(TopicPartition(topic, p))
    return consumer


def _consume_latencies(consumer: Consumer, total: int, finished) -> list[int]:
    """Poll until ``total`` timestamped records arrived or ``finished()`` and nothing came."""
    latencies: list[int] = []
    clock = time.perf_counter_ns
    while len(latencies) < total:
        records = consumer.poll(timeout_ms=2000)
        now = clock()
        if not records and finished():
            break
        for r in records:
            if len(r.value) == VALUE_SIZE:
                latencies.append(now - struct.unpack_from(">q", r.value)[0])
    return latencies


def _e2e_with_consumer_thread(bootstrap, topic, args, total, produce, done, stats, broker_pid, producer):
    with _open_e2e_consumer(bootstrap, topic, args.partitions) as consumer:
        counts = count_requests(producer, consumer)
        cpu = CpuMeter(broker_pid)
        t = threading.Thread(target=produce)
        t.start()
        latencies = _consume_latencies(consumer, total, done.is_set)
        t.join()
        stats["cpu"] = cpu.report(total)
        if os.environ.get("BENCH_THREADS"):
            stats["cpu"] += "; by thread: " + thread_cpu()
        stats["requests"] = dict(counts)
    return latencies


def _e2e_consumer_main(bootstrap: str, topic: str, partitions: int, total: int, conn) -> None:
    """The consumer of ``e2e --consumer-process``: its own process, as a consuming application
    is (perf_counter_ns is CLOCK_MONOTONIC, shared by the processes of one machine)."""
    with _open_e2e_consumer(bootstrap, topic, partitions) as consumer:
        conn.send("ready")
        latencies = _consume_latencies(consumer, total, conn.poll)
    conn.send(latencies)


def _e2e_with_consumer_process(bootstrap, topic, args, total, produce, stats, broker_pid) -> list[int]:
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_e2e_consumer_main, args=(bootstrap, topic, args.partitions, total, child),
                       daemon=True)
    proc.start()
    try:
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError("the e2e consumer process did not start")
        pids = broker_pid if isinstance(broker_pid, dict) else {"broker": broker_pid}
        cpu = CpuMeter({**pids, "consumer": proc.pid})
        produce()
        parent.send("done")
        if not parent.poll(args.seconds + 60):
            raise RuntimeError("the e2e consumer process did not finish")
        latencies = parent.recv()
        stats["cpu"] = cpu.report(total)
        return latencies
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def thread_cpu() -> str:
    """CPU seconds used so far by each live thread of this process, by name."""
    out = []
    for t in threading.enumerate():
        try:
            fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out.append(f"{t.name} {(int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'):.2f}s")
    return ", ".join(out)


def count_requests(producer: Producer, consumer: Consumer) -> dict:
    """Count produce requests and fetches (wrapping the clients' own methods; bench only)."""
    counts = {"produce": 0, "fetch": 0}
    sender, fetcher = producer._aio._sender, consumer._aio._fetcher
    send, fetch = sender._send, fetcher._fetch

    async def counting_send(*a):
        counts["produce"] += 1
        return await send(*a)

    async def counting_fetch(*a):
        counts["fetch"] += 1
        return await fetch(*a)

    sender._send, fetcher._fetch = counting_send, counting_fetch
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["produce", "bulk", "consume", "e2e"])
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--linger-ms", type=int, default=None)
    ap.add_argument("--buffer-memory", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--max-poll-records", type=int, default=500)
    ap.add_argument("--no-crc", action="store_true")
    ap.add_argument("--rate", type=float, default=10000)
    ap.add_argument("--max-in-flight", type=int, default=5, help="e2e: the producer's max in-flight requests")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--min-sleep-ms", type=float, default=2.0,
                    help="e2e: the sender sleeps only when this far ahead of the rate (Kafka's throttler: 2)")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--prof-seconds", type=float, default=5)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--brokers", type=int, default=1, help="broker processes in the cluster")
    ap.add_argument("--security", choices=["PLAINTEXT", "SASL_SSL"], default="PLAINTEXT")
    ap.add_argument("--acls", type=int, default=None, help="with --security SASL_SSL: the authorizer on, N ACLs")
    ap.add_argument("--client", choices=["tidelog", "kafka"], default="tidelog",
                    help="the timed client: the SDK on the native listener, or confluent-kafka on the Kafka listener")
    ap.add_argument("--fill", choices=["tidelog", "kafka"], default=None,
                    help="consume: who writes the records read (default: --client)")
    ap.add_argument("--replication-factor", type=int, default=1)
    ap.add_argument("--min-isr", type=int, default=1, help="the topic's min.insync.replicas")
    ap.add_argument("--acks", default="1", help="1, 0 or all")
    ap.add_argument("--idempotence", choices=["default", "on", "off"], default="default",
                    help="enable_idempotence (default: the producer's, on with acks=all)")
    ap.add_argument("--consumer-process", action="store_true",
                    help="e2e: the consumer in a process of its own (the producer stays in this one)")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="sys.setswitchinterval for this process (the GIL hand-over period)")
    args = ap.parse_args()
    args.acks = args.acks if args.acks == "all" else int(args.acks)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.records is None:
        args.records = {"produce": 1_000_000, "bulk": 3_000_000, "consume": 2_000_000}.get(args.mode, 0)

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        authorizer = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"} if args.acls is not None else {}
        cluster = DevCluster(d, brokers=args.brokers, zk_port=0, base_port=0, security=args.security,
                             extra_config=authorizer, kafka=args.client == "kafka" or args.fill == "kafka")
        try:
            cluster.start()
            SECURITY.update(cluster.client_security().options() if cluster.security else {})
            if args.acls is not None:
                load_acls(cluster.bootstrap, args.acls)
            bootstrap = cluster.bootstrap
            broker_pid = {f"broker{i}": b.proc.pid for i, b in cluster.brokers.items()} \
                if args.brokers > 1 else cluster.brokers[1].proc.pid
            results = []
            for run in range(args.runs):
                topic = f"bench-{args.mode}-{run}"
                create_topic(bootstrap, topic, args.partitions, args.replication_factor, args.min_isr)
                if args.mode == "consume":
                    if (args.fill or args.client) == "kafka":
                        producer = kafka_producer(cluster.kafka_bootstrap, args)
                        value = os.urandom(VALUE_SIZE)
                        for i in range(args.records):
                            while True:
                                try:
                                    producer.produce(topic, value)
                                    break
                                except BufferError:
                                    producer.poll(0.01)
                        assert producer.flush(120) == 0
                    else:
                        fill(bootstrap, topic, args.records, args)
                last = run == args.runs - 1
                prof = Profiler(args.profile if last else None,
                                broker_pid if isinstance(broker_pid, int) else next(iter(broker_pid.values())),
                                args.mode, args.prof_seconds)
                cpu = CpuMeter(broker_pid)
                if args.client == "kafka" and args.mode == "produce":
                    r = run_kafka_produce(cluster.kafka_bootstrap, topic, args)
                    print(f"run {run + 1}: {r:,.0f} records/s ({cpu.report(args.records)})", flush=True)
                elif args.client == "kafka" and args.mode == "consume":
                    r = run_kafka_consume(cluster.kafka_bootstrap, topic, args)
                    print(f"run {run + 1}: {r:,.0f} records/s ({cpu.report(args.records)})", flush=True)
                elif args.mode in ("produce", "bulk"):
                    r = run_produce(bootstrap, topic, args, args.mode == "bulk")
                    print(f"run {run + 1}: {r:,.0f} records/s ({cpu.report(args.records)})", flush=True)
                elif args.mode == "consume":
                    r = run_consume(bootstrap, topic, args)
                    print(f"run {run + 1}: {r:,.0f} records/s ({cpu.report(args.records)})", flush=True)
                else:
                    p50, p99, rate = run_e2e(bootstrap, topic, args, broker_pid)
                    r = (p50, p99)
                    print(f"run {run + 1}: p50 {p50:.3f} ms, p99 {p99:.3f} ms at {rate:,.0f} records/s",
                          flush=True)
                prof.wait()
                results.append(r)
            if args.mode == "e2e":
                p50s = sorted(r[0] for r in results)
                p99s = sorted(r[1] for r in results)
                print(f"median: p50 {statistics.median(p50s):.3f} ms ({', '.join(f'{x:.3f}' for x in p50s)}), "
                      f"p99 {statistics.median(p99s):.3f} ms ({', '.join(f'{x:.3f}' for x in p99s)})")
            else:
                print(f"median: {statistics.median(results):,.0f} records/s "
                      f"({', '.join(f'{x:,.0f}' for x in results)})")
            print("load:", os.getloadavg()[0])
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
