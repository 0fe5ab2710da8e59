"""``tidelog dump-log``: real segments dump and verify clean; each kind of damage is named.

Segments are written by the storage engine itself (``load_log`` with a small
``segment.bytes`` and ``index.interval.bytes``, closed so the index files are written), then
damaged byte by byte the way disks and crashes damage them.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.cli import main
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.dump import bytes_reader, dump_log, next_segment_base, show_bytes
from tidelog.broker.log.index import OffsetIndex, TimeIndex
from tidelog.broker.log.loader import load_log
from tidelog.protocol.records import CRC_START, HEADER_SIZE, build_batch, compress, iter_headers
from tidelog.protocol.topics import TopicPartition

BATCHES = 40
RECORDS_PER_BATCH = 3
FIRST_TS = 1_000_000
CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=200)
BATCH_LINE = re.compile(r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .* position: (\d+) ")


def record_ts(batch: int, j: int) -> int:
    return FIRST_TS + batch * 10 + j


def write_log(directory: Path) -> None:
    log = load_log(str(directory), TopicPartition("orders", 0), CONFIG, clock=lambda: FIRST_TS)
    for i in range(BATCHES):
        records = [(f"k{i}-{j}".encode(), f"value {i}-{j}".encode(),
                    [("trace", b"t%d" % i)] if j == 0 else None, record_ts(i, j))
                   for j in range(RECORDS_PER_BATCH)]
        log.append_as_leader(build_batch(records), leader_epoch=i // 20)
    log.close()


@pytest.fixture
def seg_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "orders-0"
    write_log(directory)
    return directory


def segment_files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob("*" + suffix))


def dump(capsys, *args) -> tuple[int, str, str]:
    code = main(["dump-log", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("ERROR:")]


def batch_positions(log_path: Path) -> list[tuple[int, int]]:
    """(position, base offset) of each batch of a healthy segment."""
    return [(p, h.base_offset) for p, h in iter_headers(log_path.read_bytes())]


def patch(path: Path, position: int, fmt: str, *values) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, position, *values)
    path.write_bytes(bytes(data))


# -- healthy segments -------------------------------------------------------------------------


def test_the_fixture_has_several_segments_with_index_entries(seg_dir):
    logs = segment_files(seg_dir, ".log")
    assert len(logs) >= 3
    for suffix in (".index", ".timeindex"):
        assert all(p.stat().st_size > 0 for p in segment_files(seg_dir, suffix))


def test_healthy_segments_verify_and_show_every_batch(capsys, seg_dir):
    files = sorted(seg_dir.glob("0*"))
    code, out, err = dump(capsys, "--verify", *files)
    assert (code, err, errors(out)) == (0, "", [])
    batches = [tuple(map(int, m.groups())) for m in map(BATCH_LINE.match, out.splitlines()) if m]
    expected_offsets = [(3 * i, 3 * i + 2, 3) for i in range(BATCHES)]
    assert [b[:3] for b in batches] == expected_offsets
    for log_path in segment_files(seg_dir, ".log"):
        assert f"Dumping {log_path}" in out
        assert f"{log_path}: verified, no problems found" in out


def test_log_dump_starts_at_the_file_name_base_offset(capsys, seg_dir):
    second = segment_files(seg_dir, ".log")[1]
    code, out, _ = dump(capsys, second)
    lines = out.splitlines()
    base = int(second.name[:20])
    assert code == 0
    assert lines[:2] == [f"Dumping {second}", f"Log starting offset: {base}"]
    first = BATCH_LINE.match(lines[2])
    assert first and int(first.group(1)) == base and first.group(4) == "0"
    assert "isvalid: true" in lines[2]


def test_print_data_shows_records_keys_values_and_headers(capsys, seg_dir):
    code, out, _ = dump(capsys, "--print-data", segment_files(seg_dir, ".log")[0])
    assert code == 0
    assert (f"| offset: 4 CreateTime: {record_ts(1, 1)} keySize: 4 valueSize: 9 sequence: -1 "
            "headers: [] key: k1-1 payload: value 1-1") in out.splitlines()
    assert (f"| offset: 3 CreateTime: {record_ts(1, 0)} keySize: 4 valueSize: 9 sequence: -1 "
            "headers: [trace=t1] key: k1-0 payload: value 1-0") in out.splitlines()
    assert sum(line.startswith("| offset: ") for line in out.splitlines()) == (
        sum(1 for line in out.splitlines() if BATCH_LINE.match(line)) * RECORDS_PER_BATCH)


def test_without_print_data_no_records_are_shown(capsys, seg_dir):
    _, out, _ = dump(capsys, segment_files(seg_dir, ".log")[0])
    assert "| offset:" not in out


def test_index_files_are_printed_by_their_entries(capsys, seg_dir):
    for suffix, cls, fmt in ((".index", OffsetIndex, "offset: {} position: {}"),
                             (".timeindex", TimeIndex, "timestamp: {} offset: {}")):
        index_path = segment_files(seg_dir, suffix)[1]
        index = cls(str(index_path), int(index_path.name[:20]))
        index.load()
        code, out, _ = dump(capsys, index_path)
        assert code == 0
        assert out.splitlines()[1:] == [fmt.format(*e) for e in index.entries()]


def test_show_bytes_text_literal_or_hex():
    assert show_bytes(None) == "null"
    assert show_bytes("héllo wörld".encode()) == "héllo wörld"
    assert show_bytes(b"two\nlines") == "'two\\nlines'"
    assert show_bytes(b"\xff\x00") == "0xff00"


def test_dump_log_is_a_pure_function_of_bytes(seg_dir):
    data = segment_files(seg_dir, ".log")[0].read_bytes()
    lines = list(dump_log(bytes_reader(data), len(data), 0, verify=True))
    assert lines[0] == "Log starting offset: 0"
    assert len(lines) == 1 + len(batch_positions(segment_files(seg_dir, ".log")[0]))


# -- damage -----------------------------------------------------------------------------------


def test_a_flipped_bit_fails_the_crc(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    position, base = batch_positions(log_path)[2]
    data = bytearray(log_path.read_bytes())
    data[position + HEADER_SIZE + 5] ^= 0x10
    log_path.write_bytes(bytes(data))
    code, out, _ = dump(capsys, "--verify", log_path)
    assert code == 1
    [problem] = errors(out)
    assert f"record batch at position {position} (base offset {base}) fails its CRC-32C check" in problem
    assert f"position: {position} " in out and "isvalid: false" in out
    assert out.count("isvalid: true") == len(batch_positions(log_path)) - 1  # the walk goes on
    assert dump(capsys, log_path)[0] == 1  # damage is reported without --verify too


def test_a_torn_tail_is_named_with_its_position(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[-1]
    batches = batch_positions(log_path)
    last_position = batches[-1][0]
    with open(log_path, "r+b") as f:
        f.truncate(log_path.stat().st_size - 10)
    for args in (["--verify"], []):
        code, out, _ = dump(capsys, *args, log_path)
        assert code == 1
        assert sum(1 for line in out.splitlines() if BATCH_LINE.match(line)) == len(batches) - 1
        assert any(f"torn tail at position {last_position}" in e for e in errors(out)), out


def test_a_tail_too_short_for_a_header(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    size = log_path.stat().st_size
    with open(log_path, "ab") as f:
        f.write(b"\x00" * 20)
    code, out, _ = dump(capsys, log_path)
    assert code == 1
    [problem] = errors(out)
    assert f"torn tail at position {size}: 20 bytes, fewer than the 61 of a batch header" in problem
    assert "(all zero: space allocated but never written)" in problem


def test_garbage_after_the_batches_is_a_corrupt_tail(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    size = log_path.stat().st_size
    with open(log_path, "ab") as f:
        f.write(struct.pack(">qi", 999, 2) + b"\xaa" * 100)
    code, out, _ = dump(capsys, log_path)
    assert code == 1
    assert f"corrupt batch header at position {size}: batch_length 2" in errors(out)[0]


def test_an_index_entry_with_a_wrong_position(capsys, seg_dir):
    index_path = segment_files(seg_dir, ".index")[0]
    offset_rel, position = struct.unpack_from(">II", index_path.read_bytes(), 8)
    patch(index_path, 8 + 4, ">I", position + 7)
    code, out, _ = dump(capsys, "--verify", index_path)
    assert code == 1
    [problem] = errors(out)
    assert (f"index entry 1 (offset {offset_rel}, position {position + 7}) "
            "does not point at the start of a batch") in problem
    assert dump(capsys, index_path)[0] == 0  # well-formed entries; only --verify compares with the log


def test_an_index_entry_whose_offset_does_not_match_the_batch(capsys, seg_dir):
    index_path = segment_files(seg_dir, ".index")[1]
    base = int(index_path.name[:20])
    rel, position = struct.unpack_from(">II", index_path.read_bytes(), 0)
    patch(index_path, 0, ">I", rel + 1)
    code, out, _ = dump(capsys, "--verify", index_path)
    assert code == 1
    [problem] = errors(out)
    assert f"index entry 0 (offset {base + rel + 1}, position {position}) does not match" in problem
    assert f"index offset: {base + rel + 1}, log offset: {base + rel}" in problem


def test_a_decreasing_index(capsys, seg_dir):
    index_path = segment_files(seg_dir, ".index")[0]
    data = index_path.read_bytes()
    index_path.write_bytes(data[8:16] + data[:8] + data[16:])  # swap entries 0 and 1
    code, out, _ = dump(capsys, "--verify", index_path)
    assert code == 1
    [problem] = errors(out)  # both entries still name real batches: only the order is wrong
    assert "index entry 1" in problem and "does not increase" in problem


def test_a_partial_index_entry(capsys, seg_dir):
    index_path = segment_files(seg_dir, ".index")[0]
    with open(index_path, "ab") as f:
        f.write(b"\x01\x02\x03")
    code, out, _ = dump(capsys, index_path)
    assert code == 1
    assert "ends with 3 bytes that are not a whole 8-byte entry" in errors(out)[0]


def test_a_time_index_entry_below_a_record_at_or_below_its_offset(capsys, seg_dir):
    tindex_path = segment_files(seg_dir, ".timeindex")[0]
    entries = [struct.unpack_from(">qI", tindex_path.read_bytes(), 12 * i) for i in range(3)]
    (ts0, _), (ts1, rel1) = entries[0], entries[1]
    assert ts0 + 1 < ts1
    patch(tindex_path, 12, ">q", ts0 + 1)  # still above entry 0, but below the records it covers
    code, out, _ = dump(capsys, "--verify", tindex_path)
    assert code == 1
    [problem] = errors(out)
    assert f"time index entry 1 (timestamp {ts0 + 1}, offset {rel1})" in problem
    assert f"a record at or below offset {rel1} has timestamp {ts1}" in problem


def test_a_time_index_entry_in_the_middle_of_a_batch_is_checked_record_by_record(capsys, seg_dir):
    tindex_path = segment_files(seg_dir, ".timeindex")[0]
    ts, rel = struct.unpack_from(">qI", tindex_path.read_bytes(), 0)
    # offset ``rel - 1`` is the middle record of its batch, whose newest record is at ``rel``
    patch(tindex_path, 0, ">qI", ts - 1, rel - 1)
    assert dump(capsys, "--verify", tindex_path)[0] == 0
    patch(tindex_path, 0, ">qI", ts - 2, rel - 1)
    code, out, _ = dump(capsys, "--verify", tindex_path)
    assert code == 1 and f"has timestamp {ts - 1}" in errors(out)[0]


def test_a_decreasing_time_index(capsys, seg_dir):
    tindex_path = segment_files(seg_dir, ".timeindex")[0]
    data = tindex_path.read_bytes()
    tindex_path.write_bytes(data[12:24] + data[:12] + data[24:])
    code, out, _ = dump(capsys, "--verify", tindex_path)
    assert code == 1
    assert any("time index entry 1" in e and "does not increase" in e for e in errors(out))


def test_a_time_index_entry_beyond_the_log(capsys, seg_dir):
    tindex_path = segment_files(seg_dir, ".timeindex")[0]
    with open(tindex_path, "ab") as f:
        f.write(struct.pack(">qI", 2**62, 10_000))
    code, out, _ = dump(capsys, "--verify", tindex_path)
    assert code == 1
    assert "names an offset beyond the log's last offset" in errors(out)[0]


def test_a_log_verify_checks_its_sibling_indexes(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    index_path = segment_files(seg_dir, ".index")[0]
    patch(index_path, 4, ">I", 3)
    code, out, _ = dump(capsys, "--verify", log_path)
    assert code == 1
    assert f"Checking {index_path} against {log_path}" in out
    assert "index entry 0" in errors(out)[0]
    assert dump(capsys, log_path)[0] == 0
    # named together, the index is checked once, in its own dump
    code, out, _ = dump(capsys, "--verify", log_path, index_path)
    assert code == 1 and len(errors(out)) == 1 and f"Checking {index_path}" not in out


def test_offsets_that_do_not_increase_fail_verify_only(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    position, _ = batch_positions(log_path)[3]
    patch(log_path, position, ">q", 0)  # the base offset is outside the CRC
    code, out, _ = dump(capsys, "--verify", log_path)
    assert code == 1
    assert any(f"batch at position {position}: base offset 0 does not follow" in e for e in errors(out))
    assert dump(capsys, log_path)[0] == 0


def test_a_batch_reaching_into_the_next_segment_fails_verify(capsys, seg_dir):
    first, second = segment_files(seg_dir, ".log")[:2]
    next_base = int(second.name[:20])
    position, _ = batch_positions(first)[-1]
    patch(first, position, ">q", next_base - 1)  # still above the batch before it
    code, out, _ = dump(capsys, "--verify", first)
    assert code == 1
    assert any(f"batch at position {position}: last offset {next_base + 1} reaches into the next "
               f"segment, which starts at offset {next_base}" in e for e in errors(out)), out


def test_next_segment_base():
    names = ["00000000000000000000.log", "00000000000000000045.index", "00000000000000000087.log",
             "00000000000000000120.log", "leader-epoch-checkpoint", "00000000000000000050.log.deleted"]
    assert [next_segment_base(names, b) for b in (0, 87, 120)] == [87, 120, None]


def test_records_that_do_not_decode_under_a_valid_crc(capsys, tmp_path):
    good = build_batch([b"x"], timestamp_ms=5)
    body = b"\xc1 not msgpack"
    tail = bytearray(good[CRC_START:HEADER_SIZE] + body)
    head = bytearray(good[:CRC_START])
    struct.pack_into(">i", head, 8, len(head) + len(tail) - 12)
    struct.pack_into(">I", head, 17, crc32c(bytes(tail)))
    log_path = tmp_path / "00000000000000000000.log"
    log_path.write_bytes(bytes(head + tail))
    code, out, _ = dump(capsys, "--print-data", log_path)
    assert code == 1
    assert "isvalid: true" in out and "not valid msgpack" in errors(out)[0]


def test_an_index_without_its_log_cannot_be_verified(capsys, seg_dir):
    index_path = segment_files(seg_dir, ".index")[0]
    index_path.with_suffix(".log").unlink()
    assert dump(capsys, index_path)[0] == 0
    code, out, _ = dump(capsys, "--verify", index_path)
    assert code == 1 and "does not exist" in errors(out)[0]


def test_empty_files_dump_cleanly(capsys, tmp_path):
    for suffix in (".log", ".index", ".timeindex"):
        (tmp_path / f"00000000000000000042{suffix}").write_bytes(b"")
    code, out, _ = dump(capsys, "--verify", "--print-data", *sorted(tmp_path.iterdir()))
    assert (code, errors(out)) == (0, [])
    assert "Log starting offset: 42" in out


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "00000000000000000000.log", "no such file"),
    (lambda d: d, "is a directory"),
    (lambda d: _touch(d / "segment.log"), "not a segment file name"),
    (lambda d: _touch(d / "0000000000000000000.log"), "not a segment file name"),
    (lambda d: _touch(d / "00000000000000000000.txt"), "not a segment file name"),
    (lambda d: _touch(d / "00000000000000000000.log.deleted"), "not a segment file name"),
    (lambda d: _touch(d / ("\u0660" * 20 + ".log")), "not a segment file name"),
    (lambda d: _touch(d / ("0" * 19 + "\u00b2.log")), "not a segment file name"),
])
def test_files_that_cannot_be_dumped_are_usage_errors(capsys, tmp_path, make, message):
    path = make(tmp_path)
    code, out, err = dump(capsys, path)
    assert (code, out) == (2, "")
    assert err.startswith("tidelog dump-log: error: ") and message in err and "Traceback" not in err


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_a_usage_error(capsys, seg_dir):
    log_path = segment_files(seg_dir, ".log")[0]
    log_path.chmod(0)
    code, _, err = dump(capsys, log_path)
    assert code == 2 and "Permission denied" in err


def test_other_files_are_still_dumped_after_a_usage_error(capsys, seg_dir):
    code, out, err = dump(capsys, seg_dir / "missing.log", segment_files(seg_dir, ".log")[0])
    assert code == 2 and "missing.log" in err and "Log starting offset: 0" in out


def test_help_and_unknown_commands(capsys):
    assert main(["--help"]) == 0
    assert "dump-log" in capsys.readouterr().out
    assert main(["bogus"]) == 2
    assert "invalid choice: 'bogus'" in capsys.readouterr().err
    assert main([]) == 2
    assert "required" in capsys.readouterr().err
    assert main(["dump-log"]) == 2
    assert "FILE" in capsys.readouterr().err


def test_the_installed_command(seg_dir):
    """Once through a real process: the console script (or ``python -m tidelog.broker.cli``)."""
    script = Path(sys.executable).with_name("tidelog")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tidelog.broker.cli"]
    log_path = segment_files(seg_dir, ".log")[0]
    ok = subprocess.run([*command, "dump-log", "--verify", str(log_path)],
                        capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stderr) == (0, "")
    assert ok.stdout.startswith(
        f"Dumping {log_path}\nLog starting offset: 0\nbaseOffset: 0 lastOffset: 2 count: 3 ")
    with open(log_path, "r+b") as f:
        f.truncate(log_path.stat().st_size - 1)
    torn = subprocess.run([*command, "dump-log", str(log_path)],
                          capture_output=True, text=True, timeout=60)
    assert torn.returncode == 1 and "ERROR: torn tail at position" in torn.stdout and torn.stderr == ""


# -- arbitrary input --------------------------------------------------------------------------


def _run_quietly(*args) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["dump-log", *map(str, args)])
    return code, out.getvalue() + err.getvalue()


def _valid_crc_batch(body: bytes, header_fields: bytes) -> bytes:
    """A batch with sound framing and a correct CRC around arbitrary header fields and records."""
    tail = header_fields + body
    return struct.pack(">qiibI", 0, len(tail) + 9, 0, 2, crc32c(tail)) + tail


msgpack_values = st.recursive(
    st.none() | st.integers(-2**63, 2**64 - 1) | st.binary(max_size=8) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=5), max_leaves=20)
int64 = st.integers(-2**63, 2**63 - 1)


@st.composite
def records_blocks(draw, count: int) -> bytes:
    """Records as the grammar has them (timestamps anywhere), or any msgpack, or any bytes."""
    well_formed = st.lists(st.tuples(st.integers(-2**40, 2**40), st.binary(max_size=6) | st.none()),
                           min_size=count, max_size=count).map(
        lambda rs: [[ts, i, None, v, [["h", v]]] for i, (ts, v) in enumerate(rs)])
    value = draw(well_formed | msgpack_values)
    return draw(st.just(msgpack.packb(value, use_bin_type=True)) | st.binary(max_size=100))


@st.composite
def crc_valid_batches(draw) -> bytes:
    """Sound framing, a correct CRC, consistent counts and a known codec: only the records vary."""
    codec = draw(st.sampled_from([0, 1, 3, 4]))
    attributes = codec | draw(st.sampled_from([0, 0x08, 0x10, 0x20]))
    count = draw(st.integers(1, 4))
    first_ts, max_ts = draw(int64), draw(int64)
    fields = struct.pack(">hiqqqhii", attributes, count - 1, first_ts, max_ts, -1, -1, -1, count)
    return _valid_crc_batch(compress(codec, draw(records_blocks(count))), fields)


garbage_logs = st.one_of(
    st.binary(max_size=600),
    st.builds(lambda fields, body, rest: _valid_crc_batch(body, fields) + rest,
              st.binary(min_size=40, max_size=40), st.binary(max_size=200), st.binary(max_size=80)),
    st.builds(lambda batches, rest: b"".join(batches) + rest,
              st.lists(crc_valid_batches(), min_size=1, max_size=3), st.binary(max_size=80)),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(log=garbage_logs, index=st.binary(max_size=100), tindex=st.binary(max_size=100))
def test_garbage_never_raises(tmp_path_factory, log, index, tindex):
    directory = tmp_path_factory.mktemp("garbage")
    paths = []
    for suffix, data in ((".log", log), (".index", index), (".timeindex", tindex)):
        paths.append(directory / f"00000000000000000007{suffix}")
        paths[-1].write_bytes(data)
    for args in (["--verify", "--print-data", *paths], ["--verify", paths[0]], paths[1:]):
        code, output = _run_quietly(*args)
        assert code in (0, 1) and "Traceback" not in output


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_real_segments_never_raise(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("damaged")
    write_log(directory)
    victim = data.draw(st.sampled_from(sorted(directory.glob("0*"))))
    raw = bytearray(victim.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    victim.write_bytes(bytes(raw[:cut]))
    code, _ = _run_quietly("--verify", "--print-data", *sorted(directory.glob("0*")))
    assert code in (0, 1)


# -- producer state snapshots ---------------------------------------------------------------


def test_a_producer_snapshot_shows_each_producer_and_a_damaged_one_is_an_error(capsys, tmp_path):
    from tidelog.broker.log.producer_state import BatchMetadata, ProducerStateEntry, encode_snapshot

    entries = [ProducerStateEntry(7, 1, [BatchMetadata(0, 4, 10, 14, 1700), BatchMetadata(5, 9, 20, 24, 1800)]),
               ProducerStateEntry(9, 0, [BatchMetadata(0, 0, 30, 30, 1900)])]
    good = tmp_path / "00000000000000000031.snapshot"
    good.write_bytes(encode_snapshot(31, entries))
    code, out, err = dump(capsys, good)
    assert (code, err, errors(out)) == (0, "", [])
    assert "Producer state as of offset 31: 2 producers" in out
    assert ("producerId: 7 producerEpoch: 1 firstSequence: 5 lastSequence: 9 firstOffset: 20 "
            "lastOffset: 24 lastTimestamp: 1800") in out
    assert "producerId: 9 producerEpoch: 0 firstSequence: 0" in out

    bad = tmp_path / "00000000000000000032.snapshot"
    data = bytearray(good.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    code, out, err = dump(capsys, bad)
    assert [e for e in errors(out) if "CRC mismatch" in e], out
