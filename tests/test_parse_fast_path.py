"""``jsonrpc.parse``'s short path agrees with the long one on every line, valid or not.

``parse`` reads the usual line through json's C scanner and hands everything else to
``parse_in_full``; both must give the same frame, or the same error, for any line. So must
the streaming validator that reads a long line as it arrives (``json_stream``), however
the line is split, and so must the answer to a client line ``parse`` refuses
(``core/long_lines``: the decoder's error for a line it read whole, without judging it
again). Lines come from hypothesis: JSON-RPC-shaped objects written with
duplicate and escaped keys, odd ids, answers with a result and an error or an error object
of the wrong shape, lone surrogates and random whitespace, then mutated byte by byte.
How many lines each test draws: :mod:`fuzz_size` (``ACP_BRIDGE_FULL_FUZZ=1`` for all).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from fuzz_size import inputs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from acp_bridge.core.long_lines import LongLines
from acp_bridge.core.router import CLIENT, Router
from acp_bridge.wire import json_stream
from acp_bridge.wire.json_stream import LineValidator
from acp_bridge.wire.jsonrpc import (
    CANCEL_REQUEST,
    PARSE_ERROR,
    Frame,
    FrameError,
    Kind,
    NestedTooDeeply,
    classify_message,
    decode,
    parse,
    parse_in_full,
)

WHITESPACE = st.sampled_from(["", "", "", " ", "  ", "\t", "\r", "\n"])

# Strings json writes or reads: lone surrogates, quotes and control characters escaped.
TEXTS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["s", "", 'a"b', "\\", "\ud800", "\udfff x", "é", "\x00", "sess_1"]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**600, max_value=10**700),  # near json's integer digit limit
    st.floats(allow_nan=False, allow_infinity=False),
    TEXTS,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXTS, inner, max_size=4)),
    max_leaves=12,
)
KEYS = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"])


@st.composite
def written_values(draw: st.DrawFn) -> str:
    """A JSON value as text, sometimes with whitespace and non-ASCII left unescaped (a lone
    surrogate written that way makes the line invalid UTF-8)."""
    value = draw(VALUES)
    ensure_ascii = draw(st.integers(0, 3)) > 0
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :")]))
    return json.dumps(value, ensure_ascii=ensure_ascii, separators=separators)


# The composite strategies are built once, here and below, and drawn from: a strategy built
# anew for every draw is checked anew each time, which cost more than the tests' lines.
WRITTEN_VALUES = written_values()


def written_key(draw: st.DrawFn, key: str) -> str:
    if draw(st.integers(0, 9)) == 0:
        # The same key with an escape in it, which json reads as the plain key.
        return f'"\\u{ord(key[0]):04x}{key[1:]}"'
    return json.dumps(key)


ODD_IDS = ["0", "-0", "-7", "1.0", "1e3", "true", "[]", "{}", '"a\\"b"', '"\\ud800"',
           '"\\u00e9"', '"é"', "9" * 700]  # fmt: skip
IDS = st.one_of(st.integers(-5, 10**20).map(str), st.sampled_from(['"s-1"', "null", *ODD_IDS]))
METHODS = st.sampled_from(["session/update", "session/prompt", CANCEL_REQUEST, 'a"b', ""])
# An error's code and message: what JSON-RPC requires (an integer, a string) and not.
CODES = st.one_of(
    st.integers(-(2**40), 2**40).map(str),
    st.sampled_from(["-32603", "0", "-0", "9" * 5000, "1.0", "-32000.5", "1e3", "true", "null",
                     '"1"', "[]", "{}"]),
)  # fmt: skip
MESSAGES = st.one_of(
    TEXTS.map(json.dumps), st.sampled_from(['"x"', "null", "7", "false", "[]", '{"t":"x"}'])
)


@st.composite
def error_objects(draw: st.DrawFn) -> str:
    """An error object as text: ``code``, ``message`` and ``data`` each there or not, in any
    order, sometimes repeated (the last one counts) or with a key escaped."""
    members = [("code", draw(CODES)), ("message", draw(MESSAGES))]
    if draw(st.booleans()):
        members.append(("data", draw(WRITTEN_VALUES)))
    members = [member for member in members if draw(st.integers(0, 9)) > 0]
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(["code", "message", "x"]))
        value = draw(CODES if key == "code" else MESSAGES)
        members.insert(draw(st.integers(0, len(members))), (key, value))
    written = []
    for key, value in draw(st.permutations(members)):
        ws = [draw(WHITESPACE) for _ in range(2)]
        written.append(f"{ws[0]}{written_key(draw, key)}:{ws[1]}{value}")
    return "{" + ",".join(written) + draw(WHITESPACE) + "}"


ERRORS = st.one_of(error_objects(), error_objects(), error_objects(), WRITTEN_VALUES)


@st.composite
def objects(draw: st.DrawFn, *, depth: int = 0) -> str:
    """An object text shaped like a request, notification or response (or nothing in
    particular), members in any order, some keys repeated, escaped or of the wrong type."""
    shape = draw(st.sampled_from(["request", "notification", "result", "error", "any"]))
    members: list[tuple[str, str]] = [("jsonrpc", '"2.0"')]
    if shape in ("request", "result", "error"):
        members.append(("id", draw(IDS)))
    if shape in ("request", "notification"):
        members.append(("method", json.dumps(draw(METHODS))))
        if draw(st.booleans()):
            members.append(("params", draw(params(depth))))
    if shape == "result":
        members.append((shape, draw(WRITTEN_VALUES)))
    elif shape == "error":
        members.append((shape, draw(ERRORS)))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(KEYS)
        if key == "id":
            value = draw(IDS)
        elif key == "method":
            value = draw(METHOD_VALUES)
        elif key == "params":
            value = draw(params(depth))
        elif key == "error":
            value = draw(ERRORS)
        else:
            value = draw(WRITTEN_VALUES)
        members.insert(draw(st.integers(0, len(members))), (key, value))
    written = []
    for key, value in members:
        ws = [draw(WHITESPACE) for _ in range(3)]
        written.append(f"{ws[0]}{written_key(draw, key)}{ws[1]}:{ws[2]}{value}")
    return "{" + ",".join(written) + draw(WHITESPACE) + "}"


METHOD_VALUES = st.one_of(METHODS.map(json.dumps), WRITTEN_VALUES)


# One strategy per depth: built anew for every draw it took about a tenth of the CPU of
# this file and test_short_reads.
@functools.cache
def params(depth: int) -> st.SearchStrategy[str]:
    session = st.one_of(TEXTS, SCALARS).map(lambda v: json.dumps({"sessionId": v}))
    nested = objects(depth=depth + 1) if depth < 2 else WRITTEN_VALUES
    scalar = SCALARS.map(json.dumps)  # not valid params for a request or notification
    return st.one_of(session, nested, WRITTEN_VALUES, scalar)


OBJECTS = objects()
LINE_TEXTS = st.one_of(
    OBJECTS,
    OBJECTS,
    OBJECTS,
    OBJECTS,
    st.lists(OBJECTS, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
    WRITTEN_VALUES,
)
BATCH_MEMBERS = st.lists(st.one_of(OBJECTS, OBJECTS, WRITTEN_VALUES), max_size=5)


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    text: str = draw(LINE_TEXTS)
    return (draw(WHITESPACE) + text + draw(WHITESPACE)).encode("utf-8", "surrogatepass")


INTERESTING_BYTES = b'{}[],:"\\ 0123456789-.eEtfnu\x00\x1f\x7f\xc3\xa9\xed\xa0\x80\xef\xbb\xbf\xff'


@st.composite
def batch_lines(draw: st.DrawFn) -> bytes:
    """A batch of generated members with whitespace anywhere json allows it."""
    members = draw(BATCH_MEMBERS)
    text = "[" + draw(WHITESPACE)
    for index, member in enumerate(members):
        if index:
            text += draw(WHITESPACE) + "," + draw(WHITESPACE)
        text += member
    text += draw(WHITESPACE) + "]"
    return (draw(WHITESPACE) + text + draw(WHITESPACE)).encode("utf-8", "surrogatepass")


LINES = lines()
MUTATIONS = st.sampled_from(["insert", "replace", "delete", "truncate"])
INTERESTING = st.sampled_from(list(INTERESTING_BYTES))


@st.composite
def mutated_lines(draw: st.DrawFn, base: st.SearchStrategy[bytes] = LINES) -> bytes:
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data)))
        byte = draw(INTERESTING)
        operation = draw(MUTATIONS)
        if operation == "insert" or not data:
            data.insert(position, byte)
        elif operation == "replace":
            data[min(position, len(data) - 1)] = byte
        elif operation == "delete":
            del data[min(position, len(data) - 1)]
        else:
            del data[position:]
    return bytes(data)


def assert_agrees(raw: bytes) -> Frame | None:
    try:
        expected = parse_in_full(raw)
    except FrameError as error:
        try:
            parse(raw)
        except FrameError as short:
            assert (short.code, short.message, short.request_id) == (
                error.code,
                error.message,
                error.request_id,
            ), raw
            return None
        raise AssertionError(f"parse accepted a line parse_in_full refuses: {raw!r}") from None
    frame = parse(raw)
    assert frame == expected, raw
    assert frame.kind is expected.kind
    assert frame.id == expected.id and type(frame.id) is type(expected.id)
    assert frame.method == expected.method and frame.params == expected.params
    assert frame.raw is raw
    return frame


def assert_refused_line_answered_as_judged(raw: bytes) -> None:
    """The short way for a client line json's decoder read whole is held to the way every
    other refused client line takes: the validator judges the line, and its fault, else
    the decoder's error, is answered. Lines nested too deeply to build are left out: they
    may pass whole, and take the long way as before."""
    raw = raw.replace(b"\n", b"\r")  # a line never holds a newline
    try:
        parse(raw)
    except NestedTooDeeply:
        return
    except FrameError as exc:
        error = exc
    else:
        return
    _, fault = json_stream.judge(raw)
    if error.code != PARSE_ERROR:
        assert fault is None, (raw, fault.message)  # json read it: no fault to find
    judged = fault or error
    plain = Router()
    plain.answer_error(judged.request_id, judged.code, judged.message)
    router = Router()
    assert LongLines(router).unparsed(CLIENT, raw, error, tried_whole=False) is None
    assert router.data_to_send() == plain.data_to_send(), raw


SETTINGS = settings(
    max_examples=inputs(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# Lines written by hand: each shape once, whatever the generated lines hold.
CRAFTED_LINES = [
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{}}}',
    b'{"id":1,"id":"two","method":"m"}',
    b'{"id":1.0,"method":"m"}',
    b'{"id":"a\\"b\\ud800","result":null}',
    b'{"\\u0069d":7,"method":"m"}',
    b'{"method":null,"id":3,"result":{}}',
    b'{"method":"m","params":3}',
    b'{"jsonrpc":"2.0","method":"m","params":null}',
    b'{"method":"m","params":{"sessionId":"a"},"params":[]}',
    b'{"id":true,"result":1}',
    b'{"id":false,"method":"m"}',
    b'{"id":[1],"method":"m","params":{}}',
    b'\xef\xbb\xbf{"id":1,"result":1}',
    b'{"id":1,"result":NaN}',
    b'{"id":1,"result":1} x',
    b'{"id":1,"result":1}\r\n ',
    b'{"id":' + b"9" * 5000 + b',"result":1}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"id":1,"result":{},"error":{"code":1,"message":"m"}}',
    b'{"id":1,"error":{"code":1,"message":"m"},"result":null}',
    b'{"id":1,"error":{"code":"1","message":"m"}}',
    b'{"id":1,"error":{"code":1.0,"message":"m"}}',
    b'{"id":1,"error":{"code":true,"message":"m"}}',
    b'{"id":1,"error":{"code":1,"message":null}}',
    b'{"id":1,"error":{"code":1}}',
    b'{"id":1,"error":"m"}',
    b'{"id":1,"error":{"code":1,"message":"m","code":"1"}}',
    b'{"id":1,"error":{"code":' + b"9" * 5000 + b',"message":"m"}}',
    b'{"id":1,"method":"m","result":1,"error":2}',
]


@pytest.mark.parametrize("raw", CRAFTED_LINES, ids=lambda raw: ascii(raw[:48]))
def test_parse_agrees_with_parse_in_full_on_crafted_lines(raw: bytes) -> None:
    assert_agrees(raw)


@SETTINGS
@given(mutated_lines())
def test_parse_agrees_with_parse_in_full_on_mutated_lines(raw: bytes) -> None:
    assert_agrees(raw)
    assert_refused_line_answered_as_judged(raw)


def judged_whole(raw: bytes) -> Frame | tuple[type, int, str]:
    """What :func:`parse` made of a line when it decoded every line whole, batches too:
    the frame, or the error's type, code and message."""
    try:
        text = raw.decode()
        if text.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        message = decode(text)
    except (UnicodeDecodeError, ValueError) as exc:
        return (FrameError, PARSE_ERROR, f"The line is not valid JSON: {exc}.")
    except RecursionError:
        return (NestedTooDeeply, -32600, "")
    try:
        return classify_message(message, raw)
    except FrameError as exc:
        return (type(exc), exc.code, exc.message)


def assert_judged_as_whole(raw: bytes) -> None:
    """A batch read a member at a time is the batch json's decoder reads whole, or the
    same error at the same place."""
    whole = judged_whole(raw)
    try:
        walked: Frame | tuple[type, int, str] = parse(raw)
    except FrameError as exc:
        walked = (type(exc), exc.code, "" if isinstance(exc, NestedTooDeeply) else exc.message)
    if isinstance(whole, Frame):
        assert isinstance(walked, Frame), (raw, walked)
        assert walked.raw is raw and walked.kind is whole.kind
        assert list(walked.message) == list(whole.message), raw
        if walked.kind is Kind.BATCH:  # a second walk gives the same members
            assert [m for m, _, _ in walked.message.spans()] == list(whole.message)
    else:
        assert walked == whole, raw


@settings(SETTINGS, max_examples=inputs(600))  # each draws up to five lines
@given(st.one_of(batch_lines(), mutated_lines(batch_lines())))
@example(b"[1,]")
@example(b"[1 2]")
@example(b"[")
@example(b"[1,")
@example(b"[1")
@example(b"[,1]")
@example(b"[1,,2]")
@example(b"[1] x")
@example(b" [ ]")
@example(b"[]")
@example(b"[] x")
@example(b'[{"a":1e400}]')
@example(b"[NaN]")
@example(b'["\\ud800"]')
@example(b"[" + b"9" * 5000 + b"]")
@example(b"[" * 3000 + b"]" * 3000)
@example(b"\xef\xbb\xbf[1]")
def test_a_batch_read_a_member_at_a_time_is_judged_as_when_read_whole(raw: bytes) -> None:
    assert_judged_as_whole(raw)
    assert_refused_line_answered_as_judged(raw)


@pytest.mark.parametrize(
    ("raw", "kind", "request_id", "method"),
    [
        (b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{}}}',
         Kind.NOTIFICATION, None, "session/update"),
        (b'{"jsonrpc":"2.0","id":"a\\"b","method":"session/prompt","params":{"sessionId":"x"}}',
         Kind.REQUEST, 'a"b', "session/prompt"),
        (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}',
         Kind.RESPONSE, None, None),
        (b'{"params":{"deep":{"id":9}},"id":"\\ud800","result":{}}',
         Kind.RESPONSE, "\ud800", None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"m"}]', Kind.BATCH, None, None),
        (b' {"jsonrpc":"2.0","id":1,"method":"m"}', Kind.REQUEST, 1, "m"),
    ],
)  # fmt: skip
def test_parse_reads_the_envelope(
    raw: bytes, kind: Kind, request_id: Any, method: str | None
) -> None:
    frame = assert_agrees(raw)
    assert frame is not None
    assert (frame.kind, frame.id, frame.method) == (kind, request_id, method)


def streamed_verdict(raw: bytes, cuts: list[int]) -> Kind | FrameError:
    """What the streaming validator makes of ``raw`` fed in pieces: the kind its envelope
    reads, or the error."""
    validator = LineValidator()
    try:
        start = 0
        for cut in [*cuts, len(raw)]:
            validator.feed(raw[start:cut])
            start = cut
        return validator.finish().kind()
    except FrameError as exc:
        return exc


def assert_streamed_agrees(raw: bytes, cuts: list[int]) -> None:
    """A line that is one JSON object (not nested too deeply to build) gets the same kind
    from the envelope the streaming validator reads as from ``parse_in_full``, or is
    refused by both, whatever pieces it arrives in."""
    streamed = streamed_verdict(raw, cuts)
    try:
        frame = parse_in_full(raw)
    except NestedTooDeeply:
        return
    except FrameError as error:
        assert isinstance(streamed, FrameError), (raw, cuts, error.message)
        if error.code == PARSE_ERROR:
            assert streamed.code == PARSE_ERROR, (raw, cuts, streamed.message)
        return
    if frame.kind is Kind.BATCH:
        assert isinstance(streamed, FrameError)
        return
    assert streamed is frame.kind, (raw, cuts, streamed)


@SETTINGS
@given(lines(), st.randoms(use_true_random=False))
@example(b'{"id":1,"result":{"t":"x"},"error":{"code":1,"message":"m"}}', None)
@example(b'{"id":1,"error":{"message":"m","data":{"t":[1]},"code":2.5}}', None)
@example(b'{"id":1,"error":{"code":1,"data":"xyz","message":"m","message":null}}', None)
@example(b'{"id":1,"error":{"c\\u006fde":1,"data":[[]],"message":"m"}}', None)
@example(b'{"id":1,"error":{"code":-' + b"7" * 5000 + b',"message":"m","data":[1]}}', None)
def test_parse_and_the_streamed_envelope_agree_with_parse_in_full_on_generated_lines(
    raw: bytes, rng: Any
) -> None:
    # One generated line serves every property: drawing it costs more than checking it.
    assert_agrees(raw)
    assert_refused_line_answered_as_judged(raw)
    raw = raw.replace(b"\n", b"\r")  # a line never holds a newline; \r fares as it would
    every = list(range(1, len(raw)))
    splits = [[], every]
    if rng is not None:
        splits.append(sorted(rng.sample(every, min(len(every), 4))))
    for cuts in splits:
        assert_streamed_agrees(raw, cuts)
