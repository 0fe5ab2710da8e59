"""TLS for a broker's listeners and its connections to other brokers, from PEM files.

* ``ssl.keystore.location``: a PEM file with the broker's certificate chain and private key
  (``ssl.key.password`` if the key is encrypted). It serves TLS listeners, and is the
  broker's client certificate towards other brokers (mutual TLS between brokers).
* ``ssl.truststore.location``: PEM CA certificates. On a listener they verify client
  certificates; towards other brokers they verify the other broker's certificate, and with
  ``ssl.endpoint.identification.algorithm=https`` (the default) also that it names the host.
* ``ssl.client.auth``: ``none`` (no client certificate asked), ``requested`` (verified when
  sent), ``required`` (the handshake fails without a trusted one).

A client certificate makes the connection's principal ``User:<subject>``, the subject as an
RFC 4514 string (``User:CN=broker-1,O=Tidelog``, Kafka's default principal builder); SASL,
where the listener uses it, decides the principal instead. TLS 1.2 is the oldest version
spoken either way.
"""

from __future__ import annotations

import ssl

from cryptography import x509

from tidelog.broker.context import ANONYMOUS

_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
HANDSHAKE_TIMEOUT_S = 10.0  # a connection that does not finish its handshake by then is closed


def server_context(keystore: str, key_password: str | None, truststore: str | None,
                   client_auth: str) -> ssl.SSLContext:
    """The context of this broker's TLS listeners; ValueError names the file that failed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_keystore(context, keystore, key_password)
    context.verify_mode = _CLIENT_AUTH[client_auth]
    if truststore:
        _load_truststore(context, truststore)
    return context


def peer_principal(ssl_object: ssl.SSLObject | None) -> str:
    """``User:<subject>`` of a verified client certificate; ANONYMOUS without one."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ANONYMOUS
    return principal_of(x509.load_der_x509_certificate(der))


def principal_of(certificate: x509.Certificate) -> str:
    return f"User:{certificate.subject.rfc4514_string()}"


def _load_keystore(context: ssl.SSLContext, path: str, password: str | None) -> None:
    try:
        context.load_cert_chain(path, password=password)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ssl.keystore.location {path}: cannot load a certificate and key: {e}") from None


def _load_truststore(context: ssl.SSLContext, path: str) -> None:
    try:
        context.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ssl.truststore.location {path}: cannot load CA certificates: {e}") from None
