"""The one host:port parser behind bootstrap servers, listeners and the health probe."""

from __future__ import annotations

import pytest

from tidelog.protocol.address import parse_host_port


@pytest.mark.parametrize("text,expected", [
    ("h:1", ("h", 1)), (" h:9092 ", ("h", 9092)), (":5", ("", 5)), ("[::1]:7", ("::1", 7)),
    ("::1:9092", ("::1", 9092)), ("h:0", ("h", 0)), ("h:65535", ("h", 65535)),
])
def test_host_and_port(text, expected):
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text,expected", [("h", ("h", 9092)), ("[::1]", ("::1", 9092)), ("h:1", ("h", 1))])
def test_a_default_port_makes_the_port_optional(text, expected):
    assert parse_host_port(text, 9092) == expected


@pytest.mark.parametrize("text", ["h", "h:", "h:x", "h:65536", "[::1]", "[::1", "[::1]x", "h:-1"])
def test_bad_addresses_raise(text):
    with pytest.raises(ValueError):
        parse_host_port(text)


def test_a_minimum_port():
    with pytest.raises(ValueError, match="from 1 to 65535"):
        parse_host_port("h:0", min_port=1)
