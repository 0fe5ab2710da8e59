"""A Hypothesis state machine: random keyed appends, tombstones, rolls, cleanings and
restarts of a compacted log, against an oracle.

The oracle is every record appended (offset -> key, value, timestamp, headers). After every
step the log must show, for every key, the value of its last record (a key whose last record
is a tombstone may show the tombstone or nothing, once its delete horizon passed); every
record it holds is exactly the one appended at that offset; offsets increase; below the
cleaner checkpoint no key appears twice; and a cleaning never changes the active segment
or the log end offset.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.unit.log.helpers import FakeClock, read_records
from tidelog.broker.log.cleaner import BYTES_PER_MAP_ENTRY, CleanerConfig, LogCleaner
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.protocol.records import BatchBuilder, Codec
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("model", 0)
keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])
values = st.one_of(st.none(), st.binary(min_size=1, max_size=30))
headers = st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["h", "x"]), st.binary(max_size=4)),
                                        min_size=1, max_size=2))
batches = st.lists(st.tuples(keys, values, headers), min_size=1, max_size=5)


class CompactedLogMachine(RuleBasedStateMachine):
    @initialize(segment_bytes=st.integers(300, 1200), map_keys=st.integers(1, 8),
                retention=st.integers(0, 50), min_ratio=st.sampled_from([0.0, 0.3, 0.5]))
    def open(self, segment_bytes, map_keys, retention, min_ratio):
        self.dir = tempfile.mkdtemp(prefix="tidelog-compaction-")
        self.clock = FakeClock()
        self.config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=128, cleanup_policy="compact",
                                delete_retention_ms=retention, min_cleanable_dirty_ratio=min_ratio,
                                max_message_bytes=segment_bytes, retention_ms=-1)
        self.cleaner_config = CleanerConfig(dedupe_buffer_size=BYTES_PER_MAP_ENTRY * map_keys, io_buffer_load_factor=1.0)
        self.appended: dict[int, tuple] = {}
        self._open()

    def _open(self):
        self.manager = LogManager([self.dir], self.config, clock=self.clock)
        self.manager.startup({TP.topic: self.config})
        self.log = self.manager.get_or_create_log(TP, self.config)
        self.cleaner = LogCleaner(self.manager, self.cleaner_config, self.clock)

    def teardown(self):
        if getattr(self, "manager", None) is not None:
            self.manager.shutdown()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(records=batches, codec=st.sampled_from([Codec.NONE, Codec.GZIP]))
    def append(self, records, codec):
        b = BatchBuilder(codec)
        for key, value, hdrs in records:
            b.append(self.clock(), key, value, hdrs)
        info = self.log.append_as_leader(b.build(), 0)
        for i, (key, value, hdrs) in enumerate(records):
            self.appended[info.first_offset + i] = (key, value, self.clock(), list(hdrs or []))
        self.log.update_high_watermark(self.log.log_end_offset)
        self.clock.advance(3)

    @rule()
    def roll(self):
        self.log.roll()

    @rule(advance=st.integers(0, 60))
    def clean(self, advance):
        self.clock.advance(advance)
        active, size, leo = self.log.active_segment, self.log.active_segment.size, self.log.log_end_offset
        before = self.visible()
        job = self.cleaner.clean_once()
        assert self.log.active_segment is active and active.size == size
        assert self.log.log_end_offset == leo
        if job is not None:
            after = self.visible()
            # no key loses its latest value; a tombstone may go
            assert {k: v for k, v in after.items() if v is not None} == \
                {k: v for k, v in before.items() if v is not None}

    @rule()
    def restart(self):
        self.manager.shutdown()
        self._open()

    def visible(self) -> dict[bytes, bytes | None]:
        out = {}
        for r in read_records(self.log):
            out[r.key] = r.value
        return out

    @invariant()
    def records_are_the_appended_ones(self):
        if not hasattr(self, "log"):
            return
        got = read_records(self.log)
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        for r in got:
            assert self.appended[r.offset] == (r.key, r.value, r.timestamp, list(r.headers))
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, (key, value, *_rest) in sorted(self.appended.items()):
            latest[key] = (offset, value)
        present = set(offsets)
        for key, (offset, value) in latest.items():
            if value is not None:
                assert offset in present, f"the latest value of {key!r} (offset {offset}) is gone"
        checkpoint = self.manager.cleaner_checkpoints().get(TP, 0)
        below = [r.key for r in got if r.offset < checkpoint]
        assert len(below) == len(set(below)), "a key appears twice in the clean section"


CompactedLogMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40)
TestCompactedLog = CompactedLogMachine.TestCase
