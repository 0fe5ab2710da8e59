"""Request decoding: the cost of the object bound on real frames, and the memory of hostile ones;
with ``--typed``, the typed bodies' loaders and dumpers instead.

    .venv/bin/python bench/decode_bench.py [--rounds 7] [--hostile-mib 100] [--before-mib 20]
    .venv/bin/python bench/decode_bench.py --typed [--rounds 7]

1. Real frames (a produce of one 16 KiB batch, of 1 MiB and of 4 MiB, a fetch of 100
   partitions, a LeaderAndIsr of 2,000 and of 20,000 partitions), decoded ``--rounds`` times each way,
   interleaved: "before" is ``decode_request`` as it was (msgpack with the container bounds only,
   then the envelope checks), "after" is ``protocol.codec.decode_request`` with the object bound.
   Median microseconds per decode.
2. Hostile frames of ``--hostile-mib`` MiB made of the smallest objects msgpack has (empty maps,
   empty arrays, one-entry maps, two-character strings, 16-bit ints, nils, one-element arrays), in
   arrays of 2^20: each decoded in a fresh process, which reports the peak resident memory the
   decoding added (VmHWM, reset before it starts, less the resident size before), the time and the
   outcome. The same frames of ``--before-mib`` MiB are decoded without the bound, for comparison.

``--typed``: the bodies of the requests and responses a record passes through at a low rate
(a produce of one 100-byte record and its response, a fetch of one partition and its
response with that record), and two large ones (a fetch of 100 partitions, a LeaderAndIsr of
2,000 partitions), turned into their messages (``from_body``) and back (``to_body``) by the
class's interpreted plan and by its generated functions, interleaved. Median microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time

import msgpack

from tidelog.protocol import codec
from tidelog.protocol.codec import ApiKey, RequestHeader, decode_request, encode_request
from tidelog.protocol.messages import (
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FetchTopicResponse,
    LeaderAndIsrRequest,
    PartitionProduceData,
    PartitionProduceResponse,
    PartitionState,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
    TopicProduceResponse,
)
from tidelog.protocol.records import build_batch

ELEMENTS = {"empty-map": b"\x80", "empty-array": b"\x90", "one-entry-map": b"\x81\xa1a\xc0",
            "two-char-str": b"\xa2ab", "uint16": b"\xcd\x12\x34", "nil": b"\xc0", "one-element-array": b"\x91\x00"}


def real_frames() -> dict[str, bytes]:
    def produce(partitions: int, batch_bytes: int) -> bytes:
        batch = build_batch([b"v" * 100] * (batch_bytes // 110))
        return encode_request(RequestHeader(ApiKey.PRODUCE, 0, 1, "bench"), ProduceRequest(
            -1, 30000, [TopicProduceData("bench", [PartitionProduceData(p, batch) for p in range(partitions)])]))

    fetch = encode_request(RequestHeader(ApiKey.FETCH, 0, 1, "bench"), FetchRequest(
        [FetchTopic(f"topic-{t}", [FetchPartition(p, 123456, 1 << 20, 5) for p in range(10)]) for t in range(10)]))
    def leader_and_isr(partitions: int) -> bytes:
        return encode_request(RequestHeader(ApiKey.LEADER_AND_ISR, 0, 1, "bench"), LeaderAndIsrRequest(1, 3, 12345, [
            PartitionState(f"topic-{p % 20}", p // 20, 3, 1 + p % 3, 7, [1, 2, 3], 12, [1, 2, 3])
            for p in range(partitions)]))

    return {"produce 1 x 16 KiB": produce(1, 16 << 10), "produce 10 x 100 KiB": produce(10, 100 << 10),
            "produce 4 x 1 MiB": produce(4, 1 << 20), "fetch 100 partitions": fetch,
            "LeaderAndIsr 2,000 partitions": leader_and_isr(2000),
            "LeaderAndIsr 20,000 partitions": leader_and_isr(20_000)}


def before(frame: bytes):
    """``decode_request`` as it was: the container bounds only, then the envelope checks."""
    return codec._parse_request(msgpack.unpackb(frame, **codec._unpack_options(len(frame))))


def timed(fn, frame: bytes, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn(frame)
    return (time.perf_counter() - started) / n * 1e6


def bench_real(rounds: int) -> list[dict]:
    out = []
    for name, frame in real_frames().items():
        n = max(3, int(2e6 // len(frame)))  # ~2 MB decoded per timing
        b, a = [], []
        for _ in range(rounds):
            b.append(timed(before, frame, n))
            a.append(timed(decode_request, frame, n))
        out.append({"frame": name, "bytes": len(frame), "hooks": len(frame) > codec.max_objects(len(frame)),
                    "before_us": statistics.median(b), "after_us": statistics.median(a)})
    return out


def typed_messages() -> dict[str, codec.Message]:
    record = build_batch([b"v" * 100], timestamp_ms=1)
    return {
        "ProduceRequest, 1 record": ProduceRequest(1, 30000, [TopicProduceData("bench", [PartitionProduceData(0, record)])]),
        "ProduceResponse, 1 partition": ProduceResponse([TopicProduceResponse("bench", [PartitionProduceResponse(0, 0, 7)])]),
        "FetchRequest, 1 partition": FetchRequest([FetchTopic("bench", [FetchPartition(0, 7, 1 << 20, 5)])]),
        "FetchResponse, 1 record": FetchResponse([FetchTopicResponse("bench", [FetchPartitionResponse(0, 0, 8, 0, record)])]),
        "FetchRequest, 100 partitions": FetchRequest(
            [FetchTopic(f"topic-{t}", [FetchPartition(p, 123456, 1 << 20, 5) for p in range(10)]) for t in range(10)]),
        "LeaderAndIsr, 2,000 partitions": LeaderAndIsrRequest(1, 3, 12345, [
            PartitionState(f"topic-{p % 20}", p // 20, 3, 1 + p % 3, 7, [1, 2, 3], 12, [1, 2, 3]) for p in range(2000)]),
    }


def bench_typed(rounds: int) -> list[dict]:
    out = []
    for name, message in typed_messages().items():
        cls, body = type(message), message.to_body()
        plan = codec._plan_of(cls)
        assert cls.from_body(body) == plan.load(body) == message and plan.dump(message) == body
        n = max(3, int(20_000 // len(codec._pack(body)) * 10))
        ways = {"load_plan": lambda: plan.load(body), "load_generated": lambda: cls.from_body(body),
                "dump_plan": lambda: plan.dump(message), "dump_generated": message.to_body}
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(rounds):
            for way, fn in ways.items():
                started = time.perf_counter()
                for _ in range(n):
                    fn()
                times[way].append((time.perf_counter() - started) / n * 1e6)
        out.append({"message": name, **{way: statistics.median(t) for way, t in times.items()}})
    return out


def hostile_frame(element: bytes, mib: int) -> bytes:
    per_array = 1 << 20
    arrays = max(1, (mib << 20) // (len(element) * per_array))
    body = b"\x81\xa1x" + b"\xdd" + struct.pack(">I", arrays) + (
        b"\xdd" + struct.pack(">I", per_array) + element * per_array) * arrays
    return b"\x95\x03\x00\x07\xc0" + body  # Metadata v0, correlation id 7, no client id


_CHILD = """
import re, sys, time, msgpack
from tidelog.protocol import codec
from tidelog.protocol.errors import InvalidRequestError
sys.path.insert(0, "bench")
from decode_bench import ELEMENTS, hostile_frame
kind, mib, bounded = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
frame = hostile_frame(ELEMENTS[kind], mib)
def status(key):
    return int(re.search(key + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
rss = status("VmRSS")
started = time.perf_counter()
try:
    if bounded:
        codec.decode_request(frame)
    else:
        msgpack.unpackb(frame, **codec._unpack_options(len(frame)))
    outcome = "decoded"
except InvalidRequestError as e:
    outcome = "INVALID_REQUEST"
print(outcome, time.perf_counter() - started, (status("VmHWM") - rss) * 1024, len(frame))
"""


def bench_hostile(mib: int, bounded: bool) -> list[dict]:
    out = []
    for kind in ELEMENTS:
        got = subprocess.run([sys.executable, "-c", _CHILD, kind, str(mib), "1" if bounded else "0"],
                             capture_output=True, text=True, check=True).stdout.split()
        outcome, seconds, added, size = got[0], float(got[1]), int(got[2]), int(got[3])
        out.append({"kind": kind, "bounded": bounded, "frame_mib": size / (1 << 20), "outcome": outcome,
                    "seconds": seconds, "added_mb": added / 1e6, "x_frame": added / size})
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--hostile-mib", type=int, default=100)
    p.add_argument("--before-mib", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.add_argument("--typed", action="store_true", help="the typed bodies' loaders and dumpers only")
    args = p.parse_args(argv)
    if args.typed:
        typed = bench_typed(args.rounds)
        if args.json:
            print(json.dumps(typed, indent=1))
            return 0
        print("| message | from_body: plan (us) | generated (us) | to_body: plan (us) | generated (us) |")
        print("|---|---|---|---|---|")
        for t in typed:
            print(f"| {t['message']} | {t['load_plan']:.2f} | {t['load_generated']:.2f} | {t['dump_plan']:.2f} | "
                  f"{t['dump_generated']:.2f} |")
        return 0
    real = bench_real(args.rounds)
    hostile = bench_hostile(args.hostile_mib, True) + bench_hostile(args.before_mib, False)
    if args.json:
        print(json.dumps({"real": real, "hostile": hostile}, indent=1))
        return 0
    print("| frame | bytes | counted | before (us) | after (us) | change |")
    print("|---|---|---|---|---|---|")
    for r in real:
        change = (r["after_us"] / r["before_us"] - 1) * 100
        print(f"| {r['frame']} | {r['bytes']:,} | {'yes' if r['hooks'] else 'no'} | {r['before_us']:.1f} | "
              f"{r['after_us']:.1f} | {change:+.1f} % |")
    print()
    print("| frame of | bound | MiB | outcome | time (s) | memory added (MB) | x frame |")
    print("|---|---|---|---|---|---|---|")
    for h in hostile:
        print(f"| {h['kind']} | {'on' if h['bounded'] else 'off'} | {h['frame_mib']:.0f} | {h['outcome']} | "
              f"{h['seconds']:.2f} | {h['added_mb']:,.0f} | {h['x_frame']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
