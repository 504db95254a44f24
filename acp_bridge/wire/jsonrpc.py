"""JSON-RPC 2.0 envelopes, sans-IO: classify a line, build the few frames the bridge writes.

A :class:`Frame` keeps the exact bytes it was read from. The relay forwards those bytes
unless it has to change the message, and only then serialises it again (:func:`encode`).
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from json.scanner import make_scanner
from typing import Any, Final, NamedTuple, TypeAlias, TypeVar

RequestId: TypeAlias = "int | str | LongInteger | None"
JsonObject: TypeAlias = dict[str, Any]

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800

CANCEL_REQUEST: Final = "$/cancel_request"
RESULT_AND_ERROR: Final = "An answer must carry a result or an error, not both."


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"
    BATCH = "batch"


class FrameError(Exception):
    """A line that is not a JSON-RPC message. ``code`` is the JSON-RPC error to answer with."""

    def __init__(self, code: int, message: str, request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


class NestedTooDeeply(FrameError):
    """Valid JSON, perhaps, but nested more deeply than a value can be built here (json's
    decoder recurses once per level). The line can still be judged without building it
    (:class:`acp_bridge.wire.json_stream.LineValidator`) and passed on unchanged."""


# A message nested this deeply may take json's decoder and encoder past Python's recursion
# limit (1,000 frames by default, less what the caller's stack already holds).
BUILD_DEPTH: Final = 900
DEPTH_LIMIT_MESSAGE: Final = (
    f"The message is nested more than about {BUILD_DEPTH} levels deep, deeper than the "
    "bridge can read or change a message; it passes such a message on only unchanged."
)


class LongInteger:
    """An integer with more digits than Python converts from text (4,300 by default, a
    guard against quadratic conversion). Valid JSON: kept as its digits, which is all the
    bridge needs to route a message holding one and to write it again. Immutable; not a
    tuple, so that nothing that walks a message takes it for an array.

    (Written by hand, as are this module's other types: the early ``initialize`` answer
    imports this module, and :mod:`dataclasses` brings :mod:`inspect` with it.)
    """

    __slots__ = ("digits",)
    digits: str

    def __init__(self, digits: str) -> None:
        object.__setattr__(self, "digits", digits)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LongInteger is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LongInteger) and other.digits == self.digits

    def __hash__(self) -> int:
        return hash((LongInteger, self.digits))

    def __repr__(self) -> str:
        return f"LongInteger(digits={self.digits!r})"


class Frame(NamedTuple):
    """One JSON-RPC message (or v2 batch) with the bytes it arrived as (immutable; one is
    made for every line relayed, and a named tuple is as cheap to make as anything)."""

    raw: bytes
    message: Any  # dict for single messages, a Batch for batches
    kind: Kind

    @property
    def id(self) -> RequestId:
        value: RequestId = self.message.get("id") if self.kind is not Kind.BATCH else None
        return value

    @property
    def method(self) -> str | None:
        if self.kind in (Kind.REQUEST, Kind.NOTIFICATION):
            method: str = self.message["method"]
            return method
        return None

    @property
    def params(self) -> Any:
        return self.message.get("params") if self.kind is not Kind.BATCH else None

    def members(self) -> list[Frame]:
        """The messages of a batch, each classified on its own (raw bytes re-encoded)."""
        if self.kind is not Kind.BATCH:
            return [self]
        return [classify_message(item) for item in self.message]


def is_request_id(value: object) -> bool:
    return (
        value is None
        or isinstance(value, (str, LongInteger))
        or (isinstance(value, int) and not isinstance(value, bool))
    )


def classify_message(message: Any, raw: bytes | None = None) -> Frame:
    """Classify an already-parsed message; raise :class:`FrameError` if it is not JSON-RPC."""
    if raw is None:
        raw = encode(message)
    if isinstance(message, list):
        if not message:
            raise FrameError(INVALID_REQUEST, EMPTY_BATCH)
        text = raw.decode()
        return Frame(raw, Batch(raw, text, text.index("[") + 1), Kind.BATCH)
    if not isinstance(message, dict):
        raise FrameError(INVALID_REQUEST, "A JSON-RPC message must be an object.")
    request_id = message.get("id")
    readable_id = request_id if is_request_id(request_id) else None
    method = message.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise FrameError(INVALID_REQUEST, "The method must be a string.", readable_id)
        if "params" in message and not isinstance(message["params"], (dict, list)):
            raise FrameError(INVALID_REQUEST, "The params must be an object or array.", readable_id)
        if "id" not in message:
            return Frame(raw, message, Kind.NOTIFICATION)
        if not is_request_id(request_id):
            raise FrameError(INVALID_REQUEST, "The id must be a string, number or null.")
        return Frame(raw, message, Kind.REQUEST)
    if "id" in message and ("result" in message or "error" in message):
        if not is_request_id(request_id):
            raise FrameError(INVALID_REQUEST, "The id must be a string, number or null.")
        fault = answer_fault(message)
        if fault is not None:
            raise FrameError(INVALID_REQUEST, fault, readable_id)
        return Frame(raw, message, Kind.RESPONSE)
    raise FrameError(
        INVALID_REQUEST, "The message is neither a request, notification nor response.", readable_id
    )


def answer_fault(message: JsonObject) -> str | None:
    """What JSON-RPC 2.0 forbids in an answer's ``result`` and ``error`` (None: nothing):
    both at once, or an error that is not an object with an integer ``code`` and a
    string ``message`` (its ``data`` may be anything)."""
    if "error" not in message:
        return None
    if "result" in message:
        return RESULT_AND_ERROR
    error = message["error"]
    if not isinstance(error, dict):
        return "The error must be an object."
    code = error.get("code")
    if not (isinstance(code, LongInteger) or (isinstance(code, int) and type(code) is not bool)):
        return "The error's code must be an integer."
    if not isinstance(error.get("message"), str):
        return "The error's message must be a string."
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_int(digits: str) -> int | LongInteger:
    try:
        return int(digits)
    except ValueError:  # more digits than int() converts
        return LongInteger(digits)


# NaN and Infinity are Python extensions, not JSON. One decoder for every line:
# json.loads with an option builds a new one per call, a cost on every frame relayed.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
# The same, with integers of any length (a Python call per integer: only where the first
# one failed).
_LENIENT_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_int=_parse_int)


def decode(text: str) -> Any:
    """JSON text to a value, as :func:`parse` reads it; raises ValueError or RecursionError."""
    try:
        return _DECODER.decode(text)
    except ValueError:
        return _LENIENT_DECODER.decode(text)


# json's C scanner itself, from the decoder above (so NaN and Infinity stay rejected):
# what JSONDecoder.decode runs after two regular-expression matches for whitespace.
# (typeshed declares the context argument as a scanner, where it is any JSONDecoder.)
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = make_scanner(_DECODER)  # type: ignore[arg-type]
scan_lenient: Final[Callable[[str, int], tuple[Any, int]]] = make_scanner(_LENIENT_DECODER)  # type: ignore[arg-type]
_TRAILING_WHITESPACE: Final = " \t\n\r"


def parse(raw: bytes) -> Frame:
    """Parse one line. Raise :class:`FrameError` with the error code the peer should get.

    The usual line (one object, no leading whitespace) takes a short path through json's C
    scanner; anything else, and every line that is not a valid message, goes through
    :func:`parse_in_full`, which gives the same result and the error to answer with.
    """
    if raw[:1] == b"[":
        return parse_in_full(raw)  # a batch: never built whole
    try:
        text = raw.decode()
        message, end = _scan_once(text, 0)
    except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
        return parse_in_full(raw)
    if (end != len(text) and text[end:].strip(_TRAILING_WHITESPACE)) or type(message) is not dict:
        return parse_in_full(raw)
    frame = _classify_short(raw, message)
    return frame if frame is not None else parse_in_full(raw)


def _classify_short(raw: bytes, message: JsonObject) -> Frame | None:
    """The short path's classification of a line json's scanner read as one object: its
    frame, or None when only :func:`parse_in_full` can tell (and word the error)."""
    method = message.get("method")
    if type(method) is str:
        params_ok = "params" not in message or type(message["params"]) in (dict, list)
        if params_ok:
            if "id" not in message:
                return Frame(raw, message, Kind.NOTIFICATION)
            request_id = message["id"]
            if request_id is None or type(request_id) in (str, int):
                return Frame(raw, message, Kind.REQUEST)
    elif method is None and "id" in message:
        request_id = message["id"]
        if request_id is not None and type(request_id) not in (str, int):
            return None
        if "result" in message:
            if "error" not in message:
                return Frame(raw, message, Kind.RESPONSE)
        elif "error" in message:
            error = message["error"]
            if (
                type(error) is dict
                and type(error.get("code")) is int
                and type(error.get("message")) is str
            ):
                return Frame(raw, message, Kind.RESPONSE)
    return None


def plain_notifications(lines: list[bytes], start: int = 0) -> tuple[int, Frame | None]:
    """How far the lines from ``lines[start]`` on are plain notifications: the index of the
    first line that is not one (``len(lines)`` if all are), and that line as
    :func:`parse` reads it when its short path can (None: give the line to :func:`parse`).

    A plain notification is a line :func:`parse` reads on its short path as a
    notification, other than ``$/cancel_request`` (whose ``requestId`` may need
    translating): a frame nothing is changed in and no state is kept for, validated as
    whole as :func:`parse` validates it. No :class:`Frame` is made for it: a run is passed
    on as it came, by the bytes. The line after the run is read only once, here.
    """
    # By index from ``start``: the pump calls this once for each line that ends a run, so
    # a walk from the list's start (islice) would make a read of blank lines quadratic.
    end = start
    for index in range(start, len(lines)):
        raw = lines[index]
        if raw[:1] != b"{":
            return end, None  # not one the short path reads (blank, spaces, garbage)
        try:
            text = raw.decode()
            message, stop = _scan_once(text, 0)
        except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
            return end, None
        if stop != len(text) or type(message) is not dict:
            return end, None
        method = message.get("method")
        if (
            type(method) is not str
            or method == CANCEL_REQUEST
            or "id" in message
            or ("params" in message and type(message["params"]) not in (dict, list))
        ):
            return end, _classify_short(raw, message)
        end += 1
    return end, None


def parse_in_full(raw: bytes) -> Frame:
    """:func:`parse` the long way, with the error message for any line that is not valid."""
    try:
        # Strict UTF-8 (json.loads would guess UTF-16/32 and let lone surrogates through).
        text = raw.decode()
        if text.startswith("\ufeff"):
            # What json.loads says of a byte order mark (the decoder itself does not check).
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        start = _after_spaces(text, 0)
        if text.startswith("[", start):
            return Frame(raw, _read_batch(raw, text, start + 1), Kind.BATCH)
        message = _LENIENT_DECODER.decode(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(PARSE_ERROR, f"The line is not valid JSON: {exc}.") from None
    except RecursionError:
        raise NestedTooDeeply(INVALID_REQUEST, DEPTH_LIMIT_MESSAGE) from None
    return classify_message(message, raw)


class Batch:
    """The members of a batch, read from its text one at a time each time they are walked.

    A batch is never built whole: a value per member costs about 25 times a small
    member's text, so a batch at the line limit would take gigabytes. Routing walks the
    members (twice for a client batch) and keeps what it passes on as bytes: a run of
    members it does not change goes on as the peer wrote it (:meth:`spans`).
    :func:`parse` has read every member once, so each walk gives the same members.
    """

    __slots__ = ("_start", "raw", "text")

    def __init__(self, raw: bytes, text: str, start: int) -> None:
        self.raw = raw
        self.text = text
        self._start = start  # just after the opening bracket

    def __iter__(self) -> Iterator[Any]:
        for member, _, _ in _members(self.text, self._start, first_read=False):
            yield member

    def spans(self) -> Iterator[tuple[Any, int, int]]:
        """Each member with where its text starts and ends (see :meth:`written`)."""
        return _members(self.text, self._start, first_read=False)

    def written(self, start: int, end: int) -> bytes:
        """The bytes of ``text[start:end]`` exactly as they came."""
        if len(self.text) == len(self.raw):  # one byte a character: the same offsets
            return self.raw[start:end]
        return self.text[start:end].encode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Batch):
            return list(self) == list(other)
        if isinstance(other, list):
            return list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like the list it stands for

    def __repr__(self) -> str:
        return f"Batch({self.text[self._start - 1 :][:60]!r}...)"


_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
EMPTY_BATCH: Final = "An empty batch is not a valid request."
# Python 3.13 names a comma before a closing bracket; earlier ones expect a value there.
_NAMES_TRAILING_COMMA: Final = sys.version_info >= (3, 13)


def _read_batch(raw: bytes, text: str, start: int) -> Batch:
    """Read a batch whose opening bracket ends at ``start`` as json's decoder would read
    it whole (the same errors at the same places), keeping no member."""
    end = start
    count = 0
    for _, _, stop in _members(text, start, first_read=True):
        end = stop
        count += 1
    close = _after_spaces(text, end)  # the closing bracket
    after = _after_spaces(text, close + 1)
    if after != len(text):
        raise json.JSONDecodeError("Extra data", text, after)
    if not count:
        raise FrameError(INVALID_REQUEST, EMPTY_BATCH)
    return Batch(raw, text, start)


def _members(text: str, pos: int, *, first_read: bool) -> Iterator[tuple[Any, int, int]]:
    """The members of the array opened just before ``pos``, each with where its text
    starts and ends; ValueError where json's decoder would raise it, at the same place.

    The first read raises RecursionError where the decoder does. A later walk may run on a
    deeper stack than the first read: a member too deep for it is read with more room
    (its depth is bounded by what the first read took)."""
    skip = _after_spaces
    scan = _first_scan if first_read else _scan_member
    if text[pos : pos + 1] in _SPACES:
        pos = skip(text, pos)
    if text.startswith("]", pos):
        return
    while True:
        try:
            member, end = scan(text, pos)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", text, stop.value) from None
        yield member, pos, end
        after = text[end : end + 1]
        if after in _SPACES:  # empty at the end of the text: in every string
            end = skip(text, end)
            after = text[end : end + 1]
        if after == "]":
            return
        if after != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, end)
        pos = end + 1
        if text[pos : pos + 1] in _SPACES:
            pos = skip(text, pos)
        if _NAMES_TRAILING_COMMA and text.startswith("]", pos):
            raise json.JSONDecodeError("Illegal trailing comma before end of array", text, end)


_SPACES: Final = " \t\n\r"


def _after_spaces(text: str, pos: int) -> int:
    """Where the whitespace json allows at ``pos`` ends."""
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def _first_scan(text: str, pos: int) -> tuple[Any, int]:
    """A member as json's decoder reads it: integers of any length (the lenient scanner
    only where the usual one failed: it calls Python for every integer)."""
    try:
        return _scan_once(text, pos)
    except ValueError:
        return scan_lenient(text, pos)


def _scan_member(text: str, pos: int) -> tuple[Any, int]:
    """A member read before by :func:`_first_scan`, on whatever stack the caller has."""
    try:
        return _first_scan(text, pos)
    except RecursionError:
        return _with_headroom(lambda: _first_scan(text, pos))


def encode(message: Any) -> bytes:
    """Serialise a message the bridge wrote or changed: compact, UTF-8, no newline inside.

    Whatever arrived as valid JSON can be written again: a lone surrogate (``"\\ud800"``
    is valid JSON, not valid UTF-8) stays a ``\\u`` escape, a number too large for a
    float (``1e400`` reads as infinity) is written as ``1e999``, never as ``Infinity``,
    and a message nested as deep as :func:`parse` allows is written from any stack.
    """
    try:
        return _encode(message)
    except RecursionError:
        return _with_headroom(lambda: _encode(message))


def _encode(message: Any) -> bytes:
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode()
    except UnicodeEncodeError:
        try:
            return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        except (ValueError, TypeError):
            return _encode_numbers(message)
    except (ValueError, TypeError):  # an infinity, a LongInteger
        return _encode_numbers(message)


def _encode_numbers(message: Any) -> bytes:
    """:func:`_encode` for a message holding numbers json cannot write: each is written
    as a marker string first, then the marker replaced by the number's text."""
    # os.urandom, as secrets.token_hex does, without importing secrets (hashlib, hmac,
    # random): this module is on the way to the early initialize answer.
    marker = f"\x00number-{os.urandom(8).hex()}-"
    numbers: list[str] = []

    def replace(value: Any) -> Any:
        if isinstance(value, float) and math.isinf(value):
            numbers.append("1e999" if value > 0 else "-1e999")
        elif isinstance(value, LongInteger):
            numbers.append(value.digits)
        elif isinstance(value, dict):
            return {key: replace(item) for key, item in value.items()}
        elif isinstance(value, list):
            return [replace(item) for item in value]
        else:
            return value
        return f"{marker}{len(numbers) - 1}"

    text = json.dumps(replace(message), separators=(",", ":"), allow_nan=False)
    quoted = re.escape(json.dumps(marker)[:-1])  # the marker's opening quote and text
    return re.sub(quoted + r'([0-9]+)"', lambda m: numbers[int(m[1])], text).encode()


_RECURSION_LOCK: Final = threading.Lock()
# The parser may have run on a shallower stack than the caller of encode(), so a message
# it accepted can exceed the recursion limit there. Its depth is bounded by the limit, so a
# few times the limit always suffices (the Python-level walk of _encode_numbers takes
# two frames a level), and the real depth, hence the C stack used, does not change.
_HEADROOM: Final = 4


_T = TypeVar("_T")


def _with_headroom(work: Callable[[], _T]) -> _T:
    with _RECURSION_LOCK:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(_HEADROOM * limit)
        try:
            return work()
        finally:
            sys.setrecursionlimit(limit)


def error_object(code: int, message: str, data: Any = None) -> JsonObject:
    error: JsonObject = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def error_response(request_id: RequestId, code: int, message: str, data: Any = None) -> JsonObject:
    return error_answer(request_id, error_object(code, message, data))


def error_answer(request_id: RequestId, error: JsonObject) -> JsonObject:
    """The answer to request ``request_id`` carrying an error object made before (an
    adapter's :class:`Reply`, an agent's own error)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result_response(request_id: RequestId, result: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def request(request_id: RequestId, method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def notification(method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "method": method, "params": params}
