"""Network partitions for the fault matrix: a network namespace per broker, nftables drops.

The mechanism (chosen over an in-process proxy because it needs no change to how brokers talk
to each other or to ZooKeeper, and because packets are really lost, so connections hang as
in a real partition instead of being closed by a proxy):

* the root namespace gets a bridge ``tl<pid><n>br`` with two addresses of a private /24:
  ``.1``, the source of the test's own clients (producer, consumers, probes, the ZooKeeper
  sampler), and ``.2``, where ZooKeeper listens;
* broker ``i`` runs in the named namespace ``tidelog-<pid>-<n>-b<i>`` (``ip netns``; the
  broker process enters it with setns before it execs, see ``broker.devcluster``). A veth
  pair joins it to the bridge: ``eth0`` inside with ``.1<i>`` (``.11``, ``.12``, ...), the
  other end ``tl<pid><n>v<i>`` on the bridge;
* inside each broker namespace, an nftables table ``netdev tidelog_partition`` on ``eth0``
  holds a set ``cut`` of addresses, and drops every packet from one of them at ingress and
  every packet to one of them at egress. Drops at the device are silent to the sockets: a
  connect times out, an established connection stalls and retransmits, and after ``heal``
  the retransmissions get through, as on a real network.

``cut(a, b)`` puts ``b``'s address into ``a``'s set and ``a``'s into ``b``'s (both directions
of all traffic between two brokers); ``isolate_from_zookeeper(b)`` puts ZooKeeper's address
into ``b``'s set (nothing ``b`` sends reaches ZooKeeper and nothing comes back, so its session
expires). The test's clients at ``.1`` are never cut: a partitioned broker stays reachable to
them, which is what makes a zombie leader visible.

Clean-up: ``close`` deletes the namespaces (their veths and nftables tables go with them) and
the bridge; it runs in the scenario's exit path, failures included. A test process killed
with SIGKILL cannot run it, so ``create`` first removes the namespaces and bridges of labs
whose creating process is gone (the pid is in every name). Needs root (CAP_NET_ADMIN),
``ip`` (iproute2) and ``nft`` (nftables); ``./dev setup`` installs both.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import threading

TABLE = "tidelog_partition"
_NETNS_NAME = re.compile(r"^tidelog-(\d+)-(\d+)-b\d+$")
_BRIDGE_NAME = re.compile(r"^tl([0-9a-z]+)x(\d)br$")
_counter = 0
_counter_lock = threading.Lock()


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network partitions need root (CAP_NET_ADMIN) for network namespaces"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"network partitions need {' and '.join(missing)} (iproute2, nftables: ./dev setup installs them)"
    return None


def _run(*args: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def sweep_stale() -> list[str]:
    """Delete the namespaces and bridges of labs whose creating process is gone."""
    removed = []
    for line in _run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NETNS_NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _run("ip", "netns", "delete", name, check=False)
            removed.append(name)
    for line in _run("ip", "-o", "link", "show", "type", "bridge").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        m = _BRIDGE_NAME.match(name)
        if m and not _alive(int(m.group(1), 36)):
            _run("ip", "link", "delete", name, check=False)
            removed.append(name)
    return removed


def _subnet_in_use(prefix: str) -> bool:
    used = _run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route", "show")
    return f"{prefix}." in used  # may also match a longer address: then another subnet is picked


def _pick_subnet() -> str:
    """A free ``10.x.y`` /24 (checked against this host's addresses and routes)."""
    rng = random.Random(os.getpid() * 1000 + _counter)
    for _ in range(50):
        prefix = f"10.{rng.randint(200, 254)}.{rng.randint(0, 255)}"
        if not _subnet_in_use(prefix):
            return prefix
    raise RuntimeError("no free 10.200-254.x.0/24 subnet for the network lab")


class NetworkLab:
    """Per-broker namespaces on one bridge, with cuts between brokers and to ZooKeeper."""

    def __init__(self, broker_ids: list[int]):
        global _counter
        with _counter_lock:
            _counter += 1
            n = _counter % 10
        pid = os.getpid()
        self.tag = f"{pid}-{n}"
        self.bridge = f"tl{_base36(pid)}x{n}br"
        self._veth_prefix = f"tl{_base36(pid)}x{n}v"
        self.prefix = _pick_subnet()
        self.client_host = f"{self.prefix}.1"
        self.zookeeper_host = f"{self.prefix}.2"
        self.hosts = {b: f"{self.prefix}.{10 + b}" for b in broker_ids}
        self.netns = {b: f"tidelog-{pid}-{n}-b{b}" for b in broker_ids}
        self.cuts: dict[int, set[str]] = {b: set() for b in broker_ids}
        self.slowed: set[int] = set()  # brokers whose inbound link is shaped (``slow``)
        self.created = False

    def describe(self) -> str:
        return (f"bridge {self.bridge} {self.prefix}.0/24 (clients {self.client_host}, ZooKeeper "
                f"{self.zookeeper_host}); brokers " +
                ", ".join(f"{b}: {h} in {self.netns[b]}" for b, h in self.hosts.items()))

    # -- lifecycle -------------------------------------------------------------------------------

    def create(self) -> None:
        sweep_stale()
        self.created = True  # from here on, close() removes whatever was made
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.client_host}/24", "dev", self.bridge)
        _run("ip", "addr", "add", f"{self.zookeeper_host}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for b in self.hosts:
            self._add_broker(b)

    def _add_broker(self, b: int) -> None:
        ns, veth = self.netns[b], f"{self._veth_prefix}{b}"
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _run("ip", "link", "set", veth, "master", self.bridge)
        _run("ip", "link", "set", veth, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.hosts[b]}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=(
            f"table netdev {TABLE} {{\n"
            "  set cut { type ipv4_addr; }\n"
            '  chain ingress { type filter hook ingress device "eth0" priority 0; policy accept; '
            "ip saddr @cut drop; }\n"
            '  chain egress { type filter hook egress device "eth0" priority 0; policy accept; '
            "ip daddr @cut drop; }\n"
            "}\n"))

    def close(self) -> None:
        """Delete the namespaces (with their veths and rules) and the bridge. Idempotent."""
        if not self.created:
            return
        for ns in self.netns.values():
            _run("ip", "netns", "delete", ns, check=False)
        _run("ip", "link", "delete", self.bridge, check=False)
        self.created = False

    # -- faults ----------------------------------------------------------------------------------

    def _set(self, b: int, verb: str, address: str) -> None:
        _run("ip", "netns", "exec", self.netns[b], "nft", verb, "element", "netdev", TABLE, "cut",
             f"{{ {address} }}")

    def _cut_address(self, b: int, address: str) -> None:
        if address not in self.cuts[b]:
            self._set(b, "add", address)
            self.cuts[b].add(address)

    def _heal_address(self, b: int, address: str) -> None:
        if address in self.cuts[b]:
            self._set(b, "delete", address)
            self.cuts[b].discard(address)

    def cut(self, a: int, b: int) -> None:
        """Drop every packet between brokers ``a`` and ``b``, both ways."""
        self._cut_address(a, self.hosts[b])
        self._cut_address(b, self.hosts[a])

    def isolate_from_zookeeper(self, b: int) -> None:
        self._cut_address(b, self.zookeeper_host)

    def slow(self, b: int, rate_kbit: int) -> None:
        """A slow link into broker ``b``: at most ``rate_kbit`` kilobits per second of what the
        other brokers, ZooKeeper and clients send it (a tc token bucket on its veth's bridge
        side; packets queued for more than a second are dropped). tc's netem, which adds
        latency, is not in every kernel (not in this sandbox's): the rate limit is what makes
        a follower fall behind. Replaces an earlier shaping."""
        veth = f"{self._veth_prefix}{b}"
        _run("tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", f"{rate_kbit}kbit",
             "burst", "32kbit", "latency", "1s")
        self.slowed.add(b)

    def unslow(self, b: int) -> None:
        if b in self.slowed:
            _run("tc", "qdisc", "del", "dev", f"{self._veth_prefix}{b}", "root", check=False)
            self.slowed.discard(b)

    def heal(self) -> None:
        """Remove every cut and every slow link."""
        for b, addresses in self.cuts.items():
            for address in sorted(addresses):
                self._heal_address(b, address)
        for b in sorted(self.slowed):
            self.unslow(b)

    def is_cut(self) -> bool:
        return any(self.cuts.values()) or bool(self.slowed)
