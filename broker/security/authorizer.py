"""The ACL authorizer: Kafka's AclAuthorizer rules as a pure decision core, its ZooKeeper side,
and the rule that keeps the inter-broker APIs to brokers (``cluster_action_problem``).

The rules (Kafka's ``AclAuthorizer.authorize``)
-----------------------------------------------
A request by *principal* from *host* for *operation* on the resource (*type*, *name*):

1. a super user (``super.users``, and the broker's own inter-broker principal) is allowed
   everything, without looking at ACLs;
2. the ACLs that *apply* are those of every pattern covering the resource: the LITERAL
   pattern of the name, the LITERAL pattern ``*`` of the type, and each PREFIXED pattern that
   is a prefix of the name;
3. none apply: allowed only with ``allow.everyone.if.no.acl.found`` (default false);
4. a **Deny** entry whose principal is the principal or ``User:*``, whose host is the host or
   ``*`` and whose operation is the operation or ``All`` refuses it, whatever else says;
5. else an **Allow** entry that matches the same way allows it, where the operation may also
   be one that implies it (the table below);
6. else it is refused.

=================  ============================================================
operation asked    Allow entries that grant it (besides its own and ``All``)
=================  ============================================================
Describe           Read, Write, Delete, Alter
DescribeConfigs    AlterConfigs
=================  ============================================================

A Deny is never widened: Deny Read does not deny Describe.

``authorize_any`` is Kafka's ``authorizeByResourceType`` (is *some* resource of the type
allowed?), used by InitProducerId: a literal Deny on ``*`` refuses; otherwise an Allow on a
literal name or a prefix that no Deny on the same name (or on a prefix of it) cancels.

Cost per request
----------------
``AclCache`` indexes entries by LITERAL (type, name) and, per type, PREFIXED name plus the
sorted set of prefix lengths in use: finding the ACLs of a resource is two dict lookups and
one per distinct prefix length, never a scan of all ACLs. Decisions are remembered by
(principal, host, operation, type, name) until the next ACL change, so a produce stream
costs one dict lookup per topic (``bench/authorizer_bench.py``).

ZooKeeper (``ZkAclStore``)
--------------------------
ACLs live where Kafka keeps them (``broker/zookeeper/layout.py``): one znode per pattern,
written with check-and-set by whichever broker receives CreateAcls/DeleteAcls, each write
followed by a sequential change notification. Every broker watches the two notification
trees and reloads only the pattern a new notification names; notifications older than
15 minutes are deleted (Kafka's ``changeExpirationMs``). The watch is set before the full
load, so no change falls between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import trio

from tidelog.broker.context import RequestContext
from tidelog.broker.zookeeper.layout import AclEntry, ZkError
from tidelog.protocol.acls import (
    CLUSTER_NAME,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

logger = logging.getLogger("tidelog.authorizer")

CHANGE_EXPIRATION_MS = 15 * 60 * 1000  # Kafka's ZkNodeChangeNotificationListener default
DECISION_CACHE_SIZE = 100_000  # remembered decisions; all forgotten at the next ACL change or when full

Pattern = tuple[ResourceType, str, ResourcePatternType]

ALLOW, DENY, ALL = AclPermissionType.ALLOW, AclPermissionType.DENY, AclOperation.ALL
LITERAL, PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED

# operation asked -> the operations whose Allow grants it (the module docstring's table)
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    op: frozenset({op, ALL}) for op in AclOperation}
IMPLIED_BY[AclOperation.DESCRIBE] = frozenset({AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                               AclOperation.DELETE, AclOperation.ALTER, ALL})
IMPLIED_BY[AclOperation.DESCRIBE_CONFIGS] = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                                                       ALL})

INTER_BROKER_APIS = ("LeaderAndIsr", "StopReplica", "UpdateMetadata", "ControlledShutdown",
                     "Fetch (replica)", "OffsetsForLeaderEpoch (replica)")
_AUTHENTICATING = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


def decide(entry_sets: Iterable[frozenset[AclEntry]], principal: str, host: str, operation: AclOperation,
           allow_if_none: bool) -> bool:
    """Rules 3 to 6 over the entries that apply to a resource (pure)."""
    granting = IMPLIED_BY[operation]
    any_acl = allowed = False
    for entries in entry_sets:
        for p, h, op, perm in entries:
            any_acl = True
            if (p != principal and p != WILDCARD_PRINCIPAL) or (h != host and h != WILDCARD_HOST):
                continue
            if perm is DENY:
                if op is operation or op is ALL:
                    return False
            elif op in granting:
                allowed = True
    return allowed if any_acl else allow_if_none


class AclCache:
    """Every ACL entry by pattern, indexed for matching (the module docstring)."""

    def __init__(self) -> None:
        self._literal: dict[tuple[ResourceType, str], frozenset[AclEntry]] = {}
        self._prefixed: dict[ResourceType, dict[str, frozenset[AclEntry]]] = {}
        self._lengths: dict[ResourceType, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return sum(len(e) for e in self._literal.values()) + sum(
            len(e) for names in self._prefixed.values() for e in names.values())

    def set(self, resource_type: ResourceType, name: str, pattern_type: ResourcePatternType,
            entries: frozenset[AclEntry]) -> bool:
        """Replace one pattern's entries (empty: remove it); whether anything changed."""
        if pattern_type is LITERAL:
            key = (resource_type, name)
            if self._literal.get(key, frozenset()) == entries:
                return False
            if entries:
                self._literal[key] = entries
            else:
                self._literal.pop(key, None)
            return True
        names = self._prefixed.setdefault(resource_type, {})
        if names.get(name, frozenset()) == entries:
            return False
        if entries:
            names[name] = entries
        else:
            names.pop(name, None)
        self._lengths[resource_type] = tuple(sorted({len(n) for n in names}))
        return True

    def get(self, resource_type: ResourceType, name: str, pattern_type: ResourcePatternType) -> frozenset[AclEntry]:
        if pattern_type is LITERAL:
            return self._literal.get((resource_type, name), frozenset())
        return self._prefixed.get(resource_type, {}).get(name, frozenset())

    def applying(self, resource_type: ResourceType, name: str) -> list[frozenset[AclEntry]]:
        """Rule 2: the entry sets of every pattern covering the resource."""
        literal = self._literal
        out = []
        if (entries := literal.get((resource_type, WILDCARD_RESOURCE))) is not None:
            out.append(entries)
        if (entries := literal.get((resource_type, name))) is not None and name != WILDCARD_RESOURCE:
            out.append(entries)
        lengths = self._lengths.get(resource_type)
        if lengths:
            prefixed = self._prefixed[resource_type]
            for n in lengths:
                if n > len(name):
                    break
                if (entries := prefixed.get(name[:n])) is not None:
                    out.append(entries)
        return out

    def patterns(self) -> Iterator[Pattern]:
        for rtype, name in self._literal:
            yield rtype, name, LITERAL
        for rtype, names in self._prefixed.items():
            for name in names:
                yield rtype, name, PREFIXED

    def bindings(self) -> Iterator[AclBinding]:
        for pattern in self.patterns():
            for entry in sorted(self.get(*pattern)):
                yield AclBinding(*pattern, *entry)

    def names_with(self, resource_type: ResourceType, pattern_type: ResourcePatternType, principal: str,
                   host: str, operation: AclOperation, permission: AclPermissionType) -> set[str]:
        """The names of ``pattern_type`` patterns of the type with an entry of ``permission``
        matching principal, host and operation (itself or All): Kafka's ``matchingResources``."""
        if pattern_type is LITERAL:
            items: Iterable[tuple[str, frozenset[AclEntry]]] = (
                (n, e) for (t, n), e in self._literal.items() if t is resource_type)
        else:
            items = self._prefixed.get(resource_type, {}).items()
        return {name for name, entries in items
                if any(perm is permission and (p == principal or p == WILDCARD_PRINCIPAL)
                       and (h == host or h == WILDCARD_HOST) and (op is operation or op is ALL)
                       for p, h, op, perm in entries)}


class Authorizer:
    """The decision core: ACLs in an ``AclCache``, super users, the no-ACL default, and the
    decisions remembered until the ACLs change. No I/O; ``ZkAclStore`` feeds it."""

    def __init__(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False, *,
                 cache_size: int = DECISION_CACHE_SIZE):
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self.acls = AclCache()
        self._decisions: dict[tuple[str, str, AclOperation, ResourceType, str], bool] = {}
        self._cache_size = cache_size
        self.changes = 0  # ACL changes applied (the decision cache's generation)

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = principal in self.super_users or decide(
                self.acls.applying(resource_type, name), principal, host, operation,
                self.allow_everyone_if_no_acl_found)
            if len(self._decisions) >= self._cache_size:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def authorize_any(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Kafka's ``authorizeByResourceType`` (the module docstring)."""
        if principal in self.super_users:
            return True
        names = self.acls.names_with
        deny_literal = names(resource_type, LITERAL, principal, host, operation, DENY)
        if WILDCARD_RESOURCE in deny_literal:
            return False
        if self.allow_everyone_if_no_acl_found:
            return True
        deny_prefixed = names(resource_type, PREFIXED, principal, host, operation, DENY)

        def denied_by_prefix(name: str) -> bool:
            return any(name.startswith(d) for d in deny_prefixed)

        if any(not denied_by_prefix(p) for p in names(resource_type, PREFIXED, principal, host, operation, ALLOW)):
            return True
        return any(n == WILDCARD_RESOURCE or (n not in deny_literal and not denied_by_prefix(n))
                   for n in names(resource_type, LITERAL, principal, host, operation, ALLOW))

    def set_acls(self, resource_type: ResourceType, name: str, pattern_type: ResourcePatternType,
                 entries: frozenset[AclEntry]) -> None:
        """One pattern's entries as ZooKeeper now holds them; forgets every decision if they
        changed."""
        if self.acls.set(resource_type, name, pattern_type, frozenset(entries)):
            self._decisions.clear()
            self.changes += 1

    def bindings(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        return [b for b in self.acls.bindings() if acl_filter is None or acl_filter.matches(b)]


# what stands for the ACLs of a pattern whose znode does not parse: fail closed
UNREADABLE_ACLS = frozenset({("User:*", "*", AclOperation.ALL, AclPermissionType.DENY)})


def cluster_action_problem(ctx: RequestContext | None, broker_principals: frozenset[str],
                           authorizer: Authorizer | None, api: str) -> str | None:
    """Why a cluster action (a follower's Fetch or OffsetsForLeaderEpoch with a replica id,
    LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) is refused, or None.

    ============================================  =============================================
    the request came                              accepted when
    ============================================  =============================================
    from inside the broker (no context)           always
    on a listener that is not the inter-broker    never
    one
    on the inter-broker listener, which does not  always: anyone who reaches it can act as a
    authenticate (PLAINTEXT, SSL that asks for no broker (docs/operations.md)
    client certificate)
    on the inter-broker listener, authenticating  the principal is a broker principal
    (SASL, or SSL asking for client certificates: (``super.users`` and the broker's own
    a peer that sent none is ANONYMOUS there)
                                                  inter-broker principal) or, with the
                                                  authorizer on, is allowed ClusterAction on
                                                  the Cluster
    ============================================  =============================================

    The refusal names the principal and the listener; the API answers
    CLUSTER_AUTHORIZATION_FAILED with it.
    """
    if ctx is None:
        return None
    if not ctx.inter_broker:
        return (f"{api} from {ctx.principal} on listener {ctx.listener} refused: broker-to-broker requests are "
                "accepted only on the inter-broker listener (inter.broker.listener.name)")
    if not ctx.authenticated and ctx.security_protocol not in _AUTHENTICATING and not ctx.client_certificates:
        return None
    if ctx.principal in broker_principals:
        return None
    if authorizer is not None and authorizer.authorize(ctx.principal, ctx.peer_host, AclOperation.CLUSTER_ACTION,
                                                       ResourceType.CLUSTER, CLUSTER_NAME):
        return None
    return (f"{api} from {ctx.principal} on listener {ctx.listener} refused: {ctx.principal} is not a broker "
            "principal (super.users, the inter-broker principal) and is not allowed ClusterAction on the Cluster")


# -- ZooKeeper -------------------------------------------------------------------------------------


class ZkAclStore:
    """The authorizer's ZooKeeper side: loads every ACL, follows the change notifications,
    and writes CreateAcls/DeleteAcls (check-and-set, ``ZkClient.update_acls``)."""

    def __init__(self, zk: Any, authorizer: Authorizer, *, change_expiration_ms: int = CHANGE_EXPIRATION_MS,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.zk = zk  # broker.zookeeper.zk.ZkClient
        self.authorizer = authorizer
        self.change_expiration_ms = change_expiration_ms
        self.clock_ms = clock_ms
        self._created: dict[ResourcePatternType, dict[str, int]] = {LITERAL: {}, PREFIXED: {}}  # seen: ctime

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Watch, load everything, then report started and follow the changes. The start is
        tried again until ZooKeeper answers (no listener opens before the ACLs are loaded)."""
        watches = await self.zk.until_answered(self._watch_and_load)
        logger.info("ACL authorizer loaded %d ACLs", len(self.authorizer.acls))
        async with trio.open_nursery() as nursery:
            for t, changes in watches.items():
                nursery.start_soon(self._follow, t, changes)
            task_status.started()

    async def _watch_and_load(self) -> dict[ResourcePatternType, Any]:
        await self.zk.ensure_acl_paths()
        watches: dict[ResourcePatternType, Any] = {}
        try:
            for t in (LITERAL, PREFIXED):
                watches[t] = await self.zk.watch_children(self.zk.paths.acl_changes(t))
            for t, changes in watches.items():
                current = await changes.receive()
                for name, _, ctime in await self.zk.acl_change_notifications(t, current):
                    self._created[t][name] = ctime
            await self.load_all()
        except BaseException:
            for changes in watches.values():
                changes.close()
            raise
        return watches

    async def load_all(self) -> None:
        """Every pattern as ZooKeeper holds it now, and no pattern it no longer holds: at start,
        and after a lost session (whose missed notifications may have expired meanwhile, so a
        revoked Allow would otherwise stay in force)."""
        present = await self.zk.acl_resources()
        for pattern in present:
            await self.reload(pattern)
        for pattern in set(self.authorizer.acls.patterns()) - set(present):
            self.authorizer.set_acls(*pattern, frozenset())

    async def reload(self, pattern: Pattern) -> None:
        """One pattern as ZooKeeper holds it now. A malformed znode denies everything on the
        pattern to all but the super users until it parses (an error logged): read in part, or
        as no ACLs, it could drop a Deny, and with ``allow.everyone.if.no.acl.found`` open the
        resource to everyone."""
        try:
            got = await self.zk.get_acls(*pattern)
        except ValueError as e:
            logger.error("ACLs of %s:%s:%s do not parse (%s): everything on it is denied to all but the super "
                         "users until they do", pattern[0].kafka_name, pattern[2].name, pattern[1], e)
            self.authorizer.set_acls(*pattern, UNREADABLE_ACLS)
            return
        self.authorizer.set_acls(*pattern, got[0] if got else frozenset())

    async def _follow(self, pattern_type: ResourcePatternType, changes) -> None:
        seen = self._created[pattern_type]
        children: list[str] = list(seen)
        while True:
            with trio.move_on_after(60):  # at least once a minute, to purge expired notifications
                children = await changes.receive()
            new = [c for c in children if c not in seen]
            while True:
                try:
                    for name, pattern, ctime in await self.zk.acl_change_notifications(pattern_type, new):
                        if pattern is not None:
                            await self.reload(pattern)
                        seen[name] = ctime
                    await self._purge(pattern_type)
                    break
                except ZkError as e:
                    logger.warning("ACL change notifications not processed yet: %s", e)
                    await trio.sleep(1.0)
            current = set(children)
            for name in [n for n in seen if n not in current]:  # purged (by any broker)
                del seen[name]

    async def _purge(self, pattern_type: ResourcePatternType) -> None:
        seen = self._created[pattern_type]
        horizon = self.clock_ms() - self.change_expiration_ms
        expired = [name for name, ctime in seen.items() if ctime < horizon]
        if expired:
            await self.zk.delete_acl_change_notifications(pattern_type, expired)
            for name in expired:
                seen.pop(name, None)

    # -- writes (CreateAcls, DeleteAcls) --------------------------------------------------------

    async def create(self, bindings: list[AclBinding]) -> list[Exception | None]:
        """Store each binding; per binding None or the error (AclError: not storable)."""
        results: list[Exception | None] = [None] * len(bindings)
        by_pattern: dict[Pattern, list[int]] = {}
        for i, b in enumerate(bindings):
            try:
                b.validate()
                self.zk.paths.acl(*b.pattern)  # a name ZooKeeper can hold
            except AclError as e:
                results[i] = e
                continue
            by_pattern.setdefault(b.pattern, []).append(i)
        for pattern, indexes in by_pattern.items():
            added = frozenset(bindings[i].entry for i in indexes)
            try:
                _, new = await self.zk.update_acls(*pattern, lambda old, added=added: old | added)
            except ZkError as e:
                for i in indexes:
                    results[i] = e
                continue
            self.authorizer.set_acls(*pattern, new)
            logger.info("ACLs of %s:%s:%s now %d entries", pattern[0].kafka_name, pattern[2].name, pattern[1], len(new))
        return results

    async def delete(self, filters: list[AclBindingFilter]) -> list[list[tuple[AclBinding, Exception | None]]]:
        """Delete what each filter matches (a binding counts for the first filter matching it);
        per filter the deleted bindings, each with None or the error that kept it."""
        results: list[list[tuple[AclBinding, Exception | None]]] = [[] for _ in filters]
        patterns = set(self.authorizer.acls.patterns())
        for f in filters:  # a pattern the filter names exactly, whether or not this broker knows it yet
            if f.restype not in (ResourceType.ANY, ResourceType.UNKNOWN) and f.name is not None:
                for t in {ResourcePatternType.ANY: (LITERAL, PREFIXED), LITERAL: (LITERAL,),
                          PREFIXED: (PREFIXED,)}.get(f.resource_pattern_type, ()):
                    try:
                        self.zk.paths.acl(f.restype, f.name, t)
                    except (AclError, ValueError):
                        continue
                    patterns.add((f.restype, f.name, t))
        for pattern in sorted(patterns, key=lambda p: (p[0], p[2], p[1])):
            matching = [(i, f) for i, f in enumerate(filters) if f.matches_pattern(*pattern)]
            if not matching:
                continue
            removed: dict[AclEntry, int] = {}

            def change(old: frozenset[AclEntry], matching=matching, removed=removed) -> frozenset[AclEntry]:
                removed.clear()
                for entry in old:
                    for i, f in matching:
                        if f.matches_entry(*entry):
                            removed[entry] = i
                            break
                return old - removed.keys()

            error: Exception | None = None
            try:
                _, new = await self.zk.update_acls(*pattern, change)
                self.authorizer.set_acls(*pattern, new)
            except ZkError as e:
                error = e
            for entry, i in sorted(removed.items()):
                results[i].append((AclBinding(*pattern, *entry), error))
        return results
