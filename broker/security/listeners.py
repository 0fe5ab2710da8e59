"""A broker's listeners: names, addresses and security protocols, by Kafka's rules.

* ``listeners`` is a comma-separated list of ``NAME://host:port``. A name is a security
  protocol (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``) or any other name
  that ``listener.security.protocol.map`` (``NAME:PROTOCOL,...``) maps to one; the map's
  default maps each protocol to itself. Names are unique; so are ports (port 0, a free
  port picked at start, may repeat).
* ``advertised.listeners`` (default: ``listeners``) is what clients and other brokers are
  told, per listener name; every advertised name is a listener, and a listener that is not
  advertised is published at its bound address.
* ``inter.broker.listener.name`` (default: the first listener) is the listener brokers use
  between themselves: followers fetch from leaders on it, the controller sends its requests
  to it, and the inter-broker APIs are accepted only on it.
* A client is told, for every broker, the address of the listener the client connected on
  (Kafka's rule): a broker without a listener of that name is not in the client's metadata.
* ``kafka.listeners`` (and ``kafka.advertised.listeners``) are listeners that speak Kafka's
  wire protocol (protocol/kafka), written and mapped to security protocols by the same
  rules. Each is known inside the cluster as ``KAFKA_<NAME>`` (``kafka_name``), so
  ``kafka.listeners = "PLAINTEXT://..."`` lives beside the native PLAINTEXT listener; a Kafka
  client is told the other brokers' Kafka addresses. A Kafka listener is never the
  inter-broker one.

Everything here is pure; ``parse_listeners`` and ``resolve`` raise ValueError with a message
that names the listener and the problem.
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidelog.protocol.address import parse_host_port


class SecurityProtocol(enum.StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in SecurityProtocol)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One ``NAME://host:port`` (host "" binds every interface)."""

    name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Listener:
    """A listener as the broker serves it: where it binds, what it advertises, its protocol."""

    name: str
    protocol: SecurityProtocol
    bind: Endpoint
    advertised: Endpoint
    inter_broker: bool
    wire: str = "tidelog"  # or "kafka": the protocol its clients speak


def parse_endpoints(value: str) -> list[Endpoint]:
    """``"A://h:1,B://h:2"`` -> endpoints, names upper-cased, in order."""
    endpoints = []
    for item in (part.strip() for part in value.split(",")):
        name, sep, rest = item.partition("://")
        if not sep or not name:
            raise ValueError(f"{item!r}: expected NAME://host:port, e.g. PLAINTEXT://127.0.0.1:9092")
        try:
            host, port = parse_host_port(rest)
        except ValueError:
            raise ValueError(f"{item!r}: expected NAME://host:port with a port from 0 to 65535") from None
        endpoints.append(Endpoint(name.strip().upper(), host, port))
    names = [e.name for e in endpoints]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"listener name {dup[0]} appears twice")
    ports = [e.port for e in endpoints if e.port]
    if dup_ports := sorted({p for p in ports if ports.count(p) > 1}):
        raise ValueError(f"port {dup_ports[0]} is used by two listeners")
    return endpoints


def parse_protocol_map(value: str) -> dict[str, SecurityProtocol]:
    """``"CLIENT:SASL_SSL,BROKER:SSL"`` -> {name: protocol}."""
    mapping = {}
    for item in (part.strip() for part in value.split(",") if part.strip()):
        name, sep, protocol = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"{item!r}: expected NAME:PROTOCOL")
        try:
            mapping[name.strip().upper()] = SecurityProtocol(protocol.strip().upper())
        except ValueError:
            raise ValueError(f"{item!r}: unknown security protocol {protocol.strip()!r} "
                             f"(known: {', '.join(SecurityProtocol)})") from None
    return mapping


def _endpoints(listeners: str, advertised: str | None, protocol_map: str, kind: str, setting: str
               ) -> tuple[list[Endpoint], dict[str, Endpoint], dict[str, SecurityProtocol]]:
    """Bound endpoints, advertised ones by name and the protocol map, checked: every listener
    has a protocol, every advertised name is a listener. ``kind`` and ``setting`` name them
    in errors ("Kafka ", "kafka.listeners")."""
    bound = parse_endpoints(listeners)
    published = {e.name: e for e in parse_endpoints(advertised)} if advertised else {}
    protocols = parse_protocol_map(protocol_map)
    names = [e.name for e in bound]
    for name in names:
        if name not in protocols:
            raise ValueError(f"{kind}listener {name} has no security protocol: name one of "
                             f"{', '.join(SecurityProtocol)} or map it in listener.security.protocol.map")
    if extra := sorted(published.keys() - set(names)):
        raise ValueError(f"{kind}advertised listener {extra[0]} is not in {setting} ({', '.join(names)})")
    return bound, published, protocols


def resolve(listeners: str, advertised: str | None, protocol_map: str,
            inter_broker_name: str | None) -> tuple[Listener, ...]:
    """The broker's listeners from the four settings, checked against each other."""
    bound, published, protocols = _endpoints(listeners, advertised, protocol_map, "", "listeners")
    names = [e.name for e in bound]
    inter = (inter_broker_name or names[0]).upper()
    if inter not in names:
        raise ValueError(f"inter.broker.listener.name {inter} is not in listeners ({', '.join(names)})")
    return tuple(Listener(e.name, protocols[e.name], e, published.get(e.name, e), e.name == inter)
                 for e in bound)


KAFKA_PREFIX = "KAFKA_"


def kafka_name(name: str) -> str:
    """The cluster-wide name of the Kafka listener a user calls ``name``."""
    return f"{KAFKA_PREFIX}{name}"


def resolve_kafka(listeners: str | None, advertised: str | None, protocol_map: str,
                  native: Iterable[Listener]) -> tuple[Listener, ...]:
    """The Kafka-protocol listeners (``kafka.listeners``), checked against the native ones."""
    if not listeners:
        if advertised:
            raise ValueError("kafka.advertised.listeners is set but kafka.listeners is not")
        return ()
    bound, published, protocols = _endpoints(listeners, advertised, protocol_map, "Kafka ", "kafka.listeners")
    taken = {listener.name: listener for listener in native}
    used_ports = {listener.bind.port for listener in taken.values() if listener.bind.port}
    out = []
    for e in bound:
        name = kafka_name(e.name)
        if name in taken:
            raise ValueError(f"Kafka listener {e.name} would be called {name}, the name of a listener in listeners")
        if e.port and e.port in used_ports:
            raise ValueError(f"port {e.port} is used by a listener in listeners and by Kafka listener {e.name}")
        adv = published.get(e.name, e)
        out.append(Listener(name, protocols[e.name], Endpoint(name, e.host, e.port),
                            Endpoint(name, adv.host, adv.port), False, "kafka"))
    return tuple(out)


def inter_broker(listeners: Iterable[Listener]) -> Listener:
    return next(listener for listener in listeners if listener.inter_broker)


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What the socket server of one listener needs to authenticate its connections."""

    name: str
    protocol: SecurityProtocol
    inter_broker: bool
    ssl_context: Any = None  # ssl.SSLContext on SSL and SASL_SSL listeners
    sasl_mechanisms: tuple[str, ...] = ()
    credentials: Callable[[str, str], Any] | None = None  # (user, mechanism) -> ScramCredential | None
    failed_authentication_delay_s: float = 0.1
    usual_iterations: Callable[[str], int] | None = None  # mechanism -> what an unknown user's decoy gets

    @property
    def asks_client_certificates(self) -> bool:
        """TLS client authentication required or requested (``ssl.client.auth``): such a
        listener counts as authenticating even for a client that sent no certificate."""
        return getattr(self.ssl_context, "verify_mode", ssl.CERT_NONE) != ssl.CERT_NONE

    @classmethod
    def plaintext(cls, name: str = "PLAINTEXT") -> ListenerSecurity:
        return cls(name, SecurityProtocol.PLAINTEXT, True)
