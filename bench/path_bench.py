"""A record's path inside one process, in a loop: what a step costs hot, and what it costs
after a sleep. No cluster, no network: the CPU of the work itself.

    .venv/bin/python bench/path_bench.py broker [--records 20000] [--sleep-ms 0]
    .venv/bin/python bench/path_bench.py wake [--records 3000] [--rate 1000] [--pin]
    .venv/bin/python bench/path_bench.py cold [--calls 400]

``broker``: the broker's side of one record at a low rate, on the test suite's in-process
broker (tests/component/broker/test_group_coordinator.py: the real Apis, ReplicaManager and
LogManager over a temporary directory, the replica manager's timer running): a consumer's
fetch at the log end is decoded and handled (it waits, a DelayedFetch), then a one-record
produce is decoded and handled (its append answers the waiting fetch, whose response is
encoded), then the produce response is encoded. Reports wall time and CPU time
(``/proc/self/task/*/schedstat``) per record, and the five steps by time stamps. With
``--sleep-ms`` the loop sleeps that long before each record, as a broker at 1,000 records/s
is idle between them.

``wake``: what an event loop's wake-up costs. A child process answers pings on a socket
pair, ``--rate`` pings a second (0: back to back), four ways: a blocking ``recv``/``send``
loop, Trio's ``wait_readable`` with ``os.read``, a Trio socket's ``recv``, and asyncio's
``sock_recv``; reports the child's CPU per ping and its wake-up latency (from the pinger's
time stamp, taken just before it sends, to the child's wait returning). ``--pin`` puts the
pinger on CPU 0 and the child on CPU 1, so that every ping wakes the other CPU (unpinned,
the scheduler often runs the child on the pinger's CPU once the pinger waits).

``cold``: what single steps of a record's path cost hot (in a loop) and cold: each call
after 8 MiB touched and some unrelated Python run, then a 1 ms sleep, as a process at a low
rate finds its caches after the other processes used the CPU. The median of ``--calls``
calls each; the steps are the ones the cold figures of bench/RESULTS.md name.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
STAMP = struct.Struct("=q")  # the pinger's perf_counter_ns (CLOCK_MONOTONIC: one clock for both)


def cpu_seconds() -> float:
    """This process's CPU so far, by the scheduler's own count (all its threads)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


# -- broker ------------------------------------------------------------------------------------

STEPS = ("decode the fetch", "handle the fetch (it waits)", "decode the produce",
         "handle the produce (append, the fetch answered and encoded)", "encode the produce response")


async def broker_path(records: int, sleep_s: float) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.component.broker.test_group_coordinator import DATA_TP, Broker
    from tidelog.broker.context import RequestContext
    from tidelog.protocol.codec import ApiKey
    from tidelog.protocol.connection import ClientConnection, ServerConnection
    from tidelog.protocol.messages import (
        FetchPartition,
        FetchRequest,
        FetchTopic,
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from tidelog.protocol.records import build_batch

    with tempfile.TemporaryDirectory() as d:
        broker = Broker(d)
        broker.lead()
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.replica_manager.run)
            server = ServerConnection()
            producer, consumer = ClientConnection(client_id="producer"), ClientConnection(client_id="consumer")
            produces = [producer.send_request(ApiKey.PRODUCE, 7, ProduceRequest(1, 5000, [TopicProduceData(
                DATA_TP.topic, [PartitionProduceData(0, build_batch([b"v" * 100], timestamp_ms=broker.clock()))])]),
                True)[1] for _ in range(records)]
            fetches = [consumer.send_request(ApiKey.FETCH, 0, FetchRequest(
                [FetchTopic(DATA_TP.topic, [FetchPartition(0, i, 1 << 20)])], max_wait_ms=30000), True)[1]
                for i in range(records)]
            answers: list[bytes] = []
            steps = [0] * len(STEPS)
            clock = time.perf_counter_ns
            started, cpu = time.perf_counter(), cpu_seconds()
            for i in range(records):
                if sleep_s:
                    time.sleep(sleep_s)
                t0 = clock()
                [fetch] = server.receive_data(fetches[i])
                t1 = clock()
                waiting = broker.apis.handle(RequestContext(fetch.header, "127.0.0.1:5000"), fetch.body)
                waiting.attach(lambda body, cid=fetch.header.correlation_id: answers.append(
                    server.send_response(cid, body)))
                t2 = clock()
                [produce] = server.receive_data(produces[i])
                t3 = clock()
                response = broker.apis.handle(RequestContext(produce.header, "127.0.0.1:5000"), produce.body)
                t4 = clock()
                answers.append(server.send_response(produce.header.correlation_id, response))
                t5 = clock()
                for k, (a, b) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4, t5))):
                    steps[k] += b - a
                if len(answers) > 1000:
                    answers.clear()
            wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
            nursery.cancel_scope.cancel()
        broker.log_manager.shutdown()
    # with sleeps, the wall time is mostly theirs (and their overshoot): the CPU tells
    spent = f"{wall / records * 1e6:.1f} us of wall time and " if not sleep_s else ""
    print(f"broker path, {records} records, sleep {sleep_s * 1000:g} ms before each: "
          f"{spent}{cpu / records * 1e6:.1f} us of CPU a record")
    for name, total in zip(STEPS, steps):
        print(f"  {name}: {total / records / 1000:.1f} us")


# -- wake --------------------------------------------------------------------------------------

def _serve(sock: socket.socket, mode: str, n: int) -> tuple[float, list[int]]:
    """Answer ``n`` pings on ``sock``: the CPU it took per ping (microseconds), and each
    ping's wake-up latency (ns: from the stamp the sender wrote just before sending to the
    return of the wait here)."""
    sock.setblocking(mode == "blocking")
    fd = sock.fileno()
    clock = time.perf_counter_ns
    latencies: list[int] = []
    woke = lambda data: latencies.append(clock() - STAMP.unpack(data)[0])  # noqa: E731

    async def trio_lowlevel() -> None:
        for _ in range(n):
            while True:
                try:
                    data = os.read(fd, 16)
                    break
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
            woke(data)
            os.write(fd, data)

    async def trio_socket() -> None:
        s = trio.socket.from_stdlib_socket(sock)
        for _ in range(n):
            data = await s.recv(16)
            woke(data)
            await s.send(data)

    async def asyncio_socket() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            data = await loop.sock_recv(sock, 16)
            woke(data)
            sock.send(data)

    started = cpu_seconds()
    if mode == "blocking":
        for _ in range(n):
            data = sock.recv(16)
            woke(data)
            sock.send(data)
    elif mode == "trio-lowlevel":
        trio.run(trio_lowlevel)
    elif mode == "trio-socket":
        trio.run(trio_socket)
    else:
        asyncio.run(asyncio_socket())
    return (cpu_seconds() - started) / n * 1e6, latencies


def wake(records: int, rate: float, pin: bool) -> None:
    interval = 1 / rate if rate else 0.0
    for mode in ("blocking", "trio-lowlevel", "trio-socket", "asyncio"):
        ours, theirs = socket.socketpair()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the echoing child
            ours.close()
            if pin:
                os.sched_setaffinity(0, {1})
            cpu, latencies = _serve(theirs, mode, records)
            steady = sorted(latencies[len(latencies) // 10:])
            q = lambda f: steady[int(f * (len(steady) - 1))] / 1000  # noqa: E731
            os.write(w, f"{cpu:.1f} us of CPU a wake-up, latency p50 {q(0.5):.1f} us p90 {q(0.9):.1f} us".encode())
            os._exit(0)
        theirs.close()
        if pin:
            os.sched_setaffinity(0, {0})
        started = time.perf_counter()
        for i in range(records):
            if interval:
                ahead = started + i * interval - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
            ours.send(STAMP.pack(time.perf_counter_ns()))
            ours.recv(16)
        os.waitpid(pid, 0)
        print(f"{mode}: {os.read(r, 200).decode()} ({records} at "
              f"{f'{rate:,.0f}/s' if rate else 'full speed'}{', on the other CPU' if pin else ''})")
        os.close(r)
        os.close(w)
        ours.close()


_JUNK = bytearray(8 << 20)


def _evict() -> None:
    """What another process does to the caches meanwhile: touch 8 MiB, run some Python."""
    _JUNK[::64] = bytes(len(_JUNK) // 64)
    sorted(str(i) for i in range(3000))


def _cold_us(step, calls: int) -> float:
    out = []
    for _ in range(calls):
        _evict()
        time.sleep(0.001)
        t = time.perf_counter_ns()
        step()
        out.append(time.perf_counter_ns() - t)
    out.sort()
    return out[len(out) // 2] / 1e3


def _hot_us(step, calls: int = 5000) -> float:
    for _ in range(100):
        step()
    t = time.perf_counter_ns()
    for _ in range(calls):
        step()
    return (time.perf_counter_ns() - t) / calls / 1e3


def cold(calls: int) -> None:
    import msgpack

    from tidelog.aio.accumulator import ProducerBatch
    from tidelog.aio.producer import build_produce_request
    from tidelog.protocol.codec import ApiKey, RequestHeader, encode_request, encode_response, pack
    from tidelog.protocol.connection import ClientConnection
    from tidelog.protocol.frames import encode_frame
    from tidelog.protocol.messages import (
        FetchPartitionResponse,
        FetchResponse,
        FetchTopicResponse,
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from tidelog.protocol.records import Codec, record_columns
    from tidelog.protocol.topics import TopicPartition

    batch = ProducerBatch(TopicPartition("t", 0), Codec.NONE, 0.0, 1e9)
    for _ in range(22):  # a burst at 10,000 records/s
        batch.append(1_700_000_000_000, None, b"x" * 100, None, 132)
    records = batch.builder.build(base_offset=100)
    body = build_produce_request([batch], acks=1, timeout_ms=30000)
    envelope = [ApiKey.PRODUCE, 0, 7, "c", body]
    header = RequestHeader(ApiKey.PRODUCE, 0, 7, "c")
    fetched = encode_frame(encode_response(7, FetchResponse([FetchTopicResponse("t", [
        FetchPartitionResponse(0, 0, 122, 0, records)])])))

    def receive() -> None:
        conn = ClientConnection()
        conn._awaiting.append(7)  # the fetch it answers
        conn.receive_data(fetched)

    steps = [
        ("msgpack.packb of a produce request", lambda: msgpack.packb(envelope, use_bin_type=True)),
        ("codec.pack (a pooled packer) of the same", lambda: pack(envelope)),
        ("encode_request of it", lambda: encode_request(header, body)),
        ("a typed ProduceRequest built and its to_body", lambda: ProduceRequest(
            1, 30000, [TopicProduceData("t", [PartitionProduceData(0, batch.encode())])]).to_body()),
        ("build_produce_request's map (the same request)", lambda: build_produce_request([batch], acks=1,
                                                                                         timeout_ms=30000)),
        ("BatchBuilder.build of 22 records", lambda: batch.builder.build()),
        ("a 22-record fetch response read (frame, envelope)", receive),
        ("record_columns of the 22 records", lambda: record_columns(records)),
    ]
    print(f"| step | hot us | cold us (median of {calls}) |")
    print("|---|---|---|")
    for name, step in steps:
        print(f"| {name} | {_hot_us(step):.2f} | {_cold_us(step, calls):.1f} |")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("broker")
    b.add_argument("--records", type=int, default=20000)
    b.add_argument("--sleep-ms", type=float, default=0.0)
    w = sub.add_parser("wake")
    w.add_argument("--records", type=int, default=3000)
    w.add_argument("--rate", type=float, default=1000.0)
    w.add_argument("--pin", action="store_true", help="the two processes on CPUs 0 and 1")
    c = sub.add_parser("cold")
    c.add_argument("--calls", type=int, default=400)
    args = p.parse_args(argv)
    if args.what == "broker":
        trio.run(broker_path, args.records, args.sleep_ms / 1000)
    elif args.what == "cold":
        cold(args.calls)
    else:
        wake(args.records, args.rate, args.pin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
