"""TLS and SASL on a listener, over real loopback TCP, with the SDK's connection as the client.

A ``SocketServer`` per test, secured as the test says, with a handler that records each
request's context; a throwaway CA (trustme) signs the broker's and the clients' certificates
at run time, and an in-memory credential store holds SCRAM credentials. What must hold:
the principal reaches the handler; a wrong password, an untrusted certificate and a missing
client certificate fail at once with their own error; nothing but ApiVersions and the SASL
requests is served before authentication; and other clients are never disturbed.
"""

from __future__ import annotations

import pytest
import trio
import trustme

from tidelog.aio.connection import BrokerConnection
from tidelog.broker.context import ANONYMOUS, RequestContext
from tidelog.broker.network import SASL_MAX_FRAME_BYTES, SocketServer
from tidelog.broker.security.credentials import SCRAM_MECHANISMS, make_credential
from tidelog.broker.security.listeners import ListenerSecurity, SecurityProtocol
from tidelog.broker.security.tls import server_context
from tidelog.errors import SaslAuthenticationError, SslAuthenticationError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED
from tidelog.protocol.messages import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, SaslHandshakeResponse
from tidelog.security import SecurityConfig

TIMEOUT_S = 10
USERS = {"alice": "alice-secret", "broker": "broker-secret"}
CREDENTIALS = {(user, mechanism): make_credential(mechanism, password)
               for user, password in USERS.items() for mechanism in SCRAM_MECHANISMS}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a broker certificate for 127.0.0.1/localhost and a client certificate, as PEM files."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA(organization_name="Tidelog test CA")
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    broker = ca.issue_cert("127.0.0.1", "localhost", common_name="broker-1")
    broker.private_key_and_cert_chain_pem.write_to_path(str(root / "broker.pem"))
    client = ca.issue_cert("client-1@example.com", common_name="client-1")
    client.private_key_and_cert_chain_pem.write_to_path(str(root / "client.pem"))
    ca.issue_cert("broker.elsewhere.example").private_key_and_cert_chain_pem.write_to_path(str(root / "elsewhere.pem"))
    other_ca = trustme.CA()
    other_ca.cert_pem.write_to_path(str(root / "other-ca.pem"))
    return root


class Recorder:
    def __init__(self):
        self.contexts: list[RequestContext] = []

    def __call__(self, context: RequestContext, body: dict):
        if context.header.api_key == ApiKey.SASL_HANDSHAKE:  # as the broker's handler answers it
            return SaslHandshakeResponse(ILLEGAL_SASL_STATE.code, [], "listener PLAINTEXT does not use SASL")
        self.contexts.append(context)
        return ApiVersionsResponse(0, [])


async def serve(nursery, security: ListenerSecurity) -> tuple[SocketServer, Recorder]:
    recorder = Recorder()
    server = SocketServer(recorder, host="127.0.0.1", port=0, security=security)
    await nursery.start(server.run)
    return server, recorder


def listener(protocol: SecurityProtocol, pki=None, *, client_auth="none",
             mechanisms=("PLAIN", *SCRAM_MECHANISMS)) -> ListenerSecurity:
    context = None
    if protocol.uses_tls:
        context = server_context(str(pki / "broker.pem"), None, str(pki / "ca.pem"), client_auth)
    return ListenerSecurity(protocol.name, protocol, False, context, mechanisms,
                            lambda user, mechanism: CREDENTIALS.get((user, mechanism)), 0.0)


async def ask(nursery, port: int, security: SecurityConfig | None) -> ApiVersionsResponse:
    conn = BrokerConnection("127.0.0.1", port, security=security, connect_timeout_s=TIMEOUT_S)
    with trio.fail_after(TIMEOUT_S):
        await nursery.start(conn.run)
        try:
            return await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
        finally:
            await conn.close()


def sasl(mechanism: str, user: str = "alice", password: str | None = None, protocol: str = "SASL_PLAINTEXT",
         **tls) -> SecurityConfig:
    return SecurityConfig(security_protocol=protocol, sasl_mechanism=mechanism, sasl_plain_username=user,
                          sasl_plain_password=USERS.get(user, "x") if password is None else password, **tls)


# -- TLS --------------------------------------------------------------------------------------


async def test_tls_serves_a_client_that_trusts_the_broker(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SSL, pki))
    await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem")))
    [context] = recorder.contexts
    assert context.principal == ANONYMOUS and context.security_protocol == "SSL" and context.listener == "SSL"


async def test_an_untrusted_broker_certificate_is_named_as_such(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SSL, pki))
    with pytest.raises(SslAuthenticationError, match="certificate is not trusted"):
        await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "other-ca.pem")))
    assert recorder.contexts == []


async def test_a_certificate_for_another_host_is_refused_unless_host_checks_are_off(nursery, pki):
    context = server_context(str(pki / "elsewhere.pem"), None, None, "none")
    server, recorder = await serve(nursery, ListenerSecurity("SSL", SecurityProtocol.SSL, False, context))
    with pytest.raises(SslAuthenticationError, match="not trusted.*mismatch"):
        await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem")))
    await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem"),
                                                   ssl_check_hostname=False))
    assert len(recorder.contexts) == 1


async def test_mutual_tls_makes_the_certificate_subject_the_principal(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SSL, pki, client_auth="required"))
    await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem"),
                                                   ssl_certfile=str(pki / "client.pem")))
    [context] = recorder.contexts
    assert context.principal.startswith("User:") and "CN=client-1" in context.principal
    assert context.authenticated


async def test_a_missing_client_certificate_fails_with_a_tls_error(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SSL, pki, client_auth="required"))
    with pytest.raises(SslAuthenticationError):
        await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem")))
    assert recorder.contexts == []


async def test_a_plain_client_on_a_tls_listener_is_told_so_and_others_carry_on(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SSL, pki))
    conn = BrokerConnection("127.0.0.1", server.port, connect_timeout_s=TIMEOUT_S)
    await nursery.start(conn.run)
    with pytest.raises(SslAuthenticationError, match="listener SSL speaks TLS"):
        await conn.request(MetadataRequest(), api_key=ApiKey.METADATA)
    await ask(nursery, server.port, SecurityConfig(security_protocol="SSL", ssl_cafile=str(pki / "ca.pem")))
    assert [c.header.api_key for c in recorder.contexts] == [ApiKey.API_VERSIONS]


# -- SASL -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_makes_the_user_the_principal(nursery, mechanism):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    await ask(nursery, server.port, sasl(mechanism))
    [context] = recorder.contexts
    assert context.principal == "User:alice" and context.security_protocol == "SASL_PLAINTEXT"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-secret")])
async def test_a_wrong_password_or_user_fails_alike_and_serves_nothing(nursery, mechanism, user, password):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    with pytest.raises(SaslAuthenticationError, match=f"invalid credentials with SASL mechanism {mechanism}"):
        await ask(nursery, server.port, sasl(mechanism, user, password))
    assert recorder.contexts == []
    await ask(nursery, server.port, sasl(mechanism))  # the listener carries on
    assert [c.principal for c in recorder.contexts] == ["User:alice"]


async def test_a_mechanism_the_listener_does_not_enable_is_named(nursery):
    server, _ = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT, mechanisms=("SCRAM-SHA-512",)))
    with pytest.raises(SaslAuthenticationError, match=r"refused SASL mechanism PLAIN.*enabled there: SCRAM-SHA-512"):
        await ask(nursery, server.port, sasl("PLAIN"))


async def test_a_sasl_client_on_a_plaintext_listener_is_told_so(nursery):
    server, _ = await serve(nursery, ListenerSecurity.plaintext())
    with pytest.raises(SaslAuthenticationError, match="ILLEGAL_SASL_STATE|does not use SASL"):
        await ask(nursery, server.port, sasl("SCRAM-SHA-256"))


async def test_sasl_over_tls(nursery, pki):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_SSL, pki))
    await ask(nursery, server.port, sasl("SCRAM-SHA-512", protocol="SASL_SSL", ssl_cafile=str(pki / "ca.pem")))
    [context] = recorder.contexts
    assert context.principal == "User:alice" and context.security_protocol == "SASL_SSL"


async def closed(stream: trio.SocketStream) -> bool:
    with trio.move_on_after(TIMEOUT_S):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


async def test_a_request_before_authentication_is_refused_and_closes_the_connection(nursery):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    conn = ClientConnection(client_id="raw")
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        # many requests in one write: the first is refused, the rest not even looked at (each
        # refusal would be a log line)
        frames = b"".join(conn.send_request(ApiKey.METADATA, 0, MetadataRequest())[1] for _ in range(200))
        await stream.send_all(frames)
        with trio.fail_after(TIMEOUT_S):
            got = []
            while not got:
                got = conn.receive_data(await stream.receive_some(65536))
        [(_, body)] = got
        assert body["error_code"] == SASL_AUTHENTICATION_FAILED.code
        assert "requires SASL authentication before METADATA" in body["error_message"]
        assert await closed(stream)
    assert recorder.contexts == []
    assert server.stats().invalid_requests == 1


async def test_a_client_without_sasl_is_told_what_the_listener_wants(nursery):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    conn = BrokerConnection("127.0.0.1", server.port, connect_timeout_s=TIMEOUT_S)
    await nursery.start(conn.run)
    with pytest.raises(SaslAuthenticationError, match="security_protocol=SASL_PLAINTEXT"):
        await conn.request(MetadataRequest(), api_key=ApiKey.METADATA)
    assert recorder.contexts == []


async def test_api_versions_is_served_before_authentication(nursery):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    conn = ClientConnection(client_id="raw")
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        await stream.send_all(conn.send_request(ApiKey.API_VERSIONS, 0, ApiVersionsRequest())[1])
        with trio.fail_after(TIMEOUT_S):
            got = []
            while not got:
                got = conn.receive_data(await stream.receive_some(65536))
    assert [c.principal for c in recorder.contexts] == [ANONYMOUS]


async def test_an_unauthenticated_peer_gets_a_bounded_number_of_requests(nursery):
    # ApiVersions is served before authentication, but not for ever: each may be half a
    # megabyte decoded on the event loop
    from tidelog.broker.network import PRE_AUTH_MAX_REQUESTS
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    conn = ClientConnection(client_id="raw")
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        for _ in range(PRE_AUTH_MAX_REQUESTS + 1):
            await stream.send_all(conn.send_request(ApiKey.API_VERSIONS, 0, ApiVersionsRequest())[1])
        got = []
        with trio.fail_after(TIMEOUT_S):
            while len(got) < PRE_AUTH_MAX_REQUESTS + 1:
                got += conn.receive_data(await stream.receive_some(65536))
        assert got[-1][1]["error_code"] == SASL_AUTHENTICATION_FAILED.code
        assert f"at most {PRE_AUTH_MAX_REQUESTS} requests" in got[-1][1]["error_message"]
        assert await closed(stream)
    assert len(recorder.contexts) == PRE_AUTH_MAX_REQUESTS


async def test_a_large_frame_before_authentication_closes_the_connection(nursery):
    server, recorder = await serve(nursery, listener(SecurityProtocol.SASL_PLAINTEXT))
    async with await trio.open_tcp_stream("127.0.0.1", server.port) as stream:
        await stream.send_all((SASL_MAX_FRAME_BYTES + 1).to_bytes(4, "big") + b"x" * 1024)
        assert await closed(stream)
    assert recorder.contexts == []
