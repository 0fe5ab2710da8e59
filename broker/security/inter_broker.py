"""How this broker connects to other brokers: the inter-broker listener's security, as the
client side of a connection (``tidelog.security.SecurityConfig``).

On a TLS inter-broker listener the broker trusts ``ssl.truststore.location``, presents its own
``ssl.keystore.location`` certificate (so mutual TLS between brokers works) and checks host
names unless ``ssl.endpoint.identification.algorithm`` is empty. On a SASL one it
authenticates with ``sasl.mechanism.inter.broker.protocol`` and the username and password of
``sasl.jaas.config``.
"""

from __future__ import annotations

from typing import Any

from tidelog.broker.config import parse_super_users
from tidelog.security import SecurityConfig


def inter_broker_security(config: Any) -> SecurityConfig | None:
    """The SecurityConfig for connections to other brokers (None: plain TCP)."""
    protocol = config.inter_broker_listener.protocol
    if not (protocol.uses_tls or protocol.uses_sasl):
        return None
    credentials = config.inter_broker_credentials
    return SecurityConfig(
        security_protocol=str(protocol),
        ssl_cafile=config.ssl_truststore_location, ssl_certfile=config.ssl_keystore_location,
        ssl_password=config.ssl_key_password,
        ssl_check_hostname=config.ssl_endpoint_identification_algorithm.lower() == "https",
        sasl_mechanism=config.sasl_mechanism_inter_broker_protocol,
        sasl_plain_username=credentials.username if credentials else None,
        sasl_plain_password=credentials.password if credentials else None)


def broker_principals(config: Any) -> frozenset[str]:
    """The principals brokers of this cluster authenticate as towards each other: the super
    users (``super.users``) and this broker's own SASL principal. Brokers that authenticate by
    certificate each have a subject of their own: list them in ``super.users``."""
    own = config.inter_broker_principal
    return parse_super_users(config.super_users) | ({own} if own else set())
