"""An order-processing program written for kafka-python, as its users write it.

tests/integration/test_kafka_python_habits.py runs this file with the import block below
(between the markers) replaced by Tidelog's and nothing else changed. Usage:
``python kafka_python_app.py BOOTSTRAP TOPIC GROUP COUNT``; prints one JSON line of what it saw.
"""

import json
import sys

# -- imports (kafka-python) --
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

# -- end of imports --

bootstrap, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

producer = KafkaProducer(bootstrap_servers=bootstrap,
                         key_serializer=lambda k: k.encode("utf-8"),
                         value_serializer=lambda v: json.dumps(v).encode("utf-8"),
                         acks="all", linger_ms=5, retries=5)
delivered = []


def on_send_success(record_metadata):
    delivered.append(record_metadata.offset)


def on_send_error(excp):
    print("send failed:", excp, file=sys.stderr)


for i in range(count):
    producer.send(topic, key="customer-%d" % (i % 3), value={"order": i, "amount": i * 10}) \
        .add_callback(on_send_success).add_errback(on_send_error)
future = producer.send(topic, key="customer-0", value={"order": count, "amount": 0})
record_metadata = future.get(timeout=30)
producer.flush()
producer_metrics = producer.metrics()["producer-metrics"]
producer.close()

consumer = KafkaConsumer(topic,
                         bootstrap_servers=bootstrap,
                         group_id=group,
                         auto_offset_reset="earliest",
                         enable_auto_commit=False,
                         consumer_timeout_ms=20000,
                         key_deserializer=lambda k: k.decode("utf-8"),
                         value_deserializer=lambda m: json.loads(m.decode("utf-8")))
orders = []
for message in consumer:
    orders.append([message.key, message.value["order"], message.value["amount"]])
    tp = TopicPartition(message.topic, message.partition)
    consumer.commit({tp: OffsetAndMetadata(message.offset + 1, "order-%d" % message.value["order"])})
    if len(orders) == count + 1:
        break

leftover = sum(len(messages) for tp, messages in consumer.poll(timeout_ms=200).items())
partitions = consumer.partitions_for_topic(topic)
committed = {}
for p in sorted(partitions):
    tp = TopicPartition(topic, p)
    offset_and_metadata = consumer.committed(tp, metadata=True)
    committed[p] = [consumer.committed(tp), offset_and_metadata.offset, offset_and_metadata.metadata]
print(json.dumps({
    "orders": orders,
    "delivered": len(delivered),
    "leftover": leftover,
    "last": [record_metadata.topic, record_metadata.partition, record_metadata.offset],
    "committed": committed,
    "topics": sorted(t for t in consumer.topics() if t == topic),
    "send_rate_positive": producer_metrics["record-send-rate"] > 0,
    "fetch_metrics": "consumer-fetch-manager-metrics" in consumer.metrics(),
}))
consumer.close()
