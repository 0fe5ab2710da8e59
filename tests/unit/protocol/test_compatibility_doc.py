"""docs/kafka-compatibility.md's API table lists exactly what the Kafka listener serves."""

import re
from pathlib import Path

from tidelog.protocol.kafka.apis import KAFKA_APIS

DOC = Path(__file__).resolve().parents[3] / "docs" / "kafka-compatibility.md"
ROW = re.compile(r"^\| (\d+) \| (\w+) \| (\d+)(?:-(\d+))? \|")


def _documented() -> dict[int, tuple[str, int, int]]:
    section = DOC.read_text().split("## APIs and versions", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if m := ROW.match(line):
            low = int(m[3])
            rows[int(m[1])] = (m[2], low, int(m[4]) if m[4] else low)
    return rows


def test_api_table_matches_served_apis():
    served = {int(key): (api.spec, api.min_version, api.max_version) for key, api in KAFKA_APIS.items()}
    assert _documented() == served
