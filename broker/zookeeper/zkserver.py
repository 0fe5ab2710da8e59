"""ZooKeeper 3.8 (Debian's package) as child processes, for tests and ``tidelog dev up``.

Debian's ``zkServer.sh`` insists on ``/etc/zookeeper``, so the java command is built here
(see notes/FEASIBILITY.md section 2). Each server lives in one directory::

    <data_dir>/zoo.cfg            rewritten at every start (ports may change)
    <data_dir>/log4j.properties
    <data_dir>/data/              snapshots, transaction logs, myid: kept across restarts
    <data_dir>/zookeeper.log      ZooKeeper's own log (log4j 1.2, WARN and up)
    <data_dir>/zookeeper.out      the JVM's stdout/stderr (start-up failures land here)

Process hygiene: the JVM runs in its own session (a Ctrl-C to the parent does not kill it
half-way) and gets PR_SET_PDEATHSIG=SIGTERM, so it dies when its parent dies, even by
SIGKILL. The kernel delivers that signal when the *thread* that forked exits, so ``start()``
must run on the main thread (never from a worker thread); it refuses otherwise. Stopping is
by PID: SIGTERM, wait, SIGKILL as a fallback.

No kazoo here: readiness is ZooKeeper's four-letter word ``srvr`` ("Mode: standalone",
"leader" or "follower" once the server serves).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
LOGGING_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
INSTALL_HINT = "install Debian's zookeeper package: apt-get install zookeeper"
PR_SET_PDEATHSIG = 1
JVM_OPTIONS = ("-Xms16m", "-Xmx128m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:-UsePerfData", "-Djava.net.preferIPv4Stack=true",
               "-Dzookeeper.admin.enableServer=false", "-Dzookeeper.jmx.log4j.disable=true")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

LOG4J_PROPERTIES = """\
log4j.rootLogger=WARN, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=${zookeeper.log.dir}/zookeeper.log
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
log4j.logger.org.apache.zookeeper.server.quorum.QuorumCnxManager=ERROR
"""


class ZooKeeperNotInstalledError(RuntimeError):
    pass


class ZooKeeperStartError(RuntimeError):
    pass


def find_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that were free a moment ago (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def find_free_port(host: str = "127.0.0.1") -> int:
    return find_free_ports(1, host)[0]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def four_letter_word(port: int, word: str = "srvr", host: str = "127.0.0.1", timeout: float = 1.0) -> str:
    """ZooKeeper's answer to a four-letter command, or "" when it does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def java_and_classpath(java: str = "java", jar: str = ZOOKEEPER_JAR) -> tuple[str, str]:
    """The java executable and ZooKeeper's classpath, or ZooKeeperNotInstalledError saying
    what to install. zookeeper.jar's manifest lists its dependencies; the two logging jars
    give SLF4J a log4j 1.2 binding (without one ZooKeeper logs nothing at all)."""
    java_path = shutil.which(java)
    if java_path is None:
        raise ZooKeeperNotInstalledError(f"{java!r} not found on PATH: {INSTALL_HINT}")
    missing = [p for p in (jar, *LOGGING_JARS) if not os.path.exists(p)]
    if missing:
        raise ZooKeeperNotInstalledError(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    return java_path, ":".join((jar, *LOGGING_JARS))


def _read_cfg(path: Path) -> dict[str, str]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _die_with_parent_preexec(parent_pid: int):
    """A ``preexec_fn`` (runs in the child between fork and exec): PDEATHSIG, then check the
    parent did not die before prctl took effect. libc is loaded here, in the parent."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)
    return preexec


class ZooKeeperServer:
    """One ZooKeeper server process (standalone, or one node of a ZooKeeperEnsemble).

    ``port=None`` reuses the client port of an existing ``zoo.cfg`` in ``data_dir`` when it
    is still free (a restarted dev cluster keeps its ``zookeeper.connect``), else picks a free
    one. The port is fixed at construction, so ``connect_string`` is known before ``start()``.
    """

    def __init__(self, data_dir: str | os.PathLike, port: int | None = None, tick_time_ms: int = 500,
                 force_sync: bool = False, *, myid: int | None = None, quorum: tuple[str, ...] = (),
                 java: str = "java", jar: str = ZOOKEEPER_JAR, host: str = "127.0.0.1"):
        self.data_dir = Path(data_dir).absolute()
        self.host = host  # the client port's address (clientPortAddress)
        self.port = port if port is not None else self._previous_or_free_port()
        self.tick_time_ms = tick_time_ms
        self.force_sync = force_sync
        self.myid = myid
        self.quorum = tuple(quorum)
        self._java, self._jar = java, jar
        self._proc: subprocess.Popen | None = None

    def _previous_or_free_port(self) -> int:
        previous = _read_cfg(Path(self.data_dir) / "zoo.cfg").get("clientPort", "")
        if previous.isdigit() and port_is_free(int(previous), self.host):
            return int(previous)
        return find_free_port(self.host)

    # ---------------------------------------------------------------- properties

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    # ---------------------------------------------------------------- configuration

    def config_text(self) -> str:
        lines = [f"tickTime={self.tick_time_ms}", "initLimit=10", "syncLimit=5",
                 f"dataDir={self.data_dir / 'data'}", f"clientPort={self.port}",
                 f"clientPortAddress={self.host}", "maxClientCnxns=0", "admin.enableServer=false",
                 "4lw.commands.whitelist=srvr,ruok,stat,mntr,cons,conf", "preAllocSize=4096",
                 "snapCount=10000", f"forceSync={'yes' if self.force_sync else 'no'}",
                 "autopurge.purgeInterval=0"]
        if self.quorum:
            lines += ["reconfigEnabled=false", *self.quorum]
        return "\n".join(lines) + "\n"

    def _write_files(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "zoo.cfg").write_text(self.config_text())
        (self.data_dir / "log4j.properties").write_text(LOG4J_PROPERTIES)
        if self.myid is not None:
            (self.data_dir / "data" / "myid").write_text(f"{self.myid}\n")

    def command(self) -> list[str]:
        java, classpath = java_and_classpath(self._java, self._jar)
        return [java, *JVM_OPTIONS, f"-Dzookeeper.log.dir={self.data_dir}",
                f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}",
                "-cp", classpath, MAIN_CLASS, str(self.data_dir / "zoo.cfg")]

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the JVM (not yet serving: see ``wait_serving``). Main thread only. Refused
        when the client port is taken: whatever holds it would answer for this server."""
        if self.running:
            raise RuntimeError(f"ZooKeeper in {self.data_dir} is already running (pid {self.pid})")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("start ZooKeeper from the main thread: PR_SET_PDEATHSIG fires when "
                               "the forking thread exits, which would kill it early")
        if not port_is_free(self.port, self.host):
            raise ZooKeeperStartError(f"port {self.port} is in use: is another cluster running? (ZooKeeper in "
                                      f"{self.data_dir} would listen on {self.host}:{self.port}); stop it, "
                                      f"or choose another port")
        command = self.command()
        self._write_files()
        with open(self.data_dir / "zookeeper.out", "ab") as out:
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=self.data_dir,
                                          start_new_session=True,
                                          preexec_fn=_die_with_parent_preexec(os.getpid()))

    def wait_serving(self, timeout: float = 30.0) -> str:
        """Wait until ``srvr`` reports a ``Mode:`` while this server's process is alive;
        returns the mode (standalone/leader/follower)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:
                raise ZooKeeperStartError(self._exit_report())
            answer = four_letter_word(self.port, "srvr", self.host)
            # another ZooKeeper on the port answers too: the answer counts while ours lives
            if "Mode:" in answer and self._proc.poll() is None:
                return answer.split("Mode:", 1)[1].split()[0]
            if "Mode:" in answer:
                raise ZooKeeperStartError(f"port {self.port} answers as ZooKeeper but ours has exited: is "
                                          f"another cluster running? {self._exit_report()}")
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(f"ZooKeeper on port {self.port} not serving after "
                                          f"{timeout} s; see {self.log_path}")
            time.sleep(0.05)

    def mode(self) -> str | None:
        answer = four_letter_word(self.port, "srvr", self.host)
        return answer.split("Mode:", 1)[1].split()[0] if "Mode:" in answer else None

    def _exit_report(self) -> str:
        rc = None if self._proc is None else self._proc.returncode
        tail = ""
        for name in ("zookeeper.out", "zookeeper.log"):
            try:
                tail += (self.data_dir / name).read_text(errors="replace")[-2000:]
            except OSError:
                pass
        return f"ZooKeeper in {self.data_dir} is not running (exit code {rc}); last output:\n{tail}"

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code (None if never started)."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                return self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        return self._proc.wait()

    def kill(self) -> int | None:
        """SIGKILL: a crash, as far as clients and the ensemble can tell."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.kill()
        return self._proc.wait()

    def __enter__(self) -> "ZooKeeperServer":
        self.start()
        try:
            self.wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({str(self.data_dir)!r}, port={self.port}, pid={self.pid})"


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers forming one quorum, in ``base_dir/zk<N>`` (N = 1..size).

    Every node gets a client port and two quorum ports (peer, election), all on 127.0.0.1.
    The configuration is static (``reconfigEnabled=false``); data and ``myid`` persist.
    """

    def __init__(self, base_dir: str | os.PathLike, size: int = 3, tick_time_ms: int = 500,
                 force_sync: bool = False):
        if size < 1:
            raise ValueError(f"an ensemble needs at least one node, got {size}")
        ports = find_free_ports(3 * size)
        ids = range(1, size + 1)
        quorum = tuple(f"server.{n}=127.0.0.1:{ports[3 * i + 1]}:{ports[3 * i + 2]}"
                       for i, n in enumerate(ids))
        self.base_dir = Path(base_dir).absolute()
        self.nodes = {n: ZooKeeperServer(self.base_dir / f"zk{n}", ports[3 * i], tick_time_ms,
                                         force_sync, myid=n, quorum=quorum)
                      for i, n in enumerate(ids)}

    @property
    def connect_string(self) -> str:
        return ",".join(node.connect_string for node in self.nodes.values())

    def node(self, myid: int) -> ZooKeeperServer:
        return self.nodes[myid]

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, then wait until each serves (which needs a quorum)."""
        for node in self.nodes.values():
            if not node.running:
                node.start()
        self.wait_serving(timeout)

    def wait_serving(self, timeout: float = 30.0) -> dict[int, str]:
        deadline = time.monotonic() + timeout
        return {n: node.wait_serving(max(0.1, deadline - time.monotonic()))
                for n, node in self.nodes.items() if node.running}

    def start_node(self, myid: int, wait: bool = True) -> None:
        self.nodes[myid].start()
        if wait:
            self.nodes[myid].wait_serving()

    def stop_node(self, myid: int) -> int | None:
        return self.nodes[myid].stop()

    def kill_node(self, myid: int) -> int | None:
        return self.nodes[myid].kill()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def kill(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def __enter__(self) -> "ZooKeeperEnsemble":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
