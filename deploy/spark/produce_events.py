"""Feed the example pipeline: keyed events at a steady rate into a tidelog topic.

    .venv/bin/python deploy/spark/produce_events.py [--topic events] [--rate 200] [--seconds 60] [--keys 5]

Each event's key is one of ``user-0`` .. ``user-<keys-1>`` and its value a small JSON
document; the topic (6 partitions, replication factor up to 3) is created if missing.
Prints how many events each key got, so the counts the pipeline writes can be checked. On a
secured cluster, TIDELOG_COMMAND_CONFIG names the client's security settings (a
``--command-config`` properties file).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tidelog import Admin, NewTopic, Producer


def security_options() -> dict:
    """The SDK's security options from the properties file TIDELOG_COMMAND_CONFIG names (the
    tools' --command-config; docker-compose.yml sets it), {} without one."""
    path = os.environ.get("TIDELOG_COMMAND_CONFIG")
    if not path:
        return {}
    from tidelog.security import SecurityConfig, read_properties

    return SecurityConfig.from_properties(read_properties(path)).options()


def main() -> int:
    ap = argparse.ArgumentParser(description="Produce keyed events for deploy/spark/windowed_counts.py.")
    ap.add_argument("--bootstrap", default=os.environ.get("TIDELOG_BOOTSTRAP", "localhost:9092"))
    ap.add_argument("--topic", default="events")
    ap.add_argument("--rate", type=float, default=200.0, help="events per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--keys", type=int, default=5)
    args = ap.parse_args()
    security = security_options()
    with Admin(args.bootstrap, **security) as admin:
        if args.topic not in admin.list_topics():
            rf = min(3, len(admin.describe_cluster().brokers))
            admin.create_topics([NewTopic(args.topic, 6, rf)])
            print(f"created topic {args.topic!r} (6 partitions, replication factor {rf})", flush=True)
    sent: collections.Counter[str] = collections.Counter()
    start = time.monotonic()
    with Producer(args.bootstrap, acks="all", **security) as producer:
        try:
            i = 0
            while time.monotonic() - start < args.seconds:
                key = f"user-{random.randrange(args.keys)}"
                producer.send(args.topic, json.dumps({"n": i, "action": random.choice(["view", "click"])}),
                              key=key)
                sent[key] += 1
                i += 1
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except KeyboardInterrupt:
            pass
        producer.flush()
    print(f"sent {sum(sent.values())} events: " + ", ".join(f"{k}={n}" for k, n in sorted(sent.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
