"""Exactly-once into an external store: the offset is the idempotency key, and the store keeps
its own positions in the same transaction as the results.

Each record's effect and the partition's next offset are written to SQLite in ONE transaction.
On assignment the consumer seeks every partition to the offset the database holds (not the
group's committed offset, which may lag behind it), so after a crash anywhere the database is
exactly the effect of every record once. The table's primary key (topic, partition, offset)
makes a repeated insert a no-op besides, and committing to the group too (after the database)
keeps ``tidelog groups describe`` lag meaningful.

    python docs/examples/exactly_once_sqlite.py --bootstrap localhost:9092 --topic events \\
        --group loader --db events.sqlite
"""

from __future__ import annotations

import argparse
import os
import sqlite3

from tidelog import Consumer, ConsumerRebalanceListener, TopicPartition

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (topic TEXT, partition INTEGER, offset INTEGER, value BLOB,
                                   PRIMARY KEY (topic, partition, offset));
CREATE TABLE IF NOT EXISTS positions (topic TEXT, partition INTEGER, next_offset INTEGER,
                                      PRIMARY KEY (topic, partition));
"""


def store(db: sqlite3.Connection, records) -> None:
    """The batch's effects and the partitions' next offsets, atomically."""
    with db:  # one transaction: both or neither survive a crash
        db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?)",
                       [(r.topic, r.partition, r.offset, r.value) for r in records])
        db.executemany("INSERT INTO positions VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                       "DO UPDATE SET next_offset = MAX(next_offset, excluded.next_offset)",
                       [(r.topic, r.partition, r.offset + 1) for r in records])


class SeekToStoredPositions(ConsumerRebalanceListener):
    def __init__(self, consumer: Consumer, db: sqlite3.Connection):
        self.consumer, self.db = consumer, db

    def on_partitions_assigned(self, assigned):
        for tp in assigned:
            row = self.db.execute("SELECT next_offset FROM positions WHERE topic = ? AND partition = ?",
                                  (tp.topic, tp.partition)).fetchone()
            if row is not None:
                self.consumer.seek(tp, row[0])  # else: the group's committed offset / auto_offset_reset


def main() -> None:
    args = parse_args()
    db = sqlite3.connect(args.db)
    db.executescript(SCHEMA)
    processed = 0
    with Consumer(args.bootstrap, group_id=args.group, enable_auto_commit=False, auto_offset_reset="earliest",
                  session_timeout_ms=args.session_timeout_ms,
                  heartbeat_interval_ms=min(3000, args.session_timeout_ms // 3)) as consumer:
        consumer.subscribe([args.topic], listener=SeekToStoredPositions(consumer, db))
        for records in batches(consumer, args.idle_ms):
            store(db, records)
            processed += len(records)
            if args.crash_after is not None and processed >= args.crash_after:
                os._exit(17)  # a crash between the database and the group commit: nothing is lost or doubled
            consumer.commit_async({TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})
    count = db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    print(f"{count} events stored", flush=True)


def batches(consumer: Consumer, idle_ms: int):
    """Poll until nothing arrived for ``idle_ms`` (an example must end; a service would not)."""
    idle = 0
    while idle < idle_ms:
        records = consumer.poll(timeout_ms=200)
        idle = 0 if records else idle + 200
        if records:
            yield records


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="localhost:9092")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--db", required=True, help="the SQLite file")
    p.add_argument("--idle-ms", type=int, default=5000, help="exit after this long without records")
    p.add_argument("--session-timeout-ms", type=int, default=45000,
                   help="how soon the group notices a crashed member (and a restart gets its partitions)")
    p.add_argument("--crash-after", type=int, help="exit abruptly after storing this many records (a demo)")
    return p.parse_args()


if __name__ == "__main__":
    main()
