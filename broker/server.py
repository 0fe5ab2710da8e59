"""The broker process: the root nursery that wires storage, ZooKeeper, replication,
the controller candidacy and the listener together.

Start-up order: lock the log dirs (a dir another broker process holds refuses the start
before anything in it is read: broker/log/manager.py), load the logs (recovering them after
an unclean shutdown), connect to ZooKeeper and agree on the cluster id, open the listener,
start the replica manager, register the broker (its ephemeral znode; the znode's creation id
is the *broker epoch*), then run for controller. The controller learns of the broker through
its watch and sends it its partitions (LeaderAndIsr) and the cluster metadata
(UpdateMetadata); the broker is *ready* once it has received metadata.

Shutdown (SIGTERM): a controlled shutdown first asks the controller to move every
leadership away from this broker (retrying a few times), then stops the listener and the
fetchers, flushes every log, writes the checkpoints and the clean-shutdown marker, and
closes the ZooKeeper session. A broker killed instead recovers its logs on the next start.

Compacted topics are cleaned by ``log.cleaner.threads`` cleaner tasks (default 1): each picks
the dirtiest compacted log, runs the cleaning's heavy steps in a worker thread and swaps the
cleaned segments in on the event loop (broker/log/cleaner.py). On shutdown a cleaning in
progress is aborted and its thread waited for before the logs are closed.

If the ZooKeeper session is lost (and a new one established), the broker registers again
with a new broker epoch; the controller treats that as a restart.

A log dir that fails is taken offline with its partitions (broker/replication/
replica_manager.py). When every log dir has failed, the broker has nothing left to serve and
stops by itself (``_every_log_dir_failed``): Kafka halts the process, which leaves its
registration in ZooKeeper until the session times out, its partitions without a working
leader meanwhile; this broker stops its tasks and closes its session at once, so the
controller elects new leaders right away. It writes nothing to its failed dirs (no
checkpoint, no clean-shutdown marker) and the process exits with status 1.

Broker-to-broker requests are checked against ZooKeeper (broker/apis.py): the broker watches
``/controller`` and ``/brokers/ids`` and keeps what it reads in ``metadata.registry``, the
controller's id and epoch and every broker's epoch; its fetchers send its own broker epoch.

With ``authorizer.class.name`` set, the ACLs are loaded from ZooKeeper (and their change
notifications followed) before any listener opens (broker/security/authorizer.py).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterable

import trio

from tidelog.broker.apis import Apis
from tidelog.broker.channel import BrokerChannel, BrokerUnreachable
from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.groups.group_coordinator import CoordinatorConfig, GroupCoordinator
from tidelog.broker.health import Readiness, broker_readiness
from tidelog.broker.log.cleaner import CleanerConfig, LogCleaner, cleaning_steps
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.log.segment import set_max_open_segment_files
from tidelog.broker.metadata_cache import MetadataCache, ZkRegistry
from tidelog.broker.network import NetworkStats, SocketServer
from tidelog.broker.producer_ids import ProducerIdManager
from tidelog.broker.replication.fetcher import RemoteLeaderEndpoint
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.security.authorizer import Authorizer, ZkAclStore
from tidelog.broker.security.entity_configs import EntityConfigStore
from tidelog.broker.security.inter_broker import broker_principals, inter_broker_security
from tidelog.broker.security.listeners import Listener, ListenerSecurity
from tidelog.broker.security.quotas import ClientQuotas, QuotaEnforcer
from tidelog.broker.security.tls import server_context
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, ZkError
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.protocol import placement
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE, StorageError, TidelogError
from tidelog.protocol.messages import ControlledShutdownRequest
from tidelog.protocol.throttles import FOLLOWER_RATE, LEADER_RATE
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.broker")

# how soon after a roll the closed segment is fsynced and the recovery point moved past it
# (Kafka schedules that flush at the roll; a round here fsyncs every log rolled since the last)
ROLLED_FLUSH_INTERVAL_S = 1.0


class BrokerServer:
    def __init__(self, config: BrokerConfig):
        self.config = config
        self.broker_id = config.broker_id
        self.log_defaults: LogConfig = config.log_config()
        self.topic_overrides: dict[str, dict[str, str]] = {}
        set_max_open_segment_files(config.log_max_open_segment_files)
        self.log_manager = LogManager(config.log_dirs, self.log_defaults, broker_id=self.broker_id,
                                      producer_id_expiration_ms=config.producer_id_expiration_ms)
        self.zk = ZkClient(config.zookeeper_connect, chroot=config.zookeeper_chroot,
                           session_timeout_ms=config.zookeeper_session_timeout_ms,
                           connection_timeout_ms=config.zookeeper_connection_timeout_ms,
                           auth=config.zookeeper_credentials, set_acl=config.zookeeper_set_acl)
        self.metadata = MetadataCache(self.broker_id, ZkRegistry(
            self.zk.current_controller, self.zk.broker_epochs,
            reread_timeout_s=config.controller_socket_timeout_ms / 1000 + 5))  # see ZkRegistry
        self.controller = Controller(ControllerConfig.from_broker_config(config), self.zk)
        self.replica_manager = ReplicaManager(
            ReplicaConfig.from_broker_config(config), self.log_manager, self.topic_log_config,
            self._endpoint_for, self._write_isr, damage_reporter=self._report_damage)
        self.producer_ids = ProducerIdManager(
            lambda: self.zk.allocate_producer_id_block(self.broker_id, config.producer_id_block_size))
        self.group_coordinator = GroupCoordinator(
            CoordinatorConfig.from_broker_config(config), self.replica_manager, self.metadata,
            create_topic=self._create_internal_topic, list_offsets=self._list_offsets_at)
        self.replica_manager.leadership_listeners.append(self.group_coordinator.on_leadership_change)
        self._coordinator_channels: dict[int, BrokerChannel] = {}
        # authorization: super.users and this broker's own inter-broker principal are brokers (and
        # super users); the ACLs are loaded from ZooKeeper before the listeners open
        self.broker_principals = broker_principals(config)
        self.authorizer = Authorizer(self.broker_principals, config.allow_everyone_if_no_acl_found) \
            if config.authorizer_class_name else None
        self.acl_store = ZkAclStore(self.zk, self.authorizer) if self.authorizer is not None else None
        self.apis = Apis(config, self.replica_manager, self.metadata, broker=self, controller=self.controller,
                         group_coordinator=self.group_coordinator, producer_ids=self.producer_ids,
                         authorizer=self.authorizer, acl_store=self.acl_store,
                         broker_principals=self.broker_principals)
        # None with log.cleaner.enable=false: nothing cleans, and the metrics leave the cleaner
        # families out rather than show a cleaner that never ran
        self.log_cleaner: LogCleaner | None = LogCleaner(self.log_manager, CleanerConfig.from_broker_config(config)) \
            if config.log_cleaner_enable else None
        # user and client-id configs (SCRAM credentials, quotas) and the quotas' enforcement
        self.entity_configs = EntityConfigStore(self.zk)
        rm, store = self.replica_manager, self.entity_configs  # the throttles follow the dynamic configs
        rm.leader_quota.rate_of = lambda: store.broker_int(self.broker_id, LEADER_RATE)
        rm.follower_quota.rate_of = lambda: store.broker_int(self.broker_id, FOLLOWER_RATE)
        self.quotas = ClientQuotas.from_config(self.entity_configs, config)
        self.quota_enforcer = QuotaEnforcer(self.quotas)
        self.broker_epoch = -1
        self.port: int | None = None  # the inter-broker listener's
        self.ports: dict[str, int] = {}  # by listener name
        self.inter_broker_security = inter_broker_security(config)  # how it connects to other brokers
        self.ready = trio.Event()
        self.logs_loaded = False
        self.metrics = None  # broker.metrics.BrokerMetrics when metrics.port >= 0
        self.metrics_port: int | None = None
        self._leader_channels: dict[tuple[int, int], BrokerChannel] = {}  # by (leader id, fetcher id)
        self._socket_servers: list[SocketServer] = []
        self._cancel: trio.CancelScope | None = None
        self._services: trio.Nursery | None = None  # the nursery of the broker's tasks
        self.stopped_because: str | None = None  # why the broker stopped by itself
        self.replica_manager.on_all_dirs_offline = self._every_log_dir_failed

    # -- run -----------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # a startup that raises has let its locks go and left the dirs as it found them; and
        # a log manager that did not start writes nothing at shutdown (the dirs may be
        # another broker's), whatever calls it. A stop during log recovery (minutes, after a
        # crash) must not wait for it: the loading thread is left behind, no log is closed and
        # no clean-shutdown marker written, as if the process had been killed; the next start
        # recovers again. The process exits soon after.
        await trio.to_thread.run_sync(self.log_manager.startup, abandon_on_cancel=True)
        self.logs_loaded = True
        try:
            async with self.zk:
                await self._join_cluster()
                async with trio.open_nursery() as nursery:
                    self._cancel, self._services = nursery.cancel_scope, nursery
                    await self._start_services(nursery)
                    task_status.started(self.port)
                    await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self._close_channels()
            self.group_coordinator.shutdown()
            self.replica_manager.shutdown()
            self.log_manager.shutdown()
            logger.info("broker %d stopped", self.broker_id)

    async def _join_cluster(self) -> None:
        cluster_id = await self.zk.until_answered(
            functools.partial(self.zk.get_or_create_cluster_id, uuid.uuid4().hex[:22]))
        self.controller.cluster_id = cluster_id
        self.metadata.cluster_id = cluster_id
        self.log_manager.join_cluster(cluster_id)

    async def _start_services(self, nursery: trio.Nursery) -> None:
        host, _ = self.config.listener
        if self.acl_store is not None:  # no request is served before the ACLs are loaded
            await nursery.start(self.acl_store.run)
        await nursery.start(self.entity_configs.run)  # credentials and quotas before any listener
        await nursery.start(self.quota_enforcer.run)
        handler = self.quota_enforcer.instrument(self.apis.handle)
        if self.config.metrics_port >= 0:  # Prometheus endpoint and per-request hook (broker/metrics.py)
            from tidelog.broker.metrics import BrokerMetrics

            self.metrics = BrokerMetrics(self)
            handler = self.metrics.instrument(handler)
            self.metrics_port = await nursery.start(self.metrics.run, host, self.config.metrics_port)
        for listener in self.config.listener_list:
            server = SocketServer.from_config(self.config, handler, self._listener_security(listener),
                                              (listener.bind.host, listener.bind.port), listener.wire)
            self.ports[listener.name] = await nursery.start(server.run)
            self._socket_servers.append(server)
        self.port = self.ports[self.config.inter_broker_listener.name]
        await nursery.start(self.replica_manager.run)
        await nursery.start(self.group_coordinator.run)
        await nursery.start(self._watch_registry)
        await self._register()
        await nursery.start(self.controller.run)
        nursery.start_soon(self._watch_session)
        nursery.start_soon(self._periodic_work)
        nursery.start_soon(self._flush_rolled_segments)
        if self.config.log_cleaner_enable:
            for _ in range(self.config.log_cleaner_threads):
                nursery.start_soon(self._run_log_cleaner)
        logger.info("broker %d listening on %s:%d (broker epoch %d)", self.broker_id, host, self.port,
                    self.broker_epoch)

    def _listener_security(self, listener: Listener) -> ListenerSecurity:
        config = self.config
        context = None
        if listener.protocol.uses_tls:
            context = server_context(config.ssl_keystore_location, config.ssl_key_password,
                                     config.ssl_truststore_location, config.ssl_client_auth)
        return ListenerSecurity(listener.name, listener.protocol, listener.inter_broker, context,
                                config.sasl_mechanisms,
                                self.entity_configs.scram_credential,
                                usual_iterations=self.entity_configs.usual_iterations,
                                failed_authentication_delay_s=config.connection_failed_authentication_delay_ms / 1000)

    async def _register(self) -> None:
        host, port = self.config.advertised
        endpoints = []
        for listener in self.config.listener_list:
            published = listener.advertised
            endpoints.append(f"{listener.name}://{_host_text(published.host or host)}:"
                             f"{published.port or self.ports[listener.name]}")
        info = BrokerInfo(self.broker_id, host, port or self.port, self.config.broker_rack, endpoints)
        # Waits out a slow or lost ZooKeeper: at start the listeners are up, after a lost
        # session the broker is serving; neither ends over a timeout.
        self.broker_epoch = self.replica_manager.broker_epoch = await self.zk.until_answered(
            functools.partial(self.zk.register_broker, info))

    async def _watch_session(self) -> None:
        lost = False
        async for state, _ in self.zk.session_events:
            if state == "LOST":
                lost = True
                logger.warning("broker %d lost its ZooKeeper session", self.broker_id)
            elif state == "CONNECTED" and lost:
                lost = False
                await self._register()
                logger.info("broker %d registered again (broker epoch %d)", self.broker_id, self.broker_epoch)
                await self._refresh_registry()
                self.entity_configs.request_reload()  # notifications may have expired meanwhile
                if self.acl_store is not None:
                    await self._reload_acls()

    async def _refresh_registry(self) -> None:
        """Read the controller and the broker epochs again after a new session, once this
        broker registered again (the watches report their reads after the reconnect, which
        may come before the registration)."""
        registry = self.metadata.registry
        for refresh in (registry.refresh_controller, registry.refresh_broker_epochs):
            while not await refresh():
                await trio.sleep(1.0)

    async def _reload_acls(self) -> None:
        """Every ACL again after a new session (the notifications missed may have expired)."""
        while True:
            try:
                await self.acl_store.load_all()
                return
            except ZkError as e:
                logger.warning("reloading the ACLs after a new ZooKeeper session failed: %s; retrying", e)
                await trio.sleep(1.0)

    async def _watch_registry(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep ``metadata.registry`` as ZooKeeper holds it: every change of ``/controller``
        (an election, a resignation) or of ``/brokers/ids`` (a registration) reads it again,
        until a read succeeds."""
        registry, paths = self.metadata.registry, self.zk.paths
        watches = ((await self.zk.watch_data(paths.controller), registry.refresh_controller),
                   (await self.zk.watch_children(paths.broker_ids), registry.refresh_broker_epochs))

        async def follow(changes, refresh) -> None:
            async for _ in changes:
                while not await refresh():
                    await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            for changes, refresh in watches:
                nursery.start_soon(follow, changes, refresh)
            task_status.started()

    async def _periodic_work(self) -> None:
        c = self.config
        jobs = [(c.replica_high_watermark_checkpoint_interval_ms, self.log_manager.checkpoint_high_watermarks),
                (c.log_flush_offset_checkpoint_interval_ms, self.log_manager.checkpoint_recovery_points),
                (c.log_flush_offset_checkpoint_interval_ms, self.log_manager.checkpoint_log_start_offsets),
                (c.log_retention_check_interval_ms, self.log_manager.cleanup_logs),
                (c.log_flush_scheduler_interval_ms, self.log_manager.flush_dirty_logs),
                (c.producer_id_expiration_check_interval_ms, self.log_manager.remove_expired_producers)]
        due = {i: trio.current_time() + ms / 1000 for i, (ms, _) in enumerate(jobs)}
        while True:
            i = min(due, key=due.get)
            await trio.sleep_until(due[i])
            ms, job = jobs[i]
            try:
                job()
            except (OSError, StorageError) as e:
                logger.error("periodic %s failed: %s", job.__name__, e)
            due[i] = trio.current_time() + ms / 1000

    async def _flush_rolled_segments(self) -> None:
        """Segments closed by rolls fsynced in a worker thread (an fsync of a closed segment
        can take as long as the disk needs: never on the event loop), then the recovery
        points moved past them. An fsync that fails is the log dir failing (taken offline)."""
        manager = self.log_manager
        while True:
            await trio.sleep(ROLLED_FLUSH_INTERVAL_S)
            for flush in manager.rolled_flushes():
                try:
                    await trio.to_thread.run_sync(flush.run)
                except OSError as e:
                    flush.log.dir_failed(e, "fsyncing the rolled segments of")
                    continue
                flush.log.flushed(flush)

    async def _run_log_cleaner(self) -> None:
        """One log cleaner (Kafka's CleanerThread): clean the filthiest compacted log, its
        heavy work in a worker thread (broker/log/cleaner.py); back off when none is dirty."""
        cleaner = self.log_cleaner
        assert cleaner is not None  # started only with log.cleaner.enable
        while True:
            job = cleaner.grab_filthiest_log()
            if job is None:
                await trio.sleep(self.config.log_cleaner_backoff_ms / 1000)
                continue
            try:
                await self._clean(job)
            except trio.Cancelled:
                cleaner.abandon(job)
                raise
            except Exception as e:  # noqa: BLE001 - the cleaner reports it and skips the log
                cleaner.abandon(job, e)
            else:
                cleaner.done_cleaning(job)
            await trio.sleep(0)

    async def _clean(self, job) -> None:
        steps = cleaning_steps(job)
        result = None
        while True:
            try:
                work = steps.send(result)
            except StopIteration:
                return
            try:
                result = await trio.to_thread.run_sync(job.run_work, work, abandon_on_cancel=True)
            except trio.Cancelled:
                job.abort()  # the thread stops at its next batch; the log is not closed before
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(job.wait_idle, 30.0)
                raise

    def readiness(self) -> Readiness:
        """Logs loaded, registered in ZooKeeper, metadata received (broker/health.py)."""
        return broker_readiness(logs_loaded=self.logs_loaded, zookeeper_connected=bool(self.zk.connected),
                                broker_epoch=self.broker_epoch, has_metadata=self.ready.is_set())

    def socket_stats(self) -> NetworkStats | None:
        """The socket servers' counters, summed over the listeners; None before they start."""
        return NetworkStats.sum(s.stats() for s in self._socket_servers) if self._socket_servers else None

    # -- shutdown ------------------------------------------------------------------------------

    async def controlled_shutdown(self) -> bool:
        """Ask the controller to move leadership away; True once nothing is left to move."""
        if not self.config.controlled_shutdown_enable:
            return False
        for attempt in range(self.config.controlled_shutdown_max_retries):
            try:
                remaining = await self._request_controlled_shutdown()
                if not remaining:
                    logger.info("controlled shutdown of broker %d succeeded", self.broker_id)
                    return True
                logger.info("controlled shutdown: %d partitions still led here", len(remaining))
            except TidelogError as e:
                logger.info("controlled shutdown attempt %d failed: %s", attempt + 1, e)
            await trio.sleep(self.config.controlled_shutdown_retry_backoff_ms / 1000)
        logger.warning("controlled shutdown of broker %d did not complete; shutting down anyway", self.broker_id)
        return False

    async def _request_controlled_shutdown(self):
        controller_id = await self.zk.get_controller_id()
        if controller_id is None:
            raise TidelogError("no controller is elected")
        req = ControlledShutdownRequest(self.broker_id, self.broker_epoch)
        if controller_id == self.broker_id and self.controller.is_active:
            resp = await self.apis.controlled_shutdown(req)
        else:
            info = (await self.zk.live_brokers()).get(controller_id)
            if info is None:
                raise TidelogError(f"controller {controller_id} is not registered")
            ch = BrokerChannel(controller_id, info.host, info.port, client_id=f"broker-{self.broker_id}",
                               security=self.inter_broker_security)
            try:
                resp = await ch.request(ApiKey.CONTROLLED_SHUTDOWN, req, 30)
            finally:
                await ch.aclose()
        if resp.error_code != NONE.code:
            raise TidelogError(f"controller answered error {resp.error_code}")
        return resp.remaining_partitions

    async def shutdown(self) -> None:
        """Controlled shutdown, then stop (the ``run`` task finishes and cleans up)."""
        with trio.move_on_after(self.config.controlled_shutdown_max_retries *
                                (self.config.controlled_shutdown_retry_backoff_ms / 1000 + 30)):
            await self.controlled_shutdown()
        self.replica_manager.shutdown()  # stop fetching: leaders must not count us in their ISRs
        if self._cancel is not None:
            self._cancel.cancel()

    def _every_log_dir_failed(self) -> None:
        """No log dir is left: stop, without a controlled shutdown (nothing is led or followed
        here any more); closing the ZooKeeper session has the controller elect elsewhere."""
        if self.stopped_because is not None:
            return
        self.stopped_because = "every log dir has failed: " + "; ".join(self.log_manager.offline_dirs.values())
        logger.critical("broker %d is stopping: %s. Fix the disks (or change log.dirs) and start it again",
                        self.broker_id, self.stopped_because)
        self.replica_manager.shutdown()
        if self._cancel is not None:
            self._cancel.cancel()

    async def _close_channels(self) -> None:
        for ch in [*self._leader_channels.values(), *self._coordinator_channels.values()]:
            await ch.aclose()

    # -- hooks used by the replica manager and the APIs ----------------------------------------

    def topic_log_config(self, topic: str) -> LogConfig:
        return self.log_defaults.with_overrides(self.topic_overrides.get(topic, {}))

    def update_topic_overrides(self, configs: dict[str, dict[str, str]]) -> None:
        for topic, overrides in configs.items():
            if self.topic_overrides.get(topic) == overrides:
                continue
            self.topic_overrides[topic] = dict(overrides)
            cfg = self.topic_log_config(topic)
            for tp in self.log_manager.logs:
                if tp.topic == topic:
                    self.log_manager.update_config(tp, cfg)

    def metadata_updated(self, deleted: Iterable[str] = ()) -> None:
        """After an UpdateMetadata: ready once this broker is in the metadata; the per-topic
        request series of the topics it deleted dropped."""
        if not self.ready.is_set() and self.broker_id in self.metadata.brokers:
            self.ready.set()
        if deleted and self.metrics is not None:
            self.metrics.requests.forget_topics(deleted)

    def _endpoint_for(self, leader_id: int, fetcher_id: int = 0) -> RemoteLeaderEndpoint:
        """Fetcher ``fetcher_id``'s endpoint on ``leader_id``: a connection of its own, so the
        long polls of a source broker's fetchers do not queue behind one another."""
        ch = self._leader_channels.get((leader_id, fetcher_id))
        broker = self.metadata.brokers.get(leader_id)
        host, port = (broker.host, broker.port) if broker else ("127.0.0.1", 0)
        if ch is None:
            ch = self._leader_channels[leader_id, fetcher_id] = BrokerChannel(
                leader_id, host, port, client_id=f"replica-fetcher-{self.broker_id}-{fetcher_id}",
                security=self.inter_broker_security)
        elif broker is not None:
            ch.retarget(host, port)
        return _RetargetingEndpoint(self, leader_id, ch, self.config.replica_socket_timeout_ms / 1000)

    async def _write_isr(self, tp: TopicPartition, isr: list[int], leader_epoch: int,
                         controller_epoch: int, zk_version: int) -> int:
        state = LeaderAndIsr(self.broker_id, leader_epoch, isr, controller_epoch)
        version = await self.zk.write_leader_isr(tp.topic, tp.partition, state, zk_version)
        # written: the new ISR takes effect now; the controller is told aside, so a ZooKeeper
        # that stops answering here holds neither this partition nor the next ones' changes
        self._services.start_soon(self._notify_isr_change, tp)
        return version

    async def _notify_isr_change(self, tp: TopicPartition) -> None:
        try:
            await self.zk.until_answered(functools.partial(self.zk.notify_isr_change, [(tp.topic, tp.partition)]))
        except Exception as e:  # never out of the broker's nursery
            logger.warning("%s: the controller was not told of its ISR change: %s", tp, e,
                           exc_info=not isinstance(e, ZkError))

    async def _report_damage(self, tps: list[TopicPartition], offline: bool = False) -> None:
        await self.zk.notify_replica_damage(self.broker_id, self.replica_manager.broker_epoch,
                                            [(tp.topic, tp.partition) for tp in tps], offline)

    def _racks(self, live: list[int]) -> dict[int, str] | None:
        """The racks of ``live`` as the metadata knows them, for placing a topic's replicas."""
        return placement.racks_when_complete({b: self.metadata.brokers[b].rack for b in live})

    async def auto_create_topics(self, names: list[str]) -> None:
        live = sorted(self.metadata.brokers)
        rf = min(self.config.default_replication_factor, len(live))
        for name in names:
            try:
                assignment = placement.assign_replicas(live, self.config.num_partitions, rf, racks=self._racks(live))
                await self.zk.create_topic(name, assignment, {})
                logger.info("auto-created topic %s", name)
                if rf < self.config.min_insync_replicas:
                    logger.warning("auto-created topic %s has replication factor %d, below min.insync.replicas %d: "
                                   "acks=all produces to it will fail with NOT_ENOUGH_REPLICAS (acks=1 works; "
                                   "raise default.replication.factor or lower the topic's min.insync.replicas)",
                                   name, rf, self.config.min_insync_replicas)
            except Exception as e:  # another broker created it first, or the name is invalid
                logger.info("auto-creation of topic %s skipped: %s", name, e)


    async def _create_internal_topic(self, name: str, partitions: int, replication_factor: int,
                                     configs: dict[str, str]) -> None:
        """For the group coordinator: create ``__consumer_offsets`` in ZooKeeper (the controller
        picks it up from its topics watch, as for any topic)."""
        live = sorted(self.metadata.brokers)
        assignment = placement.assign_replicas(live, partitions, replication_factor, racks=self._racks(live))
        await self.zk.create_topic(name, assignment, configs)

    async def _list_offsets_at(self, broker_id: int, request):
        """For the group coordinator's lag gauge: ListOffsets at another broker."""
        broker = self.metadata.brokers.get(broker_id)
        if broker is None:
            raise BrokerUnreachable(f"broker {broker_id} is not in the metadata")
        ch = self._coordinator_channels.get(broker_id)
        if ch is None:
            ch = self._coordinator_channels[broker_id] = BrokerChannel(
                broker_id, broker.host, broker.port, client_id=f"group-coordinator-{self.broker_id}",
                security=self.inter_broker_security)
        ch.retarget(broker.host, broker.port)
        return await ch.request(ApiKey.LIST_OFFSETS, request, self.config.request_timeout_ms / 1000)


class _RetargetingEndpoint(RemoteLeaderEndpoint):
    """A leader endpoint that follows the leader's advertised address in the metadata."""

    def __init__(self, server: BrokerServer, leader_id: int, channel: BrokerChannel, timeout_s: float):
        super().__init__(channel, timeout_s)
        self.server = server
        self.leader_id = leader_id

    async def fetch(self, request):
        self._retarget()
        return await super().fetch(request)

    async def offsets_for_leader_epoch(self, request):
        self._retarget()
        return await super().offsets_for_leader_epoch(request)

    def _retarget(self) -> None:
        broker = self.server.metadata.brokers.get(self.leader_id)
        if broker is not None:
            self.channel.retarget(broker.host, broker.port)
        elif self.channel.port == 0:
            raise BrokerUnreachable(f"leader {self.leader_id} is not in the metadata yet")


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host
