"""Storage engine benchmark: append as leader, sequential read, recovery re-validation.

100-byte records in ~16 KiB batches (uncompressed), one partition, real files.

    .venv/bin/python bench/log_bench.py [--mib 512] [--runs 3] [--dir DIR] [--json]

Each run uses a fresh directory; the figure reported is the median over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.loader import load_log
from tidelog.protocol.records import BatchBuilder, read_header
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("bench", 0)


def make_batch(record_size: int, batch_bytes: int) -> bytes:
    """One uncompressed batch of ``record_size``-byte values, as close to ``batch_bytes`` as fits."""
    value = os.urandom(record_size)
    ts = int(time.time() * 1000)
    n = 1
    while True:
        b = BatchBuilder()
        for _ in range(n + 1):
            b.append(ts, None, value)
        if len(b.build()) > batch_bytes:
            break
        n += 1
    b = BatchBuilder()
    for _ in range(n):
        b.append(ts, None, value)
    return b.build()


def run_once(directory: str, total_bytes: int, batch: bytes) -> dict:
    config = LogConfig(retention_ms=-1)
    path = os.path.join(directory, TP.dir_name)
    log = load_log(path, TP, config)
    n = total_bytes // len(batch)
    t0 = time.perf_counter()
    for _ in range(n):
        log.append_as_leader(batch, leader_epoch=0)
    append_s = time.perf_counter() - t0
    written = log.size

    offset, read_bytes = 0, 0
    leo = log.log_end_offset
    t0 = time.perf_counter()
    while offset < leo:
        data = log.read(offset, 1 << 20)
        read_bytes += len(data)
        offset = _next_offset(data)
    read_s = time.perf_counter() - t0
    assert read_bytes == written, (read_bytes, written)

    log.close()  # no flush, no clean-shutdown marker: the next load recovers everything
    t0 = time.perf_counter()
    log = load_log(path, TP, config, recovery_point=0, had_clean_shutdown=False)
    recover_s = time.perf_counter() - t0
    assert log.log_end_offset == leo and not log.recovery_report
    log.close()
    mb = written / 1e6
    return {"bytes": written, "batches": n, "append_mb_s": mb / append_s,
            "read_mb_s": mb / read_s, "recovery_mb_s": mb / recover_s}


def _next_offset(data: bytes) -> int:
    pos, last = 0, None
    while pos < len(data):
        last = read_header(data, pos)
        pos += last.size
    return last.next_offset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=512, help="bytes appended per run (MiB)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--batch-bytes", type=int, default=16384)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    batch = make_batch(args.record_size, args.batch_bytes)
    h = read_header(batch)
    results = []
    for i in range(args.runs):
        d = tempfile.mkdtemp(prefix="tidelog-bench-", dir=args.dir)
        try:
            results.append(run_once(d, args.mib << 20, batch))
        finally:
            shutil.rmtree(d, ignore_errors=True)
        if not args.json:
            r = results[-1]
            print(f"run {i + 1}: append {r['append_mb_s']:.0f} MB/s, read {r['read_mb_s']:.0f} MB/s, "
                  f"recovery {r['recovery_mb_s']:.0f} MB/s", file=sys.stderr)
    summary = {
        "record_size": args.record_size, "records_per_batch": h.record_count, "batch_bytes": len(batch),
        "mib_per_run": args.mib, "runs": args.runs,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        **{k: round(statistics.median(r[k] for r in results)) for k in ("append_mb_s", "read_mb_s", "recovery_mb_s")},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"median of {args.runs}: append as leader {summary['append_mb_s']} MB/s, "
              f"sequential read {summary['read_mb_s']} MB/s, recovery {summary['recovery_mb_s']} MB/s "
              f"({h.record_count} x {args.record_size} B records per {len(batch)} B batch, "
              f"load {summary['load_avg_1m']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
