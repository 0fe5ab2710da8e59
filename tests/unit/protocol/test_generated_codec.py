"""The generated loaders and dumpers of typed bodies against the plans they stand in for.

For every message class of the protocol (and the test classes of test_messages.py, which
hold the unusual shapes: recursion, a ``__post_init__`` rule, floats, dicts), on bodies made
from the class's own annotations, valid or with wrong types, values out of range and fields
missing: the generated loader either builds the very message the plan builds, or defers to
the plan (never accepting what the plan refuses), and on valid bodies it does not defer; the
generated dumper gives the plan's dict.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.protocol.test_messages import Cluster, Node, Span
from tidelog.protocol import codec, messages
from tidelog.protocol.codec import Message
from tidelog.protocol.errors import InvalidRequestError

CLASSES = sorted((c for _, c in inspect.getmembers(messages, inspect.isclass)
                  if issubclass(c, Message) and c is not Message and dataclasses.is_dataclass(c)),
                 key=lambda c: c.__name__) + [Cluster, Node, Span]
MAX_DEPTH = 3

noise_st = (st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.floats(allow_nan=False)
            | st.text(max_size=3) | st.binary(max_size=3) | st.just([]) | st.just({}) | st.just([None]))


def value_st(tp, meta, depth: int, noisy: bool) -> st.SearchStrategy:
    """Decoded values for a field annotated ``tp``; ``noisy``: now and then a wrong one."""
    valid = _valid_st(tp, meta, depth, noisy)
    if not noisy:
        return valid
    return st.integers(0, 7).flatmap(lambda k: noise_st if k == 0 else valid)


def _valid_st(tp, meta, depth: int, noisy: bool) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if tp is int:
        low, high = meta.get("min", -(1 << 64)), meta.get("max", 1 << 64)
        edges = st.sampled_from([low, high, low - 1, high + 1]) if noisy else st.sampled_from([low, high])
        return st.integers(low, high) | edges
    if tp is str:
        return st.text(max_size=5)
    if tp is bytes:
        return st.binary(max_size=5)
    if tp is bool:
        return st.booleans()
    if tp is float:
        return st.floats(allow_nan=False) | st.integers(-10, 10)
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
        return st.dictionaries(st.text(max_size=3), value_st(typing.get_args(tp)[1], meta, depth + 1, noisy),
                               max_size=2)
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
        assert type(got) is cls and got == expected
    if isinstance(expected, codec._FieldError):
        with pytest.raises(InvalidRequestError) as info:
            cls.from_body(body)
        assert str(info.value) == expected.describe()
    else:
        assert cls.from_body(body) == expected


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
    assert type(got) is cls and got == expected
    assert codec._fast_dumper(cls)(expected) == codec._plan_of(cls).dump(expected) == expected.to_body()


def test_every_protocol_message_gets_generated_functions():
    for cls in CLASSES:
        assert callable(codec._fast_loader(cls)) and callable(codec._fast_dumper(cls))
