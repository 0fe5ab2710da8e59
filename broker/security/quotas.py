"""Client quotas: byte rates and request time per user and client id, as Kafka enforces them.

Theory of operation (Kafka's ClientQuotaManager, KIP-13, KIP-55, KIP-124):

* **Quotas** are entity configs in ZooKeeper (``broker/security/entity_configs.py``):
  ``producer_byte_rate`` (bytes/s of Produce requests), ``consumer_byte_rate`` (bytes/s of
  Fetch responses to consumers; followers are not throttled by client quotas) and
  ``request_percentage`` (the percentage of one thread's time, per quota window, that the
  broker spends handling the entity's requests: here, a handler's own time on the event loop).
* **Which quota applies** to a request of user U (the principal's name; ``ANONYMOUS`` on
  listeners that do not authenticate) and client id C is, for each quota key separately, the
  first entity in this order that sets the key (``resolve``)::

      users/U/clients/C > users/U/clients/<default> > users/U > users/<default>/clients/C
      > users/<default>/clients/<default> > users/<default> > clients/C > clients/<default>

  No entity setting the key: no quota of that kind. The entity that matched also decides
  what is *shared*: requests are measured per *sensor key*, the (user, client id) pair with
  the components the matched entity does not name blanked (``users/U`` is one budget for all
  of U's client ids; ``clients/<default>`` one budget per client id).
* **The rate** is Kafka's ``Rate`` over ``quota.window.num`` samples of
  ``quota.window.size.seconds`` (``Rate``): the sum of the live samples over the time they
  span, the span padded to ``num - 1`` sample windows while the sensor is young (so a new
  client is measured over ~10 s, not over its first millisecond).
* **The throttle time** of a request that takes the rate over the quota is the time it would
  take, recording nothing more, for the rate to come back to the quota:
  ``(observed - quota) / quota * window`` (``throttle_time_ms``); a request-time throttle is
  capped at one sample window (Kafka's ClientRequestQuotaManager), a byte rate's is not
  (ClientQuotaManager). Produce and Fetch take the larger of their byte-rate and
  request-time throttles. A consumer's fetch asks for at most what its quota allows in the
  window, ``quota * (num - 1) * size`` bytes (Kafka's ``getMaxValueInQuotaWindow``): one
  answer cannot take many windows' worth.
* **Throttling** (``QuotaEnforcer``) takes one of two forms, by who waits out the throttle
  time; the response reports it in its ``throttle_time_ms`` either way, and the request's
  work is done first (a produce is appended, in request order).

  - **The client waits** (``RequestContext.client_throttles``: every native request, and a
    Kafka client from the API's KIP-219 version on, e.g. Produce v6, Fetch v8;
    ``protocol/kafka/apis.py``). It sends nothing more to that broker for
    ``throttle_time_ms`` (Tidelog's clients from the request's send, Kafka's from the
    response's receipt), so the broker must not delay it too: the client would wait twice,
    and a throttle longer than its request timeout would end the connection. As Kafka does,
    the response goes out at once and the connection is muted: it starts no further request
    until the throttle time has passed (the handler's answer is a ``deferred.Throttled``,
    which the network layer obeys), so a client that ignores the throttle gains nothing. An
    acks=0 produce has no response; its connection is muted all the same.
  - **The broker waits** (a Kafka request of an older version): the response is delayed by
    the throttle time. It waits in the request's own task (a Trio sleep; a consumer's
    deferred fetch is completed by a task of the enforcer's nursery), and since a
    connection's responses go out in request order, the connection's later responses wait
    behind it.

Everything above the ``QuotaEnforcer`` is pure: time is passed in (ms), nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from tidelog.broker.deferred import Throttled, is_awaitable, is_deferred
from tidelog.broker.zookeeper.layout import DEFAULT_ENTITY, entity_path
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.messages import fetch_answer_parts

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)
SENSOR_EXPIRY_MS = 3_600_000  # Kafka drops a quota sensor idle for an hour

SensorKey = tuple[str, str]  # (user or "", client id or "")


class QuotaType(enum.Enum):
    """Kafka's quota types: their config keys and the names of their metrics."""

    PRODUCE = PRODUCER_BYTE_RATE
    FETCH = CONSUMER_BYTE_RATE
    REQUEST = REQUEST_PERCENTAGE


def check_quota_value(key: str, value: float) -> float:
    """ValueError unless ``value`` is a valid value of quota ``key``: a positive number, a
    whole one for the byte rates (Kafka's LONG configs)."""
    if key not in QUOTA_KEYS:
        raise ValueError(f"unknown quota {key!r} (known: {', '.join(QUOTA_KEYS)})")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"quota {key} must be a positive number, got {value!r}")
    if key != REQUEST_PERCENTAGE and value != int(value):
        raise ValueError(f"quota {key} is a whole number of bytes per second, got {value!r}")
    return float(value)


def parse_quota(key: str, text: str) -> float | None:
    """A quota's value as stored in an entity config ("1048576"); None if it is not one."""
    try:
        return check_quota_value(key, float(text))
    except ValueError:
        return None


# -- which quota applies --------------------------------------------------------------------------


def quota_entities(user: str, client_id: str) -> list[tuple[str, SensorKey]]:
    """The entities whose quotas may apply to (user, client id), most specific first, each
    with the sensor key requests matched by it are measured under (the module docstring)."""
    d = DEFAULT_ENTITY
    both, user_only, client_only = (user, client_id), (user, ""), ("", client_id)
    candidates = [((user, client_id), both), ((user, d), both), ((user, None), user_only),
                  ((d, client_id), both), ((d, d), both), ((d, None), user_only),
                  ((None, client_id), client_only), ((None, d), client_only)]
    # an empty user or client id (a client that sends none) has no entity of its own: only
    # the <default> entities can apply to it
    return [(entity_path(*names), sensor) for names, sensor in candidates if "" not in names]


@dataclass(frozen=True, slots=True)
class Quota:
    """The quota of one kind that applies to a request: its bound and where it is measured."""

    bound: float
    sensor: SensorKey
    entity: str  # the entity path that set it


def resolve(configs: Mapping[str, Mapping[str, str]], user: str, client_id: str,
            key: str) -> Quota | None:
    """The quota ``key`` of (user, client id): the first entity of ``quota_entities`` whose
    config (``configs``: entity path -> config) sets it to a valid value; None: unlimited."""
    for path, sensor in quota_entities(user, client_id):
        text = configs.get(path, {}).get(key)
        if text is not None and (bound := parse_quota(key, text)) is not None:
            return Quota(bound, sensor, path)
    return None


# -- the rate -------------------------------------------------------------------------------------


class Rate:
    """Kafka's ``Rate`` over a ``SampledStat``: ``samples`` samples of ``sample_ms`` each.

    ``record`` adds to the current sample, starting a new one (reusing the oldest) once the
    current is ``sample_ms`` old. A sample that started ``samples * sample_ms`` ago or more is
    obsolete and counts for nothing. ``measure`` is the sum of the samples per second of the
    time they span (``window_ms``): from the start of the oldest sample to now, but never
    less than ``samples - 1`` sample windows (the whole span, however young the sensor)."""

    __slots__ = ("samples", "sample_ms", "_starts", "_values", "_current")

    def __init__(self, samples: int, sample_ms: float):
        if samples < 1 or sample_ms <= 0:
            raise ValueError(f"a rate needs at least one sample of a positive length, got {samples} x {sample_ms} ms")
        self.samples = samples
        self.sample_ms = sample_ms
        self._starts: list[float] = []
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self._starts:
            self._starts.append(now_ms)
            self._values.append(0.0)
        elif now_ms - self._starts[self._current] >= self.sample_ms:
            self._current = (self._current + 1) % self.samples
            if self._current == len(self._starts):
                self._starts.append(now_ms)
                self._values.append(0.0)
            else:
                self._starts[self._current], self._values[self._current] = now_ms, 0.0
        self._values[self._current] += value

    def _purge(self, now_ms: float) -> None:
        expire = self.samples * self.sample_ms
        for i, start in enumerate(self._starts):
            if now_ms - start >= expire:
                self._starts[i], self._values[i] = now_ms, 0.0

    def window_ms(self, now_ms: float) -> float:
        """The span the rate is measured over (Kafka's ``Rate.windowSize``)."""
        self._purge(now_ms)
        elapsed = now_ms - min(self._starts, default=now_ms)
        full = int(elapsed // self.sample_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.sample_ms
        return max(elapsed, 1.0)

    def measure(self, now_ms: float) -> float:
        """Units per second."""
        window = self.window_ms(now_ms)
        return sum(self._values) / (window / 1000)

    def last_record_ms(self) -> float:
        return self._starts[self._current] if self._starts else -math.inf


def throttle_time_ms(observed: float, bound: float, window_ms: float, max_ms: float) -> int:
    """How long, recording nothing more, until a rate of ``observed`` over ``window_ms`` falls
    to ``bound``: ``(observed - bound) / bound * window_ms``, capped at ``max_ms`` (infinite
    for byte rates); 0 within the quota (Kafka's ``QuotaUtils.throttleTime`` and
    ``boundedThrottleTime``)."""
    if observed <= bound:
        return 0
    return int(min(round((observed - bound) / bound * window_ms), max_ms))


@dataclass(slots=True)
class _Sensor:
    rate: Rate
    throttle_time_ms: int = 0  # in total
    throttled: int = 0  # requests throttled
    last_ms: float = 0.0


class QuotaSensors:
    """The sensors of one quota type: a ``Rate`` per sensor key, the throttle time each was
    given (for the metrics), idle ones dropped after ``SENSOR_EXPIRY_MS``. Pure: time in ms
    is passed in."""

    def __init__(self, quota_type: QuotaType, samples: int = 11, sample_ms: float = 1000.0):
        self.quota_type = quota_type
        self.samples = samples
        self.sample_ms = sample_ms
        # Kafka's: a byte rate's throttle is what brings the rate back to the quota
        # (ClientQuotaManager), a request time's at most one sample (ClientRequestQuotaManager)
        self.max_throttle_ms = sample_ms if quota_type is QuotaType.REQUEST else math.inf
        self.sensors: dict[SensorKey, _Sensor] = {}

    def window_value(self, quota: Quota) -> int:
        """What ``quota`` allows in the measured window (Kafka's getMaxValueInQuotaWindow):
        what one consumer's fetch may ask for."""
        return max(1, int(quota.bound * (self.samples - 1) * self.sample_ms / 1000))

    def record(self, quota: Quota, value: float, now_ms: float) -> int:
        """Record ``value`` against ``quota``'s sensor; the request's throttle time (ms)."""
        sensor = self.sensors.get(quota.sensor)
        if sensor is None:
            sensor = self.sensors[quota.sensor] = _Sensor(Rate(self.samples, self.sample_ms))
        sensor.last_ms = now_ms
        sensor.rate.record(value, now_ms)
        rate = sensor.rate
        throttle = throttle_time_ms(rate.measure(now_ms), quota.bound, rate.window_ms(now_ms), self.max_throttle_ms)
        if throttle:
            sensor.throttle_time_ms += throttle
            sensor.throttled += 1
        return throttle

    def expire(self, now_ms: float) -> None:
        idle = [k for k, s in self.sensors.items() if now_ms - s.last_ms >= SENSOR_EXPIRY_MS]
        for key in idle:
            del self.sensors[key]


# -- the quota managers ---------------------------------------------------------------------------


class ClientQuotas:
    """The three quota types of a broker over the entity configs it knows (``configs``: a
    callable returning entity path -> config, and a ``generation`` that changes with them).
    The quotas of a (user, client id) are resolved once per generation."""

    def __init__(self, configs: Callable[[], Mapping[str, Mapping[str, str]]],
                 generation: Callable[[], int], samples: int = 11, sample_ms: float = 1000.0):
        self._configs = configs
        self._generation = generation
        self.sensors = {t: QuotaSensors(t, samples, sample_ms) for t in QuotaType}
        self._resolved: dict[tuple[str, str], dict[QuotaType, Quota]] = {}
        self._seen = -1
        self._any = False

    @classmethod
    def from_config(cls, store: Any, config: Any) -> ClientQuotas:
        """Over an ``EntityConfigStore``, windows from ``quota.window.num`` and
        ``quota.window.size.seconds``."""
        return cls(lambda: store.configs, lambda: store.generation, config.quota_window_num,
                   config.quota_window_size_seconds * 1000.0)

    def _refresh(self) -> None:
        generation = self._generation()
        if generation != self._seen:
            self._seen = generation
            self._resolved.clear()
            self._any = any(k in QUOTA_KEYS for config in self._configs().values() for k in config)

    @property
    def any(self) -> bool:
        """Whether any entity sets any quota (else nothing is measured at all)."""
        self._refresh()
        return self._any

    def quotas_for(self, user: str, client_id: str) -> dict[QuotaType, Quota]:
        self._refresh()
        found = self._resolved.get((user, client_id))
        if found is None:
            configs = self._configs()
            found = {t: q for t in QuotaType if (q := resolve(configs, user, client_id, t.value)) is not None}
            if len(self._resolved) > 100_000:  # many client ids come and go: start over
                self._resolved.clear()
            self._resolved[(user, client_id)] = found
        return found

    def record(self, quota_type: QuotaType, quota: Quota, value: float, now_ms: float) -> int:
        return self.sensors[quota_type].record(quota, value, now_ms)


# -- enforcement on the broker --------------------------------------------------------------------

# Not subject to client quotas: the controller's requests, and what a client must be able to
# send before anything else (Kafka exempts ClusterAction requests and follower fetches).
EXEMPT = frozenset({ApiKey.LEADER_AND_ISR, ApiKey.STOP_REPLICA, ApiKey.UPDATE_METADATA,
                    ApiKey.CONTROLLED_SHUTDOWN, ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE,
                    ApiKey.SASL_AUTHENTICATE})
_PERCENT_PER_SECOND = 100.0  # a request's handler seconds as percent of one thread for a second


def user_of(principal: str) -> str:
    """The user of a principal (``User:alice`` -> ``alice``; ``User:ANONYMOUS`` -> ``ANONYMOUS``)."""
    return principal.partition(":")[2] if principal.startswith("User:") else principal


def produce_bytes(body: Mapping[str, Any]) -> int:
    """The record bytes of a Produce request body (what ``producer_byte_rate`` counts)."""
    return sum(len(p["records"]) for t in body["topic_data"] for p in t["partition_data"]
               if isinstance(p.get("records"), (bytes, bytearray)))


def fetch_bytes(response: Any) -> int:
    """The record bytes of a Fetch response, its body or the typed message (what
    ``consumer_byte_rate`` counts)."""
    return sum(len(records) for _, _, records in fetch_answer_parts(response) if records)


def with_throttle(response: Any, throttle_ms: int) -> Any:
    """``response`` reporting ``throttle_time_ms`` (when its type has the field)."""
    if isinstance(response, Message) and "throttle_time_ms" in {f.name for f in dataclasses.fields(response)}:
        return dataclasses.replace(response, throttle_time_ms=throttle_ms)
    if isinstance(response, dict):
        return {**response, "throttle_time_ms": throttle_ms}
    return response


class QuotaEnforcer:
    """Wraps the socket server's handler (``instrument``): measures each request against its
    quotas and delays the throttled ones' responses (the module docstring). ``run`` holds
    the nursery that completes throttled deferred fetches."""

    def __init__(self, quotas: ClientQuotas, clock: Callable[[], float] = time.monotonic):
        self.quotas = quotas
        self.clock = clock
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(60)
                now = self.clock() * 1000
                for sensors in self.quotas.sensors.values():
                    sensors.expire(now)

    def instrument(self, handler: Callable[[Any, dict], Any]) -> Callable[[Any, dict], Any]:
        def handle(context: Any, body: dict) -> Any:
            api_key = context.header.api_key
            if api_key in EXEMPT or not self.quotas.any:
                return handler(context, body)
            if api_key == ApiKey.FETCH and isinstance(body.get("replica_id"), int) and body["replica_id"] >= 0:
                return handler(context, body)  # a follower's
            quotas = self.quotas.quotas_for(user_of(context.principal), context.client_id or "")
            if not quotas:
                return handler(context, body)
            if api_key == ApiKey.FETCH and (q := quotas.get(QuotaType.FETCH)) is not None:
                # one answer takes at most the window's worth of the quota, as in Kafka: else a
                # 50 MB answer to a 1 MB/s consumer would be throttled long after it is read
                cap = self.quotas.sensors[QuotaType.FETCH].window_value(q)
                asked = body.get("max_bytes")
                body["max_bytes"] = cap if not isinstance(asked, int) or asked < 0 else min(asked, cap)
            start = time.perf_counter()
            result = handler(context, body)
            busy = time.perf_counter() - start
            mute = context.client_throttles
            if is_awaitable(result):
                return self._settle_later(api_key, body, quotas, busy, result, mute)
            if is_deferred(result):
                return _ThrottledDeferred(self, api_key, body, quotas, busy, result, mute)
            return self._settle(api_key, body, quotas, busy, result, mute)

        return handle

    def throttle_ms(self, api_key: int, body: dict | int, quotas: Mapping[QuotaType, Quota], busy_s: float,
                    response: Any) -> int:
        """Record the request against its quotas; its throttle time. ``body``: the request's,
        or for a produce its ``produce_bytes`` (what a waiting produce keeps of its records)."""
        now = self.clock() * 1000
        throttle = 0
        if api_key == ApiKey.PRODUCE and (q := quotas.get(QuotaType.PRODUCE)) is not None:
            produced = body if type(body) is int else produce_bytes(body)
            throttle = self.quotas.record(QuotaType.PRODUCE, q, produced, now)
        elif api_key == ApiKey.FETCH and (q := quotas.get(QuotaType.FETCH)) is not None:
            throttle = self.quotas.record(QuotaType.FETCH, q, fetch_bytes(response), now)
        if (q := quotas.get(QuotaType.REQUEST)) is not None:
            throttle = max(throttle, self.quotas.record(QuotaType.REQUEST, q, busy_s * _PERCENT_PER_SECOND, now))
        return throttle

    def _settle(self, api_key: int, body: dict, quotas: Mapping[QuotaType, Quota], busy_s: float,
                response: Any, mute: bool) -> Any:
        """``mute``: the client waits out the throttle itself (the module docstring)."""
        throttle = self.throttle_ms(api_key, body, quotas, busy_s, response)
        if not throttle:
            return response
        if mute:
            return Throttled(with_throttle(response, throttle), throttle)
        return _delayed(with_throttle(response, throttle), throttle)

    async def _settle_later(self, api_key: int, body: dict, quotas: Mapping[QuotaType, Quota],
                            busy_s: float, result: Any, mute: bool) -> Any:
        timed = _Timed()
        response = await timed.run(result)
        if is_deferred(response):  # its part done, what is left waits (acks=all): charged when answered
            return _ThrottledDeferred(self, api_key, body, quotas, busy_s + timed.busy_s, response, mute)
        throttle = self.throttle_ms(api_key, body, quotas, busy_s + timed.busy_s, response)
        if not throttle:
            return response
        if mute:
            return Throttled(with_throttle(response, throttle), throttle)
        await trio.sleep(throttle / 1000)
        return with_throttle(response, throttle)


async def _delayed(response: Any, throttle_ms: int) -> Any:
    await trio.sleep(throttle_ms / 1000)
    return response


class _Timed:
    """Awaits an awaitable, adding up the time its steps run on the event loop (``busy_s``):
    a handler's own time, not the time it waits."""

    def __init__(self) -> None:
        self.busy_s = 0.0

    async def run(self, awaitable: Any) -> Any:
        coro = awaitable if inspect.iscoroutine(awaitable) else _wrap(awaitable)
        return await self._drive(coro)

    @types.coroutine
    def _drive(self, coro: Any) -> Any:
        value: Any = None
        error: BaseException | None = None
        while True:
            start = time.perf_counter()
            try:
                yielded = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as done:
                self.busy_s += time.perf_counter() - start
                return done.value
            self.busy_s += time.perf_counter() - start
            try:
                value, error = (yield yielded), None
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as ``await`` would
                value, error = None, e


async def _wrap(awaitable: Any) -> Any:
    return await awaitable


class _ThrottledDeferred:
    """A deferred answer (a consumer's long poll, an acks=all produce) measured against the
    quotas when it comes, and delayed by its throttle time (by a task of the enforcer's
    nursery), or, for a client that waits it out itself (``mute``), answered at once as
    ``Throttled``."""

    __slots__ = ("enforcer", "api_key", "body", "quotas", "busy_s", "inner", "mute", "_scope")

    def __init__(self, enforcer: QuotaEnforcer, api_key: int, body: dict, quotas: Mapping[QuotaType, Quota],
                 busy_s: float, inner: Any, mute: bool = False):
        if api_key == ApiKey.PRODUCE:  # appended already: keep what is counted, not the records
            body = produce_bytes(body)
        self.enforcer, self.api_key, self.body, self.quotas, self.busy_s = enforcer, api_key, body, quotas, busy_s
        self.inner = inner
        self.mute = mute
        self._scope: trio.CancelScope | None = None

    def attach(self, complete: Callable[[Any], None]) -> None:
        def completed(response: Any) -> None:
            throttle = self.enforcer.throttle_ms(self.api_key, self.body, self.quotas, self.busy_s, response)
            if throttle and self.mute:
                complete(Throttled(with_throttle(response, throttle), throttle))
                return
            nursery = self.enforcer._nursery
            if not throttle or nursery is None:
                complete(response)
                return
            self._scope = trio.CancelScope()
            nursery.start_soon(self._complete_after, throttle, with_throttle(response, throttle), complete)

        self.inner.attach(completed)

    async def _complete_after(self, throttle_ms: int, response: Any, complete: Callable[[Any], None]) -> None:
        with self._scope:
            await trio.sleep(throttle_ms / 1000)
            complete(response)

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
        else:
            self.inner.cancel()
