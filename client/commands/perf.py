"""``tidelog perf``: produce, consume and e2e benchmarks (kafka-producer-perf-test,
kafka-consumer-perf-test and Kafka's EndToEndLatency). ``tidelog.perf`` measures; this module
builds the clients from the options, prints a progress line every 5 s on stderr, and then
kafka-producer-perf-test's summary line (or ``--json``) on stdout, in the words of what each
benchmark measured (``WORDS``): records sent and their acknowledgement latency, records
consumed and the poll wait, records received and their end-to-end latency.

Exit status 1 when a record failed or fewer records than ``--num-records`` completed before
the timeout (the summary is printed first).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tidelog.commands.common import (
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    check_cluster,
    client_options,
    connection_options,
    kafka_options,
    key_value,
    run_command,
)

if TYPE_CHECKING:
    from tidelog.perf import PerfResult, Window

__all__ = ["progress_line", "register", "result_json", "run", "summary_line"]


def register(commands: Any) -> None:
    add_command(commands, "perf", "producer, consumer and end-to-end benchmarks (like kafka-*-perf-test)",
                "perf produce|consume|e2e: progress every 5 s on stderr, then kafka-producer-perf-test's "
                "summary line (or --json) on stdout.", arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help, description=help)
        client_options(a)
        a.add_argument("--topic", required=True)
        a.add_argument("--num-records", type=int, required=True)
        a.add_argument("--json", action="store_true", help="print the result as one JSON object (with the "
                                                           "latency histogram)")
        a.add_argument("--histogram", action="store_true",
                       help="print the latency histogram after the summary: log-linear buckets "
                            "(HdrHistogram's), each bound within 6.25 %% of what it counts")
        return a

    props = {"type": key_value, "nargs": "+", "default": [], "metavar": "KEY=VALUE"}
    a = action("produce", "like kafka-producer-perf-test: send records, report throughput and latency")
    a.add_argument("--record-size", type=int, required=True, help="bytes per record")
    a.add_argument("--throughput", type=float, required=True, help="records/sec at most; -1: no limit")
    a.add_argument("--producer-props", **props, help="producer settings by Kafka's names (acks, linger.ms, ...)")
    a.add_argument("--bulk", type=int, nargs="?", const=1000, default=0, metavar="N",
                   help="send N records per Producer.send_many call (default N: 1000)")
    a = action("consume", "like kafka-consumer-perf-test: read records from the beginning (latency: "
                          "how long the poll that returned each record waited)")
    a.add_argument("--consumer-props", **props, help="consumer settings by Kafka's names")
    a.add_argument("--timeout-ms", type=int, default=10000, help="give up after this long without records")
    a = action("e2e", "like Kafka's EndToEndLatency: produce-to-consume latency, one record at a time "
                      "(or up to --in-flight records awaiting acknowledgement, for a latency at a rate)")
    a.add_argument("--record-size", type=int, default=100)
    a.add_argument("--throughput", type=float, default=-1, help="records/sec at most (default -1: no limit)")
    a.add_argument("--in-flight", type=int, default=1, metavar="N",
                   help="records sent before waiting for the oldest one's acknowledgement (default 1: "
                        "one at a time, as EndToEndLatency; with --throughput 10000 and N 1000, the "
                        "latency at 10,000 records/s)")
    a.add_argument("--producer-props", **props, help="producer settings (default acks=1, linger.ms=0)")
    a.add_argument("--consumer-props", **props, help="consumer settings")
    a.add_argument("--timeout-ms", type=int, default=10000,
                   help="give up waiting for records after this long without any")


def run(args: argparse.Namespace) -> int:
    return run_command(f"perf {args.action}", _ACTIONS[args.action], args)


# -- output -----------------------------------------------------------------------------------


# What each benchmark measured, in its lines: (the records counted, what the latency is).
# produce keeps kafka-producer-perf-test's words; consume counts records received and times
# each poll that returned them (the wait a consumer sees); e2e times each record from its
# send to its receipt (Kafka's EndToEndLatency).
WORDS = {"produce": ("records sent", "latency"), "consume": ("records consumed", "poll wait"),
         "e2e": ("records received", "end-to-end latency")}


def summary_line(result: PerfResult, action: str = "produce") -> str:
    """kafka-producer-perf-test's final line, in the words of what ``action`` measured."""
    counted, latency = WORDS[action]
    lat = result.latency()
    return (f"{result.records} {counted}, {result.records_per_sec:.2f} records/sec "
            f"({result.mb_per_sec:.2f} MB/sec), {lat.avg:.2f} ms avg {latency}, {lat.max:.2f} ms max {latency}, "
            f"{lat.p50:.2f} ms 50th, {lat.p95:.2f} ms 95th, {lat.p99:.2f} ms 99th, {lat.p999:.2f} ms 99.9th.")


def progress_line(window: Window, action: str = "produce") -> str:
    """kafka-producer-perf-test's progress line (one per reporting window)."""
    counted, latency = WORDS[action]
    return (f"{window.records} {counted}, {window.records_per_sec:.1f} records/sec "
            f"({window.mb_per_sec:.2f} MB/sec), {window.avg_ms:.1f} ms avg {latency}, "
            f"{window.max_ms:.1f} ms max {latency}.")


def result_json(result: PerfResult) -> dict[str, Any]:
    lat = result.latency()
    return {"records": result.records, "records_per_sec": round(result.records_per_sec, 3),
            "mb_per_sec": round(result.mb_per_sec, 6),
            "latency_ms": {"avg": round(lat.avg, 3), "max": round(lat.max, 3), "p50": round(lat.p50, 3),
                           "p95": round(lat.p95, 3), "p99": round(lat.p99, 3), "p999": round(lat.p999, 3)},
            "latency_histogram_ms": [{"le": round(upper, 6), "count": n} for upper, n in result.histogram().buckets]}


def _progress(action: str) -> Any:
    def show(window: Window) -> None:
        print(progress_line(window, action), file=sys.stderr, flush=True)
    return show


def _report(result: PerfResult, args: argparse.Namespace, noun: str) -> int:
    import json

    if args.json:
        print(json.dumps(result_json(result)), flush=True)
    else:
        print(summary_line(result, args.action), flush=True)
        if getattr(args, "histogram", False) and result.records:
            print(f"{WORDS[args.action][1]} histogram (upper bound, records, share, cumulative):", flush=True)
            print("\n".join(result.histogram().lines()), flush=True)
    if result.failed:
        raise CommandError(f"{result.failed} of {result.expected} records failed; first error: "
                           f"{result.first_error}")
    if result.records < result.expected:
        raise CommandError(f"only {result.records} of {result.expected} records {noun} "
                           f"before the timeout")
    return EXIT_OK


# -- the benchmarks ---------------------------------------------------------------------------


def _check_args(args: argparse.Namespace) -> None:
    if args.num_records <= 0:
        raise UsageError("--num-records must be positive")
    if getattr(args, "throughput", -1) == 0:
        raise UsageError("--throughput must be positive, or -1 for no limit")
    if getattr(args, "in_flight", 1) <= 0:
        raise UsageError("--in-flight must be positive")
    if getattr(args, "record_size", 1) <= 0:
        raise UsageError("--record-size must be positive")
    if getattr(args, "bulk", 0) < 0:
        raise UsageError("--bulk must be positive")


def _produce(args: argparse.Namespace) -> int:
    from tidelog import Producer
    from tidelog.aio.producer import ProducerConfig
    from tidelog.perf import make_payload
    from tidelog.perf import produce as measure

    _check_args(args)
    options = kafka_options(args.producer_props, ProducerConfig, "producer")
    check_cluster(args)
    try:
        delivery_s = ProducerConfig(**options).delivery_timeout_ms / 1000
        producer = Producer(args.bootstrap, client_id="tidelog-perf-producer", **options, **connection_options(args))
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        if args.bulk and not hasattr(producer, "send_many"):
            raise UsageError("--bulk: this SDK's Producer has no bulk API (send_many)")
        result = measure(producer, args.topic, num_records=args.num_records,
                         payload=make_payload(args.record_size), throughput=args.throughput,
                         progress=_progress("produce"), flush_timeout_s=delivery_s + 5.0, bulk=args.bulk)
    finally:
        producer.close(5.0)
    return _report(result, args, "acknowledged")


def _consume(args: argparse.Namespace) -> int:
    from tidelog import Consumer, TopicPartition
    from tidelog.aio.consumer import ConsumerConfig
    from tidelog.perf import consume as measure

    _check_args(args)
    options = {"auto_offset_reset": "earliest"}
    options.update(kafka_options(args.consumer_props, ConsumerConfig, "consumer"))
    partitions = check_cluster(args, args.topic)
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-perf-consumer", **options, **connection_options(args))
    except (TypeError, ValueError, NotImplementedError) as e:
        raise UsageError(str(e)) from None
    try:
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        result = measure(consumer, num_records=args.num_records, idle_timeout_s=args.timeout_ms / 1000,
                         progress=_progress("consume"))
    finally:
        consumer.close()
    return _report(result, args, "received")


def _e2e(args: argparse.Namespace) -> int:
    from tidelog import Consumer, Producer, TopicPartition
    from tidelog.aio.consumer import ConsumerConfig
    from tidelog.aio.producer import ProducerConfig
    from tidelog.perf import end_to_end

    _check_args(args)
    producer_options: dict[str, Any] = {"acks": 1, "linger_ms": 0}
    producer_options.update(kafka_options(args.producer_props, ProducerConfig, "producer"))
    consumer_options: dict[str, Any] = {"auto_offset_reset": "latest", "fetch_max_wait_ms": 100}
    consumer_options.update(kafka_options(args.consumer_props, ConsumerConfig, "consumer"))
    check_cluster(args)
    description = _topic_created_if_missing(args)
    try:
        producer = Producer(args.bootstrap, client_id="tidelog-perf-e2e", **producer_options, **connection_options(args))
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-perf-e2e", **consumer_options, **connection_options(args))
    except (TypeError, ValueError, NotImplementedError) as e:
        producer.close(0)
        raise UsageError(str(e)) from None
    try:
        tps = [TopicPartition(args.topic, p.partition) for p in description.partitions]
        consumer.assign(tps)
        consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the end offsets now, before the first record is sent
            consumer.position(tp)
        result = end_to_end(producer, consumer, args.topic, num_records=args.num_records,
                            record_size=args.record_size, throughput=args.throughput,
                            in_flight=args.in_flight, idle_timeout_s=args.timeout_ms / 1000,
                            progress=_progress("e2e"))
    finally:
        producer.close(5.0)
        consumer.close()
    return _report(result, args, "received")


def _topic_created_if_missing(args: argparse.Namespace) -> Any:
    """The topic's description, after creating it with one partition if it does not exist
    (as Kafka's EndToEndLatency does)."""
    from tidelog import Admin, NewTopic
    from tidelog.protocol.errors import TOPIC_ALREADY_EXISTS, UNKNOWN_TOPIC_OR_PARTITION, TidelogError

    with Admin(args.bootstrap, client_id="tidelog-cli", default_api_timeout_ms=30000, **connection_options(args)) as admin:
        try:
            (description,) = admin.describe_topics([args.topic])
        except TidelogError as e:
            if getattr(e, "error", None) is not UNKNOWN_TOPIC_OR_PARTITION:
                raise
            try:
                admin.create_topics([NewTopic(args.topic, 1)])
            except TidelogError as e:
                if getattr(e, "error", None) is not TOPIC_ALREADY_EXISTS:
                    raise
            (description,) = admin.describe_topics([args.topic])
    return description


_ACTIONS = {"produce": _produce, "consume": _consume, "e2e": _e2e}
