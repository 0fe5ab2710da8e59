"""The generated loaders and dumpers of typed bodies against the plans they stand in for.

For every message class of the protocol, the test classes of test_messages.py and the
shapes below (recursion, mutual recursion, ``__post_init__`` rules, floats, dicts, bounds that
are not ints, an ``__init__`` of the class's own, fields outside ``__init__`` or keyword-only,
a subclass with its own ``to_body``), on bodies made from the class's own annotations, valid
or with wrong types, values out of range, keys that are not str and fields missing: the
generated loader either builds the very message the plan builds (the same types all the
way down, and containers of its own, not the body's), or defers to the plan (never
accepting what the plan refuses), and on valid bodies it does not defer; the generated
dumper gives the plan's dict. Two threads meeting a pair of mutually recursive classes
first both get their messages.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import struct
import threading
import time
import types
import typing
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.protocol.test_messages import Cluster, Node, Span
from tidelog.protocol import codec, messages
from tidelog.protocol.codec import INT32, Message
from tidelog.protocol.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class Ping(Message):
    pong: Pong | None = None
    n: int = field(default=0, metadata=INT32)


@dataclass(frozen=True, slots=True)
class Pong(Message):
    pings: list[Ping] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OddBounds(Message):
    half: int = field(default=1, metadata={"min": 0.5})
    open_top: int = field(default=0, metadata={"min": -3, "max": None})
    infinite: int = field(default=0, metadata={"max": math.inf})


@dataclass(frozen=True, slots=True)
class OwnInit(Message):
    name: str

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name.lower())


@dataclass(frozen=True, slots=True)
class Shapes(Message):
    grid: list[list[float]]
    by_name: dict[str, list[Ping | None]] = field(default_factory=dict)
    later: int = field(default=7, init=False)
    flag: bool = field(default=False, kw_only=True)


@dataclass(frozen=True, slots=True)
class Item(Message):
    v: int


@dataclass(frozen=True, slots=True)
class Versioned(Item):
    def to_body(self) -> dict:
        return {"v": self.v, "schema": 2}


@dataclass(frozen=True, slots=True)
class Holder(Message):
    item: Item
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Level5(Message):
    v: int = 0


@dataclass(frozen=True, slots=True)
class Level4(Message):
    down: Level5
    more: list[Level5] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Level3(Message):
    down: Level4 | None = None


@dataclass(frozen=True, slots=True)
class Level2(Message):
    downs: list[Level3]


@dataclass(frozen=True, slots=True)
class Level1(Message):
    down: Level2 | None = None


@dataclass(frozen=True, slots=True)
class Level0(Message):
    """Nested deeper than the generated functions write messages in (``MAX_INLINE_DEPTH``)."""

    down: Level1


CLASSES = sorted((c for _, c in inspect.getmembers(messages, inspect.isclass)
                  if issubclass(c, Message) and c is not Message and dataclasses.is_dataclass(c)),
                 key=lambda c: c.__name__) + [Cluster, Node, Span, OddBounds, OwnInit, Shapes, Holder, Level0]
MAX_DEPTH = 3

noise_st = (st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.floats()
            | st.text(max_size=3) | st.binary(max_size=3) | st.just([]) | st.just({}) | st.just([None])
            | st.just({b"k": 1}) | st.just({1: 1}))


def value_st(tp, meta, depth: int, noisy: bool) -> st.SearchStrategy:
    """Decoded values for a field annotated ``tp``; ``noisy``: now and then a wrong one."""
    valid = _valid_st(tp, meta, depth, noisy)
    if not noisy:
        return valid
    return st.integers(0, 7).flatmap(lambda k: noise_st if k == 0 else valid)


def _valid_st(tp, meta, depth: int, noisy: bool) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if tp is int:
        low = math.ceil(meta["min"]) if meta.get("min") is not None else -(1 << 64)
        high = math.floor(meta["max"]) if meta.get("max") not in (None, math.inf) else 1 << 64
        edges = st.sampled_from([low, high, low - 1, high + 1]) if noisy else st.sampled_from([low, high])
        return st.integers(low, high) | edges
    if tp is str:
        return st.text(max_size=5)
    if tp is bytes:
        return st.binary(max_size=5)
    if tp is bool:
        return st.booleans()
    if tp is float:
        return st.floats() | st.integers(-10, 10)
    if origin is typing.Union or origin is types.UnionType:
        [inner] = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.none() | value_st(inner, meta, depth + 1, noisy)
    if origin is list:
        if depth >= MAX_DEPTH:
            return st.just([])
        return st.lists(value_st(typing.get_args(tp)[0], meta, depth + 1, noisy), max_size=2)
    if origin is dict:
        if depth >= MAX_DEPTH:
            return st.just({})
        keys = st.text(max_size=3) | st.binary(max_size=2) if noisy else st.text(max_size=3)
        return st.dictionaries(keys, value_st(typing.get_args(tp)[1], meta, depth + 1, noisy), max_size=2)
    assert isinstance(tp, type) and issubclass(tp, Message), tp
    return body_st(tp, depth + 1, noisy)


def body_st(cls: type, depth: int, noisy: bool) -> st.SearchStrategy:
    """Bodies of ``cls``: required fields present, defaulted ones present or not; ``noisy``:
    with wrong values, unknown keys, and a field dropped now and then."""
    hints = typing.get_type_hints(cls)
    required, optional = {}, {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        s = value_st(hints[f.name], f.metadata, depth, noisy)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required[f.name] = s
        else:
            optional[f.name] = s
    if noisy:
        optional["from_the_future"] = noise_st
    bodies = st.fixed_dictionaries(required, optional=optional)
    if not noisy:
        return bodies
    return st.tuples(bodies, st.integers(0, 12)).map(lambda b: _drop(*b))


def _drop(body: dict, k: int) -> dict:
    if k < len(body):
        del body[list(body)[k]]
    return body


DEFERRED = object()


def assert_same(got, expected, path: str = "") -> None:
    """``got == expected`` with the same types all the way down, floats to the bit (NaN, -0.0)."""
    assert type(got) is type(expected), f"{path}: {type(got).__name__} != {type(expected).__name__}"
    if isinstance(got, Message):
        for f in dataclasses.fields(got):
            assert_same(getattr(got, f.name), getattr(expected, f.name), f"{path}.{f.name}")
    elif isinstance(got, list):
        assert len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(got, dict):
        assert list(got) == list(expected), path
        for k in got:
            assert_same(got[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(got, float):
        assert struct.pack("<d", got) == struct.pack("<d", expected), f"{path}: {got!r} != {expected!r}"
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def containers(value) -> set[int]:
    """The ids of the lists and dicts in a body or a message."""
    out: set[int] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (list, dict)):
            out.add(id(v))
            todo.extend(v.values() if isinstance(v, dict) else v)
        elif isinstance(v, Message):
            todo.extend(getattr(v, f.name) for f in dataclasses.fields(v))
    return out


def loaded(cls: type, body) -> tuple[object, object]:
    """(what the plan makes of ``body``: a message or a _FieldError, what the generated
    loader makes of it: a message or DEFERRED)."""
    try:
        expected = codec._plan_of(cls).load(body)
    except codec._FieldError as e:
        expected = e
    try:
        got = codec._fast_loader(cls)(body)
    except (codec._Slow, ValueError):
        got = DEFERRED
    return expected, got


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(CLASSES).flatmap(lambda c: st.tuples(st.just(c), body_st(c, 0, noisy=True))))
def test_the_generated_loader_builds_the_plans_message_or_defers(case):
    cls, body = case
    expected, got = loaded(cls, body)
    if got is not DEFERRED:
        assert not isinstance(expected, codec._FieldError), f"accepted what the plan refuses: {expected}"
        assert type(got) is cls
        assert_same(got, expected)
        assert not containers(got) & containers(body), "a list or dict of the body was kept"
    if isinstance(expected, codec._FieldError):
        with pytest.raises(InvalidRequestError) as info:
            cls.from_body(body)
        assert str(info.value) == expected.describe()
    else:
        assert_same(cls.from_body(body), expected)


@settings(max_examples=250, deadline=None)
@given(st.sampled_from(CLASSES).flatmap(lambda c: st.tuples(st.just(c), body_st(c, 0, noisy=False))))
def test_valid_bodies_take_the_generated_loader_and_dump_as_the_plan_does(case):
    cls, body = case
    expected, got = loaded(cls, body)
    if isinstance(expected, codec._FieldError):  # a rule of a __post_init__ (a topic name, say)
        problem = expected.problem
        assert not (problem.startswith("expected ") or problem == "missing required field"
                    or "is out of range" in problem), expected.describe()
        return
    assert got is not DEFERRED
    assert type(got) is cls
    assert_same(got, expected)
    assert_same(codec._fast_dumper(cls)(expected), codec._plan_of(cls).dump(expected))


def test_every_protocol_message_gets_generated_functions():
    for cls in CLASSES:
        assert callable(codec._fast_loader(cls)) and callable(codec._fast_dumper(cls))


def test_the_odd_shapes_load_and_dump_as_the_plan_does():
    assert OddBounds.from_body({"half": 1, "open_top": 1 << 70, "infinite": 1 << 70}) == OddBounds(1, 1 << 70, 1 << 70)
    with pytest.raises(InvalidRequestError, match=r"half: 0 is out of range \[0.5, None\]"):
        OddBounds.from_body({"half": 0})
    assert OwnInit.from_body({"name": "ABC"}).name == "abc"  # its own __init__ ran
    shapes = Shapes.from_body({"grid": [[1, 2.5]], "by_name": {"a": [None, {"n": 3}]}, "later": 1, "flag": True})
    assert_same(shapes, Shapes([[1.0, 2.5]], {"a": [None, Ping(None, 3)]}, flag=True))
    assert shapes.later == 7
    holder = Holder(Versioned(1), [Item(2), Versioned(3)])  # subclasses dump by their class's plan
    assert_same(holder.to_body(), codec._plan_of(Holder).dump(holder))
    assert holder.to_body() == {"item": {"v": 1}, "items": [{"v": 2}, {"v": 3}]}
    assert codec.decode_response(codec.encode_response(1, Versioned(5)))[1] == {"v": 5, "schema": 2}
    with pytest.raises(TypeError, match="is not a Message dataclass"):
        Holder(None).to_body()


def test_messages_nested_deeper_than_written_in_load_and_dump_as_the_plan_does():
    assert codec.MAX_INLINE_DEPTH < 6
    body = {"down": {"down": {"downs": [{"down": {"down": {"v": 1}, "more": [{"v": 2}, {}]}}, {}]}}}
    got, expected = codec._fast_loader(Level0)(body), codec._plan_of(Level0).load(body)
    assert_same(got, expected)
    assert got.down.down.downs[0].down.more[1] == Level5(0) and got.down.down.downs[1] == Level3()
    assert_same(codec._fast_dumper(Level0)(got), codec._plan_of(Level0).dump(got))
    assert Level0.from_body(got.to_body()) == got
    bad = {"down": {"down": {"downs": [{"down": {"down": {"v": "1"}}}]}}}
    with pytest.raises(InvalidRequestError, match=r"down\.down\.downs\[0\]\.down\.down\.v: expected int"):
        Level0.from_body(bad)


def test_two_threads_meeting_mutually_recursive_classes_first_get_their_messages(monkeypatch):
    """Generating Ping makes Pong's loader, which points back at Ping's, before Ping's is
    done: a thread using Pong's meanwhile waits for it (the window widened by a pause in
    Ping's build)."""
    for cache in (codec._FAST_LOADS, codec._FAST_DUMPS):
        cache.pop(Ping, None)
        cache.pop(Pong, None)
    build = codec._Source.build

    def slow_build(self, fn, what):
        if what == "Ping":
            time.sleep(0.3)
        return build(self, fn, what)

    monkeypatch.setattr(codec._Source, "build", slow_build)
    results: dict[str, object] = {}

    def run(name, call):
        try:
            results[name] = call()
        except Exception as e:  # noqa: BLE001 - the assertion below names it
            results[name] = e

    first = threading.Thread(target=run, args=("ping", lambda: Ping.from_body({"pong": {"pings": [{"n": 1}]}})))
    first.start()
    time.sleep(0.1)  # Pong's loader is cached, Ping's is not yet
    run("pong", lambda: Pong.from_body({"pings": [{"n": 2}]}))
    run("dump", lambda: Pong([Ping(None, 4)]).to_body())
    first.join(10)
    assert results == {"ping": Ping(Pong([Ping(None, 1)])), "pong": Pong([Ping(None, 2)]),
                       "dump": {"pings": [{"pong": None, "n": 4}]}}
