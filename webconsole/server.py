"""``tidelog console``'s server: the SDK clients, the watch and the web app in one Trio
nursery, served by Hypercorn's Trio worker.

The console binds 127.0.0.1 unless told otherwise. A login (basic auth) is refused without
TLS: the password would cross the network in clear. Stopping the process (SIGINT, SIGTERM)
ends Hypercorn, which closes the clients.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

import trio

from tidelog.errors import TidelogError
from tidelog.protocol.errors import SECURITY_DISABLED
from tidelog.webconsole.app import Clients, build_app
from tidelog.webconsole.permissions import OPEN, READ_ONLY, Permissions, principal_of
from tidelog.webconsole.watch import ClusterWatch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsoleConfig:
    bootstrap: str
    host: str = "127.0.0.1"
    port: int = 8080
    refresh_ms: int = 1000
    window_s: int = 300
    security: dict[str, Any] = field(default_factory=dict)  # the SDK's security options
    login: tuple[str, str] | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def problem(self) -> str | None:
        """What makes this configuration unusable, or None."""
        if not 0 < self.port < 65536:
            return f"--port must be between 1 and 65535, got {self.port}"
        if not 100 <= self.refresh_ms <= 600000:
            return f"--refresh-ms must be between 100 and 600000, got {self.refresh_ms}"
        if not 10 <= self.window_s <= 86400:
            return f"--window-s must be between 10 and 86400, got {self.window_s}"
        if (self.certfile is None) != (self.keyfile is None):
            return "--certfile and --keyfile go together"
        if self.login is not None and self.certfile is None:
            return ("a login (--login-user) needs TLS (--certfile and --keyfile): basic auth would send "
                    "the password in clear")
        if self.login is not None and not self.login[1]:
            return "the login's password is empty (TIDELOG_CONSOLE_PASSWORD or --login-password-file)"
        return None

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"


async def discover_permissions(admin: Any, principal: str) -> Permissions:
    try:
        bindings = await admin.describe_acls(timeout_ms=10000)
    except TidelogError as e:
        if e.code == SECURITY_DISABLED.code:
            return Permissions(OPEN, principal, reason="the cluster has no authorizer")
        return Permissions(READ_ONLY, principal, reason=f"the ACLs cannot be read ({e}): actions are not offered")
    return Permissions.from_bindings(principal, bindings)


async def serve(config: ConsoleConfig, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    from tidelog.aio import AsyncAdmin, AsyncConsumer, AsyncProducer

    security = dict(config.security)
    async with trio.open_nursery() as nursery:
        admin = AsyncAdmin(config.bootstrap, client_id="tidelog-console", request_timeout_ms=10000,
                           default_api_timeout_ms=15000, **security)
        await nursery.start(admin.run)
        producer = AsyncProducer(config.bootstrap, client_id="tidelog-console", acks="all", linger_ms=0,
                                 max_block_ms=10000, delivery_timeout_ms=30000, **security)
        await nursery.start(producer.run)
        watch = ClusterWatch(admin, interval_s=config.refresh_ms / 1000, window_s=config.window_s)
        permissions = await discover_permissions(admin, principal_of(security))
        clients = Clients(admin, producer,
                          lambda: AsyncConsumer(config.bootstrap, client_id="tidelog-console-browser",
                                                enable_auto_commit=False, auto_offset_reset="earliest",
                                                **security),
                          watch, permissions, config.refresh_ms, _version(), config.login,
                          frozenset({"localhost", config.host.lower()}))
        if config.login is None and not config.is_loopback:
            logger.warning("the console serves %s without a login: anyone who can reach that address can "
                           "act on the cluster as %s (give it --login-user and TLS to serve beyond this "
                           "machine)", config.host, principal_of(security))
        nursery.start_soon(watch.run)
        nursery.start_soon(_refresh_permissions, clients, admin, principal_of(security))
        hc = Config()
        hc.bind = [f"[{config.host}]:{config.port}" if ":" in config.host else f"{config.host}:{config.port}"]
        hc.certfile, hc.keyfile = config.certfile, config.keyfile
        hc.accesslog = None
        hc.graceful_timeout = 2.0
        stopped = trio.Event()
        nursery.start_soon(_stop_on_signals, stopped)
        scheme = "https" if config.certfile else "http"
        logger.info("console at %s://%s:%d/ (cluster %s)", scheme, config.host, config.port, config.bootstrap)
        task_status.started()
        await hypercorn_serve(build_app(clients), hc, shutdown_trigger=stopped.wait)
        await producer.close()
        nursery.cancel_scope.cancel()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tidelog")
    except PackageNotFoundError:
        return "unknown"


async def _refresh_permissions(clients: Clients, admin: Any, principal: str) -> None:
    while True:
        await trio.sleep(30)
        clients.permissions = await discover_permissions(admin, principal)


async def _stop_on_signals(stopped: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stopped.set()
            return
