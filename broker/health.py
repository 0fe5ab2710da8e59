"""Broker readiness: in the process (``broker_readiness``) and over the wire (``probe``).

A broker is *ready* when it

1. has loaded (and, after a crash, recovered) its logs,
2. is registered in ZooKeeper (its ephemeral ``/brokers/ids/<id>`` exists: it has a broker
   epoch and its session is connected), and
3. knows the cluster metadata: the controller has sent it an UpdateMetadata that lists the
   broker itself (``BrokerServer.ready``).

Only then does it lead or follow partitions and answer clients with a full view of the
cluster, so only then should a rolling restart move on to the next broker, or a load
balancer or compose ``depends_on: condition: service_healthy`` consider it up.

Inside the broker, ``GET /ready`` on the metrics port (broker/metrics.py) reports the three
checks. From outside, ``tidelog health`` asks the broker itself with a Metadata request (no
HTTP, so it also works when the metrics endpoint is disabled): the broker's metadata cache
is empty until the controller's first UpdateMetadata reached it, which is only sent after
it registered, which is only done after its logs were loaded. A reply that lists brokers and
a controller therefore means ready; with ``broker_id`` given (``--config`` gives it), the
reply must also list that broker.

On a secured inter-broker listener (SSL, SASL_SSL) ``--config`` makes the check connect as
the broker connects to its peers (``inter_broker_security``: its truststore, keystore and
``sasl.jaas.config`` user), to the listener's *advertised* address: that is the name its
certificate carries, where the loopback address usually is not.

This module uses only the standard library and the sans-IO protocol (plus Trio and the
SDK's TLS and SASL code on a secured listener, imported only then), so the health command
starts fast (a container healthcheck runs it every few seconds).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from tidelog.protocol.address import parse_host_port
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.messages import MetadataRequest, MetadataResponse


@dataclass(frozen=True, slots=True)
class Readiness:
    logs_loaded: bool
    zookeeper_connected: bool
    registered: bool
    has_metadata: bool

    @property
    def ready(self) -> bool:
        return self.logs_loaded and self.zookeeper_connected and self.registered and self.has_metadata

    def problems(self) -> list[str]:
        return [text for ok, text in ((self.logs_loaded, "logs not loaded yet"),
                                      (self.zookeeper_connected, "not connected to ZooKeeper"),
                                      (self.registered, "not registered in ZooKeeper"),
                                      (self.has_metadata, "no cluster metadata from the controller yet"))
                if not ok]


def broker_readiness(*, logs_loaded: bool, zookeeper_connected: bool, broker_epoch: int,
                     has_metadata: bool) -> Readiness:
    """A broker's readiness from what it knows (read on its Trio thread). A lost ZooKeeper
    session takes the registration with it, so registered needs both the session and an epoch."""
    return Readiness(logs_loaded=logs_loaded, zookeeper_connected=zookeeper_connected,
                     registered=zookeeper_connected and broker_epoch >= 0, has_metadata=has_metadata)


# -- over the wire ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeResult:
    address: str
    ready: bool
    detail: str  # one line for humans
    controller_id: int = -1
    brokers: tuple[int, ...] = ()


def parse_address(text: str, default_port: int = 9092) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``host`` -> (host, port); an empty host is the loopback."""
    try:
        host, port = parse_host_port(text, default_port)
    except ValueError:
        raise ValueError(f"bad address {text.strip()!r}: expected host:port") from None
    return host or "127.0.0.1", port


def request(host: str, port: int, api_key: int, body: Any, *, timeout: float = 5.0,
            client_id: str = "tidelog-health", api_version: int = 0) -> dict[str, Any]:
    """One blocking request on a connection of its own, the whole exchange bounded by
    ``timeout``: the response body. The broker's tools and the tests share this one."""
    conn = ClientConnection(client_id=client_id)
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as s:
        _, frame = conn.send_request(api_key, api_version, body)
        s.sendall(frame)
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            data = s.recv(1 << 16)
            if not data:
                raise ConnectionError(f"the broker at {host}:{port} closed the connection")
            for _, response in conn.receive_data(data):
                return response


def metadata_request(host: str, port: int, timeout: float, *, all_topics: bool = False,
                     client_id: str = "tidelog-health") -> MetadataResponse:
    """One blocking Metadata request: for no topics (cheap on a broker with many), or with
    ``all_topics`` for every one."""
    from tidelog.errors import decode_response
    from tidelog.protocol.errors import TidelogError

    body = MetadataRequest(topics=None if all_topics else [])
    reply = request(host, port, ApiKey.METADATA, body, timeout=timeout, client_id=client_id)
    try:
        return decode_response(MetadataResponse, reply)
    except TidelogError as e:  # refused as a whole: a TLS or SASL listener says what it wants
        raise ConnectionError(str(e)) from None


def secure_metadata_request(host: str, port: int, security: Any, timeout: float, *, all_topics: bool = False,
                            client_id: str = "tidelog-health") -> MetadataResponse:
    """``metadata_request`` over TLS and SASL as ``security`` (a
    ``tidelog.security.SecurityConfig``) says; a blocking call, in a Trio run of its own.
    Failures to connect or authenticate are ConnectionError."""
    import trio

    from tidelog.errors import decode_response
    from tidelog.protocol.errors import TidelogError
    from tidelog.security import open_stream

    async def ask() -> MetadataResponse:
        conn = ClientConnection(client_id=client_id)
        with trio.fail_after(timeout):
            stream = await open_stream(host, port, security, conn, connect_timeout_s=timeout,
                                       describe=f"{host}:{port}")
            async with stream:
                request = MetadataRequest(topics=None if all_topics else [])
                await stream.send_all(conn.send_request(ApiKey.METADATA, 0, request)[1])
                while True:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        raise ConnectionError(f"the broker at {host}:{port} closed the connection")
                    for _, body in conn.receive_data(data):
                        return decode_response(MetadataResponse, body)  # a refusal raises its error

    try:
        return trio.run(ask)
    except trio.TooSlowError:
        raise ConnectionError(f"no answer from {host}:{port} within {timeout:g} s") from None
    except TidelogError as e:
        raise ConnectionError(str(e)) from None


def probe(address: str, timeout: float = 5.0, broker_id: int | None = None, security: Any = None) -> ProbeResult:
    """Is the broker at ``address`` ready? Never raises for network trouble: that is "not ready".
    ``security``: a ``tidelog.security.SecurityConfig`` for a TLS or SASL listener."""
    try:
        host, port = parse_address(address)
        md = (metadata_request(host, port, timeout) if security is None
              else secure_metadata_request(host, port, security, timeout))
    except (OSError, ValueError, ConnectionError) as e:
        return ProbeResult(address, False, f"cannot ask: {e}")
    except Exception as e:  # a reply that is not a Metadata response
        return ProbeResult(address, False, f"unexpected reply: {e}")
    ids = tuple(sorted(b.node_id for b in md.brokers))
    if not ids:
        return ProbeResult(address, False, "no cluster metadata yet (not registered, or the controller "
                                           "has not reached it)", md.controller_id, ids)
    if broker_id is not None and broker_id not in ids:
        return ProbeResult(address, False, f"broker {broker_id} is not in its metadata yet (brokers {list(ids)})",
                           md.controller_id, ids)
    if md.controller_id < 0:
        return ProbeResult(address, False, f"no controller known (brokers {list(ids)})", md.controller_id, ids)
    who = f"broker {broker_id}" if broker_id is not None else "broker"
    return ProbeResult(address, True, f"{who} ready: {len(ids)} brokers {list(ids)}, controller {md.controller_id}",
                       md.controller_id, ids)


def probe_until(addresses: list[str], timeout: float, wait_s: float, broker_id: int | None = None,
                interval: float = 0.5, security: Any = None) -> list[ProbeResult]:
    """Probe every address; with ``wait_s`` > 0, repeat until all are ready or the time is up."""
    deadline = time.monotonic() + wait_s
    while True:
        results = [probe(a, timeout, broker_id, security) for a in addresses]
        if all(r.ready for r in results) or time.monotonic() + interval > deadline:
            return results
        time.sleep(interval)


def address_from_config(config: Any) -> tuple[str, int]:
    """Where a broker with ``config`` can be reached from its own machine: its listener, with
    a wildcard or empty host replaced by the loopback address."""
    host, port = config.listener
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, port


def security_from_config(config: Any) -> Any:
    """How this broker connects to its peers (None: plain TCP), for checking it the same way."""
    protocol = config.inter_broker_listener.protocol
    if not (protocol.uses_tls or protocol.uses_sasl):
        return None
    from tidelog.broker.security.inter_broker import inter_broker_security

    return inter_broker_security(config)


def run(bootstrap: str | None, config_path: str | None, broker_id: int | None, timeout_ms: int,
        wait_s: float, quiet: bool, out, err, command_config: str | None = None) -> int:
    """``tidelog health``: 0 when every probed broker is ready, 1 otherwise, 2 on a bad config.
    ``command_config``: security settings for ``bootstrap`` (``--command-config``)."""
    addresses = [a for a in (bootstrap or "").split(",") if a.strip()]
    security = None
    if command_config and config_path is None:
        from tidelog.security import SecurityConfig, read_properties

        try:
            security = SecurityConfig.from_properties(read_properties(command_config))
        except (OSError, ValueError) as e:
            print(f"tidelog health: --command-config {command_config}: {e}", file=err)
            return 2
    if config_path is not None:
        from tidelog.broker.config import BrokerConfig, ConfigError

        try:
            config = BrokerConfig.load(config_path)
        except (ConfigError, OSError) as e:
            print(f"tidelog health: {e}", file=err)
            return 2
        security = security_from_config(config)
        if not addresses:
            host, port = address_from_config(config) if security is None else config.advertised
            addresses = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        broker_id = config.broker_id if broker_id is None else broker_id
    if not addresses:
        addresses = ["localhost:9092"]
    results = probe_until(addresses, timeout_ms / 1000, wait_s, broker_id, security=security)
    for r in results:
        if not quiet or not r.ready:
            print(f"{r.address}: {r.detail}" if r.ready else f"{r.address}: not ready: {r.detail}",
                  file=out if r.ready else err)
    return 0 if all(r.ready for r in results) else 1
