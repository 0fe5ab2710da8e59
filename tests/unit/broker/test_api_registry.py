"""The broker's handler table against the API registry (protocol.apis): one handler per
served API, each of the kind its shape needs, each taking (request, context); ApiVersions
lists exactly the registry."""

from __future__ import annotations

import inspect

import pytest

from tidelog.broker.apis import Apis, Kind, handler_table, handles
from tidelog.broker.context import RequestContext
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.protocol.apis import APIS
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.messages import ApiVersionsResponse


def test_every_served_api_has_exactly_one_handler():
    assert set(handler_table()) == set(APIS)


def test_the_kinds_of_the_handlers():
    kinds = {key: kind for key, (kind, _) in handler_table().items()}
    assert kinds[ApiKey.PRODUCE] is Kind.ORDERED  # appends in request order
    assert kinds[ApiKey.FETCH] is Kind.DEFERRED  # a consumer's long poll
    assert {k for k, kind in kinds.items() if kind is Kind.ASYNC} == set(APIS) - {ApiKey.PRODUCE, ApiKey.FETCH}


def test_every_handler_takes_the_request_and_its_context():
    for key, (_, method) in handler_table().items():
        assert getattr(Apis, method.__name__) is method
        assert list(inspect.signature(method).parameters) == ["self", "req", "ctx"], key.name


def test_a_handler_of_the_wrong_kind_is_refused_at_registration():
    async def coroutine(self, req, ctx): ...

    with pytest.raises(TypeError, match="ORDERED handler must not be a coroutine"):
        handles(ApiKey.SASL_HANDSHAKE, Kind.ORDERED)(coroutine)
    with pytest.raises(ValueError, match="PRODUCE has two handlers"):
        handles(ApiKey.PRODUCE, Kind.ORDERED)(lambda self, req, ctx: None)


async def test_api_versions_lists_exactly_the_registry():
    apis = Apis(None, None, MetadataCache(1))
    response = await apis.handle(RequestContext(RequestHeader(ApiKey.API_VERSIONS, 0, 1)), {})
    assert isinstance(response, ApiVersionsResponse)
    assert {v.api_key: (v.min_version, v.max_version) for v in response.api_keys} == \
        {int(k): (a.min_version, a.max_version) for k, a in APIS.items()}
    assert int(ApiKey.SASL_HANDSHAKE) in {v.api_key for v in response.api_keys}  # clients look for it
    assert 57 not in {v.api_key for v in response.api_keys}  # UpdateFeatures: not served
