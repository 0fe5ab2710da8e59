"""``tidelog broker``: run one broker in the foreground.

SIGTERM (or Ctrl-C, or SIGHUP: a closed terminal) starts a controlled shutdown: leadership is
moved away, the logs are flushed and the clean-shutdown marker written. A second signal stops
at once.

A signal while the broker is still starting (recovering its logs, or waiting for ZooKeeper
to answer) cancels the start, as Kafka halts a broker that is starting up: what was opened
is closed, logs not fully loaded are left for the next start to recover, and the process
exits with 128 + the signal's number (143 for SIGTERM).
"""

from __future__ import annotations

import enum
import logging
import signal
import sys

import trio

from tidelog.broker.config import BrokerConfig, ConfigError
from tidelog.broker.server import BrokerServer
from tidelog.protocol.errors import TidelogError

logger = logging.getLogger("tidelog.broker")

# SIGHUP too: the JVM runs Kafka's shutdown hook on it, so a closed terminal is a clean stop
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Reaction(enum.Enum):
    CANCEL_START = "cancel the start"
    CONTROLLED_SHUTDOWN = "controlled shutdown"
    STOP_NOW = "stop now"


def reaction(started: bool, earlier_signals: int) -> Reaction:
    """What a stop signal does. The first one cancels a start still under way (it may wait on
    ZooKeeper or on log recovery for minutes) or, once the broker has started, begins the
    controlled shutdown; any later one skips what is left of the controlled shutdown."""
    if earlier_signals:
        return Reaction.STOP_NOW
    return Reaction.CONTROLLED_SHUTDOWN if started else Reaction.CANCEL_START


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
    """Run the broker until it stops: 0 once stopped by a signal, 1 when it could not start
    (a problem named in one line) or stopped by itself (every log dir failed), 128 + the
    signal's number when a signal cancelled its start."""
    server = BrokerServer(config)
    life = _Life()
    failure = None
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_follow_signals, signals, server, nursery, life)
            try:
                await nursery.start(_run_then_exit, server, nursery)
            except Exception as e:
                failure = start_failure(e)
                if failure is None:
                    raise
                logger.debug("the start failed", exc_info=e)
                nursery.cancel_scope.cancel()
            else:
                life.started = True
                print(f"broker {config.broker_id} started on port {server.port}", file=sys.stderr, flush=True)
    if failure is not None:
        print(f"tidelog broker: {failure}", file=sys.stderr)
        return 1
    if not life.started and life.signals:
        name = signal.Signals(life.signals[0]).name
        print(f"tidelog broker: broker {config.broker_id} stopped by {name} before it had started",
              file=sys.stderr)
        return 128 + life.signals[0]
    if server.stopped_because is not None:
        print(f"tidelog broker: broker {config.broker_id} stopped: {server.stopped_because}", file=sys.stderr)
        return 1
    return 0


def start_failure(exc: BaseException) -> str | None:
    """What a failed start says on one line, when every exception it raised names its cause:
    the broker's own errors (another broker's or cluster's log dir, a broker.id registered by a
    live broker, ZooKeeper unreachable, a bad setting) and the system's (a port in use, a
    directory that cannot be written). None for anything else: a bug, whose traceback is kept
    (``--log-level DEBUG`` shows the others' too)."""
    leaves = list(_leaves(exc))
    if not all(isinstance(e, (TidelogError, OSError)) for e in leaves):
        return None
    return "; ".join(dict.fromkeys(str(e) for e in leaves))


def _leaves(exc: BaseException):
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


class _Life:
    """What ``serve`` has seen: whether the broker has started, and the stop signals so far."""

    def __init__(self) -> None:
        self.started = False
        self.signals: list[int] = []


async def _follow_signals(signals, server: BrokerServer, nursery: trio.Nursery, life: _Life) -> None:
    async for sig in signals:
        action = reaction(life.started, len(life.signals))
        life.signals.append(sig)
        name = signal.Signals(sig).name
        if action is Reaction.CONTROLLED_SHUTDOWN:
            logger.info("received %s: controlled shutdown", name)
            nursery.start_soon(_shutdown, server, nursery)
        elif action is Reaction.CANCEL_START:
            logger.warning("received %s while starting: stopping", name)
            nursery.cancel_scope.cancel()
        else:
            logger.warning("second signal (%s): stopping now", name)
            nursery.cancel_scope.cancel()


async def _run_then_exit(server: BrokerServer, nursery: trio.Nursery, *,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the broker; once it has stopped (controlled shutdown done), stop listening for
    signals too, so that the process exits instead of waiting for a second signal."""
    await server.run(task_status=task_status)
    nursery.cancel_scope.cancel()


async def _shutdown(server: BrokerServer, nursery: trio.Nursery) -> None:
    await server.shutdown()
