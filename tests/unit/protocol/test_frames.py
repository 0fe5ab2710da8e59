"""FrameDecoder: any chunking of a stream gives the same frames; the bound holds before buffering."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol.errors import FrameTooLargeError, InvalidRequestError
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT, PREFIX_SIZE, FrameDecoder, encode_frame

bodies_st = st.lists(st.binary(max_size=300), max_size=20)


def prefix(size: int) -> bytes:
    return struct.pack(">I", size)


def stream_of(bodies: list[bytes]) -> bytes:
    return b"".join(encode_frame(b) for b in bodies)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in zip(points, points[1:])]


def feed_all(decoder: FrameDecoder, parts) -> list[bytes]:
    frames = []
    for part in parts:
        frames.extend(decoder.feed(part))
    return frames


# --- encoding ---------------------------------------------------------------------------------


def test_encode_frame_is_big_endian_length_then_body():
    assert encode_frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert encode_frame(b"") == b"\x00\x00\x00\x00"
    assert encode_frame(bytearray(b"x" * 258)) == b"\x00\x00\x01\x02" + b"x" * 258
    assert encode_frame(memoryview(b"hi")) == b"\x00\x00\x00\x02hi"


def test_encode_frame_rejects_a_body_too_long_for_uint32():
    class Huge:  # stands in for a 4 GiB buffer without allocating one
        def __len__(self):
            return 1 << 32

    with pytest.raises(ValueError, match="4294967296 bytes"):
        encode_frame(Huge())


# --- any chunking gives the same frames --------------------------------------------------------


@given(bodies_st, st.data())
def test_random_splits_give_the_same_frames(bodies, data):
    stream = stream_of(bodies)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40))
    decoder = FrameDecoder()
    assert feed_all(decoder, chunks(stream, cuts)) == bodies
    assert decoder.buffered_bytes == 0


@given(bodies_st)
def test_whole_stream_and_byte_by_byte_give_the_same_frames(bodies):
    stream = stream_of(bodies)
    assert FrameDecoder().feed(stream) == bodies
    one_at_a_time = [stream[i:i + 1] for i in range(len(stream))]
    assert feed_all(FrameDecoder(), one_at_a_time) == bodies


@given(bodies_st, st.binary(min_size=1, max_size=50))
def test_an_incomplete_tail_stays_buffered(bodies, tail_body):
    tail = encode_frame(tail_body)[:-1]
    decoder = FrameDecoder()
    assert decoder.feed(stream_of(bodies) + tail) == bodies
    assert decoder.buffered_bytes == len(tail)
    assert decoder.feed(encode_frame(tail_body)[-1:]) == [tail_body]
    assert decoder.buffered_bytes == 0


def test_zero_length_frames_are_frames():
    assert FrameDecoder().feed(encode_frame(b"") * 3) == [b"", b"", b""]


def test_receive_data_then_next_frame_is_the_same_as_feed():
    decoder = FrameDecoder()
    decoder.receive_data(encode_frame(b"a") + encode_frame(b"bc") + b"\x00")
    assert decoder.next_frame() == b"a"
    assert decoder.next_frame() == b"bc"
    assert decoder.next_frame() is None
    assert decoder.buffered_bytes == 1


# --- the size bound ----------------------------------------------------------------------------


@given(st.integers(0, 1 << 20), st.integers(1, 1 << 31))
def test_oversize_is_rejected_from_the_prefix_alone(limit, excess):
    size = min(limit + excess, 0xFFFFFFFF)
    decoder = FrameDecoder(limit)
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(prefix(size))
    assert info.value.size == size and info.value.limit == limit
    assert f"{size} bytes" in str(info.value) and f"{limit} bytes" in str(info.value)
    assert decoder.buffered_bytes == 0 and decoder.failed


def test_oversize_prefix_split_over_chunks_raises_when_its_last_byte_arrives():
    decoder = FrameDecoder(1000)
    assert decoder.feed(prefix(1001)[:3]) == []
    with pytest.raises(FrameTooLargeError):
        decoder.feed(prefix(1001)[3:])
    assert decoder.buffered_bytes == 0


def test_body_bytes_after_an_oversize_prefix_are_not_kept():
    decoder = FrameDecoder(1000)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(prefix(5000) + b"x" * 900)
    assert decoder.buffered_bytes == 0


def test_the_limit_is_inclusive():
    assert FrameDecoder(5).feed(encode_frame(b"12345")) == [b"12345"]


def test_the_default_limit_is_100_mib():
    assert MAX_FRAME_BYTES_DEFAULT == 100 * 1024 * 1024
    decoder = FrameDecoder()
    assert decoder.feed(prefix(MAX_FRAME_BYTES_DEFAULT)) == []
    assert decoder.buffered_bytes == PREFIX_SIZE
    with pytest.raises(FrameTooLargeError):
        FrameDecoder().feed(prefix(MAX_FRAME_BYTES_DEFAULT + 1))


def test_frame_too_large_is_an_invalid_request():
    with pytest.raises(InvalidRequestError):
        FrameDecoder(0).feed(prefix(1))


def test_a_failed_decoder_stays_failed():
    decoder = FrameDecoder(10)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(prefix(11))
    for call in (lambda: decoder.feed(encode_frame(b"ok")), lambda: decoder.feed(b""),
                 lambda: decoder.receive_data(b"x"), decoder.next_frame):
        with pytest.raises(FrameTooLargeError, match="11 bytes"):
            call()
    assert decoder.buffered_bytes == 0


def test_frames_before_an_oversize_prefix_can_still_be_taken():
    decoder = FrameDecoder(10)
    decoder.receive_data(encode_frame(b"first") + prefix(11))
    assert decoder.next_frame() == b"first"
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()


def test_a_negative_limit_is_refused():
    with pytest.raises(ValueError):
        FrameDecoder(-1)


# --- linear work in both worst cases (quadratic copying would not finish in reasonable time) --


def test_many_small_frames_in_one_chunk():
    n = 200_000
    frames = FrameDecoder().feed(encode_frame(b"abc") * n)
    assert len(frames) == n and frames[0] == frames[-1] == b"abc"


def test_one_large_frame_in_many_small_chunks():
    body = bytes(range(256)) * (64 * 1024)  # 16 MiB
    frame = encode_frame(body)
    decoder = FrameDecoder()
    step = 4096
    out = []
    for i in range(0, len(frame), step):
        out.extend(decoder.feed(frame[i:i + step]))
        if i + step < len(frame):
            assert decoder.buffered_bytes == i + step
    assert out == [body]
    assert decoder.buffered_bytes == 0


# -- one whole frame per read ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_read_of_exactly_one_frame_is_taken_whole(kind):
    d = FrameDecoder()
    assert d.whole_frame(kind(encode_frame(b"abc"))) == b"abc"
    assert d.buffered_bytes == 0
    assert d.feed(kind(encode_frame(b"xyz"))) == [b"xyz"]


def test_whole_frame_declines_anything_but_one_frame_and_changes_nothing():
    d = FrameDecoder(max_frame_bytes=8)
    one = encode_frame(b"abc")
    for data in (one + one, one[:-1], one[:2], encode_frame(b"123456789")):
        assert d.whole_frame(data) is None
        assert d.buffered_bytes == 0 and not d.failed
    d.receive_data(one[:2])  # something buffered: the next read continues it
    assert d.whole_frame(one) is None
    d.receive_data(one[2:])
    assert d.next_frame() == b"abc"
    assert d.whole_frame(one) == b"abc"  # only consumed bytes left: whole again
    assert d.buffered_bytes == 0


def test_an_oversize_lone_frame_still_fails_the_decoder():
    d = FrameDecoder(max_frame_bytes=4)
    with pytest.raises(FrameTooLargeError):
        d.feed(encode_frame(b"12345"))
    assert d.failed and d.whole_frame(encode_frame(b"1")) is None
    with pytest.raises(FrameTooLargeError):
        d.feed(encode_frame(b"1"))
