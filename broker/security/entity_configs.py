"""User and client-id entity configs: SCRAM credentials and client quotas, in ZooKeeper.

Where they live (Kafka's ZooKeeper layout, broker/zookeeper/layout.py)::

    <chroot>/config/users/<user>                    SCRAM credentials, quotas of the user
    <chroot>/config/users/<user>/clients/<client>   quotas of the user's client id
    <chroot>/config/clients/<client>                quotas of the client id
    <chroot>/config/changes/config_change_<seq>     {"version":2,"entity_path":"users/alice"}

each ``{"version":1,"config":{...}}``, names sanitized (URL-encoded) or ``<default>``.

Writers (any broker answering AlterUserScramCredentials or AlterClientQuotas, and
``tidelog configs --zookeeper``) change one entity with a check-and-set write that retries
on a concurrent change (``ZkClient.change_entity_config``), then create a change
notification. Every broker's ``EntityConfigStore`` watches ``/config/changes``: at start it
reads every entity, then for each new notification it reads again the one entity it names.
Notifications older than ``CHANGE_EXPIRY_MS`` (15 minutes, as Kafka) are deleted by whichever
broker sees them first. After a ZooKeeper session was lost (the notifications it missed may
be gone) the broker reads every entity again (``request_reload``).

Lookups are synchronous and in memory (``scram_credential``, ``configs``) and never wait for
ZooKeeper. The SASL authenticator calls ``scram_credential`` from its worker threads while
the Trio thread may be updating the store: an update replaces one user's entry (a dict
assignment), and a full reload builds new dicts and swaps them in whole, so a lookup sees
the old state or the new one, never a store emptied half-way.

Topic configs are not served from here: they reach brokers with the controller's
LeaderAndIsr and UpdateMetadata, because the controller decides with them. Entity configs
cannot travel that way: a broker must know the SCRAM credentials before it can authenticate
the controller's connection that would bring them.

The four Admin APIs (Kafka's keys 48 to 51) are ``EntityConfigAdmin``: each reads and writes
ZooKeeper itself, so any broker answers them and a describe reads what the last alter wrote.
``tidelog configs --zookeeper`` runs the same class over its own ZooKeeper session, so a
first SCRAM user can be created before any client can authenticate.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import trio

from tidelog.broker.security.credentials import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialError,
    ScramCredential,
    check_iterations,
    credential_from_salted_password,
)
from tidelog.broker.security.quotas import QUOTA_KEYS, REQUEST_PERCENTAGE, check_quota_value
from tidelog.broker.zookeeper.layout import (
    BROKERS,
    DEFAULT_ENTITY,
    USERS,
    ZkError,
    broker_entity_path,
    config_change_sequence,
    entity_path,
    parse_broker_entity_path,
    parse_entity_path,
)
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    DUPLICATE_RESOURCE,
    INVALID_CONFIG,
    INVALID_REQUEST,
    NONE,
    RESOURCE_NOT_FOUND,
    UNACCEPTABLE_CREDENTIAL,
    UNSUPPORTED_SASL_MECHANISM,
    TidelogError,
    for_code,
)
from tidelog.protocol.messages import (
    QUOTA_MATCH_ANY,
    QUOTA_MATCH_DEFAULT,
    QUOTA_MATCH_EXACT,
    SCRAM_MECHANISM_IDS,
    AlterClientQuotasEntry,
    AlterClientQuotasEntryResult,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ClientQuotaEntityData,
    ClientQuotaValue,
    DescribeClientQuotasEntry,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    DescribeUserScramCredentialsResult,
    ScramCredentialInfo,
)
from tidelog.protocol.throttles import DYNAMIC_BROKER_CONFIGS, MAX_RATE, check_rate

logger = logging.getLogger("tidelog.entity_configs")

CHANGE_EXPIRY_MS = 15 * 60 * 1000  # Kafka's notification expiry
RETRY_S = 1.0
USER_TYPE, CLIENT_ID_TYPE = "user", "client-id"  # the entity types of the quota APIs
MECHANISM_NAMES = {v: k for k, v in SCRAM_MECHANISM_IDS.items()}
_DIGEST_BYTES = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}


class EntityConfigStore:
    """Every user and client-id config of the cluster, in memory, kept current by the
    change notifications (the module docstring). ``configs`` maps entity paths (as in
    ZooKeeper: ``users/alice``, ``users/<default>/clients/app``) to configs; ``generation``
    changes whenever they do. Updated on the Trio thread; lookups from any thread.

    Started by the broker before its listener opens: ``await nursery.start(store.run)``
    returns once every entity was read."""

    def __init__(self, zk: Any, *, clock: Callable[[], float] = time.time,
                 change_expiry_ms: int = CHANGE_EXPIRY_MS):
        self.zk = zk
        self.clock = clock
        self.change_expiry_ms = change_expiry_ms
        self.configs: dict[str, dict[str, str]] = {}
        self.generation = 0
        self._credentials: dict[str, dict[str, ScramCredential]] = {}  # user -> mechanism -> credential
        self._usual: tuple[int, dict[str, int]] = (-1, {})  # generation, mechanism -> usual_iterations
        self._last_sequence = -1  # the newest notification applied
        self._created_ms: dict[str, int] = {}  # notification name -> creation time, for the expiry
        self._reload = trio.Event()

    # -- lookups (synchronous) ----------------------------------------------------------------

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism`` (SCRAM-SHA-256 or -512), None if none."""
        return self._credentials.get(user, {}).get(mechanism)

    def usual_iterations(self, mechanism: str) -> int:
        """The iteration count most users' ``mechanism`` credentials have (Kafka's minimum
        when none): what an unknown user's made-up credential gets, so that the count a SCRAM
        exchange reveals, or the time PLAIN's derivation takes, tells no user from a stranger."""
        generation, usual = self._usual
        if generation != self.generation:  # swapped whole: lookups come from worker threads
            generation, usual = self._usual = (self.generation, {})
        known = usual.get(mechanism)
        if known is None:
            counts = Counter(c[mechanism].iterations for c in list(self._credentials.values()) if mechanism in c)
            known = usual[mechanism] = max(counts, key=lambda n: (counts[n], n), default=MIN_ITERATIONS)
        return known

    def entity_config(self, user: str | None, client_id: str | None) -> dict[str, str]:
        return self.configs.get(entity_path(user, client_id), {})

    def broker_config(self, broker_id: int) -> dict[str, str]:
        """A broker's dynamic configs: its own over the cluster-wide default's."""
        return {**self.configs.get(broker_entity_path(None), {}), **self.configs.get(broker_entity_path(broker_id), {})}

    def broker_entity_config(self, broker_id: int | None) -> dict[str, str]:
        """The dynamic configs set on one broker entity alone (None: the cluster-wide default)."""
        return self.configs.get(broker_entity_path(broker_id), {})

    def broker_int(self, broker_id: int, key: str) -> int | None:
        """One dynamic broker config as an integer (None when unset or unreadable)."""
        value = self.broker_config(broker_id).get(key)
        try:
            number = None if value is None else int(value)
        except ValueError:
            return None
        return number if number is None or 0 < number <= MAX_RATE else None  # as check_rate allows

    # -- keeping current ----------------------------------------------------------------------

    def request_reload(self) -> None:
        """Read every entity again (after a ZooKeeper session was lost)."""
        self._reload.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        changes = await self.zk.watch_children(self.zk.paths.config_changes)
        names = await changes.receive()
        await self._retrying(self._load_all, names)
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reload_when_asked)
            async for names in changes:
                await self._retrying(self._process, names)

    async def _reload_when_asked(self) -> None:
        while True:
            await self._reload.wait()
            self._reload = trio.Event()
            await self._retrying(self._load_all, None)

    async def _retrying(self, work: Callable[[Any], Any], names: Any) -> None:
        while True:
            try:
                await work(names)
                return
            except ZkError as e:
                logger.warning("reading user and client-id configs failed: %s; retrying in %.0f s", e, RETRY_S)
                await trio.sleep(RETRY_S)

    async def _load_all(self, names: list[str] | None) -> None:
        """Read every entity; the notifications ``names`` (present before the read) are done."""
        paths = await self.zk.list_entities()
        read = await self.zk.get_entity_configs(paths)
        configs: dict[str, dict[str, str]] = {}
        credentials: dict[str, dict[str, ScramCredential]] = {}
        for path in paths:
            self._apply(path, read.get(path), configs, credentials)
        self.configs, self._credentials = configs, credentials  # swapped whole (module docstring)
        self.generation += 1
        if names is not None:
            self._last_sequence = max([s for n in names if (s := config_change_sequence(n)) is not None], default=-1)
            await self._note_and_purge(names, [])
        logger.info("loaded %d user and client-id configs", len(self.configs))

    async def _process(self, names: list[str]) -> None:
        """Reload the entities that the notifications newer than the last one applied name."""
        new = sorted((s, n) for n in names if (s := config_change_sequence(n)) is not None and s > self._last_sequence)
        read = await self.zk.config_changes([n for _, n in new])
        entities = list(dict.fromkeys(e for _, e, _ in read if e is not None))
        valid = []
        for path in entities:
            try:
                _ = parse_broker_entity_path(path) if path.startswith(BROKERS + "/") else parse_entity_path(path)
                valid.append(path)
            except ValueError:
                pass  # topics (Kafka's other entity type): they come with the controller's requests
        configs = await self.zk.get_entity_configs(valid) if valid else {}
        for path in valid:
            self._apply(path, configs.get(path))
        if valid:
            self.generation += 1
        if new:
            self._last_sequence = new[-1][0]
        await self._note_and_purge(names, read)

    async def _note_and_purge(self, names: list[str], read: list[tuple[str, str | None, int]]) -> None:
        """Delete the notifications older than the expiry (each is read once for its age)."""
        self._created_ms.update({n: created for n, _, created in read})
        unknown = [n for n in names if n not in self._created_ms]
        if unknown:
            self._created_ms.update({n: created for n, _, created in await self.zk.config_changes(unknown)})
        present = set(names)
        self._created_ms = {n: c for n, c in self._created_ms.items() if n in present}
        now = self.clock() * 1000
        expired = [n for n, c in self._created_ms.items() if now - c >= self.change_expiry_ms]
        if expired:
            await self.zk.delete_config_changes(expired)
            for n in expired:
                self._created_ms.pop(n, None)

    def _apply(self, path: str, config: Mapping[str, str] | None, configs: dict | None = None,
               all_credentials: dict | None = None) -> None:
        """Set ``path``'s config in ``configs`` and ``all_credentials`` (default: the store's)."""
        configs = self.configs if configs is None else configs
        all_credentials = self._credentials if all_credentials is None else all_credentials
        if config:
            configs[path] = dict(config)
        else:
            configs.pop(path, None)
        if path.startswith(BROKERS + "/"):
            return
        user, client = parse_entity_path(path)
        if user is None or client is not None or user is DEFAULT_ENTITY:
            return
        credentials = {}
        for mechanism in SCRAM_MECHANISMS:
            if (text := (config or {}).get(mechanism)) is not None:
                try:
                    credentials[mechanism] = ScramCredential.from_text(text)
                except CredentialError as e:
                    logger.error("user %r: ignoring its %s credential: %s", user, mechanism, e)
        if credentials:
            all_credentials[user] = credentials
        else:
            all_credentials.pop(user, None)


# -- the Admin APIs ---------------------------------------------------------------------------


class EntityConfigAdmin:
    """DescribeClientQuotas, AlterClientQuotas, DescribeUserScramCredentials and
    AlterUserScramCredentials over a ``ZkClient``: the broker's handlers, and
    ``tidelog configs --zookeeper``. Each method takes the typed request and returns the
    typed response; per-entity and per-user problems are answered in the response."""

    def __init__(self, zk: Any):
        self.zk = zk

    async def alter_broker_config(self, resource_name: str, changes: Mapping[str, str | None],
                                  validate_only: bool = False, *, replace: bool = False) -> None:
        """AlterConfigs of a broker resource: ``resource_name`` is a broker id, or "" for the
        cluster-wide default. Only the dynamic broker configs (the replication throttle
        rates) change at runtime; a None value removes one, and with ``replace`` so does every
        key left out (Kafka's legacy AlterConfigs). TidelogError naming the problem."""
        name = resource_name.strip()
        if name and not (name.isascii() and name.isdigit() and len(name) <= 10):
            raise TidelogError(f"broker config resource {resource_name[:100]!r} is not a broker id (or \"\" for "
                               "the cluster default)", error=INVALID_REQUEST)
        for key, value in changes.items():
            if key not in DYNAMIC_BROKER_CONFIGS:
                raise TidelogError(f"{key[:100]!r} cannot be changed at runtime: the dynamic broker configs are "
                                   f"{', '.join(DYNAMIC_BROKER_CONFIGS)}", error=INVALID_CONFIG)
            try:
                check_rate(key, value)
            except ValueError as e:
                raise TidelogError(str(e), error=INVALID_CONFIG) from None
        if validate_only:
            return

        def change(config: dict[str, str]) -> dict[str, str]:
            if replace:
                config = {}
            for key, value in changes.items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = str(int(str(value).strip()))
            return config
        await self.zk.change_entity_config(broker_entity_path(int(name) if name else None), change)

    async def call(self, api_key: ApiKey, request: Any) -> Any:
        """The response to one of the four requests (``EntityConfigClient``'s ``call``)."""
        return await {ApiKey.DESCRIBE_CLIENT_QUOTAS: self.describe_client_quotas,
                      ApiKey.ALTER_CLIENT_QUOTAS: self.alter_client_quotas,
                      ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
                      ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials}[api_key](request)

    async def describe_client_quotas(self, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse:
        try:
            match = quota_filter(req.components, req.strict)
        except TidelogError as e:
            return DescribeClientQuotasResponse(e.code, str(e), None)
        paths = await self.zk.list_entities()
        configs = await self.zk.get_entity_configs(paths)
        entries = []
        for path in sorted(paths):
            values = quota_values(configs.get(path, {}))
            components = quota_components(path)
            if values and match(components):
                entries.append(DescribeClientQuotasEntry(
                    [ClientQuotaEntityData(t, n) for t, n in components.items()],
                    [ClientQuotaValue(k, v) for k, v in sorted(values.items())]))
        return DescribeClientQuotasResponse(NONE.code, None, entries)

    async def alter_client_quotas(self, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse:
        seen = Counter(_entity_key(e.entity) for e in req.entries)
        out = []
        for entry in req.entries:
            try:
                if seen[_entity_key(entry.entity)] > 1:
                    raise TidelogError("the entity appears more than once in the request", error=INVALID_REQUEST)
                path = quota_entity_path(entry.entity)
                change = quota_change(entry)
                if not req.validate_only:
                    await self.zk.change_entity_config(path, change)
                out.append(AlterClientQuotasEntryResult(NONE.code, None, entry.entity))
            except TidelogError as e:
                out.append(AlterClientQuotasEntryResult(e.code, str(e), entry.entity))
        return AlterClientQuotasResponse(out)

    async def describe_user_scram_credentials(self, req: DescribeUserScramCredentialsRequest
                                              ) -> DescribeUserScramCredentialsResponse:
        if req.users is None:
            paths = [p for p in await self.zk.list_entities() if p.startswith(USERS + "/") and p.count("/") == 1]
            configs = await self.zk.get_entity_configs(paths)
            results = [_described(parse_entity_path(p)[0], configs[p]) for p in sorted(configs)]
            return DescribeUserScramCredentialsResponse(NONE.code, None, [r for r in results if r.credential_infos])
        named = Counter(u.name for u in req.users)
        out = []
        for name in dict.fromkeys(u.name for u in req.users):
            if named[name] > 1:
                out.append(DescribeUserScramCredentialsResult(name, DUPLICATE_RESOURCE.code,
                                                              "the user is named more than once in the request"))
                continue
            try:
                config, _ = await self.zk.get_entity_config(checked_entity_path(_user_name(name), None))
            except TidelogError as e:
                out.append(DescribeUserScramCredentialsResult(name, RESOURCE_NOT_FOUND.code, str(e)))
                continue
            result = _described(name, config)
            if not result.credential_infos:
                result = DescribeUserScramCredentialsResult(
                    name, RESOURCE_NOT_FOUND.code, f"user {name!r} has no SCRAM credential")
            out.append(result)
        return DescribeUserScramCredentialsResponse(NONE.code, None, out)

    async def alter_user_scram_credentials(self, req: AlterUserScramCredentialsRequest
                                           ) -> AlterUserScramCredentialsResponse:
        """All of a user's alterations are one write; a problem with any of them fails them all."""
        by_user: dict[str, list[Any]] = {}
        for op in [*req.deletions, *req.upsertions]:
            by_user.setdefault(op.name, []).append(op)
        out = []
        for user, ops in by_user.items():
            try:
                change = scram_change(user, ops)
                await self.zk.change_entity_config(checked_entity_path(_user_name(user), None), change)
                out.append(AlterUserScramCredentialsResult(user, NONE.code))
            except TidelogError as e:
                out.append(AlterUserScramCredentialsResult(user, e.code, str(e)))
        return AlterUserScramCredentialsResponse(out)


def _user_name(name: str) -> str:
    if not name:
        raise TidelogError("a user name must not be empty", error=UNACCEPTABLE_CREDENTIAL)
    return name


def _described(user: str, config: Mapping[str, str]) -> DescribeUserScramCredentialsResult:
    """The mechanisms and iteration counts of a user's credentials; never their keys."""
    infos = []
    for mechanism in SCRAM_MECHANISMS:
        if (text := config.get(mechanism)) is None:
            continue
        try:
            infos.append(ScramCredentialInfo(SCRAM_MECHANISM_IDS[mechanism], ScramCredential.from_text(text).iterations))
        except CredentialError as e:
            logger.error("user %r: its %s credential is not valid: %s", user, mechanism, e)
    return DescribeUserScramCredentialsResult(user, NONE.code, None, infos)


def scram_change(user: str, ops: list[Any]) -> Callable[[dict[str, str]], dict[str, str]]:
    """The change of a user's config that ``ops`` (ScramCredentialDeletion and
    ScramCredentialUpsertion messages) make; raises what is wrong with them, before anything
    is written (a deletion of a credential the user does not have: RESOURCE_NOT_FOUND, when
    the change is applied)."""
    _user_name(user)
    mechanisms = [_mechanism(op.mechanism) for op in ops]
    if len(set(mechanisms)) < len(mechanisms):
        raise TidelogError("a user's credential for one mechanism cannot be altered twice in one request",
                           error=DUPLICATE_RESOURCE)
    set_: dict[str, str] = {}
    deleted: list[str] = []
    for op, mechanism in zip(ops, mechanisms):
        if hasattr(op, "salted_password"):
            set_[mechanism] = _credential(op, mechanism).to_text()
        else:
            deleted.append(mechanism)

    def change(config: dict[str, str]) -> dict[str, str]:
        for mechanism in deleted:
            if config.pop(mechanism, None) is None:
                raise TidelogError(f"user {user!r} has no {mechanism} credential to delete", error=RESOURCE_NOT_FOUND)
        config.update(set_)
        return config

    return change


def _mechanism(mechanism_id: int) -> str:
    name = MECHANISM_NAMES.get(mechanism_id)
    if name is None:
        raise TidelogError(f"unknown SCRAM mechanism {mechanism_id} (known: "
                           f"{', '.join(f'{v} {k}' for k, v in SCRAM_MECHANISM_IDS.items())})",
                           error=UNSUPPORTED_SASL_MECHANISM)
    return name


def _credential(op: Any, mechanism: str) -> ScramCredential:
    try:
        check_iterations(op.iterations)
    except CredentialError as e:
        raise TidelogError(str(e), error=UNACCEPTABLE_CREDENTIAL) from None
    if not op.salt:
        raise TidelogError("the salt must not be empty", error=UNACCEPTABLE_CREDENTIAL)
    if len(op.salted_password) != _DIGEST_BYTES[mechanism]:
        raise TidelogError(f"a {mechanism} salted password is {_DIGEST_BYTES[mechanism]} bytes, "
                           f"got {len(op.salted_password)}", error=UNACCEPTABLE_CREDENTIAL)
    return credential_from_salted_password(mechanism, op.salt, op.salted_password, op.iterations)


# -- quota entities and filters ---------------------------------------------------------------


def _entity_key(entity: list[ClientQuotaEntityData]) -> tuple:
    return tuple(sorted((c.entity_type, c.entity_name or "") for c in entity))


def quota_entity_path(entity: list[ClientQuotaEntityData]) -> str:
    """The entity path of an AlterClientQuotas entity: a user, a client id, or both (a name,
    or None for the default); INVALID_REQUEST for anything else."""
    names: dict[str, str] = {}
    for c in entity:
        if c.entity_type not in (USER_TYPE, CLIENT_ID_TYPE):
            raise TidelogError(f"unknown quota entity type {c.entity_type!r} (known: {USER_TYPE}, {CLIENT_ID_TYPE})",
                               error=INVALID_REQUEST)
        if c.entity_type in names:
            raise TidelogError(f"entity type {c.entity_type!r} appears twice in the entity", error=INVALID_REQUEST)
        if c.entity_name == "":
            raise TidelogError(f"an empty {c.entity_type} name (None is the default entity)", error=INVALID_REQUEST)
        names[c.entity_type] = DEFAULT_ENTITY if c.entity_name is None else c.entity_name
    if not names:
        raise TidelogError("the entity names no user and no client id", error=INVALID_REQUEST)
    return checked_entity_path(names.get(USER_TYPE), names.get(CLIENT_ID_TYPE))


def checked_entity_path(user: str | None, client_id: str | None) -> str:
    """``entity_path``, refused with INVALID_REQUEST when a name cannot be stored (too long
    for a znode name, say): a request names it, so the request is wrong, not the broker."""
    try:
        path = entity_path(user, client_id)
        parse_entity_path(path)
    except ValueError as e:
        raise TidelogError(str(e), error=INVALID_REQUEST) from None
    return path


def quota_components(path: str) -> dict[str, str | None]:
    """An entity path as the quota APIs' components: type -> name (None: the default)."""
    user, client = parse_entity_path(path)
    out: dict[str, str | None] = {}
    if user is not None:
        out[USER_TYPE] = None if user is DEFAULT_ENTITY else user
    if client is not None:
        out[CLIENT_ID_TYPE] = None if client is DEFAULT_ENTITY else client
    return out


def quota_values(config: Mapping[str, str]) -> dict[str, float]:
    """The quota keys of an entity config as numbers (SCRAM credentials are not quotas)."""
    out = {}
    for key in QUOTA_KEYS:
        if (text := config.get(key)) is not None:
            try:
                out[key] = float(text)
            except ValueError:
                logger.error("ignoring quota %s=%r: not a number", key, text)
    return out


def quota_change(entry: AlterClientQuotasEntry) -> Callable[[dict[str, str]], dict[str, str]]:
    """The change of an entity's config that an AlterClientQuotas entry makes (checked now)."""
    keys = [op.key for op in entry.ops]
    if len(set(keys)) < len(keys):
        raise TidelogError("a quota appears more than once in the entry", error=INVALID_REQUEST)
    updates: dict[str, str | None] = {}
    for op in entry.ops:
        if op.remove:
            if op.key not in QUOTA_KEYS:
                raise TidelogError(f"unknown quota {op.key!r} (known: {', '.join(QUOTA_KEYS)})", error=INVALID_REQUEST)
            updates[op.key] = None
            continue
        try:
            value = check_quota_value(op.key, op.value)
        except ValueError as e:
            raise TidelogError(str(e), error=INVALID_REQUEST) from None
        updates[op.key] = repr(value) if op.key == REQUEST_PERCENTAGE else str(int(value))

    def change(config: dict[str, str]) -> dict[str, str]:
        for key, text in updates.items():
            if text is None:
                config.pop(key, None)
            else:
                config[key] = text
        return config

    return change


def quota_filter(components: list[Any], strict: bool) -> Callable[[Mapping[str, str | None]], bool]:
    """Whether an entity's components match a DescribeClientQuotas filter (Kafka's rules:
    every component matches; strict: the entity has no other entity type)."""
    wanted: dict[str, Any] = {}
    for c in components:
        if c.entity_type not in (USER_TYPE, CLIENT_ID_TYPE):
            raise TidelogError(f"unknown quota entity type {c.entity_type!r}", error=INVALID_REQUEST)
        if c.entity_type in wanted:
            raise TidelogError(f"entity type {c.entity_type!r} is filtered twice", error=INVALID_REQUEST)
        if c.match_type == QUOTA_MATCH_EXACT and c.match is None:
            raise TidelogError("an exact match needs a name", error=INVALID_REQUEST)
        if c.match_type not in (QUOTA_MATCH_EXACT, QUOTA_MATCH_DEFAULT, QUOTA_MATCH_ANY):
            raise TidelogError(f"unknown match type {c.match_type}", error=INVALID_REQUEST)
        wanted[c.entity_type] = c

    def match(entity: Mapping[str, str | None]) -> bool:
        if strict and set(entity) != set(wanted):
            return False
        for entity_type, c in wanted.items():
            if entity_type not in entity:
                return False
            name = entity[entity_type]
            if c.match_type == QUOTA_MATCH_EXACT and name != c.match:
                return False
            if c.match_type == QUOTA_MATCH_DEFAULT and name is not None:
                return False
            if c.match_type == QUOTA_MATCH_ANY and name is None:
                return False
        return True

    return match




def set_scram_password(connect: str, user: str, password: str, *, auth_file: str | None = None) -> None:
    """Blocking: ``user``'s SCRAM-SHA-256 and -512 credentials straight into ZooKeeper
    (``connect`` is ``host:port[/chroot]``; ``auth_file`` the brokers' ZooKeeper identity, as
    ``tidelog configs --zookeeper --zk-auth-file`` takes it). For the first user of a secured
    cluster, which brokers need before any client can authenticate. The password is salted
    here and never appears in a process's arguments. Raises ValueError naming the problem."""
    from tidelog.aio.entity_configs import ScramCredentialInfo, UserScramCredentialUpsertion, alter_scram_request
    from tidelog.broker.config import read_zookeeper_credentials
    from tidelog.broker.zookeeper.zk import ZkClient

    async def write() -> AlterUserScramCredentialsResponse:
        request = alter_scram_request([UserScramCredentialUpsertion(user, ScramCredentialInfo(m), password)
                                       for m in SCRAM_MECHANISMS])
        auth = read_zookeeper_credentials(auth_file)
        async with ZkClient(connect, auth=auth, set_acl=auth is not None) as zk:
            return await EntityConfigAdmin(zk).alter_user_scram_credentials(request)

    response = trio.run(write)
    failed = [r for r in response.results if r.error_code != NONE.code]
    if failed:
        raise ValueError(f"setting the SCRAM credentials of {user!r} failed: "
                         + "; ".join(r.error_message or for_code(r.error_code).message for r in failed))
