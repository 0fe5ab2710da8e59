"""The console's HTTP side: a Starlette app whose JSON answers the page (static files in
``static/``) reads every second or so.

Reads come from the watch's snapshot (``watch.py``); the message browser and the actions
(create and delete a topic, edit its configs, produce a record, reset a group's offsets) go
to the cluster through the SDK when asked. Every error becomes a JSON ``{"error": text}``:
bad input is 400 naming the parameter, a broker's refusal is 409 with the broker's own
text, an action the principal may not do is 403, and anything unexpected is 500 with its
message, logged; no request can stop the server.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tidelog.errors import TidelogError
from tidelog.protocol.topics import TopicPartition, topic_name_problem
from tidelog.webconsole.model import (
    BadRequest,
    config_changes,
    int_param,
    matching,
    page,
    page_params,
    partition_counts,
    partition_view,
    preview_text,
)
from tidelog.webconsole.permissions import Permissions
from tidelog.webconsole.watch import ClusterWatch

logger = logging.getLogger(__name__)

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MAX_BROWSE = 500
# what a browse answers of each key, value and header value (its full size is given with it),
# and of all its records together: the rest is left for a read from the next offset
PREVIEW_BYTES = 8192
BROWSE_BUDGET_BYTES = 4 << 20
MAX_HEADERS_SHOWN = 100
MAX_RECORD_BYTES = 1 << 20
MAX_BODY_BYTES = 2 << 20
BROWSE_TIMEOUT_S = 5.0
SECURITY_HEADERS = {
    # the page loads nothing from elsewhere, and says so to the browser
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class Clients:
    """The SDK clients the console talks to the cluster through, all started."""

    admin: Any  # AsyncAdmin
    producer: Any  # AsyncProducer
    consumer_factory: Callable[[], Any]  # a fresh AsyncConsumer (not started) per browse
    watch: ClusterWatch
    permissions: Permissions
    refresh_ms: int
    version: str
    login: tuple[str, str] | None = None  # (user, password): basic auth
    # the names a request's Host may give besides an IP address (None: any; with a login)
    host_names: frozenset[str] | None = frozenset({"localhost"})


def build_app(clients: Clients) -> Starlette:
    c = clients

    def api(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(await handler(request), headers=SECURITY_HEADERS)
            except BadRequest as e:
                return _error(400, str(e))
            except Forbidden as e:
                return _error(403, str(e))
            except TidelogError as e:
                return _error(409, str(e))
            except Exception as e:  # a page's request must never take the server down
                leaf = _leaf(e)
                if isinstance(leaf, TidelogError):
                    return _error(409, str(leaf))
                logger.exception("console request %s failed", request.url.path)
                return _error(500, f"{type(leaf).__name__}: {leaf}")
        return endpoint

    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC, "index.html"), headers=SECURITY_HEADERS)

    routes = [
        Route("/", index),
        Route("/api/overview", api(lambda r: overview(c)), methods=["GET"]),
        Route("/api/topics", api(lambda r: topics(c, r)), methods=["GET"]),
        Route("/api/topics", api(lambda r: create_topic(c, r)), methods=["POST"]),
        Route("/api/topics/{name}", api(lambda r: topic(c, r)), methods=["GET"]),
        Route("/api/topics/{name}", api(lambda r: delete_topic(c, r)), methods=["DELETE"]),
        Route("/api/topics/{name}/partitions", api(lambda r: partitions(c, r)), methods=["GET"]),
        Route("/api/topics/{name}/configs", api(lambda r: alter_configs(c, r)), methods=["POST"]),
        Route("/api/topics/{name}/records", api(lambda r: browse(c, r)), methods=["GET"]),
        Route("/api/topics/{name}/records", api(lambda r: produce(c, r)), methods=["POST"]),
        Route("/api/groups", api(lambda r: groups(c, r)), methods=["GET"]),
        Route("/api/groups/{group}", api(lambda r: group(c, r)), methods=["GET"]),
        Route("/api/groups/{group}/reset", api(lambda r: reset_group(c, r)), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = _guarded(Starlette(routes=routes), None if c.login is not None else c.host_names)
    if c.login is not None:
        return _with_login(app, c.login)
    return app


class Forbidden(Exception):
    """An action the principal's ACLs do not allow (HTTP 403)."""


def _forbidden(c: Clients, action: str) -> Forbidden:
    p = c.permissions
    why = f": {p.reason}" if p.mode == "read-only" else ""
    return Forbidden(f"the console's principal {p.principal} may not {action}{why}")


def _leaf(e: BaseException) -> BaseException:
    """The first leaf of an exception group (the SDK's concurrent requests raise them)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=SECURITY_HEADERS)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def request_problem(method: str, scheme: str, headers: dict[bytes, bytes],
                    host_names: frozenset[str] | None) -> tuple[int, str] | None:
    """Why a browser's request must not be served, as ``(status, message)``, or None.

    * Without a login, a Host that is neither an IP address nor one of ``host_names``
      (``localhost``, the name served): another site's name pointed at this address (DNS
      rebinding), whose pages could otherwise read the cluster through the console.
    * An action (any method but GET, HEAD, OPTIONS) that is not a JSON body, or that says it
      comes from another site (``Origin``, ``Sec-Fetch-Site``): a page elsewhere making the
      browser post a form or a no-CORS request here. A cross-site page cannot send
      ``application/json`` without a preflight, which this server never grants."""
    host = headers.get(b"host", b"").decode("latin-1")
    if host_names is not None and host and not _known_host(host, host_names):
        return 403, (f"this console answers to {', '.join(sorted(host_names))} or an IP address, not "
                     f"{host[:100]!r}: start it with a login to serve it under other names")
    if method in SAFE_METHODS:
        return None
    content_type = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    if content_type != "application/json":
        return 415, "actions take a JSON body (Content-Type: application/json)"
    origin = headers.get(b"origin")
    if origin is not None and host and origin.decode("latin-1") != f"{scheme}://{host}":
        return 403, f"a request from another site ({origin.decode('latin-1')[:100]}) is refused"
    site = headers.get(b"sec-fetch-site")
    if site is not None and site not in (b"same-origin", b"none"):
        return 403, f"a request from another site (Sec-Fetch-Site: {site.decode('latin-1')[:40]}) is refused"
    return None


def _known_host(host: str, names: frozenset[str]) -> bool:
    """Whether a Host header names an IP address or one of ``names`` (port aside)."""
    if host.startswith("["):  # an IPv6 literal, with or without a port
        end = host.find("]")
        name = host[1:end] if end > 0 else host
    else:
        name = host.rsplit(":", 1)[0]
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name.lower() in names


def _guarded(app: Any, host_names: frozenset[str] | None) -> Any:
    """``request_problem`` in front of the routes."""
    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            problem = request_problem(scope["method"], scope.get("scheme", "http"),
                                      dict(scope.get("headers") or []), host_names)
            if problem is not None:
                await _error(*problem)(scope, receive, send)
                return
        await app(scope, receive, send)
    return guarded


def _with_login(app: Any, login: tuple[str, str]) -> Any:
    """Basic auth in front of everything (the server refuses to start it without TLS)."""
    user, password = login
    expected = base64.b64encode(f"{user}:{password}".encode()).decode()

    async def guarded(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "basic" or not secrets.compare_digest(token.strip(), expected):
                response = Response("login required", status_code=401,
                                    headers={"WWW-Authenticate": 'Basic realm="tidelog console"'})
                await response(scope, receive, send)
                return
        await app(scope, receive, send)
    return guarded


# -- reads (from the snapshot) ------------------------------------------------------------------


def _snapshot(c: Clients) -> Any:
    s = c.watch.snapshot
    if s is None:
        raise TidelogError(c.watch.error or "the console has not reached the cluster yet")
    return s


async def overview(c: Clients) -> dict:
    s = _snapshot(c)
    all_partitions = [p for t in s.topics.values() for p in t.partitions]
    total, under, offline = partition_counts(all_partitions)
    leaders: dict[int, int] = {}
    for p in all_partitions:
        leaders[p.leader] = leaders.get(p.leader, 0) + 1
    brokers = [{"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                "version": s.versions.get(b.node_id),
                "controller": b.node_id == s.cluster.controller_id, "leaders": leaders.get(b.node_id, 0),
                "error": s.broker_errors.get(b.node_id),
                "bytes_in": c.watch.broker_in.points(b.node_id),
                "bytes_out": c.watch.broker_out.points(b.node_id)} for b in s.cluster.brokers]
    return {"cluster_id": s.cluster.cluster_id, "controller": s.cluster.controller_id, "brokers": brokers,
            "topics": len(s.topics), "partitions": total, "under_replicated": under, "offline": offline,
            "groups": len(s.groups), "time_ms": s.time_ms, "error": c.watch.error, "version": c.version,
            "refresh_ms": c.refresh_ms, "permissions": c.permissions.summary()}


async def topics(c: Clients, r: Request) -> dict:
    s = _snapshot(c)
    number, size = page_params(r.query_params)
    names = [n for n in matching(s.topics, r.query_params.get("q"))
             if r.query_params.get("internal") == "1" or not s.topics[n].is_internal]
    shown = page(names, number, size)

    def row(name: str) -> dict:
        t = s.topics[name]
        _, under, offline = partition_counts(t.partitions)
        size_bytes = sum(i.size for p in t.partitions
                         for i in s.replicas.get(TopicPartition(name, p.partition), {}).values())
        return {"name": name, "partitions": len(t.partitions),
                "replication_factor": max((len(p.replicas) for p in t.partitions), default=0),
                "under_replicated": under, "offline": offline, "size": size_bytes,
                "messages_in": _last(c.watch.topic_in.points(name)),
                "messages_out": _last(c.watch.topic_out.points(name)), "internal": t.is_internal,
                "can_delete": c.permissions.can("DELETE", "TOPIC", name)}
    return shown.to_json(row) | {"can_create": c.permissions.can_create_topics()}


def _last(points: list) -> float | None:
    return points[-1][1] if points else None


def _topic_of(c: Clients, r: Request) -> Any:
    name = r.path_params["name"]
    t = _snapshot(c).topics.get(name)
    if t is None:
        raise BadRequest(f"no topic {name[:100]!r} in the cluster")
    return t


async def topic(c: Clients, r: Request) -> dict:
    t = _topic_of(c, r)
    name = t.name
    config_rows, config_error = [], None
    if r.query_params.get("configs") == "1":  # asked of the controller: only when the page shows them
        try:
            configs = await c.admin.describe_configs(name, timeout_ms=10000)
            config_rows = [{"name": e.name, "value": None if e.is_sensitive else e.value, "default": e.is_default,
                            "read_only": e.read_only} for e in sorted(configs.values(), key=lambda e: e.name)]
        except TidelogError as e:
            config_error = str(e)
    return {"name": name, "partitions": len(t.partitions), "internal": t.is_internal,
            "replication_factor": max((len(p.replicas) for p in t.partitions), default=0),
            "configs": config_rows, "configs_error": config_error,
            "messages_in": c.watch.topic_in.points(name), "messages_out": c.watch.topic_out.points(name),
            "can_alter_configs": c.permissions.can("ALTER_CONFIGS", "TOPIC", name),
            "can_delete": c.permissions.can("DELETE", "TOPIC", name),
            "can_produce": c.permissions.can("WRITE", "TOPIC", name),
            "can_read": c.permissions.can("READ", "TOPIC", name)}


async def partitions(c: Clients, r: Request) -> dict:
    t = _topic_of(c, r)
    s = _snapshot(c)
    number, size = page_params(r.query_params)
    shown = page(t.partitions, number, size)
    stale = s.stale_brokers
    return shown.to_json(lambda p: partition_view(p, s.replicas.get(TopicPartition(p.topic, p.partition), {}),
                                                  stale).to_json()) | {"time_ms": s.time_ms, "error": c.watch.error,
                                        "broker_errors": {str(b): e for b, e in s.broker_errors.items()}}


async def groups(c: Clients, r: Request) -> dict:
    s = _snapshot(c)
    number, size = page_params(r.query_params)
    shown = page(matching(s.groups, r.query_params.get("q")), number, size)

    def row(g: str) -> dict:
        st = s.groups[g]
        d = st.description
        return {"group": g, "state": d.state if d else None, "members": len(d.members) if d else None,
                "lag": st.lag, "partitions": len(st.offsets), "error": st.error}
    return shown.to_json(row)


async def group(c: Clients, r: Request) -> dict:
    s = _snapshot(c)
    gid = r.path_params["group"]
    st = s.groups.get(gid)
    if st is None:
        raise BadRequest(f"no consumer group {gid[:100]!r} in the cluster")
    d = st.description
    owner = {tp: m.member_id for m in (d.members if d else ()) for tp in m.assignment}
    committed = {o.partition for o in st.offsets}
    return {"group": gid, "state": d.state if d else None, "assignor": d.assignor if d else None,
            "generation": d.generation if d else None, "coordinator": d.coordinator if d else None,
            "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host,
                         "instance_id": m.group_instance_id,
                         "assignment": [f"{tp.topic}-{tp.partition}" for tp in m.assignment]}
                        for m in (d.members if d else ())],
            "offsets": [{"topic": o.partition.topic, "partition": o.partition.partition, "committed": o.committed,
                         "end": o.log_end_offset, "lag": o.lag, "owner": owner.get(o.partition)}
                        for o in st.offsets]
            # an assigned partition with no commit yet shows too, its figures unknown (as the CLI)
            + [{"topic": tp.topic, "partition": tp.partition, "committed": None, "end": None, "lag": None,
                "owner": member} for tp, member in sorted(owner.items())
               if tp not in committed],
            "lag": st.lag, "lag_history": c.watch.group_lag.points(gid), "error": st.error,
            "can_reset": c.permissions.can("READ", "GROUP", gid)}


# -- the message browser ------------------------------------------------------------------------


async def browse(c: Clients, r: Request) -> dict:
    t = _topic_of(c, r)
    q = r.query_params
    partition = int_param(q, "partition", 0, maximum=len(t.partitions) - 1)
    offset = int_param(q, "offset", None)
    timestamp = int_param(q, "timestamp", None)
    limit = int_param(q, "limit", 50, minimum=1, maximum=MAX_BROWSE)
    with_hex = int_param(q, "hex", 0, minimum=0, maximum=1) == 1
    if offset is not None and timestamp is not None:
        raise BadRequest("give offset or timestamp, not both")
    if not c.permissions.can("READ", "TOPIC", t.name):
        raise _forbidden(c, f"read topic {t.name!r}")
    tp = TopicPartition(t.name, partition)
    consumer = c.consumer_factory()
    async with trio.open_nursery() as nursery:
        await nursery.start(consumer.run)
        try:
            return await _read(consumer, tp, offset, timestamp, limit, with_hex)
        finally:
            await consumer.close()


async def _read(consumer: Any, tp: TopicPartition, offset: int | None, timestamp: int | None, limit: int,
                with_hex: bool = False) -> dict:
    """Up to ``limit`` records from ``offset`` (or ``timestamp``), below the high watermark,
    each key and value cut to ``PREVIEW_BYTES`` (hex only when asked, or when the bytes are
    not text), and no more records than fit ``BROWSE_BUDGET_BYTES`` of JSON: when the budget
    ends the read, ``budget_reached`` says so and ``next_offset`` is where to read on."""
    start = await consumer.beginning_offsets([tp], timeout_ms=10000)
    end = await consumer.end_offsets([tp], timeout_ms=10000)  # the high watermark
    low, high = start[tp], end[tp]
    if timestamp is not None:
        found = (await consumer.offsets_for_times({tp: timestamp}, timeout_ms=10000)).get(tp)
        offset = high if found is None else found.offset
    offset = low if offset is None else min(max(offset, low), high)
    records: list = []
    if offset < high:
        consumer.assign([tp])
        consumer.seek(tp, offset)
        with trio.move_on_after(BROWSE_TIMEOUT_S):
            while len(records) < limit and (not records or records[-1].offset < high - 1):
                batch = await consumer.poll(timeout_ms=500, max_records=limit - len(records))
                records += [x for x in batch if x.offset < high]  # never above the HW it was asked at
    answer: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "log_start_offset": low,
                              "high_watermark": high, "from_offset": offset, "records": [],
                              "budget_reached": False, "next_offset": None, "hex": with_hex}
    used = 0
    for x in records[:limit]:
        shown = _record_json(x, with_hex)
        size = len(json.dumps(shown))
        if answer["records"] and used + size > BROWSE_BUDGET_BYTES:
            answer["budget_reached"], answer["next_offset"] = True, x.offset
            break
        answer["records"].append(shown)
        used += size
    return answer


def _record_json(x: Any, with_hex: bool = False) -> dict:
    headers = list(x.headers)
    return {"offset": x.offset, "timestamp": x.timestamp, "timestamp_type": int(x.timestamp_type),
            "key": _bytes_json(x.key, with_hex), "value": _bytes_json(x.value, with_hex),
            "headers": [{"key": k[:PREVIEW_BYTES], "value": _bytes_json(v, with_hex)}
                        for k, v in headers[:MAX_HEADERS_SHOWN]],
            "headers_omitted": max(0, len(headers) - MAX_HEADERS_SHOWN)}


def _bytes_json(data: bytes | None, with_hex: bool = False) -> dict | None:
    """Bytes as the page shows them: their first ``PREVIEW_BYTES`` as text (None when not
    UTF-8), as hex when asked or not text, their full ``size`` and whether they were cut."""
    if data is None:
        return None
    text, truncated = preview_text(data, PREVIEW_BYTES)
    shown = {"text": text, "size": len(data), "truncated": truncated}
    if with_hex or text is None:
        shown["hex"] = data[:PREVIEW_BYTES].hex()
    return shown


# -- actions --------------------------------------------------------------------------------------


async def _body(r: Request) -> Any:
    raw = await r.body()
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"the request body is {len(raw)} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        return json.loads(raw or b"{}")
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from None


def _int_field(body: dict, name: str, default: int | None = None, minimum: int = 0,
               maximum: int = (1 << 31) - 1) -> int:
    value = body.get(name, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise BadRequest(f"{name} must be an integer between {minimum} and {maximum}, got {str(value)[:40]!r}")
    return value


async def create_topic(c: Clients, r: Request) -> dict:
    from tidelog.aio.admin import NewTopic

    body = await _body(r)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    name = body.get("name")
    if not isinstance(name, str) or (problem := topic_name_problem(name)) is not None:
        raise BadRequest(f"topic name: {problem if isinstance(name, str) else 'missing'}")
    if not c.permissions.can("CREATE", "TOPIC", name):
        raise _forbidden(c, f"create topic {name!r}")
    configs = config_changes({"set": body["configs"]}) if body.get("configs") else {}
    try:
        new = NewTopic(name, _int_field(body, "partitions", 1, 1, 100000),
                       _int_field(body, "replication_factor", -1, -1, 100),
                       config={k: v for k, v in configs.items() if v is not None})
    except ValueError as e:  # a replication factor of 0
        raise BadRequest(str(e)) from None
    await c.admin.create_topics([new], timeout_ms=30000)
    await c.watch.poll_once()
    return {"created": name}


async def delete_topic(c: Clients, r: Request) -> dict:
    name = r.path_params["name"]
    if not c.permissions.can("DELETE", "TOPIC", name):
        raise _forbidden(c, f"delete topic {name!r}")
    await c.admin.delete_topics([name], timeout_ms=30000)
    await c.watch.poll_once()
    return {"deleted": name}


async def alter_configs(c: Clients, r: Request) -> dict:
    t = _topic_of(c, r)
    if not c.permissions.can("ALTER_CONFIGS", "TOPIC", t.name):
        raise _forbidden(c, f"alter the configs of topic {t.name!r}")
    changes = config_changes(await _body(r))
    await c.admin.alter_configs(t.name, changes, timeout_ms=30000)
    return {"altered": t.name, "changes": changes}


async def produce(c: Clients, r: Request) -> dict:
    t = _topic_of(c, r)
    if not c.permissions.can("WRITE", "TOPIC", t.name):
        raise _forbidden(c, f"write to topic {t.name!r}")
    body = await _body(r)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with 'value' (and 'key', 'partition', 'headers')")
    value, key = _payload(body, "value"), _payload(body, "key")
    partition = None if body.get("partition") in (None, "") else \
        _int_field(body, "partition", maximum=len(t.partitions) - 1)
    headers = body.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise BadRequest("headers must be an object of header name to text")
    future = await c.producer.send(t.name, value, key=key, partition=partition,
                                   headers=[(k, v.encode()) for k, v in headers.items()] or None)
    with trio.fail_after(35):
        meta = await future
    return {"topic": meta.topic, "partition": meta.partition, "offset": meta.offset, "timestamp": meta.timestamp}


def _payload(body: dict, name: str) -> bytes | None:
    """A key or value as text, or as hex when ``<name>_format`` is "hex"."""
    text = body.get(name)
    if text is None:
        return None
    if not isinstance(text, str):
        raise BadRequest(f"{name} must be text")
    if body.get(f"{name}_format") == "hex":
        try:
            data = binascii.unhexlify(text.replace(" ", ""))
        except (binascii.Error, ValueError):
            raise BadRequest(f"{name} is not hexadecimal") from None
    else:
        data = text.encode()
    if len(data) > MAX_RECORD_BYTES:
        raise BadRequest(f"{name} is {len(data)} bytes; the console sends at most {MAX_RECORD_BYTES}")
    return data


async def reset_group(c: Clients, r: Request) -> dict:
    gid = r.path_params["group"]
    if not c.permissions.can("READ", "GROUP", gid):
        raise _forbidden(c, f"reset group {gid!r}")
    body = await _body(r)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    to = body.get("to")
    if to not in ("earliest", "latest", "offset"):
        raise BadRequest("to must be 'earliest', 'latest' or 'offset'")
    target = _int_field(body, "offset", maximum=(1 << 62)) if to == "offset" else None
    topic_name = body.get("topic")
    if topic_name:  # every partition of the topic, as kafka-consumer-groups --topic
        (described,) = await c.admin.describe_topics([topic_name], timeout_ms=10000)
        tps = [TopicPartition(topic_name, p.partition) for p in described.partitions]
    else:
        tps = [o.partition for o in await c.admin.list_group_offsets(gid, timeout_ms=10000)]
    if not tps:
        raise BadRequest(f"group {gid!r} has no committed offsets")
    earliest = await c.admin.list_offsets({tp: -2 for tp in tps}, timeout_ms=10000)
    latest = await c.admin.list_offsets({tp: -1 for tp in tps}, timeout_ms=10000)
    # clamped into what each partition holds, as kafka-consumer-groups does
    offsets = {tp: min(max(earliest[tp][0] if to == "earliest" else latest[tp][0] if to == "latest" else target,
                           earliest[tp][0]), latest[tp][0]) for tp in tps}
    await c.admin.alter_group_offsets(gid, offsets, timeout_ms=30000)
    await c.watch.poll_once()
    return {"group": gid, "offsets": {f"{tp.topic}-{tp.partition}": o for tp, o in sorted(offsets.items())}}
