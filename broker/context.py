"""What a handler knows about the request it serves besides its body: ``RequestContext``.

The network layer builds one per request and passes it to the handler with the body; the
handler gets it with the typed request (``broker.apis``). It is the one place where the
connection's identity reaches the APIs: the peer's address (the group coordinator records a
member's host), the listener the request came in on and its security protocol, whether it is
the inter-broker listener, and the principal the connection authenticated as (``ANONYMOUS``
on a listener that does not authenticate its clients: PLAINTEXT, or SSL without client
certificates).
"""

from __future__ import annotations

from typing import NamedTuple

from tidelog.protocol.codec import RequestHeader


def host_of(peer: str) -> str:
    """The host of a ``host:port`` peer address (IPv6 hosts keep their colons)."""
    return peer.rpartition(":")[0] if ":" in peer else peer


ANONYMOUS = "User:ANONYMOUS"  # Kafka's principal for unauthenticated connections
DEFAULT_LISTENER = "PLAINTEXT"


class RequestContext(NamedTuple):  # one per request: a tuple is made in one call
    header: RequestHeader
    peer: str = "?"  # "host:port" of the client, "?" when the socket could not tell
    listener: str = DEFAULT_LISTENER
    principal: str = ANONYMOUS
    security_protocol: str = "PLAINTEXT"
    inter_broker: bool = True  # the listener is inter.broker.listener.name (one listener: it is)
    host: str = ""  # the peer's host, taken out of ``peer`` once per connection (authorization reads it)
    # an SSL listener that asks clients for a certificate (ssl.client.auth requested or
    # required): one that sent none is unauthenticated there, not on an open listener
    client_certificates: bool = False
    # the Kafka version of a request read on a Kafka listener (its header has the native
    # version serving it); None for a native request
    kafka_version: int | None = None
    # its client waits out a response's throttle_time_ms itself (a Kafka client, from the
    # API's KIP-219 version on): a throttled answer goes out at once, then the connection is
    # muted (broker/security/quotas.py)
    client_throttles: bool = False

    @property
    def authenticated(self) -> bool:
        """The principal was proven (SASL, or a client certificate), not assumed."""
        return self.principal != ANONYMOUS

    @property
    def peer_host(self) -> str:
        return self.host or host_of(self.peer)

    @property
    def client_id(self) -> str | None:
        return self.header.client_id
