"""User and client-id configs in the Admin API: SCRAM credentials and client quotas.

The shapes are Kafka's Admin client's (and confluent-kafka's): ``UserScramCredentialUpsertion``
(user, ``ScramCredentialInfo(mechanism, iterations)``, password), ``UserScramCredentialDeletion``
(user, mechanism), ``ClientQuotaEntity`` ({"user": ..., "client-id": ...}, None naming the
default entity), ``ClientQuotaAlteration`` (entity, ops) and ``ClientQuotaFilter``.

Everything here is pure: the requests ``AsyncAdmin`` sends and the results it makes of the
responses. An upsertion's password is salted here, on the client (RFC 5802's Hi, PBKDF2 with
the mechanism's hash, over a fresh random salt): the request carries the salt and the salted
password, never the password.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.errors import TidelogError, broker_error
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import (
    QUOTA_MATCH_ANY,
    QUOTA_MATCH_DEFAULT,
    QUOTA_MATCH_EXACT,
    SCRAM_MECHANISM_IDS,
    AlterClientQuotasEntry,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    ClientQuotaEntityData,
    ClientQuotaOp,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
    ScramUserName,
)
from tidelog.protocol.messages import ClientQuotaFilterComponent as _FilterComponentData

__all__ = ["ScramCredentialInfo", "UserScramCredentialUpsertion", "UserScramCredentialDeletion",
           "UserScramCredentialsDescription", "ClientQuotaEntity", "ClientQuotaAlteration", "QuotaOp",
           "ClientQuotaFilter", "ClientQuotaFilterComponent", "SCRAM_MECHANISMS", "EntityConfigClient"]

SCRAM_MECHANISMS = tuple(SCRAM_MECHANISM_IDS)
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_MECHANISM_NAMES = {v: k for k, v in SCRAM_MECHANISM_IDS.items()}
SALT_BYTES = 32
MAX_ITERATIONS = 16384  # the brokers refuse more (and fewer than 4096)


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    iterations: int = 4096


@dataclass(frozen=True, slots=True)
class UserScramCredentialUpsertion:
    """Set ``user``'s credential for ``credential_info.mechanism`` from ``password`` (salted
    on the client with ``salt``, a fresh random one when None)."""

    user: str
    credential_info: ScramCredentialInfo
    password: str = field(repr=False)
    salt: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: str


@dataclass(frozen=True, slots=True)
class UserScramCredentialsDescription:
    """A user's credentials as a broker describes them: mechanisms and iterations only."""

    name: str
    credential_infos: tuple[ScramCredentialInfo, ...]


class ClientQuotaEntity:
    """A quota entity: ``{"user": "alice"}``, ``{"client-id": "app"}`` or both; a None name is
    the entity type's default (``<default>`` in ZooKeeper)."""

    USER = "user"
    CLIENT_ID = "client-id"
    __slots__ = ("entries",)

    def __init__(self, entries: Mapping[str, str | None]):
        object.__setattr__(self, "entries", dict(sorted(entries.items())))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ClientQuotaEntity is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientQuotaEntity) and other.entries == self.entries

    def __hash__(self) -> int:
        return hash(tuple(self.entries.items()))

    def __repr__(self) -> str:
        return f"ClientQuotaEntity({self.entries!r})"

    def to_data(self) -> list[ClientQuotaEntityData]:
        return [ClientQuotaEntityData(t, n) for t, n in self.entries.items()]


@dataclass(frozen=True, slots=True)
class QuotaOp:
    """Set quota ``key`` to ``value``; a None value removes it."""

    key: str  # producer_byte_rate, consumer_byte_rate or request_percentage
    value: float | None


@dataclass(frozen=True, slots=True)
class ClientQuotaAlteration:
    entity: ClientQuotaEntity
    ops: tuple[QuotaOp, ...]


@dataclass(frozen=True, slots=True)
class ClientQuotaFilterComponent:
    entity_type: str
    match: str | None
    match_type: int

    @classmethod
    def of_entity(cls, entity_type: str, name: str) -> ClientQuotaFilterComponent:
        return cls(entity_type, name, QUOTA_MATCH_EXACT)

    @classmethod
    def of_default_entity(cls, entity_type: str) -> ClientQuotaFilterComponent:
        return cls(entity_type, None, QUOTA_MATCH_DEFAULT)

    @classmethod
    def of_entity_type(cls, entity_type: str) -> ClientQuotaFilterComponent:
        """Any entity of the type that has a name (not the default)."""
        return cls(entity_type, None, QUOTA_MATCH_ANY)


@dataclass(frozen=True, slots=True)
class ClientQuotaFilter:
    components: tuple[ClientQuotaFilterComponent, ...]
    strict: bool = False

    @classmethod
    def contains(cls, components: Iterable[ClientQuotaFilterComponent]) -> ClientQuotaFilter:
        """Entities matching every component, whatever other entity types they have."""
        return cls(tuple(components), False)

    @classmethod
    def contains_only(cls, components: Iterable[ClientQuotaFilterComponent]) -> ClientQuotaFilter:
        """Entities matching every component and of no other entity type."""
        return cls(tuple(components), True)

    @classmethod
    def all(cls) -> ClientQuotaFilter:
        return cls((), False)


# -- SCRAM credentials ------------------------------------------------------------------------


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(password, salt, iterations) with the mechanism's hash."""
    return hashlib.pbkdf2_hmac(_hash(mechanism), password.encode(), salt, iterations)


def _hash(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (known: {', '.join(SCRAM_MECHANISMS)})") from None


def alter_scram_request(alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion]
                        ) -> AlterUserScramCredentialsRequest:
    deletions, upsertions = [], []
    for a in alterations:
        if isinstance(a, UserScramCredentialDeletion):
            _hash(a.mechanism)
            deletions.append(ScramCredentialDeletion(a.user, SCRAM_MECHANISM_IDS[a.mechanism]))
            continue
        info = a.credential_info
        _hash(info.mechanism)
        if not 1 <= info.iterations <= MAX_ITERATIONS:  # the broker says why it refuses fewer than 4096
            raise ValueError(f"iterations must be at most {MAX_ITERATIONS}, got {info.iterations}")
        salt = a.salt if a.salt is not None else os.urandom(SALT_BYTES)
        upsertions.append(ScramCredentialUpsertion(
            a.user, SCRAM_MECHANISM_IDS[info.mechanism], info.iterations, salt,
            salted_password(info.mechanism, a.password, salt, info.iterations)))
    return AlterUserScramCredentialsRequest(deletions, upsertions)


def alter_scram_results(response: AlterUserScramCredentialsResponse) -> dict[str, TidelogError | None]:
    return {r.user: None if r.error_code == NONE.code else
            broker_error(r.error_code, f"user {r.user!r}", r.error_message) for r in response.results}


def describe_scram_request(users: Iterable[str] | None) -> DescribeUserScramCredentialsRequest:
    return DescribeUserScramCredentialsRequest(None if users is None else [ScramUserName(u) for u in users])


def describe_scram_results(response: DescribeUserScramCredentialsResponse
                           ) -> dict[str, UserScramCredentialsDescription | TidelogError]:
    if response.error_code != NONE.code:
        raise broker_error(response.error_code, "DescribeUserScramCredentials", response.error_message)
    out: dict[str, UserScramCredentialsDescription | TidelogError] = {}
    for r in response.results:
        if r.error_code != NONE.code:
            out[r.user] = broker_error(r.error_code, f"user {r.user!r}", r.error_message)
            continue
        infos = tuple(ScramCredentialInfo(_MECHANISM_NAMES.get(i.mechanism, f"UNKNOWN({i.mechanism})"), i.iterations)
                      for i in r.credential_infos)
        out[r.user] = UserScramCredentialsDescription(r.user, infos)
    return out


# -- client quotas ----------------------------------------------------------------------------


def alter_quotas_request(alterations: Iterable[ClientQuotaAlteration], validate_only: bool
                         ) -> AlterClientQuotasRequest:
    return AlterClientQuotasRequest(
        [AlterClientQuotasEntry(a.entity.to_data(),
                                [ClientQuotaOp(op.key, 0.0, True) if op.value is None else
                                 ClientQuotaOp(op.key, float(op.value), False) for op in a.ops])
         for a in alterations], validate_only)


def alter_quotas_results(response: AlterClientQuotasResponse) -> dict[ClientQuotaEntity, TidelogError | None]:
    out: dict[ClientQuotaEntity, TidelogError | None] = {}
    for e in response.entries:
        entity = _entity(e.entity)
        out[entity] = None if e.error_code == NONE.code else broker_error(
            e.error_code, f"quota entity {entity.entries}", e.error_message)
    return out


def describe_quotas_request(quota_filter: ClientQuotaFilter) -> DescribeClientQuotasRequest:
    return DescribeClientQuotasRequest([_FilterComponentData(c.entity_type, c.match_type, c.match)
                                        for c in quota_filter.components], quota_filter.strict)


def describe_quotas_results(response: DescribeClientQuotasResponse) -> dict[ClientQuotaEntity, dict[str, float]]:
    if response.error_code != NONE.code:
        raise broker_error(response.error_code, "DescribeClientQuotas", response.error_message)
    return {_entity(e.entity): {v.key: v.value for v in e.values} for e in response.entries or []}


def _entity(data: list[ClientQuotaEntityData]) -> ClientQuotaEntity:
    return ClientQuotaEntity({c.entity_type: c.entity_name for c in data})


def raise_first(results: Mapping[Any, TidelogError | None]) -> dict[Any, None]:
    """``{key: None}`` when every result succeeded, else the first error raised, with
    ``.results`` (every key's None or error) attached."""
    failures = [e for e in results.values() if e is not None]
    if failures:
        failures[0].results = dict(results)
        raise failures[0]
    return {k: None for k in results}


Call = Callable[[ApiKey, Message], Awaitable[Any]]


class EntityConfigClient:
    """The four operations over ``call(api_key, request) -> response``: ``AsyncAdmin`` sends
    the request to any broker; ``tidelog configs --zookeeper`` answers it from ZooKeeper
    with the brokers' own code. Errors as ``raise_first`` raises them."""

    def __init__(self, call: Call):
        self.call = call

    async def alter_user_scram_credentials(
            self, alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion]) -> dict[str, None]:
        response = await self.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, alter_scram_request(alterations))
        return raise_first(alter_scram_results(response))

    async def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                              ) -> dict[str, UserScramCredentialsDescription]:
        response = await self.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
                                   describe_scram_request(None if users is None else list(users)))
        found = describe_scram_results(response)
        raise_first({u: r if isinstance(r, TidelogError) else None for u, r in found.items()})
        return found  # type: ignore[return-value]  # no errors left

    async def alter_client_quotas(self, alterations: Iterable[ClientQuotaAlteration],
                                  validate_only: bool = False) -> dict[ClientQuotaEntity, None]:
        response = await self.call(ApiKey.ALTER_CLIENT_QUOTAS, alter_quotas_request(alterations, validate_only))
        return raise_first(alter_quotas_results(response))

    async def describe_client_quotas(self, quota_filter: ClientQuotaFilter | None = None
                                     ) -> dict[ClientQuotaEntity, dict[str, float]]:
        response = await self.call(ApiKey.DESCRIBE_CLIENT_QUOTAS,
                                   describe_quotas_request(quota_filter or ClientQuotaFilter.all()))
        return describe_quotas_results(response)
