"""A local cluster of real processes: one ZooKeeper and N brokers (``tidelog dev up``).

Everything lives under one directory: ``zookeeper/``, and per broker ``broker-<id>.toml``
(its config, written once and reused, so a broker can also be stopped and started by hand
with ``tidelog broker --config``), ``broker-<id>/`` (its log dirs) and ``broker-<id>.log``.
A second run over the same directory reuses the data; while one runs, ``dev-up.lock`` there
refuses another (its brokers would share the running ones' configs and dirs), and a ZooKeeper
port in use is refused before anything starts.

Children are started from the main thread with PR_SET_PDEATHSIG, so they die with the
process that started them, even if it is killed. Tests use the same class, on free ports.
The network-partition tests give each broker its own address and a named network namespace
(``ip netns``) that its process enters before it runs (``hosts``, ``netns``).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tidelog.broker.config import parse_listener
from tidelog.broker.health import metadata_request, secure_metadata_request
from tidelog.broker.security.certificates import make_cluster_pki
from tidelog.broker.security.entity_configs import set_scram_password
from tidelog.broker.zookeeper.zkserver import ZooKeeperServer, find_free_port
from tidelog.protocol.messages import MetadataResponse
from tidelog.security import SecurityConfig, read_properties

SECURED = "SASL_SSL"
ADMIN_USER = "admin"
ADMIN_MECHANISM = "SCRAM-SHA-512"

PR_SET_PDEATHSIG = 1
CLONE_NEWNET = 0x40000000


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _enter_netns(name: str) -> None:
    """Move the calling process into the named network namespace (``ip netns add NAME``)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


# what a local cluster changes from the brokers' defaults (its own extra_config wins)
DEV_DEFAULTS: dict[str, object] = {"controlled.shutdown.retry.backoff.ms": 500}

class BrokerProcess:
    def __init__(self, broker_id: int, config_path: Path, log_path: Path, port: int,
                 host: str = "127.0.0.1", netns: str | None = None):
        self.broker_id = broker_id
        self.config_path = config_path
        self.log_path = log_path
        self.port = port
        self.host = host
        self.netns = netns  # a named network namespace the process runs in, or None
        self.env: dict[str, str] = {}  # set in the process's environment at its next start
        self.proc: subprocess.Popen | None = None

    def _preexec(self) -> None:
        _die_with_parent()
        if self.netns is not None:
            _enter_netns(self.netns)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidelog.broker.cli", "broker", "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            preexec_fn=self._preexec, start_new_session=True)
        log.close()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (controlled shutdown) and wait; SIGKILL if it does not stop in time."""
        if not self.running:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


class DevCluster:
    def __init__(self, directory: str | os.PathLike, brokers: int = 3, *, zk_port: int = 2181,
                 base_port: int = 9092, extra_config: dict[str, object] | None = None,
                 zk_host: str = "127.0.0.1", hosts: Mapping[int, str] | None = None,
                 netns: Mapping[int, str] | None = None, security: str | None = None,
                 inter_broker_security: str | None = None, kafka: bool = False):
        """``hosts``: broker id -> the address it listens on and advertises (default
        127.0.0.1); ``netns``: broker id -> the named network namespace it runs in.
        ``security="SASL_SSL"``: a secured cluster (``secure_settings``).
        ``inter_broker_security="SASL_SSL"``: clients keep a PLAINTEXT listener, brokers talk
        to each other on a SASL_SSL listener named BROKER (the fault matrix runs so).
        ``kafka``: every broker also opens a Kafka-protocol listener (``kafka.listeners``, with
        the clients' security protocol); ``kafka_bootstrap`` lists them."""
        self.kafka = kafka
        self.base_port = base_port
        self.dir = Path(directory).absolute()
        self.dir.mkdir(parents=True, exist_ok=True)
        if security not in (None, "PLAINTEXT", SECURED):
            raise ValueError(f"security must be PLAINTEXT or {SECURED}, got {security!r}")
        self.security = security if security == SECURED else None
        if inter_broker_security not in (None, "PLAINTEXT", SECURED):
            raise ValueError(f"inter_broker_security must be PLAINTEXT or {SECURED}, got {inter_broker_security!r}")
        self.inter_broker_security = inter_broker_security if inter_broker_security == SECURED else None
        # ports this cluster picked: a port freed a moment ago can come back from the kernel
        self._picked_ports: set[int] = set()
        # an address of its own (not loopback) is ZooKeeper's alone: its usual port is free there
        zk_port = zk_port or (self._free_port() if zk_host == "127.0.0.1" else 2181)
        self.zookeeper = ZooKeeperServer(self.dir / "zookeeper", port=zk_port, host=zk_host)
        # Kafka's habit for a small cluster: __consumer_offsets is never created with fewer
        # replicas than offsets.topic.replication.factor (3), so fewer brokers set it to their count
        small = {"offsets.topic.replication.factor": brokers} if 0 < brokers < 3 else {}
        # stopped a broker at a time, the last replica of a partition has nobody to hand its
        # leadership to: Kafka's 3 retries 5 s apart would hold each such stop 15 s
        self.extra_config = {**DEV_DEFAULTS, **small, **(extra_config or {})}
        self.hosts = dict(hosts or {})
        self.netns = dict(netns or {})
        if self.security or self.inter_broker_security:
            self.extra_config = {**self._secure_settings(brokers), **self.extra_config}
        self.brokers: dict[int, BrokerProcess] = {}
        for i in range(1, brokers + 1):
            self.brokers[i] = self._broker(i, base_port + i - 1 if base_port else 0)

    def _broker(self, broker_id: int, port: int) -> BrokerProcess:
        config_path = self.dir / f"broker-{broker_id}.toml"
        host = self.hosts.get(broker_id, "127.0.0.1")
        if config_path.exists():
            port = _port_of(config_path) or port
            made = _listener_name_of(config_path)
            if made is not None and made != (self.security or "PLAINTEXT"):
                raise ValueError(f"the cluster in {self.dir} was made with {made} listeners; start it with "
                                 f"--security {made}, or use another --dir for a {self.security or 'PLAINTEXT'} cluster")
        else:
            # a broker in its own namespace has its address to itself: any port is free there
            port = port or (9092 if broker_id in self.netns else self._free_port())
            lines = [f"\"broker.id\" = {broker_id}",
                     f"listeners = \"{self._listeners(broker_id, host, port)}\"",
                     *([f"\"kafka.listeners\" = \"{self.security or 'PLAINTEXT'}://{host}:"
                        f"{self._kafka_port(broker_id, port)}\""] if self.kafka else []),
                     f"\"log.dirs\" = [\"{self.dir / f'broker-{broker_id}' / 'logs'}\"]",
                     f"\"zookeeper.connect\" = \"{self.zookeeper.connect_string}\""]
            lines += [f"\"{k}\" = {_toml(v)}" for k, v in self.extra_config.items()
                      if k != "ssl.keystore.location"]
            if self.security or self.inter_broker_security:
                lines.append(f"\"ssl.keystore.location\" = {_toml(self.dir / 'pki' / f'broker-{broker_id}.pem')}")
            config_path.write_text("\n".join(lines) + "\n")
        return BrokerProcess(broker_id, config_path, self.dir / f"broker-{broker_id}.log", port,
                             host=host, netns=self.netns.get(broker_id))

    def add_broker(self, broker_id: int | None = None, rack: str | None = None, timeout: float = 60.0) -> BrokerProcess:
        """Grow the cluster: write a new broker's config (the next id by default), start it and
        wait until every broker sees it. Its partitions come only from reassignments."""
        broker_id = broker_id if broker_id is not None else max(self.brokers, default=0) + 1
        if broker_id in self.brokers:
            raise ValueError(f"broker {broker_id} is already in the cluster")
        if self.security or self.inter_broker_security:  # a certificate from the cluster's CA
            make_cluster_pki(self.dir / "pki", {broker_id: [self.hosts.get(broker_id, "127.0.0.1"), "localhost"]})
        saved = self.extra_config
        if rack is not None:
            self.extra_config = {**saved, "broker.rack": rack}
        try:
            b = self.brokers[broker_id] = self._broker(broker_id, self.base_port + broker_id - 1 if self.base_port else 0)
        finally:
            self.extra_config = saved
        b.start()
        self.wait_ready(timeout)
        return b

    def _kafka_port(self, broker_id: int, port: int) -> int:
        """Fixed ports put the Kafka listener 100 above the broker's (9092 -> 9192)."""
        if broker_id in self.netns:
            return 9192
        return port + 100 if self.base_port else self._free_port()

    def _free_port(self) -> int:
        """A free port this cluster has not handed out yet (its processes bind them later,
        so the kernel may offer one of them again in the meantime)."""
        for _ in range(100):
            port = find_free_port()
            if port not in self._picked_ports:
                self._picked_ports.add(port)
                return port
        raise RuntimeError("no free port found that this cluster has not picked already")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b.host}:{b.port}" for b in self.brokers.values())

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' Kafka-protocol listeners (``kafka=True``), for Kafka clients."""
        addresses = []
        for b in self.brokers.values():
            line = next((x for x in b.config_path.read_text().splitlines() if x.startswith('"kafka.listeners"')), None)
            if line is None:
                raise ValueError(f"broker {b.broker_id} has no Kafka listener: make the cluster with kafka=True")
            addresses.append(line.split("://", 1)[1].rstrip('"'))
        return ",".join(addresses)

    # -- security ---------------------------------------------------------------------------

    def _listeners(self, broker_id: int, host: str, port: int) -> str:
        if not self.inter_broker_security:
            return f"{self.security or 'PLAINTEXT'}://{host}:{port}"
        # a broker in its own namespace has its address to itself: any port is free there
        broker_port = 9093 if broker_id in self.netns else self._free_port()
        return f"PLAINTEXT://{host}:{port},BROKER://{host}:{broker_port}"

    def _secure_settings(self, brokers: int) -> dict[str, object]:
        """SASL_SSL everywhere: a CA and broker certificates made now (kept for the next
        run), SCRAM-SHA-512 between brokers as the super user ``admin``, whose password is
        made once and written to ``client.properties`` for the tools (owner-readable only)."""
        pki = self.dir / "pki"
        names = {i: [self.hosts.get(i, "127.0.0.1"), "localhost"] for i in range(1, brokers + 1)}
        ca = make_cluster_pki(pki, names)
        props_path = self.dir / "client.properties"
        if props_path.exists():
            password = read_properties(str(props_path))["sasl.password"]
        else:
            password = secrets.token_urlsafe(18)
            fd = os.open(props_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write("# the dev cluster's super user: tidelog ... --command-config <this file>\n"
                        f"security.protocol={SECURED}\nsasl.mechanism={ADMIN_MECHANISM}\n"
                        f"sasl.username={ADMIN_USER}\nsasl.password={password}\nssl.ca.location={ca}\n")
        self.admin_password = password
        self.client_properties = props_path
        jaas = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" ' \
               f'password="{password}";'
        inter = {"listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,BROKER:{SECURED}",
                 "inter.broker.listener.name": "BROKER"} if self.inter_broker_security else {}
        return {**inter, "ssl.truststore.location": str(ca), "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol": ADMIN_MECHANISM, "sasl.jaas.config": jaas,
                "super.users": f"User:{ADMIN_USER}"}

    def client_security(self) -> SecurityConfig | None:
        """How a client of this cluster connects (the super user's credentials when secured)."""
        if not self.security:
            return None
        return SecurityConfig.from_properties(read_properties(str(self.client_properties)))

    def _create_admin(self, timeout: float) -> None:
        """The super user's SCRAM credentials, straight into ZooKeeper (brokers need them to
        talk to each other, and no client can authenticate before they exist). With a ZooKeeper
        identity (zookeeper.digest.*) the tool takes it from a broker's config file."""
        chroot = str(self.extra_config.get("zookeeper.chroot", "/tidelog"))
        zk_auth = (str(next(iter(self.brokers.values())).config_path)
                   if "zookeeper.digest.username" in self.extra_config else None)
        set_scram_password(f"{self.zookeeper.connect_string}{chroot}", ADMIN_USER, self.admin_password,
                           auth_file=zk_auth)

    def metadata(self, broker_id: int, timeout: float = 5.0) -> MetadataResponse:
        """Broker ``broker_id``'s Metadata for every topic, over the cluster's security."""
        b = self.brokers[broker_id]
        security = self.client_security()
        if security is None:
            return metadata(b.port, b.host, timeout)
        return secure_metadata(b.host, b.port, security, timeout)

    def start(self, timeout: float = 60.0) -> None:
        self.zookeeper.start()
        self.zookeeper.wait_serving(timeout)
        if self.security or self.inter_broker_security:
            self._create_admin(timeout)
        for b in self.brokers.values():
            b.start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0, brokers: set[int] | None = None) -> MetadataResponse:
        """Wait until every running broker is in the cluster metadata, seen through each of them."""
        want = brokers or {i for i, b in self.brokers.items() if b.running}
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            for i, b in self.brokers.items():
                if not b.running and i in want:
                    raise RuntimeError(f"broker {i} exited with status {b.proc.returncode if b.proc else None}; "
                                       f"see {b.log_path}")
            try:
                seen = [self.metadata(i) for i in self.brokers if i in want]
                last = seen[-1]
                if all({x.node_id for x in m.brokers} >= want and m.controller_id >= 0 for m in seen):
                    return last
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"brokers {sorted(want)} not ready within {timeout} s (last metadata: {last})")

    def stop(self) -> None:
        for b in self.brokers.values():
            b.stop()
        self.zookeeper.stop()

    def kill(self) -> None:
        for b in self.brokers.values():
            b.kill()
        self.zookeeper.kill()

    def __enter__(self) -> "DevCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.kill() if exc[0] is not None else self.stop()


def metadata(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> MetadataResponse:
    """One blocking Metadata request for every topic (for readiness checks)."""
    return metadata_request(host, port, timeout, all_topics=True, client_id="tidelog-dev")


def secure_metadata(host: str, port: int, security: SecurityConfig, timeout: float = 5.0) -> MetadataResponse:
    """``metadata`` over TLS and SASL (ConnectionError, an OSError, when it cannot ask)."""
    return secure_metadata_request(host, port, security, timeout, all_topics=True, client_id="tidelog-dev")


def _port_of(config_path: Path) -> int | None:
    listener = _listener_of(config_path)
    return listener[2] if listener else None


def _listener_name_of(config_path: Path) -> str | None:
    listener = _listener_of(config_path)
    return listener[0] if listener else None


def _listener_of(config_path: Path) -> tuple[str, str, int] | None:
    import tomllib
    listeners = tomllib.loads(config_path.read_text()).get("listeners", "")
    try:
        return parse_listener(str(listeners))
    except ValueError:
        return None


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _has_kafka_listeners(cluster: DevCluster) -> bool:
    try:
        cluster.kafka_bootstrap
    except ValueError:  # a cluster made before Kafka listeners existed keeps its configuration
        return False
    return True


def run_dev_up(directory: str, brokers: int, zk_port: int, base_port: int, security: str = "PLAINTEXT",
               kafka: bool = True) -> int:
    """``tidelog dev up``: start, print the bootstrap address, wait for Ctrl-C, SIGTERM or
    SIGHUP (a closed terminal: without a handler it would end this process, and
    PR_SET_PDEATHSIG would then SIGKILL every broker), then stop the cluster cleanly. A
    broker that exits meanwhile is reported, and the rest keeps running."""
    try:
        lock = hold_dev_lock(Path(directory))
    except OSError as e:
        print(f"tidelog dev up: {e}", file=sys.stderr)
        return 1
    stop = []
    kept = {sig: signal.signal(sig, lambda *_: stop.append(1)) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _dev_up(directory, brokers, zk_port, base_port, security, kafka, stop)
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
        lock.close()


DEV_LOCK = "dev-up.lock"


def hold_dev_lock(directory: Path):
    """Lock ``<directory>/dev-up.lock`` (flock, released when this process ends, however it
    ends) and write this process's id in it: a second dev up on a running cluster's directory
    would start brokers with the same configs on the same dirs. The open file holds the lock;
    BlockingIOError (an OSError) naming the running dev up when another holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory.absolute() / DEV_LOCK
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pid = f.read().strip() or "unknown"
        f.close()
        raise BlockingIOError(f"the cluster in {directory.absolute()} is already running (tidelog dev up, "
                              f"pid {pid}): stop it first, or use another --dir") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _dev_up(directory: str, brokers: int, zk_port: int, base_port: int, security: str, kafka: bool,
            stop: list) -> int:
    try:
        cluster = DevCluster(directory, brokers, zk_port=zk_port, base_port=base_port, security=security,
                             kafka=kafka)
    except ValueError as e:
        print(f"tidelog dev up: {e}", file=sys.stderr)
        return 2
    try:
        print(f"starting ZooKeeper on 127.0.0.1:{cluster.zookeeper.port} and {brokers} brokers in {cluster.dir}",
              flush=True)
        cluster.start()
        print(f"cluster ready. bootstrap: {cluster.bootstrap}", flush=True)
        if _has_kafka_listeners(cluster):
            print(f"Kafka clients (librdkafka, kafka-python, kcat, Java): {cluster.kafka_bootstrap}", flush=True)
        secured = f" --command-config {cluster.client_properties}" if cluster.security else ""
        print("  try: tidelog topics create demo --partitions 6 --replication-factor "
              f"{min(3, brokers)} --bootstrap {cluster.bootstrap}{secured}", flush=True)
        print("broker pids (kill PID: a controlled shutdown of that broker): " +
              ", ".join(f"{i}: {b.proc.pid}" for i, b in cluster.brokers.items() if b.running), flush=True)
        print("Ctrl-C stops the cluster.", flush=True)
        # A broker that exits is reported once; the rest of the cluster stays up, so that a
        # broker can be stopped and started by hand (``tidelog broker --config``).
        reported: dict[int, object] = {}  # broker id -> the process whose exit was reported
        while not stop:
            for i, b in cluster.brokers.items():
                if not b.running and b.proc is not None and reported.get(i) is not b.proc:
                    reported[i] = b.proc
                    print(f"broker {i} exited (status {b.proc.returncode}); start it again with: tidelog "
                          f"broker --config {b.config_path} (its log until now: {b.log_path})", flush=True)
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"tidelog dev up: {e}", file=sys.stderr)
        cluster.kill()
        return 1
    finally:
        print("stopping the cluster ...", flush=True)
        cluster.stop()
    return 0
