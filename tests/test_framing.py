"""LineSplitter: bytes in, lines out, whatever the chunking; over-long lines dropped."""

from __future__ import annotations

import itertools

import pytest
from fuzz_size import inputs
from hypothesis import given, settings
from hypothesis import strategies as st
from peak_memory import peak_while

from acp_bridge.wire.framing import (
    DEFAULT_LINE_LIMIT,
    JOIN_LIMIT,
    Item,
    Line,
    LineSplitter,
    LongLineStart,
    OverlongLine,
    join_lines,
)


def feed_all(splitter: LineSplitter, *chunks: bytes | bytearray) -> list[Item]:
    out: list[Item] = []
    for chunk in chunks:
        out += splitter.feed(chunk)
    return out + splitter.close()


def test_lines_come_out_whole_whatever_the_chunk_boundaries() -> None:
    stream = b'{"a":1}\n{"b":"x y"}\n\n{"c":[1,2]}\n'
    expected = [Line(b'{"a":1}'), Line(b'{"b":"x y"}'), Line(b""), Line(b'{"c":[1,2]}')]
    for size in range(1, len(stream) + 1):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert feed_all(LineSplitter(), *chunks) == expected, size


def test_every_two_way_split_gives_the_same_lines() -> None:
    stream = b'{"jsonrpc":"2.0","method":"x"}\r\n{"id":1}\n'
    for cut in range(len(stream) + 1):
        assert feed_all(LineSplitter(), stream[:cut], stream[cut:]) == [
            Line(b'{"jsonrpc":"2.0","method":"x"}'),
            Line(b'{"id":1}'),
        ]


def test_crlf_terminator_is_not_part_of_the_frame() -> None:
    assert feed_all(LineSplitter(), b"one\r\ntwo\r", b"\nthree\n") == [
        Line(b"one"),
        Line(b"two"),
        Line(b"three"),
    ]


def test_carriage_return_inside_a_line_is_kept() -> None:
    assert feed_all(LineSplitter(), b"a\rb\n") == [Line(b"a\rb")]


def test_final_line_without_newline_still_counts() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":1}\n{"b":2}') == [Line(b'{"a":1}')]
    assert splitter.buffered == len(b'{"b":2}')
    assert splitter.close() == [Line(b'{"b":2}')]
    assert splitter.close() == []


def test_close_with_nothing_buffered_gives_nothing() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"x\n") == [Line(b"x")]
    assert splitter.close() == []


def test_line_exactly_at_the_limit_passes() -> None:
    assert feed_all(LineSplitter(5), b"12345\n") == [Line(b"12345")]
    assert feed_all(LineSplitter(5), b"12", b"345", b"\n") == [Line(b"12345")]


def test_line_at_the_limit_may_end_in_crlf() -> None:
    assert feed_all(LineSplitter(5), b"12345\r\n") == [Line(b"12345")]
    assert feed_all(LineSplitter(5), b"12345\r", b"\n") == [Line(b"12345")]


def test_line_one_byte_over_the_limit_is_reported() -> None:
    assert feed_all(LineSplitter(5), b"123456\n") == [OverlongLine(6)]
    assert feed_all(LineSplitter(5), b"123456\r\n") == [OverlongLine(7)]


def test_overlong_line_is_reported_once_with_its_full_size() -> None:
    splitter = LineSplitter(10)
    out = splitter.feed(b"ok\n" + b"x" * 7)
    for _ in range(100):
        out += splitter.feed(b"y" * 7)
    out += splitter.feed(b"z\nafter\n")
    assert out == [Line(b"ok"), OverlongLine(7 + 700 + 1), Line(b"after")]


def test_overlong_line_is_not_held_in_memory() -> None:
    splitter = LineSplitter(1000)
    for _ in range(100):
        splitter.feed(b"x" * 999)
        assert splitter.buffered <= 1001
    assert splitter.feed(b"\n") == [OverlongLine(99_900)]


def test_overlong_final_line_without_newline_is_reported_at_close() -> None:
    splitter = LineSplitter(3)
    assert splitter.feed(b"abcdef") == []
    assert splitter.close() == [OverlongLine(6)]


def test_overlong_line_in_one_chunk_between_good_lines() -> None:
    assert feed_all(LineSplitter(4), b"a\n" + b"b" * 50 + b"\nc\n") == [
        Line(b"a"),
        OverlongLine(50),
        Line(b"c"),
    ]


def test_bytearray_input_is_copied_not_aliased() -> None:
    splitter = LineSplitter()
    chunk = bytearray(b"abc")
    splitter.feed(chunk)
    chunk[:] = b"XYZ"
    assert splitter.feed(b"\n") == [Line(b"abc")]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LineSplitter(0)


def test_default_limit_is_64_mib() -> None:
    assert LineSplitter().limit == DEFAULT_LINE_LIMIT == 64 * 1024 * 1024


def test_small_frames_are_written_as_one_buffer() -> None:
    assert list(join_lines([b"a", b"bc", b"d"])) == [b"a\nbc\nd\n"]


def test_large_frame_is_written_from_its_own_buffer_in_order() -> None:
    large = b"x" * JOIN_LIMIT
    buffers = list(join_lines([b"a", large, b"b", large]))
    assert buffers == [b"a\n", large, b"\nb\n", large, b"\n"]
    assert buffers[1] is large  # not copied


def test_no_frames_write_nothing() -> None:
    assert list(join_lines([])) == []


@pytest.mark.parametrize("read_size", [8, 4096, 65536])
def test_a_line_costs_at_most_twice_its_size_however_small_the_reads(read_size: int) -> None:
    # A peer that writes slowly is read in small pieces; each piece must not cost a Python
    # object of its own while the line is buffered.
    size = 1 << 20
    reads = [b"a" * read_size] * (size // read_size)  # the same object: only the splitter counts
    splitter = LineSplitter()

    def split() -> None:
        for piece in reads:
            splitter.feed(piece)
        (line,) = splitter.feed(b"\r\n")
        assert isinstance(line, Line) and len(line.data) == size

    assert peak_while(split) < 2.3 * size


def test_lines_complete_in_one_read_are_not_copied_twice() -> None:
    data = b"x" * (1 << 20) + b"\n"
    splitter = LineSplitter()
    assert peak_while(lambda: splitter.feed(data)) < 1.3 * len(data)


def expected_lines(stream: bytes, limit: int) -> list[Item]:
    """What the splitter must give for ``stream``, however it arrives: every line (and a
    final one without a newline), a trailing ``\\r`` removed, over-long ones by size."""
    pieces = stream.split(b"\n")
    if not pieces[-1]:
        pieces.pop()  # the stream ended with a newline: no final partial line
    out: list[Item] = []
    for piece in pieces:
        frame = piece[:-1] if piece.endswith(b"\r") else piece
        out.append(Line(frame) if len(frame) <= limit else OverlongLine(len(piece)))
    return out


@settings(max_examples=500, deadline=None)
@given(
    stream=st.lists(st.sampled_from([b"a", b"bc", b"\r", b"\n", b"\r\n", b"xyz1"])).map(b"".join),
    limit=st.integers(1, 8),
    cuts=st.lists(st.integers(0, 64), max_size=8),
    as_bytearray=st.booleans(),
)
def test_any_chunking_gives_the_lines_of_the_whole_stream(
    stream: bytes, limit: int, cuts: list[int], as_bytearray: bool
) -> None:
    bounds = sorted({0, len(stream), *(c for c in cuts if c <= len(stream))})
    chunks: list[bytes | bytearray] = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    if as_bytearray:  # what some streams hand out
        chunks = [bytearray(chunk) for chunk in chunks]
    splitter = LineSplitter(limit)
    got = feed_all(splitter, *chunks)
    assert got == expected_lines(stream, limit)
    assert all(type(item.data) is bytes for item in got if isinstance(item, Line))
    assert splitter.buffered == 0


class GatheredFirst(LineSplitter):
    """The splitter as it was before a long line's first read was offered as it came: every
    start is kept in the buffer and offered from it."""

    def _starts_long_line(self, data: bytes | bytearray) -> bool:
        return False


@settings(max_examples=inputs(400), deadline=None)
@given(
    stream=st.lists(
        st.sampled_from([b"a", b"x" * 7, b"y" * 40, b"\r", b"\n", b"\r\n", b"z" * 90])
    ).map(b"".join),
    sizes=st.tuples(st.sampled_from([8, 30, 64, 200]), st.sampled_from([1, 4, 16, 30, 64])),
    cuts=st.lists(st.integers(0, 400), max_size=10),
    holds=st.lists(st.booleans(), max_size=10),
    as_bytearray=st.booleans(),
)
def test_a_long_lines_first_read_is_offered_as_gathering_it_first_would(
    stream: bytes, sizes: tuple[int, int], cuts: list[int], holds: list[bool], as_bytearray: bool
) -> None:
    """Item for item, with the reader holding some starts and passing the others on (the
    line limit and ``stream_after`` in ``sizes``)."""
    limit, stream_after = sizes
    bounds = sorted({0, len(stream), *(c for c in cuts if c <= len(stream))})
    reads = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    offered, gathered = LineSplitter(limit, stream_after), GatheredFirst(limit, stream_after)
    decisions = iter(holds)
    for data in reads:
        items = offered.feed(bytearray(data) if as_bytearray else data)
        assert items == gathered.feed(data)
        for item in items:
            if isinstance(item, LongLineStart) and next(decisions, False):
                offered.hold(item.data)
                gathered.hold(item.data)
        assert all(type(getattr(item, "data", b"")) is bytes for item in items)
    assert offered.close() == gathered.close()
    assert offered.buffered == gathered.buffered == 0
