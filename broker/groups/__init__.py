"""The group coordinator: consumer group membership and committed offsets (Kafka's
GroupCoordinator, GroupMetadata and GroupMetadataManager).

* ``group_metadata``: one group's state machine, pure (time passed in, replies returned);
* ``offsets_records``: the key/value codec of ``__consumer_offsets`` records and the fold that
  rebuilds groups and offsets from a partition's records;
* ``group_coordinator``: the Trio side: request handlers, timers, writes through the replica
  manager, loading and unloading partitions of ``__consumer_offsets``.
"""
