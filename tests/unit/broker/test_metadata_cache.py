"""The broker's metadata cache: what a Metadata request is answered from."""

from __future__ import annotations

from tidelog.broker.metadata_cache import MetadataCache
from tidelog.protocol.errors import NONE, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import LiveBroker, PartitionState, UpdateMetadataRequest


def cache_with(*topics: str, controller_epoch: int = 3) -> MetadataCache:
    cache = MetadataCache(1)
    cache.update(UpdateMetadataRequest(
        1, controller_epoch, 0, [PartitionState(t, 0, controller_epoch, 1, 0, [1], 0, [1]) for t in topics],
        [LiveBroker(1, "127.0.0.1", 9092)]))
    return cache


def test_only_kafkas_internal_topics_are_marked_internal():
    cache = cache_with("orders", "__consumer_offsets", "__transaction_state", "__audit")
    marked = {t.name: t.is_internal for t in cache.topic_metadata(None)}
    # a user topic whose name starts with "__" is an ordinary topic, as in Kafka
    assert marked == {"orders": False, "__consumer_offsets": True, "__transaction_state": True,
                      "__audit": False}


def test_an_update_from_an_older_controller_epoch_is_ignored():
    cache = cache_with("orders", controller_epoch=3)
    stale = UpdateMetadataRequest(2, 2, 0, [PartitionState("stale", 0, 2, 2, 0, [2], 0, [2])], [])
    assert not cache.update(stale)
    assert cache.topics == ["orders"] and cache.controller_id == 1 and 1 in cache.brokers
    (known, unknown) = cache.topic_metadata(["orders", "stale"])
    assert known.error_code == NONE.code and unknown.error_code == UNKNOWN_TOPIC_OR_PARTITION.code


def test_a_topic_named_twice_is_described_once():
    cache = cache_with("orders")
    described = cache.topic_metadata(["orders", "nope", "orders"] * 1000 + ["late"])
    assert [t.name for t in described] == ["orders", "nope", "late"]


def full_update(*topics: str, controller_epoch: int = 3, full: bool = True) -> UpdateMetadataRequest:
    return UpdateMetadataRequest(
        1, controller_epoch, 0, [PartitionState(t, 0, controller_epoch, 1, 0, [1], 0, [1]) for t in topics],
        [LiveBroker(1, "127.0.0.1", 9092)], full=full)


def test_a_full_update_drops_every_topic_it_does_not_name():
    """A topic deleted while this broker did not hear of it (it had lost its ZooKeeper session,
    and registered again): the full update a controller sends a joining broker does not name
    it, and nothing else ever would. As Kafka 3.4+'s full UpdateMetadata."""
    cache = cache_with("orders", "gone", "also-gone")
    update = full_update("orders", "new")
    assert cache.deleted_by(update) == ["also-gone", "gone"]
    assert cache.update(update)
    assert cache.topics == ["new", "orders"]
    assert cache.topic_metadata(["gone"])[0].error_code == UNKNOWN_TOPIC_OR_PARTITION.code


def test_an_incremental_update_or_a_stale_full_one_drops_only_the_topics_it_names_deleted():
    cache = cache_with("orders", "gone")
    incremental = UpdateMetadataRequest(1, 3, 0, [], [LiveBroker(1, "127.0.0.1", 9092)], ["gone"])
    assert cache.deleted_by(incremental) == ["gone"] and cache.deleted_by(full_update(full=False)) == []
    assert cache.update(incremental) and cache.topics == ["orders"]
    stale = full_update(controller_epoch=2)
    assert cache.deleted_by(stale) == [] and not cache.update(stale) and cache.topics == ["orders"]


def test_a_replica_in_a_failed_log_dir_is_offline_though_its_broker_is_live():
    cache = MetadataCache(1)
    st = PartitionState("orders", 0, 3, 2, 1, [2], 0, [1, 2, 3], offline_replicas=[1, 3])  # 3 is down
    cache.update(UpdateMetadataRequest(1, 3, 0, [st], [LiveBroker(b, "127.0.0.1", 9092 + b) for b in (1, 2)]))
    (t,) = cache.topic_metadata(["orders"])
    assert t.partitions[0].offline_replicas == [1, 3]
