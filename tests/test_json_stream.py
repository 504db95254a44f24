"""The incremental validator agrees with ``jsonrpc.parse`` on every line, however split."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_bridge import jsonrpc
from acp_bridge.json_stream import Large, LineValidator
from acp_bridge.jsonrpc import FrameError

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def parse_verdict(line: bytes) -> bool:
    try:
        jsonrpc.parse_in_full(line)
    except FrameError as exc:
        return exc.code != jsonrpc.PARSE_ERROR  # valid JSON, not a message
    return True


def stream_verdict(line: bytes, cuts: list[int]) -> bool:
    validator = LineValidator()
    try:
        start = 0
        for cut in sorted(set(cuts)):
            validator.feed(line[start:cut])
            start = cut
        validator.feed(line[start:])
        validator.finish()
    except FrameError:
        return False
    return True


def splits(line: bytes, rng: random.Random) -> list[list[int]]:
    every = list(range(1, len(line)))
    return [[], every, rng.sample(every, min(len(every), 5))]


def spaced(value: object, rng: random.Random) -> bytes:
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0]))
    return text.replace("\n", rng.choice(["", " ", "\t", "\r"])).encode()


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.randoms(use_true_random=False))
def test_valid_json_is_valid_however_split(value: object, rng: random.Random) -> None:
    line = spaced(value, rng)
    for cuts in splits(line, rng):
        assert stream_verdict(line, cuts), (line, cuts)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.randoms(use_true_random=False), st.data())
def test_mutated_lines_get_the_parsers_verdict(
    value: object, rng: random.Random, data: st.DataObject
) -> None:
    line = bytearray(spaced(value, rng))
    for _ in range(data.draw(st.integers(1, 3))):
        at = rng.randrange(len(line) + 1)
        action = rng.random()
        if action < 0.4 and line:
            del line[min(at, len(line) - 1)]
        elif action < 0.8:
            line.insert(at, rng.choice(b'{}[]",:\\ u0123456789eE.+-tfnaxl\t\r\x01\xc3\xa9\xff'))
        else:
            line[at:at] = rng.choice(
                [b"NaN", b"-Infinity", b"\\ud800", b"\xed\xa0\x80", b"\xef\xbb\xbf"]
            )
    raw = bytes(line).replace(b"\n", b"")
    expected = parse_verdict(raw)
    for cuts in splits(raw, rng):
        assert stream_verdict(raw, cuts) == expected, (raw, cuts)


@pytest.mark.parametrize(
    "line",
    [
        b'{"a":"\\u12"}',
        b'{"a":NaN}',
        b'{"a":-Infinity}',
        b'{"a":1.}',
        b'{"a":01}',
        b'{"a":"tab\there"}',
        b'\xef\xbb\xbf{"a":1}',
        b'{"a":"\xed\xa0\x80"}',
        b'{"a":1}}',
        b'{"a":1',
        b'{"a" 1}',
        b"[1,]",
        b'{"a":tru}',
        b"",
        b"   ",
    ],
)
def test_invalid_lines_are_refused_however_split(line: bytes) -> None:
    assert not parse_verdict(line)
    for cuts in ([], list(range(1, len(line)))):
        assert not stream_verdict(line, cuts)


def test_deep_nesting_has_no_limit() -> None:
    line = b"[" * 100_000 + b"]" * 100_000
    assert stream_verdict(line, list(range(0, len(line), 4096)))


def test_envelope_keeps_small_members_and_the_type_of_large_ones() -> None:
    blob = "x" * 300_000
    line = json.dumps(
        {"jsonrpc": "2.0", "id": 7, "method": "fs/write_text_file", "params": {"content": blob}}
    ).encode()
    validator = LineValidator()
    validator.feed(line[:200_000])
    envelope = validator.envelope
    assert envelope.members == {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "fs/write_text_file",
        "params": Large(dict),
    }
    assert envelope.open_member == "params"
    validator.feed(line[200_000:])
    envelope = validator.finish()
    assert envelope.open_member is None
    assert envelope.kind() is jsonrpc.Kind.REQUEST
    # A member after the large one, and a duplicate key: the last one counts, as in json.
    validator = LineValidator()
    validator.feed(b'{"method":"a","params":["' + b"y" * 100 + b'"],"id":"q","method":"b"}')
    envelope = validator.finish()
    assert envelope.members == {"method": "b", "params": Large(list), "id": "q"}


def test_a_top_level_key_split_across_pieces_is_read_whole() -> None:
    line = b'{"jsonr' + b'pc":"2.0","met' + b'hod":"x","par' + b'ams":{}}'
    validator = LineValidator()
    for piece in (line[:7], line[7:20], line[20:34], line[34:]):
        validator.feed(piece)
    assert validator.finish().members == {"jsonrpc": "2.0", "method": "x", "params": Large(dict)}


def test_a_number_longer_than_64_kib_is_refused_not_held() -> None:
    validator = LineValidator()
    validator.feed(b'{"a":1.')
    with pytest.raises(FrameError, match="longer than 64 KiB"):
        for _ in range(10):
            validator.feed(b"0" * 10_000)
