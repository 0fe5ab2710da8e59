"""At-least-once: process a batch, *then* commit its offsets.

A crash after processing but before the commit makes the group deliver those records again
(to this consumer after a restart, or to the member that takes the partition over): nothing
is lost, something may be processed twice, so processing should tolerate repeats.

    python docs/examples/at_least_once.py --bootstrap localhost:9092 --topic events --group mailer
"""

from __future__ import annotations

import argparse

from tidelog import CommitFailedError, Consumer, TopicPartition


def process(record) -> None:
    print(f"{record.topic}-{record.partition}@{record.offset}: {record.value!r}", flush=True)


def main() -> None:
    args = parse_args()
    with Consumer(args.bootstrap, group_id=args.group, enable_auto_commit=False,
                  auto_offset_reset="earliest") as consumer:
        consumer.subscribe([args.topic])
        for records in batches(consumer, args.idle_ms):
            for record in records:
                process(record)
            try:  # a crash before this line: the batch is delivered again
                consumer.commit({TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})
            except CommitFailedError as e:
                # the group rebalanced while we processed: another member owns these partitions
                # now and starts from the last commit, so this batch is processed again there
                print(f"commit failed: {e}", flush=True)


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
    p.add_argument("--idle-ms", type=int, default=5000, help="exit after this long without records")
    return p.parse_args()


if __name__ == "__main__":
    main()
