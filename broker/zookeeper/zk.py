"""The one module that imports kazoo: Tidelog's ZooKeeper client, used from Trio.

Theory of operation
-------------------
kazoo is thread-based: each KazooClient runs a connection thread (which also calls state
listeners), a completion worker and a callback worker (which runs every watch callback and
the DataWatch/ChildrenWatch recipes, one at a time). Trio must never block on it, and kazoo's
threads must never block on Trio. So:

* every blocking kazoo call runs in a worker thread, ``trio.to_thread.run_sync`` with this
  client's own CapacityLimiter (not Trio's shared default of 40) and
  ``abandon_on_cancel=True``, inside a Trio timeout (``op_timeout_s``) that raises
  ZkTimeoutError. An abandoned call may still be applied by ZooKeeper later: writes are
  check-and-set, so a retry after a timeout re-reads first. That includes the recipe
  constructors, which do a synchronous read;
* kazoo's threads only *enqueue*: session state changes and watch callbacks call
  ``token.run_sync_soon(send.send_nowait, item)`` into an unbounded memory channel (so
  nothing ever blocks or drops) and return at once. Closing the receiving end of a watch
  channel stops the watch at its next event;
* kazoo's exceptions never leave this module: they become the ZkError family of
  ``broker.zookeeper.layout``.

Sessions: ``session_events`` carries ("CONNECTED" | "SUSPENDED" | "LOST", monotonic time).
SUSPENDED means the connection dropped and the session may still be alive (ephemerals kept);
LOST means ZooKeeper expired it, and the CONNECTED that follows is a *new* session: the owner
re-registers its ephemerals (broker registration, controller candidacy). Watches made with
``watch_children`` / ``watch_data`` survive both, as kazoo's recipes re-arm themselves by
reading again on each reconnect. Changes made while the connection was down fire no watch,
and a znode deleted and created again meanwhile leaves the children's names as they were
(a broker that restarted: the same id, a new broker epoch), so a children watch reports its
read after every reconnect, changed or not (kazoo's own reports only changed names): the
owner reads again what the children hold, and must find a report of nothing new harmless.
A data watch reports a znode whose modification zxid changed. A deliberate ``close()`` ends
the channel without a LOST.

Fencing: every write derived from a read carries the znode version it read (check-and-set,
ZkVersionConflict when stale); controller writes (partition states, assignments, topic
configs, deletions of handled notifications) also carry a check of ``/controller_epoch``'s
znode version in the same transaction (``_fenced``), so a controller that has been replaced
(ControllerMovedError) cannot overwrite or discard its successor's work.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

import trio
from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionDropped,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import ACL, Id

from tidelog.broker.zookeeper.layout import (
    BROKERS,
    CLIENTS,
    DEFAULT_CHROOT,
    INITIAL_CONTROLLER_EPOCH,
    USERS,
    AclEntry,
    BrokerIdInUseError,
    BrokerInfo,
    ControllerMovedError,
    DigestCredentials,
    LeaderAndIsr,
    ProducerIdBlock,
    ReplicaReport,
    TopicExistsError,
    ZkAcl,
    ZkConnectionError,
    ZkError,
    ZkNoAuthError,
    ZkNodeExistsError,
    ZkNoNodeError,
    ZkPaths,
    ZkTimeoutError,
    ZkVersionConflict,
    decode_acl_change,
    decode_acls,
    decode_broker_info,
    decode_cluster_id,
    decode_config_change,
    decode_controller,
    decode_controller_epoch,
    decode_entity_config,
    decode_isr_change,
    decode_partition_state,
    decode_producer_id_block,
    decode_replica_damage,
    decode_topic_assignment,
    decode_topic_config,
    decode_topic_moves,
    encode_acl_change,
    encode_acls,
    encode_broker_info,
    encode_cluster_id,
    encode_config_change,
    encode_controller,
    encode_controller_epoch,
    encode_entity_config,
    encode_isr_change,
    encode_partition_state,
    encode_producer_id_block,
    encode_replica_damage,
    encode_topic_assignment,
    encode_topic_config,
    more_open_than,
    next_producer_id_block,
    split_connect,
)
from tidelog.protocol.acls import AclError, ResourcePatternType, ResourceType, parse_enum
from tidelog.protocol.topics import validate_topic_name

__all__ = ["ZkClient", "ZkError", "ZkTimeoutError", "ZkConnectionError", "ZkNoNodeError",
           "ZkNodeExistsError", "ZkVersionConflict", "ControllerMovedError", "TopicExistsError",
           "BrokerIdInUseError", "CONNECTED", "SUSPENDED", "LOST"]

CONNECTED, SUSPENDED, LOST = "CONNECTED", "SUSPENDED", "LOST"
logging.getLogger("kazoo").setLevel(logging.ERROR)  # else every failed reconnect is a WARNING
log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_S = 1.0  # between the attempts of until_answered
RETRY_WARN_S = 60.0  # its failures are logged as a warning at most this often
# deletions per fenced transaction: at most ~300 bytes a path, well within the 1 MB a
# ZooKeeper request may carry (jute.maxbuffer)
DELETES_PER_TRANSACTION = 1000


def _retry() -> KazooRetry:
    # kazoo's default backs off up to an hour between reconnects; cap it at 1 s.
    return KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=1.0)


def _translate(exc: Exception, what: str) -> ZkError:
    """A kazoo exception as the ZkError family (kazoo stays inside this module)."""
    kinds = ((NoNodeError, ZkNoNodeError), (NodeExistsError, ZkNodeExistsError),
             (BadVersionError, ZkVersionConflict), (NoAuthError, ZkNoAuthError),
             ((ConnectionLoss, ConnectionDropped, SessionExpiredError, OperationTimeoutError),
              ZkConnectionError))
    cls = next((zk_cls for kz_cls, zk_cls in kinds if isinstance(exc, kz_cls)), ZkError)
    hint = (": this client's ZooKeeper identity may not do that (zookeeper.digest.username and "
            "zookeeper.digest.password must be the cluster's)") if cls is ZkNoAuthError else ""
    return cls(f"ZooKeeper {what}: {type(exc).__name__} {exc}".rstrip() + hint)


def _kazoo_acl(acl: Iterable[ZkAcl]) -> list[ACL]:
    return [ACL(a.perms, Id(a.scheme, a.id)) for a in acl]


def _zk_acl(acl: Iterable[ACL]) -> frozenset[ZkAcl]:
    return frozenset(ZkAcl(a.perms, a.id.scheme, a.id.id) for a in acl)


def _decoded_state(path: str, data: bytes) -> LeaderAndIsr:
    """A partition state's data, or ValueError naming its znode."""
    try:
        return decode_partition_state(data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _decoded_broker(path: str, broker_id: int, data: bytes) -> BrokerInfo:
    """A broker's registration, or ValueError naming its znode."""
    try:
        return decode_broker_info(broker_id, data)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


class _ChildrenWatch(ChildrenWatch):
    """kazoo's ChildrenWatch, except that the read it makes after a reconnect is reported even
    when the children kept their names. kazoo reports it only if a name changed; but while
    the connection was down a znode may have been deleted and created again (a broker that
    restarted: the same id, a new broker epoch), and no watch fired meanwhile (kazoo sets
    watches again by reading, not with ZooKeeper's SetWatches). The owner reads again what
    the children hold: a report with nothing changed must be harmless to it."""

    def _session_watcher(self, state: str) -> None:   # kazoo's connection thread
        # no lock: a read in flight holds the recipe's lock until the connection is back.
        # Forgotten at the drop and at the reconnect, the names the read after it is
        # compared with are none, so it is reported
        self._prior_children = None
        super()._session_watcher(state)


class _Feed:
    """An unbounded channel fed from kazoo's threads, delivered on the Trio thread.

    ``post`` is the only method called off the Trio thread; it never blocks. It returns False
    once the consumer is gone (receive side closed) or the client is closing, so that the
    kazoo recipe stops watching.
    """

    def __init__(self) -> None:
        self._send, self.receive = trio.open_memory_channel(math.inf)
        self.token: trio.lowlevel.TrioToken | None = None
        self.closed = False

    def post(self, item: Any) -> bool:
        if self.closed or self.token is None:
            return False
        try:
            self.token.run_sync_soon(self._deliver, item)
        except trio.RunFinishedError:
            self.closed = True
        return not self.closed

    def _deliver(self, item: Any) -> None:
        try:
            self._send.send_nowait(item)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True

    def close(self) -> None:
        self.closed = True
        self._send.close()


class ZkClient:
    """Tidelog's ZooKeeper session: ``async with ZkClient("127.0.0.1:2181") as zk: ...``.

    ``connect`` may carry a chroot suffix (``host:port/chroot``, as Kafka's
    ``zookeeper.connect``), which then wins over ``chroot``. All paths are absolute; kazoo's
    own chroot support is not used, so creating the chroot is just another ensure_path.

    ``auth`` (``zookeeper.digest.username`` and ``.password``) is added to every session
    (kazoo adds it again after each reconnect). With ``set_acl`` (``zookeeper.set.acl``,
    which needs ``auth``) every znode this client creates gets ``ZkPaths.znode_acl``: ALL for
    that identity, READ for anyone but on sensitive paths; without it znodes are open to all,
    as before. Each missing parent is created with its own ACL, never its child's. With
    ``create_paths=False`` (tools that must not create a cluster by mistake) ``start`` only
    connects.
    """

    def __init__(self, connect: str, chroot: str = DEFAULT_CHROOT, session_timeout_ms: int = 6000,
                 op_timeout_s: float = 10.0, *, max_threads: int = 8, connection_timeout_ms: int | None = None,
                 auth: DigestCredentials | None = None, set_acl: bool = False, create_paths: bool = True):
        if set_acl and auth is None:
            raise ZkError("zookeeper.set.acl needs zookeeper.digest.username and zookeeper.digest.password: "
                          "the identity that owns the znodes")
        self.hosts, connect_chroot = split_connect(connect)
        self.paths = ZkPaths(chroot if connect_chroot is None else connect_chroot)
        self.auth = auth
        self.owner = auth.identity if set_acl and auth is not None else None  # the ACLs' owner, or None: open
        self.create_paths = create_paths
        self.session_timeout_ms = session_timeout_ms
        self.op_timeout_s = op_timeout_s
        # zookeeper.connection.timeout.ms: how long start() waits for the first connection
        self.connect_timeout_s = op_timeout_s if connection_timeout_ms is None else connection_timeout_ms / 1000
        self._limiter = trio.CapacityLimiter(max_threads)
        self._zk: KazooClient | None = None
        self._session_feed = _Feed()
        self.session_events: trio.MemoryReceiveChannel = self._session_feed.receive
        self._watch_feeds: list[_Feed] = []
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect (within ``connect_timeout_s``) and create the chroot and the container znodes."""
        if self._zk is not None or self._closed:
            raise ZkError("ZkClient.start() may be called once")
        self._session_feed.token = trio.lowlevel.current_trio_token()
        self._zk = KazooClient(hosts=self.hosts, timeout=self.session_timeout_ms / 1000,
                               connection_retry=_retry(), command_retry=_retry(),
                               auth_data=[self.auth.auth] if self.auth is not None else None)
        self._zk.add_listener(self._on_state)
        try:
            await self._call(f"connect to {self.hosts}", self._zk.start, self.connect_timeout_s,
                             timeout=self.connect_timeout_s + 1)
            if self.create_paths:
                for path in self.paths.persistent_paths():
                    await self._ensure_path(path)
                await self._ensure_controller_epoch()
                if self.owner is not None:
                    await self.secure_containers()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """End the session (its ephemerals go at once) and every channel. Idempotent; works
        while being cancelled (shielded, bounded by ``op_timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        self._session_feed.close()
        for feed in self._watch_feeds:
            feed.close()
        zk, self._zk = self._zk, None
        if zk is None:
            return

        def stop_and_close() -> None:
            zk.stop()
            zk.close()
        with trio.CancelScope(shield=True), trio.move_on_after(self.op_timeout_s):
            # Not through self._limiter: abandoned calls may hold all of its tokens.
            await trio.to_thread.run_sync(stop_and_close, abandon_on_cancel=True)

    async def __aenter__(self) -> "ZkClient":
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    @property
    def session_id(self) -> int | None:
        """The current session's id (changes after LOST), or None while disconnected."""
        client_id = self._zk.client_id if self._zk is not None else None
        return client_id[0] if client_id else None

    @property
    def closed(self) -> bool:
        """``close()`` was called: nothing is tried again any more."""
        return self._closed

    @property
    def connected(self) -> bool:
        return self._zk is not None and self._zk.connected

    def _owns(self, stat: Any) -> bool:
        """Whether an ephemeral znode belongs to the current session."""
        session_id = self.session_id
        if session_id is None:
            raise ZkConnectionError("ZooKeeper session unknown: not connected")
        return stat.ephemeralOwner == session_id

    def _on_state(self, state: str) -> None:
        """kazoo connection thread: enqueue only."""
        self._session_feed.post((str(state), time.monotonic()))

    # ------------------------------------------------------------------ the bridge

    @property
    def _kz(self) -> KazooClient:
        if self._zk is None:
            raise ZkError("ZooKeeper client is not started (or closed)")
        return self._zk

    async def _call(self, what: str, fn: Callable, *args, timeout: float | None = None, **kwargs) -> Any:
        """Run one blocking kazoo call in a worker thread, bounded by the op timeout."""
        limit = self.op_timeout_s if timeout is None else timeout
        try:
            with trio.fail_after(limit):
                return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                                     limiter=self._limiter, abandon_on_cancel=True)
        except trio.TooSlowError:
            raise ZkTimeoutError(f"ZooKeeper {what}: no answer within {limit} s "
                                 f"(is ZooKeeper at {self.hosts} reachable?)") from None
        except KazooTimeoutError:
            raise ZkTimeoutError(f"ZooKeeper {what}: no connection within {self.connect_timeout_s} s") from None
        except KazooException as exc:
            raise _translate(exc, what) from exc

    async def _get(self, path: str) -> tuple[bytes, Any] | None:
        """(data, stat), or None if the znode does not exist."""
        try:
            return await self._call(f"get {path}", self._kz.get, path)
        except ZkNoNodeError:
            return None

    async def _get_many(self, paths: list[str]) -> list[tuple[bytes, Any] | None]:
        """Pipelined gets (one thread, all requests in flight together); None for absent nodes."""
        def run() -> list:
            pending = [self._kz.get_async(p) for p in paths]
            out = []
            for result in pending:
                try:
                    out.append(result.get())
                except NoNodeError:
                    out.append(None)
            return out
        return await self._call(f"get {len(paths)} znodes", run)

    async def _children(self, path: str) -> list[str] | None:
        try:
            return sorted(await self._call(f"get_children {path}", self._kz.get_children, path))
        except ZkNoNodeError:
            return None

    def _acl(self, path: str) -> list[ACL]:
        return _kazoo_acl(self.paths.znode_acl(path, self.owner))

    async def _create(self, path: str, data: bytes = b"", *, makepath: bool = False, **kwargs) -> Any:
        """kazoo's create with this client's ACL for ``path``; with ``makepath`` the missing
        parents are created first (each with its own ACL), on the first NoNodeError."""
        def run() -> Any:
            try:
                return self._kz.create(path, data, acl=self._acl(path), **kwargs)
            except NoNodeError:
                if not makepath:
                    raise
            self._ensure_path_sync(path.rsplit("/", 1)[0])
            return self._kz.create(path, data, acl=self._acl(path), **kwargs)
        return await self._call(f"create {path}", run)

    def _ensure_path_sync(self, path: str) -> None:
        """In a worker thread: create ``path`` and whichever of its ancestors are missing,
        each with its own ACL. Only missing znodes are created (Kafka's createRecursive): a
        create of an existing znode whose parent this identity may not create under (a
        secured chroot, a locked-down root) would be refused rather than found."""
        if not path or self._kz.exists(path):
            return
        try:
            self._kz.create(path, b"", acl=self._acl(path))
        except NodeExistsError:
            return
        except NoNodeError:
            self._ensure_path_sync(path.rsplit("/", 1)[0])
            try:
                self._kz.create(path, b"", acl=self._acl(path))
            except NodeExistsError:
                pass

    async def _ensure_path(self, path: str) -> None:
        await self._call(f"ensure_path {path}", self._ensure_path_sync, path)

    async def _create_if_missing(self, path: str, data: bytes = b"") -> None:
        try:
            await self._create(path, data)
        except ZkNodeExistsError:
            pass

    async def _set(self, path: str, data: bytes, version: int = -1) -> int:
        """set_data with check-and-set (``version=-1``: unconditional); returns the new version."""
        stat = await self._call(f"set {path}", self._kz.set, path, data, version=version)
        return stat.version

    async def _delete(self, path: str, version: int = -1) -> None:
        try:
            await self._call(f"delete {path}", self._kz.delete, path, version=version)
        except ZkNoNodeError:
            pass

    async def _transaction(self, what: str, ops: list[tuple]) -> list:
        """Commit ``ops`` (``(method, *args)`` of kazoo's TransactionRequest) atomically.

        kazoo's commit() never raises: it returns one result per op, the failing op's being
        the real error (the others RolledBackError / RuntimeInconsistency). The real error is
        raised translated, with ``op_index`` naming the failing op.
        """
        def run() -> list:
            txn = self._kz.transaction()
            for method, *args in ops:
                if method == "create":  # (path, data, acl, ephemeral): this client's ACL for path
                    path, data, *flags = args
                    txn.create(path, data, self._acl(path), *flags[1:])
                else:
                    getattr(txn, method)(*args)
            return txn.commit()
        results = await self._call(what, run)
        for index, result in enumerate(results):
            if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
                error = _translate(result, f"{what} (op {index}: {ops[index][0]} {ops[index][1]})")
                error.op_index = index
                raise error
        return results

    # ------------------------------------------------------------------ watches

    async def watch_children(self, path: str) -> trio.MemoryReceiveChannel:
        """Sorted children of ``path`` now, after each change, and after each reconnect even
        when they did not change (creating ``path`` if missing).

        Deletion of ``path`` itself ends the watch silently (kazoo's ChildrenWatch): watch
        container znodes only. Close the returned channel to stop watching. The first read is
        tried again until ZooKeeper answers (``until_answered``).
        """
        async def once() -> trio.MemoryReceiveChannel:
            await self._ensure_path(path)
            feed = self._new_feed()

            def on_children(children: list[str]) -> bool | None:   # kazoo thread: enqueue only
                return None if feed.post(sorted(children)) else False
            await self._start_watch(feed, f"watch children of {path}", _ChildrenWatch, self._kz, path,
                                    on_children)
            return feed.receive
        return await self.until_answered(once)

    async def watch_data(self, path: str) -> trio.MemoryReceiveChannel:
        """(data, version) of ``path`` now and after each change; (None, None) while it does not
        exist (an exists watch then waits for its creation). Close the channel to stop. The
        first read is tried again until ZooKeeper answers (``until_answered``)."""
        async def once() -> trio.MemoryReceiveChannel:
            feed = self._new_feed()

            def on_data(data: bytes | None, stat: Any, event: Any = None) -> bool | None:   # kazoo thread
                item = (None, None) if stat is None else (data, stat.version)
                return None if feed.post(item) else False
            await self._start_watch(feed, f"watch data of {path}", DataWatch, self._kz, path, on_data)
            return feed.receive
        return await self.until_answered(once)

    async def until_answered(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, again every ``RETRY_S`` after a ZkTimeoutError or ZkConnectionError,
        until it returns, raises anything else, or this client is closed.

        For what a broker that has joined must not give up on (its watches, its registration):
        a slow ZooKeeper, a dropped connection, an expired session or this process stopped for
        longer than the op timeout (the deadline passes while nothing runs) are waited out, as
        Kafka's ZooKeeper client waits for a connection, instead of ending the broker. Each
        attempt must be safe to repeat: reads, and writes that re-read first.
        """
        failures, warned = 0, -math.inf
        while True:
            try:
                result = await attempt()
            except (ZkTimeoutError, ZkConnectionError) as e:
                if self._closed:
                    raise
                failures += 1
                now = time.monotonic()  # a warning a minute at most: an outage is no log flood
                level = logging.WARNING if now - warned >= RETRY_WARN_S else logging.DEBUG
                warned = now if level == logging.WARNING else warned
                log.log(level, "%s; trying again every %.0f s (failure %d)", e, RETRY_S, failures)
            else:
                if failures:
                    log.info("ZooKeeper answered after %d failed tries", failures)
                return result
            await trio.sleep(RETRY_S)

    def _new_feed(self) -> _Feed:
        feed = _Feed()
        feed.token = trio.lowlevel.current_trio_token()
        self._watch_feeds = [f for f in self._watch_feeds if not f.closed] + [feed]
        return feed

    async def _start_watch(self, feed: _Feed, what: str, recipe: Callable, *args) -> None:
        # The recipe constructors read synchronously (and call back once): a worker thread.
        try:
            await self._call(what, recipe, *args)
        except BaseException:
            feed.close()    # a late, abandoned registration then stops at its first event
            raise

    # ------------------------------------------------------------------ cluster id

    async def get_or_create_cluster_id(self, proposed: str) -> str:
        """The cluster id: ``proposed`` if this call created it, else the existing one."""
        path = self.paths.cluster_id
        try:
            await self._create(path, encode_cluster_id(proposed), makepath=True)
            return proposed
        except ZkNodeExistsError:
            got = await self._get(path)
            if got is None:
                raise ZkError(f"{path} vanished while being read") from None
            return decode_cluster_id(got[0])

    # ------------------------------------------------------------------ brokers

    async def register_broker(self, info: BrokerInfo) -> int:
        """Register this broker (ephemeral ``/brokers/ids/<id>``); returns the broker epoch.

        The broker epoch is the znode's czxid: it grows with every registration, so the
        controller can tell a restarted broker from the one it knew. If the znode already
        belongs to this session (a retry, or a second call) it is reused and its data
        refreshed; if another live session holds it, BrokerIdInUseError (a restarted broker
        may retry until its previous session times out).
        """
        path, data = self.paths.broker(info.broker_id), encode_broker_info(info)
        for _ in range(5):   # the node may vanish between our create and our read
            try:
                _, stat = await self._create(path, data, ephemeral=True, include_data=True)
                return stat.czxid
            except ZkNodeExistsError:
                got = await self._get(path)
            if got is None:
                continue
            owner = got[1].ephemeralOwner
            if not self._owns(got[1]):
                raise BrokerIdInUseError(f"broker.id {info.broker_id} is already registered "
                                         f"(by ZooKeeper session 0x{owner:x})")
            try:
                await self._set(path, data, got[1].version)
            except ZkVersionConflict:  # an earlier, abandoned try's write landed: read again
                continue
            return got[1].czxid
        raise ZkError(f"could not register broker {info.broker_id}: {path} keeps changing")

    async def get_broker(self, broker_id: int) -> BrokerInfo | None:
        """``broker_id``'s registration, None if it is not registered; ValueError naming the
        znode if its data does not decode."""
        path = self.paths.broker(broker_id)
        got = await self._get(path)
        return None if got is None else _decoded_broker(path, broker_id, got[0])

    async def _registrations(self) -> list[tuple[int, str, bytes, int]]:
        """(broker id, znode path, data, broker epoch) of every registered broker, by id."""
        ids = sorted(int(c) for c in await self._children(self.paths.broker_ids) or [] if c.isdigit())
        paths = [self.paths.broker(i) for i in ids]
        got = await self._get_many(paths)
        return [(i, path, g[0], g[1].czxid) for i, path, g in zip(ids, paths, got) if g is not None]

    async def broker_registrations(self) -> tuple[dict[int, tuple[BrokerInfo, int]], dict[int, tuple[str, int]]]:
        """Every registered broker: (the readable, id -> (registration, broker epoch); the
        unreadable, id -> (the problem, naming the znode, and broker epoch)). One registration
        that does not decode (written by hand, or by a broker of another version) must not
        hide the others: the caller decides what such a broker is (to the controller, not
        live)."""
        readable, unreadable = {}, {}
        for i, path, data, epoch in await self._registrations():
            try:
                readable[i] = (_decoded_broker(path, i, data), epoch)
            except ValueError as e:
                unreadable[i] = (str(e), epoch)
        return readable, unreadable

    async def live_brokers_and_epochs(self) -> dict[int, tuple[BrokerInfo, int]]:
        """broker id -> (registration, broker epoch), for every registered broker whose
        registration decodes; each other one is logged (``broker_registrations``)."""
        readable, unreadable = await self.broker_registrations()
        for i, (problem, _) in sorted(unreadable.items()):
            log.warning("broker %d is registered but its registration does not decode, ignored: %s", i, problem)
        return readable

    async def live_brokers(self) -> dict[int, BrokerInfo]:
        return {i: info for i, (info, _) in (await self.live_brokers_and_epochs()).items()}

    async def broker_epochs(self) -> dict[int, int]:
        """broker id -> broker epoch of every registered broker, read after a ``sync`` (so a
        ZooKeeper server that lags its leader answers no older than the moment of the call).
        The epoch is the registration's creation, whatever its data holds."""
        await self._call(f"sync {self.paths.broker_ids}", self._kz.sync, self.paths.broker_ids)
        return {i: epoch for i, _, _, epoch in await self._registrations()}

    async def get_broker_epoch(self, broker_id: int) -> int | None:
        """The broker epoch of ``broker_id``'s registration now (after a ``sync``), None if it
        is not registered."""
        path = self.paths.broker(broker_id)
        await self._call(f"sync {path}", self._kz.sync, path)
        got = await self._get(path)
        return None if got is None else got[1].czxid

    # ------------------------------------------------------------------ controller

    async def _ensure_controller_epoch(self) -> None:
        await self._create_if_missing(self.paths.controller_epoch,
                                      encode_controller_epoch(INITIAL_CONTROLLER_EPOCH))

    async def controller_epoch(self) -> tuple[int, int]:
        """(controller epoch, znode version of ``/controller_epoch``)."""
        got = await self._get(self.paths.controller_epoch)
        if got is None:
            await self._ensure_controller_epoch()
            return await self.controller_epoch()
        return decode_controller_epoch(got[0]), got[1].version

    async def try_elect_controller(self, broker_id: int) -> int | None:
        """Try to become the controller: the new controller epoch, or None if another is.

        One transaction creates the ephemeral ``/controller`` and bumps ``/controller_epoch``
        (check-and-set), so no controller ever runs with its predecessor's epoch. If this
        session already is the controller (a retry), its current epoch is returned.
        """
        while True:
            epoch, version = await self.controller_epoch()
            try:
                await self._transaction("elect controller", [
                    ("create", self.paths.controller, encode_controller(broker_id), None, True),
                    ("set_data", self.paths.controller_epoch, encode_controller_epoch(epoch + 1), version)])
                return epoch + 1
            except ZkNodeExistsError:
                return await self._current_epoch_if_ours(broker_id)
            except ZkVersionConflict:
                continue    # the epoch moved between our read and our write: read again

    async def _current_epoch_if_ours(self, broker_id: int) -> int | None:
        got = await self._get(self.paths.controller)
        if got is None or decode_controller(got[0]) != broker_id or not self._owns(got[1]):
            return None
        return (await self.controller_epoch())[0]

    async def get_controller_id(self) -> int | None:
        got = await self._get(self.paths.controller)
        return None if got is None else decode_controller(got[0])

    async def current_controller(self) -> tuple[int | None, int]:
        """(controller id, or None while none is elected; controller epoch) as ZooKeeper holds
        them now: read after a ``sync``, and as one pair. ``/controller`` is created in the
        transaction that bumps ``/controller_epoch`` (``try_elect_controller``), so its czxid
        is the epoch znode's mzxid; a pair read across an election is read again."""
        paths = self.paths

        def run() -> tuple[int | None, int]:
            kz = self._kz
            kz.sync(paths.controller_epoch)
            for _ in range(5):
                epoch_data, epoch_stat = kz.get(paths.controller_epoch)
                try:
                    data, stat = kz.get(paths.controller)
                except NoNodeError:
                    return None, decode_controller_epoch(epoch_data)
                if stat.czxid == epoch_stat.mzxid:
                    break
            return decode_controller(data), decode_controller_epoch(epoch_data)
        return await self._call("read the controller and its epoch", run)

    async def resign_controller(self, broker_id: int) -> None:
        """Delete ``/controller`` if (and only if) it is ours: this broker, this session."""
        got = await self._get(self.paths.controller)
        if got is None or decode_controller(got[0]) != broker_id or not self._owns(got[1]):
            return
        try:
            await self._delete(self.paths.controller, version=got[1].version)
        except ZkVersionConflict:
            pass

    # ------------------------------------------------------------------ topics

    async def create_topic(self, name: str, assignment: Mapping[int, Iterable[int]],
                           config: Mapping[str, str]) -> None:
        """Write the topic config, then the topic, in one transaction (Kafka's order: a broker
        that sees the topic always finds its config). A leftover config of a deleted topic is
        overwritten. TopicExistsError if the topic exists."""
        validate_topic_name(name)
        topic_path, config_path = self.paths.topic(name), self.paths.topic_config(name)
        while True:
            old_config = await self._get(config_path)
            config_op = (("create", config_path, encode_topic_config(config)) if old_config is None else
                         ("set_data", config_path, encode_topic_config(config), old_config[1].version))
            try:
                await self._transaction(f"create topic {name}", [
                    config_op, ("create", topic_path, encode_topic_assignment(assignment))])
                return
            except (ZkNodeExistsError, ZkVersionConflict) as exc:
                if exc.op_index == 1:
                    raise TopicExistsError(f"Topic '{name}' already exists.") from None
                # the config znode changed under us: read it again

    async def get_topics(self) -> list[str]:
        return await self._children(self.paths.topics) or []

    async def get_assignment_with_version(self, topic: str) -> tuple[dict[int, list[int]], int] | None:
        got = await self._get(self.paths.topic(topic))
        return None if got is None else (decode_topic_assignment(got[0]), got[1].version)

    async def get_assignment(self, topic: str) -> dict[int, list[int]] | None:
        got = await self.get_assignment_with_version(topic)
        return None if got is None else got[0]

    async def get_assignment_and_moves(self, topic: str) -> tuple[dict[int, list[int]], dict[int, tuple]] | None:
        """The topic's replica sets and, for partitions under reassignment, their replicas
        being (added, removed)."""
        got = await self._get(self.paths.topic(topic))
        return None if got is None else (decode_topic_assignment(got[0]), decode_topic_moves(got[0]))

    async def set_assignment(self, topic: str, assignment: Mapping[int, Iterable[int]],
                             version: int | None = None,
                             moving: Mapping[int, tuple[Iterable[int], Iterable[int]]] | None = None, *,
                             controller_epoch_zk_version: int) -> int:
        """Replace the assignment (CreatePartitions, reassignments with ``moving``: partition ->
        replicas being added, being removed); check-and-set when ``version`` is given; the new
        znode version. Only the controller writes it, and only while the controller epoch's
        znode is still at ``controller_epoch_zk_version`` (ControllerMovedError): a deposed
        controller's queued event must not change a topic its successor has read."""
        path, data = self.paths.topic(topic), encode_topic_assignment(assignment, moving)
        expected = -1 if version is None else version
        results = await self._fenced(f"set {path}", controller_epoch_zk_version, ("set_data", path, data, expected))
        return results[1].version

    async def get_topic_config(self, topic: str) -> dict[str, str]:
        got = await self._get(self.paths.topic_config(topic))
        return {} if got is None else decode_topic_config(got[0])

    async def set_topic_config(self, topic: str, config: Mapping[str, str], *,
                               controller_epoch_zk_version: int) -> None:
        """Set the topic's config (creating its znode); the controller's, fenced by its epoch
        as ``set_assignment``."""
        path, data = self.paths.topic_config(topic), encode_topic_config(config)
        try:
            await self._fenced(f"set {path}", controller_epoch_zk_version, ("set_data", path, data, -1))
        except ZkNoNodeError:
            await self._fenced(f"create {path}", controller_epoch_zk_version, ("create", path, data))

    async def mark_topic_for_deletion(self, topic: str) -> None:
        await self._create_if_missing(self.paths.delete_topic_marker(topic))

    async def topics_marked_for_deletion(self) -> list[str]:
        return await self._children(self.paths.delete_topics) or []

    async def delete_topic(self, topic: str, *, controller_epoch_zk_version: int) -> None:
        """Remove the topic, its partition states, its config and, last, its deletion marker;
        the controller's, every removal fenced as its other writes (ControllerMovedError): a
        deposed controller must not remove a topic of the name its successor has created since."""
        path, rest = self.paths.topic(topic), [self.paths.topic_config(topic), self.paths.delete_topic_marker(topic)]
        tree = await self._call(f"list {path}", self._subtree, path)
        await self._fenced_deletes(f"delete topic {topic}", controller_epoch_zk_version, tree + rest)

    def _subtree(self, path: str) -> list[str]:
        """``path`` and every znode below it, deepest first (an order they can be deleted in),
        read level by level with each level's reads pipelined (a topic of N partitions takes
        four round trips, not 2N). Blocking: run through ``_call``."""
        levels, level = [], [path]
        while level:
            levels.append(level)
            below = []
            for parent, children in [(p, self._kz.get_children_async(p)) for p in level]:
                try:
                    below += [f"{parent}/{c}" for c in sorted(children.get())]
                except NoNodeError:  # gone meanwhile: its deletion is skipped
                    pass
            level = below
        return [p for level in reversed(levels) for p in level]

    # ------------------------------------------------------------------ user and client-id configs

    async def get_entity_config(self, entity_path: str) -> tuple[dict[str, str], int | None]:
        """(config, znode version) of a user or client-id entity; ({}, None) when it has none."""
        got = await self._get(self.paths.entity_config(entity_path))
        return ({}, None) if got is None else (decode_entity_config(got[0], entity_path), got[1].version)

    async def get_entity_configs(self, entity_paths: list[str]) -> dict[str, dict[str, str]]:
        """The configs of ``entity_paths`` (pipelined reads); absent entities are left out."""
        got = await self._get_many([self.paths.entity_config(p) for p in entity_paths])
        return {p: decode_entity_config(g[0], p) for p, g in zip(entity_paths, got) if g is not None}

    async def change_entity_config(self, entity_path: str,
                                   change: Callable[[dict[str, str]], dict[str, str]]) -> dict[str, str]:
        """Replace an entity's config with ``change(current config)`` and tell every broker
        (a change notification); returns the new config. The write is check-and-set on the
        version read, so two writers altering the same entity at once both take effect: the
        loser reads again and applies its change to the winner's config. ``change`` must be
        pure (it runs again on a retry); what it raises is raised here, nothing written."""
        path = self.paths.entity_config(entity_path)
        while True:
            current, version = await self.get_entity_config(entity_path)
            config = change(dict(current))
            data = encode_entity_config(config)
            try:
                if version is None:
                    await self._create(path, data, makepath=True)
                else:
                    await self._set(path, data, version)
            except (ZkNodeExistsError, ZkVersionConflict):
                continue  # another writer got there first: apply the change to its config
            await self.notify_config_change(entity_path)
            return config

    async def list_entities(self) -> list[str]:
        """The entity path of every user, client-id and broker config: ``users/U``,
        ``clients/C``, ``users/U/clients/C`` (names sanitized, ``<default>`` as it is) and
        ``brokers/B``."""
        users = await self._children(self.paths.entity_type(USERS)) or []
        clients = await self._children(self.paths.entity_type(CLIENTS)) or []
        brokers = await self._children(self.paths.entity_type(BROKERS)) or []
        out = [f"users/{u}" for u in users] + [f"clients/{c}" for c in clients] + [f"brokers/{b}" for b in brokers]
        for user in users:
            for client in await self._children(self.paths.user_clients(user)) or []:
                out.append(f"users/{user}/clients/{client}")
        return out

    async def notify_config_change(self, entity_path: str) -> str:
        """A sequential ``/config/changes/config_change_<seq>`` naming the entity (Kafka's
        version 2 notification): every broker's watch reloads that entity. Its path."""
        return await self._create(self.paths.config_change_prefix, encode_config_change(entity_path),
                                  sequence=True, makepath=True)

    async def config_changes(self, names: list[str]) -> list[tuple[str, str | None, int]]:
        """(name, entity path or None when unreadable, creation time in ms) of the change
        notifications ``names`` that still exist, in the order given."""
        paths = [f"{self.paths.config_changes}/{n}" for n in names]
        out = []
        for name, got in zip(names, await self._get_many(paths)):
            if got is None:
                continue
            try:
                entity = decode_config_change(got[0])
            except ValueError as e:
                log.error("ignoring change notification %s: %s", name, e)
                entity = None
            out.append((name, entity, got[1].ctime))
        return out

    async def delete_config_changes(self, names: Iterable[str]) -> None:
        await self.delete_isr_change_notifications(f"{self.paths.config_changes}/{n}" for n in names)

    # ------------------------------------------------------------------ partition state

    async def get_partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        """(leader and ISR, znode version) or None if the partition has no state yet;
        ValueError naming the znode if its data does not decode."""
        path = self.paths.partition_state(topic, partition)
        got = await self._get(path)
        return None if got is None else (_decoded_state(path, got[0]), got[1].version)

    async def get_partition_states(self, topic: str) -> dict[int, tuple[LeaderAndIsr, int]]:
        """Every state of ``topic``'s partitions (as ``get_partition_state``)."""
        names = await self._children(self.paths.partitions(topic)) or []
        partitions = sorted(int(n) for n in names if n.isdigit())
        paths = [self.paths.partition_state(topic, p) for p in partitions]
        got = await self._get_many(paths)
        return {p: (_decoded_state(path, g[0]), g[1].version)
                for p, path, g in zip(partitions, paths, got) if g is not None}

    async def create_partition_state(self, topic: str, partition: int, leader_and_isr: LeaderAndIsr,
                                     expected_controller_epoch_version: int) -> int:
        """Create the state znode, fenced by ``/controller_epoch``'s version; returns its version
        (0). ZkNodeExistsError if it exists, ZkNoNodeError if the topic does not."""
        await self._create_if_missing(self.paths.partitions(topic))
        await self._create_if_missing(self.paths.partition(topic, partition))
        path = self.paths.partition_state(topic, partition)
        await self._fenced(f"create {path}", expected_controller_epoch_version,
                           ("create", path, encode_partition_state(leader_and_isr)))
        return 0

    async def update_partition_state(self, topic: str, partition: int, leader_and_isr: LeaderAndIsr,
                                     expected_version: int, controller_epoch_zk_version: int | None = None) -> int:
        """Check-and-set the state; returns the new znode version.

        ZkVersionConflict if ``expected_version`` is stale (someone else wrote since our read:
        re-read and decide again). With ``controller_epoch_zk_version`` (controller writes) the
        write is fenced: ControllerMovedError if another controller was elected since.
        """
        path = self.paths.partition_state(topic, partition)
        data = encode_partition_state(leader_and_isr)
        if controller_epoch_zk_version is None:
            return await self._set(path, data, expected_version)
        results = await self._fenced(f"update {path}", controller_epoch_zk_version,
                                     ("set_data", path, data, expected_version))
        return results[1].version

    async def write_leader_isr(self, topic: str, partition: int, state: LeaderAndIsr, expected_version: int) -> int:
        """A leader's ISR change: check-and-set the state; the new znode version (the caller
        then notifies the controller, ``notify_isr_change``). A write ZooKeeper applied but
        whose answer was lost (a timeout, a dropped connection; a retry then conflicts with
        it) counts as written when the state read back is ``state`` (Kafka's
        checkLeaderAndIsrZkData): else the leader would keep the old version, conflict with
        every later write, and wait for a LeaderAndIsr from a controller that was never
        notified. ZkVersionConflict when someone else wrote."""
        try:
            return await self.update_partition_state(topic, partition, state, expected_version)
        except (ZkTimeoutError, ZkConnectionError, ZkVersionConflict):
            got = await self.until_answered(functools.partial(self.get_partition_state, topic, partition))
            if got is None or got[0] != state:
                raise
            return got[1]

    async def _fenced(self, what: str, controller_epoch_zk_version: int, *ops: tuple) -> list:
        """``ops`` in one transaction after a check of ``/controller_epoch``'s version (their
        results follow the check's, from index 1)."""
        try:
            return await self._transaction(what, [
                ("check", self.paths.controller_epoch, controller_epoch_zk_version), *ops])
        except ZkError as exc:
            if exc.op_index == 0:
                raise ControllerMovedError(f"{what}: the controller epoch moved on "
                                           f"(expected znode version {controller_epoch_zk_version})") from exc
            raise

    # ------------------------------------------------------------------ ISR change notifications

    async def notify_isr_change(self, partitions: list[tuple[str, int]]) -> str:
        """Tell the controller these partitions' ISR changed (a sequential znode); its path."""
        return await self._create(self.paths.isr_change_prefix, encode_isr_change(partitions), sequence=True)

    async def isr_change_notifications(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """Pending notifications, oldest first: (path, [(topic, partition), ...]). One that
        cannot be decoded is logged, deleted and skipped."""
        return await self._notifications(self.paths.isr_change_notification, decode_isr_change)

    # ------------------------------------------------------------------ replica damage notifications

    async def notify_replica_damage(self, broker_id: int, broker_epoch: int,
                                    partitions: list[tuple[str, int]], offline: bool = False) -> str:
        """Tell the controller these replicas on ``broker_id`` hold damaged batches (with
        ``offline``: are in a log dir that failed); its path."""
        return await self._create(self.paths.replica_damage_prefix,
                                  encode_replica_damage(broker_id, broker_epoch, partitions, offline), sequence=True)

    async def replica_damage_notifications(self) -> list[tuple[str, ReplicaReport]]:
        """Pending reports, oldest first: (path, report). One that cannot be decoded is
        logged, deleted and skipped."""
        return await self._notifications(self.paths.replica_damage_notification, decode_replica_damage)

    async def _notifications(self, parent: str, decode: Callable[[bytes], T]) -> list[tuple[str, T]]:
        """The notifications under ``parent``, oldest first: (path, decoded data). One that
        cannot be decoded is logged, deleted and skipped: left in place, it would fail every
        controller that reads it, each failover in turn."""
        names = await self._children(parent) or []  # sorted: sequence numbers, oldest first
        paths = [f"{parent}/{n}" for n in names]
        out, bad = [], []
        for path, got in zip(paths, await self._get_many(paths)):
            if got is None:
                continue
            try:
                out.append((path, decode(got[0])))
            except ValueError as e:
                log.error("%s: %s; deleted", path, e)
                bad.append(path)
        if bad:
            await self.delete_isr_change_notifications(bad)
        return out

    async def delete_isr_change_notifications(self, paths: Iterable[str],
                                              controller_epoch_zk_version: int | None = None) -> None:
        """Delete handled notifications (ISR changes, replica damage reports); one already
        gone is skipped. With ``controller_epoch_zk_version`` (the controller's deletions)
        fenced as its other writes: a deposed controller must leave the notifications it
        handled to its successor, which has not seen them (ControllerMovedError)."""
        paths = list(paths)
        if controller_epoch_zk_version is not None:
            await self._fenced_deletes(f"delete {len(paths)} notifications", controller_epoch_zk_version, paths)
            return

        def run(paths: list[str]) -> None:
            for result in [self._kz.delete_async(p) for p in paths]:
                try:
                    result.get()
                except NoNodeError:
                    pass
        await self._call(f"delete {len(paths)} notifications", run, paths)

    async def _fenced_deletes(self, what: str, controller_epoch_zk_version: int, paths: list[str]) -> None:
        """Delete ``paths`` in order, fenced (``_fenced``), in transactions of at most
        DELETES_PER_TRANSACTION; a path already gone is skipped."""
        for start in range(0, len(paths), DELETES_PER_TRANSACTION):
            chunk = paths[start:start + DELETES_PER_TRANSACTION]
            while chunk:  # a transaction fails whole on a path already gone: without it, again
                try:
                    await self._fenced(what, controller_epoch_zk_version, *(("delete", p) for p in chunk))
                    break
                except ZkNoNodeError as exc:
                    del chunk[exc.op_index - 1]

    # ------------------------------------------------------------------ producer ids

    async def allocate_producer_id_block(self, broker_id: int, size: int = 1000) -> tuple[int, int]:
        """Claim the next ``size`` producer ids (inclusive bounds), check-and-set on
        ``/latest_producer_id_block`` so two brokers never get overlapping blocks."""
        path = self.paths.latest_producer_id_block
        while True:
            got = await self._get(path)
            previous: ProducerIdBlock | None = decode_producer_id_block(got[0]) if got and got[0] else None
            block = next_producer_id_block(previous, broker_id, size)
            try:
                if got is None:
                    await self._create(path, encode_producer_id_block(block))
                else:
                    await self._set(path, encode_producer_id_block(block), got[1].version)
                return block.first, block.last
            except (ZkNodeExistsError, ZkVersionConflict):
                continue    # another broker got a block first: take the next one

    # ------------------------------------------------------------------ znode ACLs (zookeeper.set.acl)

    async def get_znode_acl(self, path: str) -> frozenset[ZkAcl] | None:
        """The ACL of ``path`` as ZooKeeper holds it; None when the znode does not exist."""
        try:
            acl, _ = await self._call(f"get_acls {path}", self._kz.get_acls, path)
        except ZkNoNodeError:
            return None
        return _zk_acl(acl)

    async def secure_containers(self) -> list[str]:
        """Give the chroot and the containers (``ZkPaths.container_paths``) this client's ACL
        where they exist with a more open one (created before ``zookeeper.set.acl`` was on),
        so that no one else can add topics, partitions or brokers; returns the paths changed.
        The znodes below them keep their ACLs: that is the security migration's work
        (``set_acls_recursively``). ZkNoAuthError if they belong to another identity."""
        changed = []
        for path in self.paths.container_paths():
            current, wanted = await self.get_znode_acl(path), self.paths.znode_acl(path, self.owner)
            if current is not None and more_open_than(current, wanted):
                await self._call(f"set_acls {path}", self._kz.set_acls, path, _kazoo_acl(wanted))
                changed.append(path)
        if changed:
            log.warning("zookeeper.set.acl: secured %d open containers (%s); the znodes below them keep "
                        "their ACLs until `tidelog zookeeper-security-migration` runs", len(changed), ", ".join(changed))
        return changed

    async def set_acls_recursively(self, batch_size: int = 500) -> tuple[int, int]:
        """Kafka's zookeeper-security-migration: give the chroot and every znode of the
        cluster's top-level paths (``ZkPaths.secure_root_paths``, recursively) the ACL this
        client creates it with: secured with ``set_acl``, open to all without. Returns
        (znodes found, znodes changed). Top-down, ``batch_size`` znodes at a time, their
        reads and writes pipelined; a znode deleted meanwhile is skipped, one created
        meanwhile gets its creator's ACL. ZkNoAuthError names a znode this identity may not
        change. Running it again changes nothing."""
        found = changed = 0
        if self.paths.chroot:   # the chroot itself, not what else may live under it
            _, found, changed = await self._call("set the ACL of the chroot", self._set_acls_batch,
                                                 [self.paths.chroot])
        queue = list(self.paths.secure_root_paths())
        while queue:
            batch, queue = queue[:batch_size], queue[batch_size:]
            children, n_found, n_changed = await self._call(f"set the ACLs of {len(batch)} znodes",
                                                            self._set_acls_batch, batch)
            queue += children
            found, changed = found + n_found, changed + n_changed
        return found, changed

    def _set_acls_batch(self, paths: list[str]) -> tuple[list[str], int, int]:
        """In a worker thread: (children of ``paths``, how many exist, how many were changed)."""
        kz = self._kz
        reads = [(p, kz.get_acls_async(p), kz.get_children_async(p)) for p in paths]
        children, found, writes = [], 0, []
        for path, acl_result, children_result in reads:
            try:
                current, names = _zk_acl(acl_result.get()[0]), children_result.get()
            except NoNodeError:
                continue
            except NoAuthError as e:
                raise NoAuthError(f"reading {path}") from e
            found += 1
            children += [f"{path}/{name}" for name in names]
            wanted = self.paths.znode_acl(path, self.owner)
            if current != frozenset(wanted):
                writes.append((path, kz.set_acls_async(path, _kazoo_acl(wanted))))
        changed = 0
        for path, result in writes:
            try:
                result.get()
                changed += 1
            except NoNodeError:
                pass
            except NoAuthError as e:
                raise NoAuthError(f"setting the ACL of {path}") from e
        return children, found, changed

    # ------------------------------------------------------------------ ACLs

    async def ensure_acl_paths(self) -> None:
        """Kafka's ACL containers (``/kafka-acl``, ``/kafka-acl-extended/prefixed`` and their
        change trees), created by the authorizer before it watches them."""
        for path in self.paths.acl_paths():
            await self._ensure_path(path)

    async def acl_resources(self) -> list[tuple[ResourceType, str, ResourcePatternType]]:
        """Every pattern that has an ACL znode. Resource types this broker does not know
        (Kafka's DelegationToken, User) are skipped with a warning."""
        out = []
        for pattern_type in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED):
            for type_name in await self._children(self.paths.acl_root(pattern_type)) or []:
                try:
                    rtype = parse_enum(ResourceType, type_name, "resource type")
                except AclError:
                    rtype = None
                if rtype is None or rtype.value < 2:
                    log.warning("ignoring ACLs of unknown resource type %r", type_name)
                    continue
                for name in await self._children(self.paths.acl_type(pattern_type, rtype)) or []:
                    out.append((rtype, name, pattern_type))
        return out

    async def get_acls(self, resource_type: ResourceType, name: str,
                       pattern_type: ResourcePatternType) -> tuple[frozenset[AclEntry], int] | None:
        """(entries, znode version) of one pattern, None when it has no znode."""
        path = self.paths.acl(resource_type, name, pattern_type)
        got = await self._get(path)
        return None if got is None else (decode_acls(got[0], f"ACL {path}"), got[1].version)

    async def update_acls(self, resource_type: ResourceType, name: str, pattern_type: ResourcePatternType,
                          change: Callable[[frozenset[AclEntry]], frozenset[AclEntry]],
                          max_attempts: int = 10) -> tuple[frozenset[AclEntry], frozenset[AclEntry]]:
        """Apply ``change`` (old entries -> new entries, pure) to one pattern's znode with
        check-and-set, reading again and re-applying when another writer got there first
        (Kafka's ``updateResourceAcls``); an empty result deletes the znode. A change
        notification follows every write that changed something. Returns (old, new)."""
        path = self.paths.acl(resource_type, name, pattern_type)
        for attempt in range(max_attempts):
            got = await self.get_acls(resource_type, name, pattern_type)
            old, version = (frozenset(), None) if got is None else got
            new = frozenset(change(old))
            if new == old:
                return old, new
            try:
                if version is None:
                    await self._create(path, encode_acls(new), makepath=True)
                elif not new:
                    await self._call(f"delete {path}", self._kz.delete, path, version=version)
                else:
                    await self._set(path, encode_acls(new), version)
            except (ZkNodeExistsError, ZkVersionConflict, ZkNoNodeError):
                await trio.sleep(0.01 * (attempt + 1))  # another writer: read again
                continue
            await self._create(self.paths.acl_change_prefix(pattern_type),
                               encode_acl_change(resource_type, name, pattern_type), sequence=True, makepath=True)
            return old, new
        raise ZkError(f"could not update {path}: it kept changing ({max_attempts} attempts)")

    async def acl_change_notifications(self, pattern_type: ResourcePatternType, names: Iterable[str]
                                       ) -> list[tuple[str, tuple[ResourceType, str, ResourcePatternType] | None, int]]:
        """(child name, pattern it names or None when malformed, creation time in ms) of the
        given notifications that still exist, read together."""
        root = self.paths.acl_changes(pattern_type)
        names = list(names)
        got = await self._get_many([f"{root}/{n}" for n in names])
        out = []
        for n, g in zip(names, got):
            if g is None:
                continue
            try:
                pattern = decode_acl_change(g[0], pattern_type)
            except ValueError as e:
                log.warning("ignoring %s/%s: %s", root, n, e)
                pattern = None
            out.append((n, pattern, g[1].ctime))
        return out

    async def delete_acl_change_notifications(self, pattern_type: ResourcePatternType, names: Iterable[str]) -> None:
        root = self.paths.acl_changes(pattern_type)

        def run(paths: list[str]) -> None:
            for result in [self._kz.delete_async(p) for p in paths]:
                try:
                    result.get()
                except NoNodeError:
                    pass
        paths = [f"{root}/{n}" for n in names]
        if paths:
            await self._call(f"delete {len(paths)} ACL change notifications", run, paths)

