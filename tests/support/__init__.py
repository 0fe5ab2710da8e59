"""What the integration, Spark and system tests share (real ZooKeeper and broker processes).

- ``waiting``     bounded polling: ``wait_until`` and ``NotYet``
- ``cluster``     a DevCluster's processes: start, stop or kill, failure dumps, metadata, consuming
- ``raw_client``  a blocking socket that speaks the framed protocol or raw bytes (hostile input)
- ``disk``        replicas on disk, read with the broker's own checkpoint and record readers

A single request straight to one broker is ``tidelog.broker.health.request``, the broker's own.
"""
