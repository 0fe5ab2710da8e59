"""``tidelog broker``: run one broker in the foreground.

SIGTERM (or Ctrl-C) starts a controlled shutdown: leadership is moved away, the logs are
flushed and the clean-shutdown marker written. A second signal stops at once.
"""

from __future__ import annotations

import logging
import signal
import sys

import trio

from tidelog.broker.config import BrokerConfig, ConfigError
from tidelog.broker.server import BrokerServer

logger = logging.getLogger("tidelog.broker")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def parse_sets(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def run(config_path: str | None, sets: list[str], log_level: str = "INFO") -> int:
    setup_logging(log_level)
    try:
        config = BrokerConfig.load(config_path, parse_sets(sets))
    except (ConfigError, OSError) as e:
        print(f"tidelog broker: {e}", file=sys.stderr)
        return 2
    try:
        return trio.run(serve, config)
    except KeyboardInterrupt:
        return 130


async def serve(config: BrokerConfig) -> int:
    """Run the broker until it stops: 0 once stopped by a signal, 1 when it stopped by itself
    (every log dir failed)."""
    server = BrokerServer(config)
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await nursery.start(_run_then_exit, server, nursery)
            print(f"broker {config.broker_id} started on port {server.port}", file=sys.stderr, flush=True)
            async for sig in signals:
                logger.info("received %s: controlled shutdown", signal.Signals(sig).name)
                nursery.start_soon(_shutdown, server, nursery)
                break
            async for _ in signals:
                logger.warning("second signal: stopping now")
                nursery.cancel_scope.cancel()
    if server.stopped_because is not None:
        print(f"tidelog broker: broker {config.broker_id} stopped: {server.stopped_because}", file=sys.stderr)
        return 1
    return 0


async def _run_then_exit(server: BrokerServer, nursery: trio.Nursery, *,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the broker; once it has stopped (controlled shutdown done), stop listening for
    signals too, so that the process exits instead of waiting for a second signal."""
    await server.run(task_status=task_status)
    nursery.cancel_scope.cancel()


async def _shutdown(server: BrokerServer, nursery: trio.Nursery) -> None:
    await server.shutdown()
