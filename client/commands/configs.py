"""``tidelog configs``: users' SCRAM credentials, user and client-id quotas, and topic configs,
in the shape of Kafka's kafka-configs.

    tidelog configs --alter --entity-type users --entity-name alice \\
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],producer_byte_rate=1048576'
    tidelog configs --describe --entity-type users --entity-name alice
    tidelog configs --alter --entity-type clients --entity-default --delete-config consumer_byte_rate
    tidelog configs --alter --entity-type users --entity-name alice --entity-type clients --entity-name app ...

``--add-config`` takes Kafka's syntax: ``k=v`` pairs separated by commas, a value in square
brackets keeping its commas (``SCRAM-SHA-256=[iterations=8192,password=secret]``; iterations
default to 4096). ``--describe`` never prints a password or a credential's keys: for each
user its SCRAM mechanisms and iteration counts, as Kafka.

With ``--bootstrap`` (default: env TIDELOG_BOOTSTRAP) the changes go through any broker
(the Admin APIs); with ``--zookeeper host:port[/chroot]`` (default chroot ``/tidelog``, as
brokers use) they are written to ZooKeeper directly by the brokers' own code, as Kafka's
ZooKeeper-mode kafka-configs: that is how the first SCRAM user is created before any client
can authenticate. With ``zookeeper.set.acl`` on the brokers, ``--zk-auth-file FILE`` (the
brokers' ZooKeeper identity, e.g. a broker's config file) lets it read and write the users'
znodes. Passwords are salted on this side either way. Topic configs go through the same
Admin calls as ``tidelog topics alter`` (``--bootstrap`` only).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from tidelog.commands.common import (
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    client_options,
    connection_options,
    run_command,
    unreachable,
)

__all__ = ["register", "parse_add_config", "parse_delete_config", "run"]

DEFAULT = None  # --entity-default, in the list of entity names
SCRAM_KEYS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate", "request_percentage")
ENTITY_TYPES = ("users", "clients", "topics", "brokers")
_SPLIT = re.compile(r",(?=[^\]]*(?:\[|$))")  # kafka-configs' split: commas outside [...]


def register(commands: Any) -> None:
    add_command(commands, "configs", "SCRAM users, user and client-id quotas, topic configs (like kafka-configs)",
                "Alter or describe the configs of users (SCRAM credentials, quotas), client ids "
                "(quotas), a user's client id (quotas) and topics. Through --bootstrap, or straight "
                "into ZooKeeper with --zookeeper (to create the first SCRAM user).", arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    client_options(p)
    p.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                   help="write ZooKeeper directly instead of going through a broker (users and clients "
                        "only; chroot default /tidelog)")
    p.add_argument("--zk-auth-file", metavar="FILE",
                   help="with --zookeeper: the brokers' ZooKeeper identity, zookeeper.digest.username and "
                        "zookeeper.digest.password in TOML (a broker's config file will do; env "
                        "TIDELOG_ZOOKEEPER_DIGEST_* override it); what is created gets the brokers' ACLs")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true", help="add or delete configs")
    action.add_argument("--describe", action="store_true", help="print configs (never passwords)")
    p.add_argument("--entity-type", action="append", default=[], choices=ENTITY_TYPES,
                   help="users, clients, topics or brokers; users then clients for a user's client id")
    p.add_argument("--entity-name", action="append", dest="entity_names", default=[],
                   help="the entity's name (one per --entity-type, in order)")
    p.add_argument("--entity-default", action="append_const", dest="entity_names", const=DEFAULT,
                   help="the default entity of the type (users and clients)")
    p.add_argument("--add-config", metavar="K=V,K=[K=V,...]",
                   help="configs to set, e.g. 'SCRAM-SHA-256=[iterations=8192,password=secret],producer_byte_rate=1024'")
    p.add_argument("--delete-config", metavar="K,K", help="configs to delete, e.g. 'SCRAM-SHA-256,producer_byte_rate'")
    p.add_argument("--timeout-ms", type=int, default=30000, metavar="MS", help="bound on the requests (default 30000)")


# -- the bracket syntax -----------------------------------------------------------------------


def parse_add_config(text: str) -> dict[str, str]:
    """kafka-configs' ``--add-config``: ``k1=v1,k2=[v21,v22],k3=v3`` -> {k: v} (brackets
    removed, the commas inside them kept). UsageError for an item without ``=``."""
    out: dict[str, str] = {}
    for item in (i for i in _SPLIT.split(text) if i.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--add-config: {item!r} is not key=value")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        elif "[" in value or "]" in value:
            raise UsageError(f"--add-config: unbalanced brackets in {item!r}")
        if key.strip() in out:
            raise UsageError(f"--add-config: {key.strip()} is given twice")
        out[key.strip()] = value
    if not out:
        raise UsageError("--add-config names no config")
    return out


def parse_delete_config(text: str) -> list[str]:
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise UsageError("--delete-config names no config")
    return keys


def parse_scram(mechanism: str, value: str) -> tuple[int, str]:
    """``iterations=8192,password=secret`` -> (8192, "secret"); iterations default to 4096."""
    fields: dict[str, str] = {}
    for item in value.split(","):
        key, sep, v = item.partition("=")
        if not sep or key.strip() not in ("iterations", "password"):
            raise UsageError(f"{mechanism}: expected [iterations=N,password=P], got an item {key.strip()!r}")
        fields[key.strip()] = v
    if not fields.get("password"):
        raise UsageError(f"{mechanism}: a password is required ({mechanism}=[password=...])")
    try:
        iterations = int(fields.get("iterations", "4096"))
    except ValueError:
        raise UsageError(f"{mechanism}: iterations must be a whole number, got {fields['iterations']!r}") from None
    return iterations, fields["password"]


# -- entities ---------------------------------------------------------------------------------


def _entity(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """(user, client id, topic): each a name, DEFAULT_NAME for --entity-default, or None when
    not part of the entity. UsageError for combinations kafka-configs refuses."""
    types, names = args.entity_type, args.entity_names
    if not types:
        raise UsageError("--entity-type is required (users, clients, topics or brokers)")
    if len(names) > len(types):
        raise UsageError("more --entity-name/--entity-default than --entity-type")
    if types == ["brokers"]:
        raise UsageError("tidelog configs does not set broker configs: they are set in the broker's config file "
                         "(tidelog broker --config), except the dynamic replication throttle rates "
                         "(leader.replication.throttled.rate, follower.replication.throttled.rate), which "
                         "tidelog reassign --throttle sets, as does Admin.alter_broker_configs")
    if "topics" in types:
        if types != ["topics"] or (args.alter and not names) or (names and names[0] is DEFAULT):
            raise UsageError("a topic is named with one --entity-type topics --entity-name NAME")
        return None, None, names[0] if names else None
    if types not in (["users"], ["clients"], ["users", "clients"]):
        raise UsageError("entity types: users, clients, or users then clients (a user's client id)")
    if args.alter and len(names) != len(types):
        raise UsageError("--alter needs an --entity-name or --entity-default for each --entity-type")
    given = dict(zip(types, [_named(n) for n in names]))
    return given.get("users", _ALL if "users" in types else None), \
        given.get("clients", _ALL if "clients" in types else None), None


DEFAULT_NAME = "<default>"
_ALL = "*"  # --describe without a name: every entity of the type


def _named(name: str | None) -> str:
    return DEFAULT_NAME if name is DEFAULT else name


def entity_label(user: str | None, client: str | None) -> str:
    """How kafka-configs names an entity in its messages."""
    parts = []
    if user is not None:
        parts.append("the default user-principal" if user == DEFAULT_NAME else f"user-principal '{user}'")
    if client is not None:
        parts.append("the default client-id" if client == DEFAULT_NAME else f"client-id '{client}'")
    return ", ".join(parts)


# -- running ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    import trio

    return run_command("configs", lambda a: trio.run(_run, a), args)


async def _run(args: argparse.Namespace) -> int:
    user, client, topic = _entity(args)
    if topic is not None or args.entity_type == ["topics"]:
        if args.zookeeper:
            raise UsageError("topic configs go through the controller: use --bootstrap, not --zookeeper")
        return await _topics(args, topic)
    if args.zk_auth_file and not args.zookeeper:
        raise UsageError("--zk-auth-file goes with --zookeeper (a broker authenticates clients itself)")
    if args.zookeeper:
        open_session = getattr(args, "zookeeper_session", None)
        if open_session is None:
            raise UsageError("--zookeeper needs the broker's modules: run the tidelog command of a broker install")
        async with open_session(args.zookeeper, args.zk_auth_file) as call:
            return await _entities(args, _client(call), user, client)
    from tidelog.aio import AsyncAdmin

    async with AsyncAdmin(args.bootstrap, client_id="tidelog-configs", request_timeout_ms=min(args.timeout_ms, 30000),
                          default_api_timeout_ms=args.timeout_ms, **connection_options(args)) as admin:
        await _connect(admin, args)
        return await _entities(args, admin, user, client)


def _client(call: Callable[..., Any]) -> Any:
    from tidelog.aio.entity_configs import EntityConfigClient

    return EntityConfigClient(call)


async def _connect(admin: Any, args: argparse.Namespace) -> None:
    from tidelog.protocol.errors import TidelogError

    try:
        await admin.describe_cluster(timeout_ms=args.connect_timeout_ms)
    except TidelogError as e:
        raise CommandError(unreachable(args.bootstrap, e)) from None


async def _entities(args: argparse.Namespace, admin: Any, user: str | None, client: str | None) -> int:
    if args.describe:
        if args.add_config or args.delete_config:
            raise UsageError("--describe takes no --add-config or --delete-config")
        for line in await describe_lines(admin, user, client):
            print(line)
        return EXIT_OK
    await alter(admin, user, client, args.add_config, args.delete_config)
    print(f"Completed updating config for {entity_label(user, client)}.")
    return EXIT_OK


async def alter(admin: Any, user: str | None, client: str | None, add: str | None, delete: str | None) -> None:
    """Apply ``--add-config`` and ``--delete-config`` to a user, client id or user's client id."""
    from tidelog.aio.entity_configs import (
        ClientQuotaAlteration,
        ClientQuotaEntity,
        QuotaOp,
        ScramCredentialInfo,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    added = parse_add_config(add) if add else {}
    deleted = parse_delete_config(delete) if delete else []
    if not added and not deleted:
        raise UsageError("--alter needs --add-config or --delete-config")
    if both := sorted(set(added) & set(deleted)):
        raise UsageError(f"{', '.join(both)} is both added and deleted")
    for key in [*added, *deleted]:
        if key not in SCRAM_KEYS + QUOTA_KEYS:
            raise UsageError(f"unknown config {key!r} for users and clients (known: {', '.join(SCRAM_KEYS + QUOTA_KEYS)})")
        if key in SCRAM_KEYS and (client is not None or user == DEFAULT_NAME):
            raise UsageError(f"{key} credentials belong to a named user alone (--entity-type users --entity-name U)")
    scram: list[Any] = [UserScramCredentialDeletion(user, k) for k in deleted if k in SCRAM_KEYS]
    for key, value in added.items():
        if key in SCRAM_KEYS:
            iterations, password = parse_scram(key, value)
            scram.append(UserScramCredentialUpsertion(user, ScramCredentialInfo(key, iterations), password))
    ops = [QuotaOp(k, None) for k in deleted if k in QUOTA_KEYS]
    for key, value in added.items():
        if key in QUOTA_KEYS:
            try:
                ops.append(QuotaOp(key, float(value)))
            except ValueError:
                raise UsageError(f"{key} must be a number, got {value!r}") from None
    if ops:
        entries = {}
        if user is not None:
            entries[ClientQuotaEntity.USER] = None if user == DEFAULT_NAME else user
        if client is not None:
            entries[ClientQuotaEntity.CLIENT_ID] = None if client == DEFAULT_NAME else client
        await admin.alter_client_quotas([ClientQuotaAlteration(ClientQuotaEntity(entries), tuple(ops))])
    if scram:
        await admin.alter_user_scram_credentials(scram)


async def describe_lines(admin: Any, user: str | None, client: str | None) -> list[str]:
    """kafka-configs --describe's lines: quotas per entity, then each user's SCRAM mechanisms
    and iterations (the credential itself is never printed)."""
    from tidelog.aio.entity_configs import ClientQuotaEntity, ClientQuotaFilter, ClientQuotaFilterComponent

    wanted = {t: n for t, n in ((ClientQuotaEntity.USER, user), (ClientQuotaEntity.CLIENT_ID, client))
              if n is not None}
    components = [ClientQuotaFilterComponent.of_default_entity(t) if n == DEFAULT_NAME else
                  ClientQuotaFilterComponent.of_entity(t, n) for t, n in wanted.items() if n != _ALL]
    found = await admin.describe_client_quotas(ClientQuotaFilter.contains(components))
    # without a name: every entity of the type, the default one too (as kafka-configs)
    quotas = {e: v for e, v in found.items() if set(e.entries) == set(wanted)}
    lines = []
    for entity, values in sorted(quotas.items(), key=lambda kv: sorted((k, v or "") for k, v in kv[0].entries.items())):
        shown = ",".join(f"{k}={_number(v)}" for k, v in sorted(values.items()))
        label = entity_label(*[None if t not in entity.entries else entity.entries[t] or DEFAULT_NAME
                               for t in (ClientQuotaEntity.USER, ClientQuotaEntity.CLIENT_ID)])
        lines.append(f"Quota configs for {label} are {shown}")
    if user is not None and client is None and user != DEFAULT_NAME:
        lines += await _scram_lines(admin, None if user == _ALL else user)
    return lines


async def _scram_lines(admin: Any, user: str | None) -> list[str]:
    from tidelog.protocol.errors import RESOURCE_NOT_FOUND, TidelogError

    try:
        found = await admin.describe_user_scram_credentials(None if user is None else [user])
    except TidelogError as e:
        if getattr(e, "error", None) is RESOURCE_NOT_FOUND:
            return []
        raise
    return [f"SCRAM credential configs for {entity_label(name, None)} are "
            + ", ".join(f"{i.mechanism}=iterations={i.iterations}" for i in d.credential_infos)
            for name, d in sorted(found.items())]


def _number(v: float) -> str:
    return str(int(v)) if v == int(v) else repr(v)


# -- topics: the same Admin calls as ``tidelog topics alter`` and ``describe`` --------------------


async def _topics(args: argparse.Namespace, topic: str | None) -> int:
    from tidelog.aio import AsyncAdmin

    async with AsyncAdmin(args.bootstrap, client_id="tidelog-configs", request_timeout_ms=min(args.timeout_ms, 30000),
                          default_api_timeout_ms=args.timeout_ms, **connection_options(args)) as admin:
        await _connect(admin, args)
        names = [topic] if topic is not None else await admin.list_topics()
        if args.describe:
            for name in names:
                entries = await admin.describe_configs(name)
                shown = ",".join(f"{k}={e.value}" for k, e in sorted(entries.items()) if not e.is_default)
                print(f"Dynamic configs for topic {name} are {shown}")
            return EXIT_OK
        changes: dict[str, str | None] = dict(parse_add_config(args.add_config)) if args.add_config else {}
        for key in parse_delete_config(args.delete_config) if args.delete_config else []:
            if key in changes:
                raise UsageError(f"{key} is both added and deleted")
            changes[key] = None
        if not changes:
            raise UsageError("--alter needs --add-config or --delete-config")
        await admin.alter_configs(topic, changes)
    print(f"Completed updating config for topic {topic}.")
    return EXIT_OK

