"""Coordination through ZooKeeper (docs/architecture.md, section 9).

* ``layout``   znode paths, JSON codecs, replica placement and the coordination errors: pure;
* ``zk``       ``ZkClient``, the only module of the project that imports kazoo;
* ``zkserver`` ZooKeeper servers and ensembles as child processes (tests, ``tidelog dev up``);
* ``security_migration`` ``tidelog zookeeper-security-migration`` (znode ACLs, Kafka's tool).

Importing this package imports none of them, so pure code can use ``layout`` without kazoo.
"""
