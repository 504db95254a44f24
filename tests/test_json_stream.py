"""The incremental validator agrees with ``jsonrpc.parse`` on every line, however split.

How many inputs each property draws: :mod:`fuzz_size`.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import threading
import tracemalloc
from collections.abc import Callable
from functools import partial
from itertools import cycle

import pytest
from fuzz_size import inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acp_bridge.wire import json_stream, jsonrpc
from acp_bridge.wire.json_stream import CUT_METHOD, Large, LineValidator, judge
from acp_bridge.wire.jsonrpc import FrameError

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


def fed(line: bytes, cuts: list[int]) -> json_stream.Envelope:
    """The envelope of ``line`` fed to a validator in pieces ending at ``cuts``."""
    validator = LineValidator()
    start = 0
    for cut in sorted(set(cuts)):
        validator.feed(line[start:cut])
        start = cut
    validator.feed(line[start:])
    return validator.finish()


def stream_verdict(line: bytes, cuts: list[int]) -> bool:
    try:
        fed(line, cuts)
    except FrameError:
        return False
    return True


def splits(line: bytes, rng: random.Random) -> list[list[int]]:
    every = list(range(1, len(line)))
    return [[], every, rng.sample(every, min(len(every), 5))]


def spaced(value: object, rng: random.Random) -> bytes:
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 0]))
    return text.replace("\n", rng.choice(["", " ", "\t", "\r"])).encode()


@settings(max_examples=inputs(400), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values, st.randoms(use_true_random=False))
def test_valid_json_is_valid_however_split(value: object, rng: random.Random) -> None:
    line = spaced(value, rng)
    for cuts in splits(line, rng):
        assert stream_verdict(line, cuts), (line, cuts)


@settings(max_examples=inputs(600), suppress_health_check=[HealthCheck.too_slow], deadline=None)
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


@settings(max_examples=inputs(60), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values, st.randoms(use_true_random=False), st.booleans())
def test_lines_past_the_long_look_get_the_parsers_verdict(
    value: object, rng: random.Random, damaged: bool
) -> None:
    """Lines longer than json's scanner looks at once (64 KiB), with containers nested so
    that scans fail and are not tried again inside what they read
    (``LineValidator._scan_from``): whole or damaged at one place, in any pieces, judged
    as the parser judges them."""
    item = spaced(value, rng)
    body = b"[" + b",".join([item] * max(1, 96 * 1024 // (len(item) + 1))) + b"]"
    for _ in range(rng.randint(0, 4)):
        body = rng.choice([b'{"k":%s,"n":[1,{"a":"x"}]}', b'[%s,{"z":[]}]', b"[[],%s]"]) % body
    line = bytearray(b'{"jsonrpc":"2.0","method":"m","params":%s}' % body)
    if damaged:
        at = rng.randrange(len(line))
        line[at : at + 1] = rng.choice([b"", b"]", b"}", b",", b'"', b"\x01", b"[1"])
    raw = bytes(line)
    expected = parse_verdict(raw)
    every = list(range(rng.randint(997, 70_000), len(raw), rng.randint(997, 70_000)))
    for cuts in ([], every, rng.sample(range(1, len(raw)), 8)):
        assert stream_verdict(raw, cuts) == expected, (len(raw), cuts[:3])


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


def test_a_top_level_string_split_across_pieces_is_read_whole() -> None:
    # A read may end inside the method or the id that follows a large member: routing
    # needs them as they are (a split method was read as "" and an id as too long).
    line = (
        b'{"jsonrpc":"2.0","params":{"t":"' + b"x" * 5000 + b'"},'
        b'"method":"session/n\\u0065w","id":"req-\xc3\xa9-7"}'
    )
    for cuts in ([], list(range(1, len(line)))):
        envelope = fed(line, cuts)
        assert envelope.members == {
            "jsonrpc": "2.0",
            "params": Large(dict),
            "method": "session/new",
            "id": "req-\u00e9-7",
        }, cuts[:1]
        assert envelope.kind() is jsonrpc.Kind.REQUEST
    # A long one still counts as large, however it arrives.
    long_id = b'{"jsonrpc":"2.0","method":"m","id":"' + b"i" * 2000 + b'"}'
    for cuts in ([], list(range(1, len(long_id), 100))):
        assert fed(long_id, cuts).members["id"] == Large(str)


def test_numbers_of_any_length_are_judged_as_they_arrive() -> None:
    digits = "7" * 200_000  # far beyond int()'s 4,300 digits
    for number, valid in (
        (digits, True),
        ("-" + digits + ".5e+" + digits, True),
        ("0" + digits, False),
        (digits + ".", False),
        (digits + "e", False),
        (digits + ".5.5", False),
    ):
        line = b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"n":%s}}' % number.encode()
        assert parse_verdict(line) is valid, number[-8:]
        # A piece at a time: each feed judges its own bytes (once quadratic: held whole).
        assert stream_verdict(line, list(range(0, len(line), 997))) is valid, number[-8:]


def test_a_long_integer_id_is_read_from_the_envelope_up_to_a_kibibyte() -> None:
    for digits in ("1234567890" * 100, "1234567890" * 500):
        line = b'{"jsonrpc":"2.0","id":%s,"method":"x","params":{}}' % digits.encode()
        for cuts in ([], list(range(0, len(line), 7))):
            envelope = fed(line, cuts)
            if len(digits) <= 1024:
                assert envelope.request_id() == int(digits) == jsonrpc.parse(line).id
            else:
                # Too long to keep: such a line is parsed whole, never routed by its start.
                assert envelope.members["id"] == Large(int)
                with pytest.raises(FrameError, match="id is longer"):
                    envelope.kind()


def messages(value: object, rng: random.Random) -> bytes:
    body = spaced(value, rng)
    roll = rng.random()
    if roll < 0.4:
        return b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % body
    if roll < 0.7:
        return b'{"jsonrpc":"2.0","id":3,"result":%s,"x":1}' % body
    # An error object cut before its code or message (or both) arrived.
    return b'{"jsonrpc":"2.0","id":3,"error":{"data":%s,"code":-1,"message":"m"}}' % body


def check_cut(line: bytes, cuts: list[int]) -> None:
    """Fed up to the last cut, the judged bytes and the cut ending make a message that a
    JSON reader takes for the cut notification (or an answer to no request)."""
    validator = LineValidator()
    start = 0
    judged = 0
    for cut in cuts:
        validator.feed(line[start:cut])
        start = cut
        assert judged <= validator.judged <= cut
        judged = validator.judged
    ending = validator.cut_ending()
    members = validator.envelope.members
    if ending is None:
        # Nothing that makes it a message has been read yet: such a start is not passed.
        assert type(members.get("method")) is not str and "id" not in members
        return
    frame = jsonrpc.parse(line[:judged] + ending)
    if type(members.get("method")) is str:
        assert (frame.method, frame.params) == (CUT_METHOD, {})
    else:
        assert frame.kind is jsonrpc.Kind.RESPONSE and frame.id is None


@settings(max_examples=inputs(300), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values, st.randoms(use_true_random=False))
def test_what_is_judged_can_always_be_ended_as_a_message(value: object, rng: random.Random) -> None:
    line = messages(value, rng)
    ends = rng.sample(range(1, len(line) + 1), min(len(line), 12))
    for end in ends:
        cuts = sorted({*rng.sample(range(1, end + 1), min(end, 3)), end})
        check_cut(line, cuts)


def test_a_line_judged_to_its_end_holds_back_its_closing_bracket() -> None:
    line = b'{"jsonrpc":"2.0","method":"m","params":{"a":[1,"x"]}}  '
    validator = LineValidator()
    validator.feed(line)
    assert validator.judged == line.index(b"}}") + 1
    assert validator.cut_ending() == b',"method":"_acp-bridge/cut_line","params":{}}'
    validator.finish()


@pytest.mark.parametrize(
    ("start", "released", "ending"),
    [
        (b'{"method":"m","params":{"t":"abc\\u00', b'{"method":"m","params":{"t":"abc', b'"}'),
        (b'{"method":"m","params":{"t":"\xc3', b'{"method":"m","params":{"t":"', b'"}'),
        (b'{"method":"m","params":[1,tr', b'{"method":"m","params":[1,', b"null]"),
        (b'{"method":"m","params":{"n":-1.', b'{"method":"m","params":{"n":-1.', b"0}"),
        (b'{"method":"m","params":{"k', b'{"method":"m","params":{"k', b'":null}'),
        (b'{"method":"m","params":{"k":', b'{"method":"m","params":{"k":', b"null}"),
        (b'{"id":4,"result":[[{}', b'{"id":4,"result":[[{}', b"]]"),
        # A top-level key cut short is closed as none a message has: "error" here would
        # make an answer with a result and an error, which nothing appended can undo.
        (b'{"id":4,"result":{},"error', b'{"id":4,"result":{},"error', b'_":null,"id":null}'),
        (b'{"id":4,"result":{},"err\\u006f', b'{"id":4,"result":{},"err\\u006f', b'_":null'),
        # An error object cut short is replaced by a whole one (the last of two wins).
        (b'{"id":4,"error":{"code":1,"data":"ab', b'{"id":4,"error":{"code":1,"data":"ab',
         b'"},"id":null,"error":{"code":-32603,'),
        (b'{"id":4,"error":', b'{"id":4,"error":', b'null,"id":null,"error":{"code":-32603,'),
    ],
)  # fmt: skip
def test_a_cut_ending_completes_exactly_what_was_judged(
    start: bytes, released: bytes, ending: bytes
) -> None:
    validator = LineValidator()
    validator.feed(start)
    assert start[: validator.judged] == released
    cut = validator.cut_ending()
    assert cut is not None and cut.startswith(ending)
    frame = jsonrpc.parse(released + cut)
    if frame.method is None:
        assert frame.kind is jsonrpc.Kind.RESPONSE and frame.id is None


def nested(levels: int, opener: bytes, closer: bytes, core: bytes = b"1") -> bytes:
    return opener * levels + core + closer * levels


@pytest.mark.parametrize(
    ("line", "valid"),
    [
        (nested(6_000, b"[", b"]"), True),
        (nested(3_000, b"[ ", b" ]"), True),
        (nested(3_000, b'{"d":', b"}"), True),
        (nested(3_000, b'[{"d" : ', b"}]"), True),
        (nested(3_000, b"[1,", b"]"), True),
        (nested(6_000, b"[", b"]")[:-1], False),
        (nested(6_000, b"[", b"]") + b"]", False),
        (nested(3_000, b'{"d":', b"]"), False),
        (nested(3_000, b'[{"d":', b"]}"), False),
        (nested(3_000, b'{"d":', b"}", core=b"[1,]"), False),
        (nested(3_000, b"[[1,2],", b"]"), True),
        (nested(3_000, b'{"a":{},"b":[1," ]"],"c":', b"}"), True),
        # A malformed or wrongly closed flat container half way in.
        (nested(1_500, b"[[1,2],", b"]", core=nested(1_500, b"[[1,],", b"]")), False),
        (nested(1_500, b'{"a":{},"b":', b"}", core=nested(1_500, b'{"a":{],"b":', b"}")), False),
    ],
)
def test_deep_nesting_is_judged_a_run_at_a_time_as_the_parser_would(
    line: bytes, valid: bool
) -> None:
    message = b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % line
    for cuts in ([], list(range(0, len(message), 997)), list(range(0, len(message), 4096))):
        assert stream_verdict(message, cuts) is valid
    # Cut anywhere, what was judged still ends as the cut-line message (too deep for
    # json to build: the validator reads it, the last of two members winning).
    rng = random.Random(len(line))
    for end in rng.sample(range(1, len(message)), 5):
        validator = LineValidator()
        try:
            validator.feed(message[: end // 2])
            validator.feed(message[end // 2 : end])
        except FrameError:
            assert not valid
            continue
        ending = validator.cut_ending()
        assert ending is not None
        envelope, fault = judge(message[: validator.judged] + ending)
        assert fault is None
        assert (envelope.members["method"], envelope.members["params"]) == (CUT_METHOD, Large(dict))


@pytest.mark.parametrize("size", [100, json_stream._SEARCH_EACH_FROM, 128 * 1024])
def test_control_bytes_are_found_alike_in_small_and_large_pieces(size: int) -> None:
    """A large piece is searched byte value by byte value, a small one in one pass: both
    find every control byte wherever it lies, and tell tabs and carriage returns apart."""
    for byte in [*range(0x20), 0x20, 0x7F, 0xFF]:
        for at in (0, size // 2, size - 1):
            piece = bytearray(b"x" * size)
            piece[at] = byte
            controls = bytes(piece).translate(None, bytes(range(0x20, 0x100)))
            expected = (bool(controls.strip(b"\t\r")), bool(controls))
            assert json_stream._controls_in(bytes(piece)) == expected, (byte, at)
    assert json_stream._controls_in(b"x" * size) == (False, False)


def judging_work(line: bytes, cuts: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """What judging ``line`` cut at ``cuts`` costs, counted rather than timed: the Python
    calls made (generator steps included) and the characters handed to json's scanner
    (all the text after where it starts, for a scan that fails)."""
    handed = 0
    scan_once = json_stream._scan_once

    def counting(text: str, start: int) -> tuple[object, int]:
        nonlocal handed
        try:
            value, after = scan_once(text, start)
        except (ValueError, StopIteration, RecursionError):
            handed += len(text) - start
            raise
        handed += after - start
        return value, after

    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    monkeypatch.setattr(json_stream, "_scan_once", counting)
    sys.setprofile(count)
    try:
        stream_verdict(line, cuts)
    finally:
        sys.setprofile(None)
    monkeypatch.undo()
    return calls, handed


def damaged(opener: bytes, closer: bytes, levels: int) -> list[bytes]:
    """Deep nesting gone wrong near its end: a closer short, cut among the closers, and a
    closer of the wrong kind half way out."""
    whole = nested(levels, opener, closer)
    wrong = b"}" if closer.endswith(b"]") else b"]"
    half = closer * (levels // 2)
    return [whole[:-1], whole[: len(whole) * 3 // 4], opener * levels + b"1" + half + wrong + half]


@pytest.mark.parametrize(
    ("opener", "closer"), [(b"[", b"]"), (b'{"d":', b"}"), (b'[{"d" : ', b"}]"), (b"[1,", b"]")]
)
def test_judging_deep_nesting_costs_its_length_whatever_is_wrong_with_it(
    opener: bytes, closer: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each level of a line that ended a closer short, or had a wrong one, built the run of
    closers again: 2,000 levels cost 4 million steps, 12,000 levels 2.8 s of CPU. And in
    small pieces every level of a nesting inside a piece was scanned to the piece's end:
    1 MiB of arrays 990 levels deep cost 8.9 s fed 997 bytes at a time."""
    lines = [*damaged(opener, closer, 2_000), b",".join([nested(900, opener, closer)] * 8)]
    for inner in lines:
        message = b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"v":%s}}' % inner
        for cuts in ([], list(range(0, len(message), 997))):
            calls, handed = judging_work(message, cuts, monkeypatch)
            assert calls <= 8 * len(message), (inner[-20:], len(cuts), calls, len(message))
            assert handed <= 3 * len(message), (inner[-20:], len(cuts), handed, len(message))


def test_deep_nesting_holds_about_a_byte_per_open_container() -> None:
    """The stack of open containers held a Python list entry per level: a line of 4 MiB
    of openings made the validator hold 34 MiB, a line at the 64 MiB limit about 540 MiB."""
    line = b'{"jsonrpc":"2.0","method":"m","params":' + b"[" * (1 << 20) + b'{"d":' * (1 << 18)
    validator = LineValidator()
    tracemalloc.start()
    try:
        for start in range(0, len(line), 128 * 1024):
            validator.feed(line[start : start + 128 * 1024])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(validator._stack) == 1 + (1 << 20) + (1 << 18)
    assert held < 2 * (1 << 20), held


def test_a_line_of_many_top_level_members_keeps_only_what_routing_reads() -> None:
    """Every top-level member was kept in the envelope: a 1.4 MiB line of 100,000 small
    ones made the validator hold 11.6 MiB (a line at the 64 MiB limit, about 500 MiB)."""
    line = (
        b'{"jsonrpc":"2.0","method":"m",'
        + b",".join(b'"k%d":%s' % (i, [b"1", b'"v"', b"[]", b"{}"][i % 4]) for i in range(20_000))
        + b',"id":"q","result":1}'
    )
    for cuts in ([], list(range(0, len(line), 64 * 1024))):
        envelope = fed(line, cuts)
        assert envelope.members == {"jsonrpc": "2.0", "method": "m", "id": "q", "result": 1}
        assert envelope.kind() is jsonrpc.Kind.REQUEST


def test_a_string_with_escapes_costs_its_length_not_that_of_the_text_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """qwen-code sends its skills' markdown (~570 KB in one ``available_commands_update``):
    many strings with escapes in a container too large to scan whole. Each is judged where
    it lies, not in a copy of the whole text held after it (its length squared, before)."""
    handed = 0
    scanstring = json_stream._scanstring

    def counting(text: str, start: int, strict: bool) -> tuple[str, int]:
        nonlocal handed
        try:
            value, after = scanstring(text, start, strict)
        except ValueError:
            handed += len(text) - start
            raise
        # A text that starts at the string was copied for this call: all of it counts.
        handed += len(text) if start == 0 else after - start
        return value, after

    monkeypatch.setattr(json_stream, "_scanstring", counting)
    bodies = ['Run `tool --flag "value"` when asked.\n' * 100 for _ in range(100)]
    line = json.dumps(
        {"jsonrpc": "2.0", "method": "session/update", "params": {"bodies": bodies}}
    ).encode()
    for cuts in ([], list(range(0, len(line), 64 * 1024))):
        handed = 0
        assert stream_verdict(line, cuts)
        assert handed <= 2 * len(line), (cuts[:2], handed, len(line))


@pytest.mark.parametrize("run", [1, 2, 31, 32, 33, 64, 65, 70_001, 70_002])
def test_a_run_of_backslashes_cut_anywhere_is_judged_as_the_parser_does(run: int) -> None:
    """Where a piece ends inside a run of backslashes, the validator counts the run back to
    tell whether the last one begins an escape; the counting looks at the run's last
    characters first, then at the rest."""
    for after in (b"x", b"n", b"u00e9", b"u00"):
        line = b'{"jsonrpc":"2.0","method":"m","params":{"b":"%s%s"}}' % (b"\\" * run, after)
        expected = parse_verdict(line)
        for step in (1, 7, 997, 64 * 1024) if len(line) < 1_000 else (997, 64 * 1024):
            assert stream_verdict(line, list(range(step, len(line), step))) == expected, (
                run,
                after,
                step,
            )


def test_the_backslashes_before_a_place_are_counted_as_a_walk_back_counts_them() -> None:
    def walked(text: str, pos: int, end: int) -> int:
        start = end
        while start > pos and text[start - 1] == "\\":
            start -= 1
        return end - start

    rng = random.Random(5)
    for _ in range(3_000):
        parts = [rng.choice(["\\", "\\", "a", "u", "\\" * rng.randint(30, 70)]) for _ in range(9)]
        text = "".join(parts)
        end = rng.randint(0, len(text))
        pos = rng.randint(0, end)
        assert json_stream._backslashes_before(text, pos, end) == walked(text, pos, end)


def test_containers_inside_one_too_long_to_scan_are_not_each_scanned_as_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large value nested a few levels deep (qwen-code's skill text sits in
    ``params.update._meta.availableSkillDetails[10].body``): once a container is found too
    long for json's scanner to judge at once, the ones inside it get only the short look;
    before, each level read as far again before it failed."""
    wasted = 0
    scan_once = json_stream._scan_once

    def counting(text: str, start: int) -> tuple[object, int]:
        nonlocal wasted
        try:
            return scan_once(text, start)
        except (ValueError, StopIteration):
            wasted += len(text) - start
            raise

    monkeypatch.setattr(json_stream, "_scan_once", counting)
    inner: object = {"body": "x" * 300_000}
    for name in ("details", "meta", "update"):
        inner = {"small": [{"n": n} for n in range(20)], name: [inner]}
    line = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": inner}).encode()
    for cuts in ([], list(range(0, len(line), 128 * 1024))):
        wasted = 0
        assert stream_verdict(line, cuts)
        assert wasted < 2 * json_stream._WHOLE_AT_ONCE, (cuts[:2], wasted)


@pytest.mark.parametrize(
    "run",
    [
        '{"d":' * 5 + "[",
        '[ {\t"a[b":\r[{"{":{ "": [',
        '{"é:[{" : {"x y":',
        "[" * 7,
        '{"k":[' * 3,
        '[1,[true, "x" ,{"a":1,"b":null,"c":[-0.5e3,\t"]{",[',
        '{"a":"[{",  "b":-1.5E+3,"c":[ [ 0,false,{"":"","d":[',
    ],
)
def test_a_run_of_openings_is_a_byte_per_container_whatever_its_keys_hold(run: str) -> None:
    """A byte per container the run opens, the scalars, keys and strings before each
    opening skipped (a string's brackets are not openings)."""
    text = f"x,{run}1"
    end = len(text) - 1
    assert json_stream._OPENERS.match(text, 2).end() == end  # type: ignore[union-attr]
    containers, in_string = [], False
    for char in run:
        if char == '"':
            in_string = not in_string
        elif char in "[{" and not in_string:
            containers.append(char == "{")
    assert json_stream._opened(text, 2, end) == bytes(containers)


# Deep nesting with something between its levels, entered or left a level at a time before:
# a few Python steps per level, about a second per MiB. Items or members before each
# opening (``[1,[1,…``, ``{"a":1,"b":{…``), and small flat containers (``[{},[{},…``,
# ``[[1,2],[[1,2],…``: 1-2 s a MiB); items or spaces between the closings (``…1],1],1]``,
# ``] ] ]``), and flat containers (``…{}],{}]``, ``…[1,2]],[1,2]]``: 1-2 s a MiB).
BETWEEN_LEVELS = [
    (b"[1,", b"]"), (b'{"a":1,"b":', b"}"), (b'[ "x" , {"k":null,"d":', b"}]"),
    (b"[{},", b"]"), (b"[[1,2],", b"]"), (b'{"a":{"k":"]"},"b":[],"c":', b"}"),
    (b"[", b",1]"), (b"[ ", b" ]"), (b'{"a":', b',"b":2}'),
    (b"[", b",{}]"), (b"[", b", [1,2] ]"), (b'{"a":', b',"b":{"k":"}"},"c":[]}'),
]  # fmt: skip


@pytest.mark.parametrize(("opener", "closer"), BETWEEN_LEVELS)
def test_deep_nesting_with_items_between_its_levels_is_judged_a_run_at_a_time(
    opener: bytes, closer: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    inner = nested(20_000, opener, closer)
    message = b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % inner
    for cuts in ([], list(range(0, len(message), 128 * 1024))):
        calls, _ = judging_work(message, cuts, monkeypatch)
        assert calls <= len(message) // 8, (opener, closer, len(cuts), calls, len(message))


def closing_wrong_half_way(opener: bytes, closer: bytes, wrong: bytes) -> bytes:
    half = 600
    return opener * 1_200 + b"1" + closer * half + wrong + closer * (half - 1)


@pytest.mark.parametrize(
    "inner",
    [
        nested(1_200, b"[", b" , 1 ]"),
        nested(1_200, b"[ ", b" ]"),
        nested(1_200, b'{"a":', b',"b":2}'),
        nested(1_200, b'[{"a":', b',"b":"]"},3]'),
        nested(1_200, b"[", b',"k":1]'),  # a member in an array
        nested(1_200, b'{"a":', b",2}"),  # an item in an object
        nested(1_200, b"[", b',1,"k":2]'),  # both
        nested(1_200, b"[", b",1}"),  # the wrong closer
        nested(1_200, b"[", b",1 ,]"),  # an item missing
        nested(1_200, b"[", b",01]"),  # a malformed number
        closing_wrong_half_way(b"[", b",1]", b",1}"),
        closing_wrong_half_way(b"[", b",1]", b',"k":1]'),
        closing_wrong_half_way(b'{"a":', b',"b":2}', b",2}"),
        closing_wrong_half_way(b'[{"a":', b',"b":2},3]', b',"b":2}]'),
        nested(1_200, b"[", b",{}]"),  # flat containers between the closers
        nested(1_200, b'{"a":', b',"b":[1, "]"],"c":{"k":"}"}}'),
        nested(1_200, b"[", b",[1,2}]"),  # a flat container closed wrongly
        nested(1_200, b"[", b',{"k":1}}'),  # the wrong closer after one
        nested(1_200, b"[", b",[1,]]"),  # a malformed one
        nested(1_200, b"[", b",[[1]]]"),  # one that is not flat
        closing_wrong_half_way(b"[", b",{}]", b",{}}"),
        closing_wrong_half_way(b"[", b",[1,2]]", b",[1,]]"),
        closing_wrong_half_way(b'{"a":', b',"b":{"k":1}}', b',"b":{"k":}}'),
    ],
)
def test_closings_with_items_between_them_get_the_parsers_verdict(inner: bytes) -> None:
    """Deep closings with spaces or items between them are taken a run at a time; a run
    that goes wrong somewhere is judged the usual way from there, and refused where json
    refuses it. The value is followed by a member of ``params`` (the run stops short of the
    top-level members)."""
    message = b'{"jsonrpc":"2.0","method":"m","params":{"v":%s,"w":1}}' % inner
    expected = json_verdict_deep(message)
    for cuts in ([], list(range(997, len(message), 997)), list(range(1, len(message), 4096))):
        assert stream_verdict(message, cuts) == expected, (inner[-40:], cuts[:2])


# Between and around the openings of a deep line: scalar items, members, whitespace.
DEEP_SCALARS = ["1", "-0.5e3", "0", "true", "null", '"x"', '"]{"', '"é"', '"a\\"b"', "1e+2",
                "{}", "[ ]", '[1,"]"]', '{"k":null, "j":"}"}', "[[1]]", '{"k":[]}']  # fmt: skip
DEEP_KEYS = ['"d"', '""', '"[{"', '"k y"', '"\\u0041"']
DEEP_SPACES = ["", "", "", " ", "\t", "\r", " \t "]


def deep_line(rng: random.Random, levels: int) -> bytes:
    """A value ``levels`` deep, each level an array or object with some scalar items or
    members before the next level and some after it. (Choices are drawn in bulk and taken
    in turn: a line makes tens of thousands.)"""
    space: Callable[[], str] = partial(next, cycle(rng.choices(DEEP_SPACES, k=97)))
    scalar: Callable[[], str] = partial(next, cycle(rng.choices(DEEP_SCALARS, k=101)))
    name: Callable[[], str] = partial(next, cycle(rng.choices(DEEP_KEYS, k=103)))

    def key() -> str:
        return f"{space()}{name()}{space()}:{space()}"

    openings, closings = [], []
    before = rng.choices([0, 0, 1, 2], k=levels)
    after = rng.choices([0, 0, 0, 1], k=levels)
    arrays = rng.choices([True, False], weights=[3, 2], k=levels)
    for level in range(levels):
        if arrays[level]:
            items = "".join(f"{space()}{scalar()}{space()}," for _ in range(before[level]))
            openings.append(f"[{space()}{items}{space()}")
            tail = "".join(f",{space()}{scalar()}" for _ in range(after[level]))
            closings.append(f"{tail}{space()}]")
        else:
            members = "".join(f"{key()}{scalar()}{space()}," for _ in range(before[level]))
            openings.append("{" + members + key())
            tail = "".join(f",{key()}{scalar()}" for _ in range(after[level]))
            closings.append(f"{tail}{space()}}}")
    return ("".join(openings) + scalar() + "".join(reversed(closings))).encode()


def damaged_at_random(line: bytes, rng: random.Random, mutations: int, inserted: bytes) -> bytes:
    """``line`` with ``mutations`` bytes deleted, inserted (one of ``inserted``) or replaced
    by punctuation or a digit, at random places."""
    damaged = bytearray(line)
    for _ in range(mutations):
        at = rng.randrange(len(damaged))
        action = rng.random()
        if action < 0.4:
            del damaged[at]
        elif action < 0.8:
            damaged.insert(at, rng.choice(inserted))
        else:
            damaged[at] = rng.choice(b'{}[]",:1')
    return bytes(damaged)


def json_verdict_deep(raw: bytes) -> bool:
    """json's verdict on ``raw`` however deep: read in a thread with room for the
    recursion (the bridge's own limit makes json give up past about 1,000 levels)."""
    verdict: list[bool] = []

    def read() -> None:
        try:
            json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            verdict.append(False)
        else:
            verdict.append(True)

    limit, size = sys.getrecursionlimit(), threading.stack_size(512 << 20)
    sys.setrecursionlimit(100_000)
    try:
        reader = threading.Thread(target=read)
        reader.start()
        reader.join()
    finally:
        sys.setrecursionlimit(limit)
        threading.stack_size(size)
    return verdict[0]


@settings(max_examples=inputs(120), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 2**32), st.integers(1_050, 1_300), st.integers(0, 3))
def test_deep_lines_of_mixed_openings_get_the_parsers_verdict(
    seed: int, levels: int, mutations: int
) -> None:
    """Deep enough that json's scanner gives up and the validator enters the nesting a run
    of openings at a time; whole or damaged, in any pieces, judged as json judges it.
    (A seed, not drawn choices: a line makes thousands of them.)"""
    rng = random.Random(seed)
    line = damaged_at_random(deep_line(rng, levels), rng, mutations, b'{}[]",: 1ae-.\t\x01')
    raw = b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % line
    expected = json_verdict_deep(raw)
    pieces = rng.choice([list(range(997, len(raw), 997)), rng.sample(range(1, len(raw)), 5)])
    for cuts in ([], pieces):
        assert stream_verdict(raw, cuts) == expected, (bytes(line[:200]), cuts[:3])


def many(item: bytes, size: int) -> bytes:
    return b",".join([item] * (size // (len(item) + 1)))


# Lines of many small items or members in a container too long for json's scanner to judge
# whole: each of these was walked an item or a member at a time, 0.2 to 0.6 s per MiB.
MEMBERS = b",".join(b'"k%d":%d' % (i, i) for i in range(200_000 // 14))
MANY_SMALL = {
    "objects holding arrays": b'{"jsonrpc":"2.0","method":"m","params":[%s]}'
    % many(b'{"a":1,"b":[1,2],"c":"x"}', 200_000),
    "arrays": b'{"jsonrpc":"2.0","method":"m","params":[%s]}' % many(b"[1,2.5,null]", 200_000),
    "members": b'{"jsonrpc":"2.0","method":"m","params":{%s}}' % MEMBERS,
    "top-level members": b'{"jsonrpc":"2.0","method":"m",%s}' % MEMBERS,
    "strings with escapes": b'{"jsonrpc":"2.0","method":"m","params":[%s]}'
    % many(b'"a \\"quoted\\" word"', 200_000),
    "strings with commas": b'{"jsonrpc":"2.0","id":7,"result":[%s]}'
    % many(b'"one, two, [three]"', 200_000),
}


@pytest.mark.parametrize("name", MANY_SMALL)
def test_many_small_items_or_members_are_judged_a_run_at_a_time(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """json's scanner judges a run of them at once; a run is never handed to it twice
    over, whatever commas the items hold."""
    message = MANY_SMALL[name]
    for cuts, share in (([], 64), (list(range(0, len(message), 128 * 1024)), 64),
                        (list(range(0, len(message), 997)), 8)):  # fmt: skip
        calls, handed = judging_work(message, cuts, monkeypatch)
        assert calls <= len(message) // share, (name, len(cuts), calls, len(message))
        assert handed <= 3 * len(message), (name, len(cuts), handed, len(message))


# Items of the lines below: what a run handed to json's scanner at once may hold. Strings
# with commas, quotes and brackets (a run's end is a comma, never one in a string),
# escapes and lone surrogates, integers longer than json reads (the validator takes them:
# a run holding one is walked), floats json reads as infinity, nesting json's recursion
# may not reach, and members whose keys the envelope keeps (at the top, those are walked).
SMALL_ITEMS = [
    b"1", b"-0.5e3", b"1e400", b"true", b"null", b'"x"', b'"a, b"', b'"]},{\\"k\\":["',
    b'"\\u00e9\\ud800"', b'"\\\\"', b'"\xc3\xa9"', b"7" * 5_000, b"[]", b"{}",
    b"[1,2.5,null]", b'{"a":1,"b":[1,2],"c":"x"}', b'[{"k":[{"j":",[{"}]}]',
    b"[" * 400 + b"]" * 400,
]  # fmt: skip
SMALL_KEYS = [b'"k"', b'"a,b"', b'"\\u0041"', b'"id"', b'"method"', b'"\\u0069d"', b'"params"']
SMALL_SPACES = [b"", b"", b"", b" ", b"\t", b" \r "]


def many_small_line(rng: random.Random, size: int) -> bytes:
    """A message about ``size`` bytes long whose bulk is many small items or members: in
    an array or object of ``params``, among the top-level members, or in a batch."""
    space: Callable[[], bytes] = partial(next, cycle(rng.choices(SMALL_SPACES, k=97)))
    item: Callable[[], bytes] = partial(next, cycle(rng.choices(SMALL_ITEMS, k=101)))
    key: Callable[[], bytes] = partial(
        next, cycle(rng.choices(SMALL_KEYS, weights=[60, 5, 5, 1, 1, 1, 1], k=103))
    )
    shape = rng.choice(["array", "object", "top", "batch"])
    parts: list[bytes] = []
    length = 0
    while length < size:
        if shape == "array":
            part = space() + item() + space()
        elif shape == "batch":
            part = b'{"jsonrpc":"2.0","method":"n","params":[%s]}' % item()
        else:
            part = space() + key() + space() + b":" + space() + item() + space()
        parts.append(part)
        length += len(part) + 1
    body = b",".join(parts)
    if shape == "array":
        return b'{"jsonrpc":"2.0","method":"m","params":[%s]}' % body
    if shape == "object":
        return b'{"jsonrpc":"2.0","id":1,"result":{%s}}' % body
    if shape == "top":
        return b'{"jsonrpc":"2.0","method":"m",%s,"params":{}}' % body
    return b"[%s]" % body


@settings(max_examples=inputs(200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 3))
def test_lines_of_many_small_items_get_the_parsers_verdict_and_envelope(
    seed: int, mutations: int
) -> None:
    """Whole or damaged, in any pieces, judged as the parser judges them, and a valid
    message read as the kind it is. (A seed, not drawn choices: a line makes thousands.)"""
    rng = random.Random(seed)
    line = many_small_line(rng, rng.randint(2_000, 40_000))
    raw = damaged_at_random(line, rng, mutations, b'{}[]",: 1ae-.\\\t\x01')
    try:
        frame: jsonrpc.Frame | None = jsonrpc.parse_in_full(raw)
        expected = True
    except FrameError as exc:
        frame, expected = None, exc.code != jsonrpc.PARSE_ERROR
    pieces = rng.choice([list(range(997, len(raw), 997)), rng.sample(range(1, len(raw)), 5)])
    for cuts in ([], pieces, list(range(128 * 1024, len(raw), 128 * 1024))):
        try:
            envelope: json_stream.Envelope | None = fed(raw, cuts)
        except FrameError:
            envelope = None
        assert (envelope is not None) == expected, (raw[:200], cuts[:3])
        if envelope is None or frame is None or frame.kind is jsonrpc.Kind.BATCH:
            continue
        if type(envelope.members.get("id")) is Large:  # an integer of thousands of digits
            with pytest.raises(FrameError, match="longer than the bridge reads"):
                envelope.kind()
        else:
            assert envelope.kind() is frame.kind, (raw[:200], cuts[:3])


@pytest.mark.parametrize("key", [b'"id"', b'"\\u0069d"'])
def test_a_run_of_top_level_members_leaves_the_envelopes_members_to_the_walk(key: bytes) -> None:
    """A member routing reads, among many that it does not, is read into the envelope, even
    when its key is written with escapes."""
    members = b",".join(b'"k%d":%d' % (i, i) for i in range(5_000))
    line = b'{"jsonrpc":"2.0","method":"m",%s,%s:7,%s}' % (members, key, members)
    for cuts in ([], list(range(997, len(line), 997)), list(range(0, len(line), 128 * 1024))):
        envelope = fed(line, cuts)
        assert envelope.members.get("id") == 7, (key, len(cuts))
        assert envelope.kind() is jsonrpc.Kind.REQUEST


@pytest.mark.parametrize(
    "inner",
    [
        nested(40_000, b"[", b",{}]"),  # a container between closers: a short closing run
        nested(20_000, b'{"a":', b',"b":[],"c":{}}'),
        nested(20_000, b"[[1,2],", b"]"),
        b"[%s]" % many(b'"]]",{"k":"[,"}', 400_000),
        b"[%s]" % many(b'"a, b"', 400_000),
    ],
)
def test_runs_of_items_tried_cost_the_lines_length_at_most(
    inner: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each try at a run reads up to a window of the text held; a container found to close
    within it let the next one up try again at once, so closings with containers between
    them (``,{}]``) read a window per level: 584 MB for a 200 KB line, 4.4 s of CPU."""
    message = b'{"jsonrpc":"2.0","method":"m","params":{"v":%s}}' % inner
    run_of_items = json_stream._run_of_items
    for cuts in ([], list(range(0, len(message), 128 * 1024)), list(range(0, len(message), 997))):
        tried = 0

        def counted(text: str, pos: int, end: int, is_object: bool) -> object:
            nonlocal tried
            tried += end - pos
            return run_of_items(text, pos, end, is_object)

        monkeypatch.setattr(json_stream, "_run_of_items", counted)
        with contextlib.suppress(FrameError):
            fed(message, cuts)
        monkeypatch.undo()
        assert tried <= 2 * len(message), (inner[-20:], len(cuts), tried, len(message))


@pytest.mark.parametrize("tail", ['{"a":[1,2],"s":"x, y', '"x, y'])
def test_a_run_of_items_ends_at_the_last_comma_between_two_of_them(tail: str) -> None:
    """The last commas of a window inside an item, or inside a string, are passed over for
    the last one between two items (the bracket and quote counts, see ``_balance``)."""
    items = ",".join(['{"a":[1,2],"s":"x, y"}', '"x, y"'] * 20 + ['"say \\"hi"'])
    text = f"{items},{tail}"
    run = json_stream._run_of_items(text, 0, len(text), is_object=False)
    assert run is not None
    assert run[1] == len(items), run[1]
    assert run[0] == json.loads(f"[{items}]")
