"""At-most-once: commit the offsets of a batch *before* processing it.

A crash while processing loses the rest of that batch (it was committed, the group goes on
after it); nothing is ever processed twice.

    python docs/examples/at_most_once.py --bootstrap localhost:9092 --topic events --group audit
"""

from __future__ import annotations

import argparse

from tidelog import Consumer, TopicPartition


def process(record) -> None:
    print(f"{record.topic}-{record.partition}@{record.offset}: {record.value!r}", flush=True)


def main() -> None:
    args = parse_args()
    with Consumer(args.bootstrap, group_id=args.group, enable_auto_commit=False,
                  auto_offset_reset="earliest") as consumer:
        consumer.subscribe([args.topic])
        for records in batches(consumer, args.idle_ms):
            consumer.commit({TopicPartition(r.topic, r.partition): r.offset + 1 for r in records})
            for record in records:  # a crash from here on loses what is left of the batch
                process(record)


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
