"""docker-compose.yml read as data: its ZooKeeper ensemble and brokers, and how to run the
same brokers as local processes (tests/integration/test_ops.py) without Docker.

The file is parsed with PyYAML (anchors and ``<<`` merge keys included) and compose's
variable interpolation is applied with the defaults written in the file (``${VAR:-default}``),
so the result does not depend on the caller's environment or on docker-compose being
installed. A component test checks that ``docker-compose config`` resolves the same values.

Running a broker service locally keeps everything that is not about *where* it runs: the
same config file (the one the compose file mounts at /etc/tidelog/broker.toml), the same
TIDELOG_* variables, the same command line and the same healthcheck command. Only these are
rewritten (``Localizer``):

* host:port pairs naming a service of the compose file (``zk1:2181``, ``broker-2:9093``) and
  listener addresses of the broker itself (``0.0.0.0:9092``) become 127.0.0.1 and a free port
  (ZooKeeper nodes: their local ensemble's ports);
* the container port of the metrics endpoint (``TIDELOG_METRICS_PORT``) becomes a free port;
* paths inside a mounted volume (``/var/lib/tidelog/...``, ``/etc/tidelog/broker.toml``,
  ``/etc/tidelog/pki/...``) become the local directory or file standing in for that volume.

The one-shot services brokers wait for (``security-init``: certificates, the admin user) are
localized the same way (``one_shot_services``); each listener of a broker, bound and
advertised, maps to one local port (``listener_addresses``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
CONFIG_IN_CONTAINER = "/etc/tidelog/broker.toml"
PKI_IN_CONTAINER = "/etc/tidelog/pki"
# Variables the compose file passes to the broker containers that are not broker settings:
# they configure the tools in the same image (TIDELOG_BOOTSTRAP, TIDELOG_COMMAND_CONFIG) and
# the log level of `tidelog broker` (TIDELOG_LOG_LEVEL).
TOOL_VARIABLES = {"TIDELOG_BOOTSTRAP", "TIDELOG_COMMAND_CONFIG", "TIDELOG_LOG_LEVEL"}

_VAR = re.compile(r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                  r"|\$(?P<plain>[A-Za-z_][A-Za-z0-9_]*)")
_HOST_PORT = re.compile(r"(?P<host>[A-Za-z0-9_.\-]*):(?P<port>\d{1,5})\b")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}`` and ``$$``,
    with ``env`` (default: empty, so the file's own defaults apply)."""
    env = env or {}

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("plain")
        op, arg = m.group("op"), m.group("arg") or ""
        if op == ":-":
            return env.get(name) or arg
        if op == "-":
            return env.get(name, arg)
        if op in (":?", "?") and not env.get(name):
            raise ValueError(f"compose variable {name} is required: {arg}")
        return env.get(name, "")

    return _VAR.sub(sub, value)


def _interpolate_all(node: Any, env: dict[str, str] | None) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_all(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _interpolate_all(v, env) for k, v in node.items()}
    return node


def load_compose(path: Path = COMPOSE_FILE, env: dict[str, str] | None = None) -> dict:
    with open(path) as f:
        return _interpolate_all(yaml.safe_load(f), env)


def environment_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Volume:
    source: str  # a named volume, or a host path relative to the compose file
    target: str
    read_only: bool

    @property
    def named(self) -> bool:
        return not self.source.startswith((".", "/", "~"))


def volumes_of(service: dict) -> list[Volume]:
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            out.append(Volume(v["source"], v["target"], bool(v.get("read_only"))))
            continue
        parts = v.split(":")
        out.append(Volume(parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def ports_of(service: dict) -> list[tuple[int, int]]:
    """(published, target) pairs."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append((int(p["published"]), int(p["target"])))
            continue
        parts = str(p).split(":")
        out.append((int(parts[-2]), int(parts[-1].split("/")[0])))
    return out


@dataclass(frozen=True)
class ZooKeeperService:
    name: str
    hostname: str
    myid: int
    client_port: int
    servers: str  # ZOO_SERVERS


@dataclass(frozen=True)
class Service:
    name: str
    hostname: str
    service: dict = field(repr=False)

    @property
    def environment(self) -> dict[str, str]:
        return environment_of(self.service)

    @property
    def volumes(self) -> list[Volume]:
        return volumes_of(self.service)

    @property
    def ports(self) -> list[tuple[int, int]]:
        return ports_of(self.service)

    @property
    def command(self) -> list[str]:
        return [str(a) for a in self.service.get("command") or []]

    @property
    def entrypoint(self) -> list[str]:
        return [str(a) for a in self.service.get("entrypoint") or []]


@dataclass(frozen=True)
class BrokerService(Service):
    """A service running the broker image's entrypoint with a mounted broker config."""

    @property
    def healthcheck(self) -> list[str]:
        return [str(a) for a in self.service["healthcheck"]["test"]]

    @property
    def config_file(self) -> Path:
        """The host file the service mounts as its broker config."""
        for v in self.volumes:
            if v.target == CONFIG_IN_CONTAINER:
                return (COMPOSE_FILE.parent / v.source).resolve()
        raise LookupError(f"{self.name} mounts no {CONFIG_IN_CONTAINER}")


def _hostname(name: str, service: dict) -> str:
    return str(service.get("hostname") or name)


def zookeeper_services(compose: dict) -> list[ZooKeeperService]:
    out = []
    for name, s in compose["services"].items():
        if str(s.get("image", "")).split(":")[0] == "zookeeper":
            env = environment_of(s)
            port = int(env.get("ZOO_CLIENT_PORT", "2181"))
            out.append(ZooKeeperService(name, _hostname(name, s), int(env["ZOO_MY_ID"]), port,
                                        env.get("ZOO_SERVERS", "")))
    return sorted(out, key=lambda z: z.myid)


def broker_services(compose: dict) -> list[BrokerService]:
    """Services running the Tidelog image's broker entrypoint (they mount a broker config)."""
    out = []
    for name, s in compose["services"].items():
        if any(v.target == CONFIG_IN_CONTAINER for v in volumes_of(s)):
            out.append(BrokerService(name, _hostname(name, s), s))
    return sorted(out, key=lambda b: b.name)


def one_shot_services(compose: dict) -> list[Service]:
    """Services a broker waits for to complete (``condition: service_completed_successfully``)."""
    names = {name for b in broker_services(compose) for name, d in (b.service.get("depends_on") or {}).items()
             if d.get("condition") == "service_completed_successfully"}
    return [Service(n, _hostname(n, compose["services"][n]), compose["services"][n]) for n in sorted(names)]


def entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT (exec form) of the broker image."""
    import json

    found = None
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            found = found or json.loads(line[len("ENTRYPOINT "):])
    if found is None:
        raise LookupError("no ENTRYPOINT in the Dockerfile")
    return found


# -- running the brokers locally -----------------------------------------------------------------


class Localizer:
    """Rewrites one broker service's addresses and volume paths for a local run."""

    def __init__(self, broker: Service, addresses: dict[tuple[str, int], tuple[str, int]],
                 metrics_port: int, volume_dirs: dict[str, Path]):
        self.broker = broker
        self.addresses = dict(addresses)
        self.metrics_port = metrics_port
        self.paths: dict[str, str] = {}
        if isinstance(broker, BrokerService):
            self.paths[CONFIG_IN_CONTAINER] = str(broker.config_file)
        for v in broker.volumes:
            if v.named:
                self.paths[v.target] = str(volume_dirs[v.source])

    def value(self, key: str, value: str) -> str:
        if key == "TIDELOG_METRICS_PORT":
            return str(self.metrics_port)
        return self.path(_HOST_PORT.sub(self._address, value))

    def _address(self, m: re.Match) -> str:
        host, port = m.group("host"), int(m.group("port"))
        if host in ("", "0.0.0.0", "::"):  # a listener of this broker
            host = self.broker.hostname
        if (host, port) not in self.addresses:
            raise LookupError(f"{self.broker.name}: {m.group(0)!r} names no service address of the compose file")
        new_host, new_port = self.addresses[(host, port)]
        return f"{new_host}:{new_port}"

    def path(self, value: str) -> str:
        for inside, outside in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            if value == inside or value.startswith(inside.rstrip("/") + "/"):
                return outside + value[len(inside):]
        return value

    def environment(self) -> dict[str, str]:
        """The service's environment, localized (TIDELOG_* only: the process's other variables
        come from the caller, its TIDELOG_* ones are dropped)."""
        return {k: self.value(k, v) for k, v in self.broker.environment.items()}

    def argv(self, args: list[str]) -> list[str]:
        return [self.path(a) for a in args]

    def command(self, args: list[str]) -> list[str]:
        """A command line whose arguments may hold addresses as well as paths."""
        return [self.value("", a) for a in args]


def process_environment(service_env: dict[str, str]) -> dict[str, str]:
    """This process's environment without its TIDELOG_* variables, plus the service's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_")}
    return {**base, **service_env, "PYTHONUNBUFFERED": "1"}


def listener_addresses(broker: BrokerService) -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
    """(listener name, (host, port) it binds, (host, port) it advertises) of each listener,
    from TIDELOG_LISTENERS / TIDELOG_ADVERTISED_LISTENERS or the config file; a wildcard bind
    host is the broker's host name."""
    from tidelog.broker.config import BrokerConfig

    config = BrokerConfig.load(broker.config_file, env=broker.environment)
    out = []
    for listener in config.listener_list:
        bind_host = listener.bind.host
        if bind_host in ("", "0.0.0.0", "::"):
            bind_host = broker.hostname
        out.append((listener.name, (bind_host, listener.bind.port),
                    (listener.advertised.host or broker.hostname, listener.advertised.port)))
    return out
