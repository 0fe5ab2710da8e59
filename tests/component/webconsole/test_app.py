"""The console's HTTP side in process, over ASGI, with a fake Admin: every bad input is a
400 naming the problem, a broker's refusal is its own text, an action the ACLs forbid is a
403 and is not offered, a crash in a handler is a 500 that leaves the server serving, and a
login guards every path."""

from __future__ import annotations

import base64
import json
from urllib.parse import urlsplit

from tests.unit.webconsole.test_watch import FakeAdmin
from tidelog.errors import TidelogError
from tidelog.protocol.acls import AclBinding
from tidelog.protocol.errors import TOPIC_ALREADY_EXISTS
from tidelog.webconsole.app import Clients, build_app
from tidelog.webconsole.permissions import OPEN, Permissions
from tidelog.webconsole.watch import ClusterWatch


class Admin(FakeAdmin):
    async def create_topics(self, topics, timeout_ms=None):
        raise TidelogError("cannot create topic 'orders': topic 'orders' already exists", error=TOPIC_ALREADY_EXISTS)

    async def describe_configs(self, topic, timeout_ms=None):
        raise RuntimeError("a bug in a handler")


async def call(app, method: str, url: str, body: object = None, headers: dict | None = None) -> tuple[int, dict]:
    parts = urlsplit(url)
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    # what the console's page sends: its Host, and every call as JSON
    headers = {"Host": "127.0.0.1:8080", "Content-Type": "application/json", **(headers or {})}
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": parts.path, "raw_path": parts.path.encode(), "query_string": parts.query.encode(),
             "root_path": "", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items() if v is not None]}
    sent: list[dict] = []
    delivered = False

    async def receive():
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, {"text": payload.decode()}


async def app_with(permissions: Permissions, login=None):
    admin = Admin()
    watch = ClusterWatch(admin, interval_s=1, window_s=60)
    await watch.poll_once()
    return build_app(Clients(admin, None, lambda: None, watch, permissions, 1000, "test", login))


async def test_bad_input_is_refused_with_a_message_naming_the_problem():
    app = await app_with(Permissions(OPEN, "User:ANONYMOUS"))
    cases = [
        ("GET", "/api/topics?size=100000", None, "size must be between 1 and 500"),
        ("GET", "/api/topics?page=x", None, "page must be an integer"),
        ("GET", "/api/topics/nope/partitions", None, "no topic 'nope'"),
        ("GET", "/api/topics/orders/records?partition=9", None, "partition must be between 0 and 0"),
        ("GET", "/api/topics/orders/records?offset=1&timestamp=2", None, "offset or timestamp, not both"),
        ("POST", "/api/topics", b"{not json", "the body is not JSON"),
        ("POST", "/api/topics", {"name": "bad name"}, "topic name"),
        ("POST", "/api/topics", {"name": "ok", "partitions": "many"}, "partitions must be an integer"),
        ("POST", "/api/topics", {"name": "ok", "replication_factor": 0},
         "replication_factor must be positive or -1 (the broker's default), got 0"),
        ("POST", "/api/topics/orders/configs", {"set": {"Retention": "1"}}, "is not a config name"),
        ("POST", "/api/topics/orders/records", {"value": "ab", "value_format": "hex", "partition": 3},
         "partition must be an integer between 0 and 0"),
        ("POST", "/api/topics/orders/records", {"value": "zz", "value_format": "hex"}, "value is not hexadecimal"),
        ("POST", "/api/groups/billing/reset", {"to": "yesterday"}, "to must be 'earliest', 'latest' or 'offset'"),
        ("GET", "/api/groups/nobody", None, "no consumer group 'nobody'"),
    ]
    for method, url, body, expected in cases:
        status, answer = await call(app, method, url, body)
        assert status == 400 and expected in answer["error"], (url, body, status, answer)


async def test_a_brokers_refusal_is_its_own_text_and_a_crash_is_a_500_that_leaves_the_server_up():
    app = await app_with(Permissions(OPEN, "User:ANONYMOUS"))
    status, answer = await call(app, "POST", "/api/topics", {"name": "orders", "partitions": 1})
    assert status == 409 and "already exists" in answer["error"]
    status, answer = await call(app, "GET", "/api/topics/orders?configs=1")
    assert status == 500 and "a bug in a handler" in answer["error"]
    status, answer = await call(app, "GET", "/api/overview")
    assert status == 200 and [b["id"] for b in answer["brokers"]] == [1, 2]


async def test_actions_the_acls_forbid_are_neither_offered_nor_done():
    alice = "User:alice"
    read_only = Permissions.from_bindings(alice, [AclBinding("TOPIC", "*", "LITERAL", alice, "*", "READ", "ALLOW")])
    app = await app_with(read_only)
    status, topics = await call(app, "GET", "/api/topics")
    assert status == 200 and topics["can_create"] is False and topics["items"][0]["can_delete"] is False
    for method, url, body in [("POST", "/api/topics", {"name": "new"}), ("DELETE", "/api/topics/orders", None),
                              ("POST", "/api/topics/orders/records", {"value": "v"}),
                              ("POST", "/api/topics/orders/configs", {"set": {"retention.ms": "1"}}),
                              ("POST", "/api/groups/billing/reset", {"to": "earliest"})]:
        status, answer = await call(app, method, url, body)
        assert status == 403 and "may not" in answer["error"], (url, answer)


async def test_a_login_guards_every_path():
    app = await app_with(Permissions(OPEN, "User:ANONYMOUS"), login=("ops", "s3cret-pass"))
    for path in ("/", "/api/overview", "/static/app.js"):
        status, _ = await call(app, "GET", path)
        assert status == 401
    wrong = base64.b64encode(b"ops:guess").decode()
    assert (await call(app, "GET", "/api/overview", headers={"Authorization": f"Basic {wrong}"}))[0] == 401
    right = base64.b64encode(b"ops:s3cret-pass").decode()
    status, answer = await call(app, "GET", "/api/overview", headers={"Authorization": f"Basic {right}"})
    assert status == 200 and answer["brokers"]


async def test_another_sites_page_cannot_act_through_the_browser():
    """A page elsewhere can make the browser post here (a form, a no-CORS fetch) and, through
    a name of its own pointed at this address (DNS rebinding), read the answers: neither
    reaches the cluster."""
    app = await app_with(Permissions(OPEN, "User:admin"))
    new = {"name": "csrf", "partitions": 1, "replication_factor": 1}
    status, body = await call(app, "POST", "/api/topics", new, {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]
    status, body = await call(app, "POST", "/api/topics", new, {"Origin": "https://evil.example"})
    assert status == 403 and "another site" in body["error"]
    status, body = await call(app, "DELETE", "/api/topics/t", None, {"Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "another site" in body["error"]
    status, body = await call(app, "GET", "/api/overview", None, {"Host": "attacker.example:8080"})
    assert status == 403 and "attacker.example" in body["error"]
    # the console's own page, by address or by localhost, works
    for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
        assert (await call(app, "GET", "/api/overview", None, {"Host": host}))[0] == 200
    status, body = await call(app, "POST", "/api/topics", new, {"Origin": "http://127.0.0.1:8080",
                                                                 "Sec-Fetch-Site": "same-origin"})
    assert status == 409 and "already exists" in body["error"]  # reached the (fake) cluster


async def test_with_a_login_the_console_answers_to_any_name():
    app = await app_with(Permissions(OPEN, "User:admin"), login=("ops", "secret"))
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:secret").decode()}
    assert (await call(app, "GET", "/api/overview", None, {"Host": "console.example.com", **auth}))[0] == 200
    assert (await call(app, "POST", "/api/topics", {"name": "x"}, {"Content-Type": "text/plain", **auth}))[0] == 415


async def test_a_reset_covers_the_whole_topic_and_is_clamped_to_what_it_holds():
    """kafka-consumer-groups' rules from the page: ``--topic`` resets every partition of the
    topic (one the group never committed too), and a target past a partition's end (or
    before its start) is clamped into it: an offset beyond the log would only make the
    consumer reset by auto.offset.reset."""
    from tidelog.aio.admin import PartitionInfo, TopicDescription
    from tidelog.records import TopicPartition

    altered = []

    class Resettable(Admin):
        async def describe_topics(self, names=None, timeout_ms=None):
            if names is None:
                return await super().describe_topics()
            return [TopicDescription("orders", [PartitionInfo("orders", p, 1, 0, (1,), (1,)) for p in (0, 1)])]

        async def list_offsets(self, specs, timeout_ms=None):
            return {tp: ((10 if spec == -2 else 500), -1) for tp, spec in specs.items()}

        async def alter_group_offsets(self, group_id, offsets, timeout_ms=None):
            altered.append(dict(offsets))

    admin = Resettable()
    watch = ClusterWatch(admin, interval_s=1, window_s=60)
    await watch.poll_once()
    app = build_app(Clients(admin, None, lambda: None, watch, Permissions(OPEN, "User:ANONYMOUS"), 1000, "test", None))
    status, body = await call(app, "POST", "/api/groups/billing/reset", {"to": "offset", "offset": 5000,
                                                                         "topic": "orders"})
    assert status == 200, body
    assert altered == [{TopicPartition("orders", 0): 500, TopicPartition("orders", 1): 500}]
    await call(app, "POST", "/api/groups/billing/reset", {"to": "offset", "offset": 3, "topic": "orders"})
    assert altered[-1] == {TopicPartition("orders", 0): 10, TopicPartition("orders", 1): 10}


class BrowsedConsumer:
    """A consumer over one partition's records (what ``_read`` uses of AsyncConsumer)."""

    def __init__(self, records):
        self.records, self.position = records, 0

    async def beginning_offsets(self, tps, timeout_ms=None):
        return {tp: 0 for tp in tps}

    async def end_offsets(self, tps, timeout_ms=None):
        return {tp: len(self.records) for tp in tps}

    def assign(self, tps):
        pass

    def seek(self, tp, offset):
        self.position = offset

    async def poll(self, timeout_ms=None, max_records=500):
        batch = self.records[self.position:self.position + max_records]
        self.position += len(batch)
        return batch


def browsed_record(offset: int, value: bytes, key: bytes | None = b"k", headers=()):
    import types

    return types.SimpleNamespace(offset=offset, timestamp=0, timestamp_type=0, key=key, value=value,
                                 headers=list(headers))


async def test_the_message_browser_answers_previews_within_a_byte_budget():
    """500 records of 1 MiB must not make a GiB answer: each value is cut to a preview with
    its full size, hex comes only when asked (or for bytes that are not text), and records
    stop at the answer's budget, saying where to read on."""
    from tidelog.protocol.topics import TopicPartition
    from tidelog.webconsole.app import BROWSE_BUDGET_BYTES, PREVIEW_BYTES, _read

    tp = TopicPartition("orders", 0)
    big = [browsed_record(i, b"\x01" * (1 << 20)) for i in range(500)]
    answer = await _read(BrowsedConsumer(big), tp, 0, None, 500)
    assert len(json.dumps(answer)) <= BROWSE_BUDGET_BYTES + 4096
    assert answer["budget_reached"] and answer["next_offset"] == len(answer["records"]) > 0
    value = answer["records"][0]["value"]
    assert value["size"] == 1 << 20 and value["truncated"] and value["text"] == "\x01" * PREVIEW_BYTES
    assert "hex" not in value  # text: hex only when asked
    text = [browsed_record(0, "é".encode() * (1 << 19)), browsed_record(1, b"\xff" * 10)]
    answer = await _read(BrowsedConsumer(text), tp, 0, None, 10)
    cut, binary = answer["records"][0]["value"], answer["records"][1]["value"]
    assert cut["text"] == "é" * (PREVIEW_BYTES // 2) and cut["truncated"]  # never half a character
    assert binary == {"text": None, "size": 10, "truncated": False, "hex": "ff" * 10}
    assert not answer["budget_reached"] and answer["next_offset"] is None
    asked = await _read(BrowsedConsumer(text), tp, 0, None, 10, with_hex=True)
    assert asked["records"][0]["value"]["hex"] == ("é".encode() * (1 << 19))[:PREVIEW_BYTES].hex()
