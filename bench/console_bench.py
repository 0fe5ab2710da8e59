"""The web console on a large cluster: 1,000 topics of 10 partitions (10,000 partitions) on a
local 3-broker cluster, then how long the console's poll of the whole cluster takes and how
long its pages take to answer (bench/RESULTS.md, "The web console").

    .venv/bin/python bench/console_bench.py [--topics 1000] [--partitions 10] [--rf 1]

Topics are created in batches through the Admin; the console runs as a child process
(``tidelog console``); each page is asked 20 times and the median and the worst are printed.
Every process is stopped at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.console import ConsoleProcess  # noqa: E402
from tidelog import Admin, NewTopic  # noqa: E402
from tidelog.broker.devcluster import DevCluster  # noqa: E402


def timed_get(url: str) -> tuple[float, dict]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = json.loads(r.read())
    return time.perf_counter() - start, body


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--rf", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="console-bench-"))
    cluster = DevCluster(work / "cluster", 3, zk_port=0, base_port=0,
                         extra_config={"num.partitions": args.partitions})
    console = None
    try:
        cluster.start(120)
        start = time.perf_counter()
        with Admin(cluster.bootstrap, default_api_timeout_ms=300000) as admin:
            names = [f"bench-{i:05d}" for i in range(args.topics)]
            for i in range(0, len(names), 100):
                admin.create_topics([NewTopic(n, args.partitions, args.rf) for n in names[i:i + 100]])
        total = args.topics * args.partitions
        print(f"created {args.topics} topics, {total} partitions (RF {args.rf}) in {time.perf_counter() - start:.1f} s")
        console = ConsoleProcess(cluster.bootstrap, work / "console.log", refresh_ms=5000)
        console.start(300)
        deadline = time.monotonic() + 300
        while console.get("/api/overview").get("partitions", 0) < total and time.monotonic() < deadline:
            time.sleep(1)
        pages = {"overview": "/api/overview", "topics page 1": "/api/topics?page=1&size=50",
                 "topics page 20": "/api/topics?page=20&size=50",
                 "topic partitions": "/api/topics/bench-00500/partitions?size=20",
                 "topic configs": "/api/topics/bench-00500", "groups": "/api/groups"}
        for name, path in pages.items():
            times = []
            for _ in range(20):
                elapsed, body = timed_get(console.url + path)
                times.append(elapsed * 1000)
            size = len(json.dumps(body))
            print(f"{name:18s} median {statistics.median(times):7.1f} ms  worst {max(times):7.1f} ms  {size:8d} bytes")
        log = (work / "console.log").read_text(errors="replace")
        print("console log warnings:", sum("WARNING" in x for x in log.splitlines()))
        polls = []
        watch_start = time.perf_counter()
        for _ in range(3):
            before = console.get("/api/overview")["time_ms"]
            while console.get("/api/overview")["time_ms"] == before:
                time.sleep(0.05)
            polls.append(time.perf_counter() - watch_start)
            watch_start = time.perf_counter()
        print("seconds between snapshots at --refresh-ms 5000:", ", ".join(f"{p:.1f}" for p in polls))
    finally:
        if console is not None:
            console.stop()
        cluster.kill()


if __name__ == "__main__":
    main()
