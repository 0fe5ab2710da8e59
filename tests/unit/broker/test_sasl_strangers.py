"""A stranger's SCRAM exchange looks like a user's: the server-first message of an unknown
user carries the iteration count most users' credentials have, so a SASL client cannot tell
which user names exist by the count (or PLAIN's derivation time)."""

from __future__ import annotations

import scramp

from tidelog.broker.security.credentials import MIN_ITERATIONS, make_credential
from tidelog.broker.security.entity_configs import EntityConfigStore
from tidelog.broker.security.sasl import ServerAuthenticator

MECHANISM = "SCRAM-SHA-256"


def store_with(iterations_by_user: dict[str, int]) -> EntityConfigStore:
    store = EntityConfigStore(zk=None)
    for user, iterations in iterations_by_user.items():
        text = make_credential(MECHANISM, f"{user}-secret", iterations=iterations).to_text()
        store._apply(f"users/{user}", {MECHANISM: text})
    store.generation += 1
    return store


def iterations_offered(store: EntityConfigStore, user: str) -> int:
    auth = ServerAuthenticator((MECHANISM,), store.scram_credential, store.usual_iterations)
    auth.handshake(MECHANISM)
    first = scramp.ScramClient([MECHANISM], user, "any").get_client_first().encode()
    server_first = auth.authenticate(first).auth_bytes.decode()
    return int(dict(part.split("=", 1) for part in server_first.split(","))["i"])


def test_a_stranger_is_offered_the_count_the_users_have():
    store = store_with({"alice": 8192, "bob": 8192, "carol": 4096})
    assert iterations_offered(store, "alice") == 8192
    assert iterations_offered(store, "mallory") == 8192


def test_the_usual_count_follows_the_credentials_and_starts_at_the_minimum():
    store = store_with({})
    assert store.usual_iterations(MECHANISM) == MIN_ITERATIONS
    store = store_with({"alice": 10000})
    assert store.usual_iterations(MECHANISM) == 10000
    store._apply("users/alice", None)
    store.generation += 1
    assert store.usual_iterations(MECHANISM) == MIN_ITERATIONS
