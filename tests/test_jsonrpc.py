"""Envelope classification: what each line is, and the error code for what it is not."""

# ruff: noqa: E501  (one wire frame per table row reads better than wrapped bytes)

from __future__ import annotations

import json

import pytest

from acp_bridge.wire import jsonrpc
from acp_bridge.wire.jsonrpc import INVALID_REQUEST, PARSE_ERROR, FrameError, Kind


def parse_error(raw: bytes) -> FrameError:
    with pytest.raises(FrameError) as caught:
        jsonrpc.parse(raw)
    return caught.value


@pytest.mark.parametrize(
    ("raw", "kind", "request_id", "method"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}', Kind.REQUEST, 1, "session/new"),
        (b'{"jsonrpc":"2.0","id":"a-1","method":"x"}', Kind.REQUEST, "a-1", "x"),
        (b'{"jsonrpc":"2.0","id":null,"method":"x","params":[]}', Kind.REQUEST, None, "x"),
        (b'{"params":{},"method":"_zed/ext","jsonrpc":"2.0","id":0}', Kind.REQUEST, 0, "_zed/ext"),
        (b'{"jsonrpc":"2.0","method":"session/update","params":{}}', Kind.NOTIFICATION, None, "session/update"),
        (b'{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":3}}', Kind.NOTIFICATION, None, "$/cancel_request"),
        (b'{"jsonrpc":"2.0","id":7,"result":null}', Kind.RESPONSE, 7, None),
        (b'{"jsonrpc":"2.0","id":"x","error":{"code":-1,"message":"m"}}', Kind.RESPONSE, "x", None),
        (b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}', Kind.RESPONSE, None, None),
    ],
)  # fmt: skip
def test_single_messages_are_classified(
    raw: bytes, kind: Kind, request_id: object, method: str | None
) -> None:
    frame = jsonrpc.parse(raw)
    assert frame.kind is kind
    assert frame.id == request_id
    assert frame.method == method
    assert frame.raw is raw


def test_frame_keeps_the_bytes_it_arrived_as() -> None:
    raw = b'{ "method" :\t"x/y" , "jsonrpc":"2.0", "params": {"b":1, "a":"\\ud83d\\ude00"} }'
    frame = jsonrpc.parse(raw)
    assert frame.raw is raw
    assert frame.params == {"b": 1, "a": "\U0001f600"}


def test_unescaped_non_bmp_text_is_parsed() -> None:
    frame = jsonrpc.parse('{"jsonrpc":"2.0","method":"m","params":{"t":"𝄞 ü"}}'.encode())
    assert frame.params == {"t": "𝄞 ü"}


def test_batch_is_one_frame_whose_members_classify_on_their_own() -> None:
    raw = b'[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","method":"b"},{"jsonrpc":"2.0","id":2,"result":{}}]'
    frame = jsonrpc.parse(raw)
    assert frame.kind is Kind.BATCH
    assert frame.id is None and frame.method is None and frame.params is None
    assert [m.kind for m in frame.members()] == [Kind.REQUEST, Kind.NOTIFICATION, Kind.RESPONSE]


@pytest.mark.parametrize(
    "raw",
    [b"{", b"not json", b'{"a":1}}', b"", b"\xff\xfe{}", b'{"a":"\xed\xa0\x80"}', b'\xef\xbb\xbf{"a":1}',
     b'{"jsonrpc":"2.0","method":"m","params":{"v":NaN}}', b"Infinity",
     '{"a":1}'.encode("utf-16")],
    ids=["truncated", "words", "trailing", "empty", "bad-utf8", "lone-surrogate-bytes", "bom",
         "nan", "infinity", "utf16"],
)  # fmt: skip
def test_malformed_json_is_a_parse_error_with_null_id(raw: bytes) -> None:
    error = parse_error(raw)
    assert error.code == PARSE_ERROR
    assert error.request_id is None


def test_integers_longer_than_int_reads_are_kept_and_written_back_as_they_came() -> None:
    digits = "9" * 5000  # int() converts at most 4,300
    raw = b'{"jsonrpc":"2.0","id":%s,"method":"x","params":{"n":-%s,"a":[%s]}}' % (
        (digits.encode(),) * 3
    )
    frame = jsonrpc.parse(raw)
    assert frame.kind is Kind.REQUEST
    assert frame.id == jsonrpc.LongInteger(digits)
    assert frame.params == {"n": jsonrpc.LongInteger("-" + digits), "a": [frame.id]}
    assert jsonrpc.encode(frame.message) == raw
    assert jsonrpc.encode({**frame.message, "x": float("inf")}).endswith(b',"x":1e999}')
    assert parse_error(b"1" * 5000).code == INVALID_REQUEST  # valid JSON, not an object


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000, b'{"a":' * 100_000, b"[" * 5000 + b"]" * 5000],
    ids=["deep-array", "deep-object", "deep-valid"],
)
def test_a_line_too_deep_to_build_says_so_not_that_it_is_invalid(raw: bytes) -> None:
    # Whether it is valid JSON is the validator's to judge (it has no depth limit).
    error = parse_error(raw)
    assert isinstance(error, jsonrpc.NestedTooDeeply)
    assert error.code == INVALID_REQUEST and "900 levels" in error.message


@pytest.mark.parametrize("raw", [b"5", b'"a string"', b"null", b"true", b"[]", b"3.5"])
def test_non_objects_are_invalid_requests(raw: bytes) -> None:
    error = parse_error(raw)
    assert error.code == INVALID_REQUEST
    assert error.request_id is None


@pytest.mark.parametrize("bad_id", ["{}", "[]", "true", "1.5", '{"id":1}', "[1]", "false"])
def test_unreadable_request_ids_are_invalid_with_null_id(bad_id: str) -> None:
    for template in (
        '{"jsonrpc":"2.0","id":%s,"method":"x"}',
        '{"jsonrpc":"2.0","id":%s,"result":{}}',
        '{"jsonrpc":"2.0","id":%s,"error":{"code":1,"message":"m"}}',
    ):
        error = parse_error((template % bad_id).encode())
        assert error.code == INVALID_REQUEST
        assert error.request_id is None


@pytest.mark.parametrize(
    ("raw", "readable_id"),
    [
        (b'{"jsonrpc":"2.0","id":7,"method":5}', 7),
        (b'{"jsonrpc":"2.0","id":"s","method":["x"]}', "s"),
        (b'{"jsonrpc":"2.0","id":8,"method":"x","params":"text"}', 8),
        (b'{"jsonrpc":"2.0","id":9,"method":"x","params":null}', 9),
        (b'{"jsonrpc":"2.0","id":10}', 10),
        (b'{"jsonrpc":"2.0","method":"x","params":3}', None),
        (b'{"jsonrpc":"2.0","result":{}}', None),
        (b"{}", None),
    ],
)
def test_invalid_shapes_answer_with_the_id_when_it_is_readable(
    raw: bytes, readable_id: object
) -> None:
    error = parse_error(raw)
    assert error.code == INVALID_REQUEST
    assert error.request_id == readable_id


def test_error_messages_are_readable_sentences() -> None:
    assert parse_error(b"5").message == "A JSON-RPC message must be an object."
    assert parse_error(b"[]").message == "An empty batch is not a valid request."
    assert parse_error(b"{").message.startswith("The line is not valid JSON")


def test_encode_is_compact_utf8_on_one_line() -> None:
    message = {"jsonrpc": "2.0", "id": 1, "result": {"t": "ü\n😀", "u": "\u2028"}}
    raw = jsonrpc.encode(message)
    assert b"\n" not in raw
    assert raw.decode() == '{"jsonrpc":"2.0","id":1,"result":{"t":"ü\\n😀","u":"\u2028"}}'
    assert json.loads(raw) == message


def test_error_response_shape() -> None:
    assert jsonrpc.error_response(None, PARSE_ERROR, "bad") == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": PARSE_ERROR, "message": "bad"},
    }
    assert jsonrpc.error_response(3, -32603, "gone", {"exitStatus": 2})["error"]["data"] == {
        "exitStatus": 2
    }
