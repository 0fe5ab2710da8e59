"""The server side of SASL authentication: SaslHandshake, then SaslAuthenticate rounds.

A connection on a SASL listener (SASL_PLAINTEXT, SASL_SSL) owns one ``ServerAuthenticator``.
Until it reports ``complete``, the connection serves only ApiVersions, SaslHandshake and
SaslAuthenticate (``allows``); any other request closes the connection (Kafka answers such a
request with nothing and disconnects). The states:

================  ================================  ===================================
state             request                           outcome
================  ================================  ===================================
HANDSHAKE         SaslHandshake(enabled mechanism)  -> AUTHENTICATE; NONE + the list
HANDSHAKE         SaslHandshake(other mechanism)    stays; UNSUPPORTED_SASL_MECHANISM
HANDSHAKE         SaslAuthenticate                  -> FAILED; ILLEGAL_SASL_STATE
AUTHENTICATE      SaslAuthenticate(a round)         stays (SCRAM's first round), or
                                                    -> COMPLETE (principal User:<name>),
                                                    or -> FAILED; SASL_AUTHENTICATION_FAILED
AUTHENTICATE      SaslHandshake                     -> FAILED; ILLEGAL_SASL_STATE
COMPLETE, FAILED  SaslHandshake / SaslAuthenticate  -> FAILED; ILLEGAL_SASL_STATE
================  ================================  ===================================

After FAILED the connection answers that request (late by
``connection.failed.authentication.delay.ms``, to slow password guessing) and closes.

Mechanisms. SCRAM-SHA-256/512 (RFC 5802, by scramp) checks a client's proof against the
stored credential (``broker.security.credentials``); the server never learns the password.
PLAIN checks ``authzid NUL user NUL password`` against the user's stored SCRAM credential (one
credential store serves both; a password is only ever compared through its salted hash).
An unknown user and a wrong password fail alike, in the same round: an unknown SCRAM user
is given a made-up salt and the iteration count most users have, so the exchange cannot tell
which users exist.

Costs. A SCRAM round is a few HMACs; PLAIN derives the salted password (PBKDF2, thousands of
iterations), so the network layer runs each round in a worker thread: hashlib releases the
GIL, and no authentication holds the event loop.
"""

from __future__ import annotations

import enum
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

import scramp

from tidelog.broker.security.credentials import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    ScramCredential,
    password_matches,
)
from tidelog.protocol.errors import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    ErrorCode,
)

SASL_MECHANISMS = ("PLAIN", *SCRAM_MECHANISMS)
MAX_AUTH_BYTES = 64 * 1024  # a SASL message is a few hundred bytes; more is not a client

CredentialLookup = Callable[[str, str], ScramCredential | None]  # (user, mechanism) -> credential


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Step:
    """What to answer to one SaslHandshake or SaslAuthenticate, and whether to close after."""

    error: ErrorCode
    message: str | None = None
    auth_bytes: bytes = b""
    mechanisms: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.error is not NONE


class ServerAuthenticator:
    """One connection's SASL exchange (see the module docstring). Not thread-safe: one
    round at a time, as the connection serves them."""

    def __init__(self, enabled: tuple[str, ...], lookup: CredentialLookup,
                 usual_iterations: Callable[[str], int] | None = None):
        self.enabled = enabled
        self._lookup = lookup
        self._usual_iterations = usual_iterations  # per mechanism: an unknown user's count (None: the minimum)
        self.state = SaslState.HANDSHAKE
        self.mechanism: str | None = None
        self.principal: str | None = None
        self._scram: scramp.ScramServer | None = None
        self._user = ""  # the SCRAM client's user name, once its first message is read

    @property
    def complete(self) -> bool:
        return self.state is SaslState.COMPLETE

    @staticmethod
    def allows(api_name: str) -> bool:
        """Requests served before authentication completes."""
        return api_name in ("API_VERSIONS", "SASL_HANDSHAKE", "SASL_AUTHENTICATE")

    def handshake(self, mechanism: str) -> Step:
        if self.state is not SaslState.HANDSHAKE:
            return self._fail(ILLEGAL_SASL_STATE, f"SaslHandshake in state {self.state.value}")
        if mechanism not in self.enabled:
            return Step(UNSUPPORTED_SASL_MECHANISM, f"mechanism {mechanism!r} is not enabled on this listener "
                        f"(enabled: {', '.join(self.enabled)})", mechanisms=self.enabled)
        self.mechanism, self.state = mechanism, SaslState.AUTHENTICATE
        return Step(NONE, mechanisms=self.enabled)

    def authenticate(self, auth_bytes: bytes) -> Step:
        """One SaslAuthenticate round (may be slow for PLAIN: run it off the event loop)."""
        if self.state is not SaslState.AUTHENTICATE:
            return self._fail(ILLEGAL_SASL_STATE, f"SaslAuthenticate in state {self.state.value}")
        if len(auth_bytes) > MAX_AUTH_BYTES:
            return self._fail(SASL_AUTHENTICATION_FAILED, f"auth bytes over {MAX_AUTH_BYTES}")
        if self.mechanism == "PLAIN":
            return self._plain(auth_bytes)
        return self._scram_round(auth_bytes)

    def _plain(self, auth_bytes: bytes) -> Step:
        parts = auth_bytes.split(b"\0")
        if len(parts) != 3:
            return self._fail(SASL_AUTHENTICATION_FAILED, "PLAIN expects authzid NUL username NUL password")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            return self._fail(SASL_AUTHENTICATION_FAILED, "PLAIN credentials are not UTF-8")
        if authzid and authzid != user:
            return self._fail(SASL_AUTHENTICATION_FAILED, "PLAIN: the authorization id must be the username")
        found = next(((m, c) for m in SCRAM_MECHANISMS if (c := self._lookup(user, m)) is not None), None)
        mechanism, credential = found or (SCRAM_MECHANISMS[0], self._decoy(SCRAM_MECHANISMS[0], user))
        if password_matches(mechanism, credential, password) and found is not None:  # same work either way
            return self._succeed(user)
        return self._invalid()

    def _scram_round(self, auth_bytes: bytes) -> Step:
        try:
            text = auth_bytes.decode()
            if self._scram is None:
                self._scram = scramp.ScramMechanism(self.mechanism).make_server(self._auth_info)
                self._scram.set_client_first(text)
                return Step(NONE, auth_bytes=self._scram.get_server_first().encode())
            self._scram.set_client_final(text)
            final = self._scram.get_server_final().encode()
        except (UnicodeDecodeError, scramp.ScramException, ValueError, TypeError):
            return self._invalid()
        user = self._user
        return self._succeed(user, final) if self._lookup(user, self.mechanism) is not None else self._invalid()

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        self._user = user
        credential = self._lookup(user, self.mechanism) or self._decoy(self.mechanism, user)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _decoy(self, mechanism: str, user: str) -> ScramCredential:
        usual = self._usual_iterations
        return _decoy(mechanism, user, MIN_ITERATIONS if usual is None else usual(mechanism))

    def _succeed(self, user: str, auth_bytes: bytes = b"") -> Step:
        self.state, self.principal = SaslState.COMPLETE, f"User:{user}"
        return Step(NONE, auth_bytes=auth_bytes)

    def _invalid(self) -> Step:
        return self._fail(SASL_AUTHENTICATION_FAILED,
                          f"Authentication failed: invalid credentials with SASL mechanism {self.mechanism}")

    def _fail(self, code: ErrorCode, message: str) -> Step:
        self.state = SaslState.FAILED
        return Step(code, message)


_DECOY_KEY = os.urandom(32)  # per process: the same unknown user gets the same salt each time


def _decoy(mechanism: str, user: str, iterations: int) -> ScramCredential:
    """A credential nobody has a password for, stable per user name, made without PBKDF2
    (keyed hashes of the name): an unknown user then costs what a known one does, one
    salted-password derivation for PLAIN and none for SCRAM's server side."""
    name = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"

    def keyed(label: bytes) -> bytes:
        return hmac.digest(_DECOY_KEY, label + b"\0" + mechanism.encode() + b"\0" + user.encode(), name)

    return ScramCredential(keyed(b"salt")[:16], keyed(b"stored"), keyed(b"server"), iterations)
