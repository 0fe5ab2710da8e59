"""``host:port`` as bootstrap servers, listeners and the health probe write it.

One parser for the SDK's bootstrap list, the broker's listeners and ``tidelog health``; each
caller decides what an empty host means and words its own error. IPv6 literals go in
brackets (``[::1]:9092``); an unbracketed one (``::1:9092``) is read up to its last colon.
"""

from __future__ import annotations

__all__ = ["parse_host_port"]

MAX_PORT = 65535


def parse_host_port(text: str, default_port: int | None = None, *, min_port: int = 0) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` -> (host, port); with ``default_port``, also a bare ``host``
    or ``[v6]``. The host may come back empty (``:9092``). ValueError says what is wrong."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: expected [IPv6 address]:port")
        sep, port = rest[:1], rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host = text
    if not sep:
        if default_port is None:
            raise ValueError(f"{text!r}: no port")
        return host, default_port
    if not port.isdigit() or not min_port <= int(port) <= MAX_PORT:
        raise ValueError(f"{text!r}: expected a port from {min_port} to {MAX_PORT}")
    return host, int(port)
