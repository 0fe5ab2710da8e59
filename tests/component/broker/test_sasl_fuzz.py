"""The SASL exchange under hostile input: random, truncated and out-of-order authentication.

A SASL_PLAINTEXT listener with a recording handler; each fuzz connection sends a random
sequence of frames, chosen from valid SaslHandshakes, SaslAuthenticates with random or
truncated SCRAM and PLAIN messages, requests that are not allowed before authentication,
malformed envelopes and raw garbage, then reads until the server closes or goes quiet. What
must hold, whatever was sent: no request other than ApiVersions reaches the handler
unauthenticated, no connection authenticates without the password, the server never logs an
unexpected error, and a well-behaved client authenticates and is served afterwards. Bounded
by ``--fuzz-seconds`` (default a short slice) and replayable with ``--fuzz-seed``.
"""

from __future__ import annotations

import logging
import random
import time

import pytest
import scramp
import trio

from tidelog.aio.connection import BrokerConnection
from tidelog.broker.context import ANONYMOUS, RequestContext
from tidelog.broker.network import SocketServer
from tidelog.broker.security.credentials import SCRAM_MECHANISMS, make_credential
from tidelog.broker.security.listeners import ListenerSecurity, SecurityProtocol
from tidelog.protocol.codec import ApiKey, RequestHeader, encode_request
from tidelog.protocol.frames import encode_frame
from tidelog.protocol.messages import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from tidelog.security import SecurityConfig

CREDENTIALS = {("alice", m): make_credential(m, "alice-secret") for m in SCRAM_MECHANISMS}
MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
READ_QUIET_S = 0.2
DEFAULT_SLICE_S = 3.0


class Recorder:
    def __init__(self):
        self.contexts: list[RequestContext] = []

    def __call__(self, context: RequestContext, body: dict):
        self.contexts.append(context)
        return ApiVersionsResponse(0, [])


def _frame(api_key: int, body, correlation_id: int, version: int = 0) -> bytes:
    return encode_frame(encode_request(RequestHeader(api_key, version, correlation_id, "fuzz"), body))


def _auth_bytes(rng: random.Random) -> bytes:
    """Plausible or broken SASL payloads: SCRAM first/final messages, PLAIN triples, noise."""
    kind = rng.randrange(7)
    if kind == 0:
        return scramp.ScramClient([rng.choice(SCRAM_MECHANISMS)], rng.choice(("alice", "mallory", "a,=b")),
                                  "guess").get_client_first().encode()
    if kind == 1:
        return f"\0{rng.choice(('alice', 'mallory'))}\0{rng.choice(('guess', '', 'alice'))}".encode()
    if kind == 2:  # a SCRAM final message with a made-up proof
        return f"c=biws,r={rng.randbytes(8).hex()},p={rng.randbytes(32).hex()}".encode()
    if kind == 3:
        return rng.randbytes(rng.randrange(0, 300))
    if kind == 4:  # truncated valid-looking messages
        good = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "x").get_client_first().encode()
        return good[:rng.randrange(len(good))]
    if kind == 5:
        return b"n,,n=alice,r=" + b"\xff" * rng.randrange(1, 40)
    return b"\0" * rng.randrange(0, 5)


def _fuzz_frames(rng: random.Random) -> bytes:
    out = bytearray()
    for correlation_id in range(rng.randrange(1, 8)):
        choice = rng.randrange(8)
        if choice == 0:
            out += _frame(ApiKey.SASL_HANDSHAKE, {"mechanism": rng.choice((*MECHANISMS, "GSSAPI", ""))}, correlation_id)
        elif choice in (1, 2):
            out += _frame(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": _auth_bytes(rng)}, correlation_id)
        elif choice == 3:
            out += _frame(rng.choice((ApiKey.METADATA, ApiKey.PRODUCE, ApiKey.LEADER_AND_ISR, ApiKey.FETCH)),
                          MetadataRequest(), correlation_id)
        elif choice == 4:
            out += _frame(ApiKey.API_VERSIONS, ApiVersionsRequest(), correlation_id)
        elif choice == 5:  # a wrong body type for the SASL APIs
            out += _frame(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": rng.randrange(1 << 30)}, correlation_id)
        elif choice == 6:
            out += rng.randbytes(rng.randrange(1, 64))
        else:
            frame = _frame(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": _auth_bytes(rng)}, correlation_id)
            out += frame[:rng.randrange(1, len(frame))]  # truncated, the connection then ends
            break
    return bytes(out)


async def _one_connection(port: int, data: bytes) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        try:
            await stream.send_all(data)
            await stream.send_eof()
            while True:
                with trio.move_on_after(READ_QUIET_S):
                    if not await stream.receive_some(65536):
                        return
                    continue
                return
        except trio.BrokenResourceError:
            return


@pytest.fixture
def fuzz_budget(request) -> tuple[float, int]:
    seconds = request.config.getoption("--fuzz-seconds", default=None) or DEFAULT_SLICE_S
    seed = request.config.getoption("--fuzz-seed", default=None)
    return float(seconds), int(seed) if seed is not None else random.randrange(1 << 32)


async def test_random_and_truncated_sasl_never_authenticates_or_crashes(nursery, caplog, fuzz_budget):
    seconds, seed = fuzz_budget
    rng = random.Random(seed)
    recorder = Recorder()
    security = ListenerSecurity("SASL_PLAINTEXT", SecurityProtocol.SASL_PLAINTEXT, False, None, MECHANISMS,
                                lambda user, mechanism: CREDENTIALS.get((user, mechanism)), 0.0)
    server = SocketServer(recorder, host="127.0.0.1", port=0, security=security)
    await nursery.start(server.run)
    caplog.set_level(logging.ERROR, logger="tidelog.broker.network")
    deadline = time.monotonic() + seconds
    connections = 0
    while time.monotonic() < deadline and connections < 10_000:
        await _one_connection(server.port, _fuzz_frames(rng))
        connections += 1
    served = [(c.header.api_key, c.principal) for c in recorder.contexts]
    assert all(key == ApiKey.API_VERSIONS and principal == ANONYMOUS for key, principal in served), (seed, served)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], seed
    good = BrokerConnection("127.0.0.1", server.port, security=SecurityConfig(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="alice",
        sasl_plain_password="alice-secret"))
    await nursery.start(good.run)
    await good.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
    assert recorder.contexts[-1].principal == "User:alice"
    await good.close()
    assert connections > 0
