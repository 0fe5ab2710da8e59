"""How a client proves who it is to a broker: TLS and SASL, with Kafka's option names.

``SecurityConfig`` holds kafka-python's option names (``security_protocol``, ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``, ``ssl_check_hostname``,
``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``); ``from_properties``
reads a properties file's keys as librdkafka and Kafka's Java tools spell them
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``, ...).

``open_stream`` connects: TCP, then the TLS handshake (SSL, SASL_SSL), then the SASL exchange
(SASL_PLAINTEXT, SASL_SSL): SaslHandshake names the mechanism, SaslAuthenticate carries its
rounds (one for PLAIN, two for SCRAM, whose last round also proves that the broker holds
the credential). Failures are ``SslAuthenticationError`` (an untrusted or misnamed
certificate, a refused client certificate) and ``SaslAuthenticationError`` (a wrong user or
password, a mechanism the listener does not enable): not retried, and their messages say
which. The SDK's connections and the brokers' own connections to each other use it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import scramp
import trio

from tidelog.errors import BrokerConnectionError, SaslAuthenticationError, SslAuthenticationError, decode_response
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import NONE, for_code
from tidelog.protocol.messages import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

__all__ = ["SecurityConfig", "open_stream", "read_properties", "parse_jaas_config", "JaasCredentials",
           "SECURITY_PROTOCOLS", "SASL_MECHANISMS"]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
READ_BYTES = 64 * 1024
MAX_SCRAM_ITERATIONS = 16384  # Kafka's bound on a stored credential

# librdkafka / Kafka Java property -> SecurityConfig field (both spellings are accepted)
_PROPERTIES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism", "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username", "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile", "ssl.truststore.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile", "ssl.key.location": "ssl_keyfile",
    "ssl.keystore.location": "ssl_certfile",  # a PEM keystore holds the certificate and the key
    "ssl.key.password": "ssl_password", "ssl.key.location.password": "ssl_password",
    "ssl.endpoint.identification.algorithm": "ssl_check_hostname",
}


@dataclass(frozen=True)
class SecurityConfig:
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None  # PEM CA bundle; None: the system's trusted CAs
    ssl_certfile: str | None = None  # PEM client certificate (and key, if ssl_keyfile is None)
    ssl_keyfile: str | None = None
    ssl_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_check_hostname: bool = True
    sasl_mechanism: str = "PLAIN"
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        protocol = str(self.security_protocol).upper()
        object.__setattr__(self, "security_protocol", protocol)
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"security_protocol {self.security_protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}")
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ValueError(f"sasl_mechanism {self.sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
            if not self.sasl_plain_username or self.sasl_plain_password is None:
                raise ValueError(f"security_protocol {protocol} needs sasl_plain_username and sasl_plain_password")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile (the certificate it belongs to)")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> SecurityConfig:
        """From a properties file's keys (librdkafka's or Kafka's); other keys are ignored
        here (the caller decides which it knows), a bad value raises ValueError naming it."""
        return cls(**options_from_properties(props))

    @staticmethod
    def knows(key: str) -> bool:
        """Whether ``from_properties`` reads the property ``key``."""
        return key in _PROPERTIES or key == "sasl.jaas.config"

    def options(self) -> dict[str, Any]:
        """The keyword options that make a client with this security (Producer, Consumer, Admin)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(SecurityConfig)}

    def ssl_context(self) -> ssl.SSLContext:
        return _ssl_context(self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile, self.ssl_password,
                            self.ssl_check_hostname)


def options_from_properties(props: Mapping[str, str]) -> dict[str, Any]:
    """The SecurityConfig options the security properties among ``props`` give (unchecked;
    other keys are ignored)."""
    values: dict[str, Any] = {}
    for key, value in props.items():
        name = _PROPERTIES.get(key)
        if name == "ssl_check_hostname":
            values[name] = str(value).strip().lower() in ("https", "true")
        elif name is not None:
            values[name] = value.strip()
    if "sasl.jaas.config" in props:  # Kafka's Java clients put the user and password there
        credentials = parse_jaas_config(props["sasl.jaas.config"])
        values.setdefault("sasl_plain_username", credentials.username)
        values.setdefault("sasl_plain_password", credentials.password)
    return values


@functools.lru_cache(maxsize=16)
def _ssl_context(cafile: str | None, certfile: str | None, keyfile: str | None, password: str | None,
                 check_hostname: bool) -> ssl.SSLContext:
    """One context per distinct configuration (loading certificates costs milliseconds)."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
        context.check_hostname = check_hostname
        if certfile:
            context.load_cert_chain(certfile, keyfile, password)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the TLS files (ssl_cafile={cafile}, ssl_certfile={certfile}, "
                         f"ssl_keyfile={keyfile}): {e}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def open_stream(host: str, port: int, security: SecurityConfig | None, proto: ClientConnection, *,
                      connect_timeout_s: float, describe: str) -> trio.abc.Stream:
    """A connected stream to ``host:port``, with TLS and SASL done as ``security`` says.
    ``proto`` frames the SASL requests (its correlation ids continue from them).
    Raises BrokerConnectionError (retriable: TCP, timeouts), SslAuthenticationError or
    SaslAuthenticationError; ``describe`` names the peer in messages ("node 1 at h:p")."""
    try:
        with trio.fail_after(connect_timeout_s):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            try:
                if security is not None and security.uses_tls:
                    stream = await _tls(stream, host, security, describe)
                if security is not None and security.uses_sasl:
                    await _sasl(stream, proto, security, describe)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except trio.TooSlowError:
        raise BrokerConnectionError(f"connecting to {describe} timed out after {connect_timeout_s:g} s") from None
    except (OSError, trio.BrokenResourceError) as e:
        raise BrokerConnectionError(f"cannot connect to {describe}: {e}") from None
    return stream


async def _tls(tcp: trio.SocketStream, host: str, security: SecurityConfig, describe: str) -> trio.SSLStream:
    stream = trio.SSLStream(tcp, security.ssl_context(), server_hostname=host)
    try:
        await stream.do_handshake()
    except trio.BrokenResourceError as e:
        cause = e.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):
            raise SslAuthenticationError(f"TLS handshake with {describe} failed: the broker's certificate "
                                         f"is not trusted: {cause.verify_message}") from None
        if isinstance(cause, ssl.SSLError):
            raise SslAuthenticationError(f"TLS handshake with {describe} failed: {cause.reason or cause}"
                                         " (does the listener use TLS, and does it accept this client's certificate?)") from None
        raise BrokerConnectionError(f"TLS handshake with {describe} failed: the connection broke"
                                    f"{f' ({cause})' if cause else ''} (does the listener use TLS?)") from None
    return stream


async def _sasl(stream: trio.abc.Stream, proto: ClientConnection, security: SecurityConfig, describe: str) -> None:
    mechanism = security.sasl_mechanism
    reply = await _exchange(stream, proto, ApiKey.SASL_HANDSHAKE, SaslHandshakeRequest(mechanism), describe)
    assert isinstance(reply, SaslHandshakeResponse)
    if reply.error_code != NONE.code:
        raise SaslAuthenticationError(f"{describe} refused SASL mechanism {mechanism}: "
                                      f"{reply.error_message or for_code(reply.error_code).message}"
                                      f" (enabled there: {', '.join(reply.mechanisms) or 'none'})")
    user, password = security.sasl_plain_username, security.sasl_plain_password or ""
    if mechanism == "PLAIN":
        await _authenticate(stream, proto, f"\0{user}\0{password}".encode(), describe, user)
        return
    client = scramp.ScramClient([mechanism], user, password)
    server_first = await _authenticate(stream, proto, client.get_client_first().encode(), describe, user)
    try:
        client.set_server_first(server_first.decode())
    except (scramp.ScramException, UnicodeDecodeError) as e:
        raise SaslAuthenticationError(f"SASL {mechanism} with {describe}: the broker's first message "
                                      f"is not valid SCRAM: {e}") from None
    if not 0 < int(client.iterations) <= MAX_SCRAM_ITERATIONS:  # the salted password costs that many hashes
        raise SaslAuthenticationError(f"SASL {mechanism} with {describe}: the broker asks for {client.iterations} "
                                      f"iterations (at most {MAX_SCRAM_ITERATIONS} are done)")
    # the salted password takes milliseconds of hashing: not on the event loop (a broker
    # connecting to its peers runs this too)
    final = (await trio.to_thread.run_sync(client.get_client_final)).encode()
    server_final = await _authenticate(stream, proto, final, describe, user)
    try:
        client.set_server_final(server_final.decode())
    except (scramp.ScramException, UnicodeDecodeError) as e:
        raise SaslAuthenticationError(f"SASL {mechanism} with {describe}: the broker did not prove that it "
                                      f"holds the credential of {user!r}: {e}") from None


async def _authenticate(stream: trio.abc.Stream, proto: ClientConnection, auth_bytes: bytes,
                        describe: str, user: str | None) -> bytes:
    reply = await _exchange(stream, proto, ApiKey.SASL_AUTHENTICATE, SaslAuthenticateRequest(auth_bytes), describe)
    assert isinstance(reply, SaslAuthenticateResponse)
    if reply.error_code != NONE.code:
        raise SaslAuthenticationError(f"SASL authentication of user {user!r} with {describe} failed: "
                                      f"{reply.error_message or for_code(reply.error_code).message}")
    return reply.auth_bytes


async def _exchange(stream: trio.abc.Stream, proto: ClientConnection, api_key: ApiKey, message: Message,
                    describe: str) -> Message:
    """One request and its response, before the connection's reader starts."""
    _, frame = proto.send_request(api_key, 0, message)
    await stream.send_all(frame)
    while True:
        data = await stream.receive_some(READ_BYTES)
        if not data:
            raise SaslAuthenticationError(f"{describe} closed the connection during SASL authentication "
                                          f"(does the listener use SASL? a {api_key.name} was not answered)")
        for _, body in proto.receive_data(data):
            return decode_response(response_type(api_key), body)


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file (``key=value``, ``key: value``; ``#`` and ``!`` comments), as
    Kafka's tools read ``--command-config``. Line continuations are not supported."""
    props = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text[0] in "#!":
                continue
            match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", text)
            if match is None:
                raise ValueError(f"{path}:{number}: expected key=value, got {text!r}")
            props[match.group(1)] = match.group(2)
    return props


# -- JAAS credentials (Kafka's sasl.jaas.config) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class JaasCredentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print a password
        return f"JaasCredentials(username={self.username!r}, password=***)"


_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_jaas_config(text: str) -> JaasCredentials:
    """Kafka's ``sasl.jaas.config``: ``<LoginModule> required username="u" password="p";``
    (the login module is not checked: PLAIN's and SCRAM's read alike here). Brokers read
    their own inter-broker credentials so, clients their ``--command-config``'s."""
    options = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_OPTION.findall(text)}
    missing = [k for k in ("username", "password") if not options.get(k)]
    if missing:
        wanted = " and ".join(k + '="..."' for k in missing)
        raise ValueError(f"expected {wanted} in the JAAS config")
    return JaasCredentials(options["username"], options["password"])
