"""The client command families of the ``tidelog`` CLI (docs/architecture.md, "CLI"), one module each:

* ``topics``: create, list, describe, alter, delete, delete-records, elect-leaders (kafka-topics);
* ``console``: ``produce`` and ``consume`` (kafka-console-producer and -consumer);
* ``groups``: list, describe, reset-offsets, delete (kafka-consumer-groups);
* ``perf``: produce, consume, e2e (the kafka-*-perf-test tools; ``tidelog.perf`` measures);
* ``reassign``: generate, execute, verify, cancel (kafka-reassign-partitions).

Each family module has ``register(subcommands)``, which adds its command(s) to the
``tidelog`` parser with their arguments and sets ``run`` (args -> exit status) as the parsed
namespace's default. ``tidelog.broker.cli``, the entry point, lists the families next to the
broker-side commands. A family module imports only the stdlib and ``common`` at import time
and the SDK when a command runs, so ``tidelog --help`` builds every parser cheaply.

Exit status: 0 success, 1 failure (explained on stderr), 2 usage errors. Every command first
checks that some broker answers within ``--connect-timeout-ms``, so a cluster that is down is
reported as such within seconds; every later wait is bounded too (``--timeout-ms`` for admin
calls, the producer's delivery timeout, the consumer's idle timeout).
"""
