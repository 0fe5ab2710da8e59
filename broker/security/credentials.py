"""SCRAM credentials: what a broker stores of a password, and how it is written down.

A SCRAM credential (RFC 5802) is a random salt, an iteration count and two keys derived from
the salted password: ``stored_key`` (the hash of the client key, to check a client's proof)
and ``server_key`` (to prove the server knows the credential). The password itself is never
stored, and the credential alone does not let anyone authenticate as the user.

Credentials live in ZooKeeper in the user's entity config (``/config/users/<user>``), one
entry per mechanism, in Kafka's text form:
``SCRAM-SHA-256 = "salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=4096"``.
The derivation is scramp's (a maintained implementation), with the mechanism's hash.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import scramp

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MIN_ITERATIONS = 4096  # Kafka's minimum (and its default)
MAX_ITERATIONS = 16384  # Kafka's maximum: more would let a stored config stall the event loop
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class CredentialError(ValueError):
    """A credential's text or parameters are not valid; the message says which part."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_text(self) -> str:
        """Kafka's form: ``salt=..,stored_key=..,server_key=..,iterations=N``."""
        b64 = base64.b64encode
        return (f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},"
                f"server_key={b64(self.server_key).decode()},iterations={self.iterations}")

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        fields = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep:
                raise CredentialError(f"{item!r} is not key=value")
            fields[key.strip()] = value.strip()
        missing = {"salt", "stored_key", "server_key", "iterations"} - fields.keys()
        if missing:
            raise CredentialError(f"a SCRAM credential needs {', '.join(sorted(missing))}")
        try:
            salt, stored, server = (base64.b64decode(fields[k], validate=True)
                                    for k in ("salt", "stored_key", "server_key"))
            iterations = int(fields["iterations"])
        except (binascii.Error, ValueError) as e:
            raise CredentialError(f"a SCRAM credential is not valid: {e}") from None
        return cls(salt, stored, server, check_iterations(iterations))


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialError(f"iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}, got {iterations}")
    return iterations


def check_mechanism(mechanism: str) -> str:
    if mechanism not in _HASHES:
        raise CredentialError(f"unknown SCRAM mechanism {mechanism!r} (known: {', '.join(SCRAM_MECHANISMS)})")
    return mechanism


def make_credential(mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """A new credential for ``password`` (a random salt unless one is given)."""
    check_mechanism(mechanism)
    salt_, stored, server, count = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=check_iterations(iterations), salt=salt)
    return ScramCredential(salt_, stored, server, count)


def credential_from_salted_password(mechanism: str, salt: bytes, salted_password: bytes,
                                    iterations: int) -> ScramCredential:
    """The credential for a salted password, as AlterUserScramCredentials sends it (the
    client salts the password, so the password itself never crosses the network)."""
    name = _HASHES[check_mechanism(mechanism)]
    client_key = hmac.digest(salted_password, b"Client Key", name)
    server_key = hmac.digest(salted_password, b"Server Key", name)
    return ScramCredential(salt, hashlib.new(name, client_key).digest(), server_key, check_iterations(iterations))


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802, with the mechanism's hash."""
    name = _HASHES[check_mechanism(mechanism)]
    return hashlib.pbkdf2_hmac(name, password.encode(), salt, check_iterations(iterations))


def password_matches(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one the credential was made from (SASL/PLAIN checks a
    password against the stored SCRAM credential). Constant-time comparison."""
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    derived = credential_from_salted_password(mechanism, credential.salt, salted, credential.iterations)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)
