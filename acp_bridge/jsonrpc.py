"""JSON-RPC 2.0 envelopes, sans-IO: classify a line, build the few frames the bridge writes.

A :class:`Frame` keeps the exact bytes it was read from. The relay forwards those bytes
unless it has to change the message, and only then serialises it again (:func:`encode`).
"""

from __future__ import annotations

import enum
import json
import math
import sys
import threading
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

RequestId: TypeAlias = int | str | None
JsonObject: TypeAlias = dict[str, Any]

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
REQUEST_CANCELLED: Final = -32800

CANCEL_REQUEST: Final = "$/cancel_request"


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


@dataclass(frozen=True)
class Frame:
    """One JSON-RPC message (or v2 batch) with the bytes it arrived as."""

    raw: bytes
    message: Any  # dict for single messages, list for batches
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
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
    )


def classify_message(message: Any, raw: bytes | None = None) -> Frame:
    """Classify an already-parsed message; raise :class:`FrameError` if it is not JSON-RPC."""
    if raw is None:
        raw = encode(message)
    if isinstance(message, list):
        if not message:
            raise FrameError(INVALID_REQUEST, "An empty batch is not a valid request.")
        return Frame(raw, message, Kind.BATCH)
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
        return Frame(raw, message, Kind.RESPONSE)
    raise FrameError(
        INVALID_REQUEST, "The message is neither a request, notification nor response.", readable_id
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e400 is valid JSON but becomes inf, which no JSON encoder can write back: a frame
        # the bridge had to change would reach the peer as invalid JSON.
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


# NaN and Infinity are Python extensions, not JSON. One decoder for every line:
# json.loads with an option builds a new one per call, a cost on every frame relayed.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def decode(text: str) -> Any:
    """JSON text to a value, as :func:`parse` reads it; raises ValueError or RecursionError."""
    return _DECODER.decode(text)


def parse(raw: bytes) -> Frame:
    """Parse one line. Raise :class:`FrameError` with the error code the peer should get."""
    try:
        # Strict UTF-8 (json.loads would guess UTF-16/32 and let lone surrogates through).
        text = raw.decode()
        if text.startswith("\ufeff"):
            # What json.loads says of a byte order mark (the decoder itself does not check).
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        message = _DECODER.decode(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FrameError(PARSE_ERROR, f"The line is not valid JSON: {exc}.") from None
    except RecursionError:
        raise FrameError(PARSE_ERROR, "The line is nested too deeply to parse.") from None
    return classify_message(message, raw)


def encode(message: Any) -> bytes:
    """Serialise a message the bridge wrote or changed: compact, UTF-8, no newline inside.

    Valid JSON may carry a lone surrogate escape (``"\\ud800"``), which has no UTF-8 form;
    such a message is written with every non-ASCII character escaped, as JSON allows.
    """
    try:
        text = _dumps(message, ensure_ascii=False)
    except RecursionError:
        text = _dumps_deep(message)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _dumps(message, ensure_ascii=True).encode()


def _dumps(message: Any, *, ensure_ascii: bool) -> str:
    # allow_nan=False: never write NaN/Infinity, which are not JSON (parse refuses them).
    return json.dumps(message, ensure_ascii=ensure_ascii, allow_nan=False, separators=(",", ":"))


_RECURSION_LOCK: Final = threading.Lock()


def _dumps_deep(message: Any) -> str:
    """Serialise a message nested nearly as deep as :func:`parse` allows.

    The parser may have run on a shallower stack than the caller of :func:`encode`, so a
    message it accepted can exceed the recursion limit here. Its depth is bounded by that
    limit, so twice the limit always suffices (and stays far from the C stack's size).
    """
    with _RECURSION_LOCK:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(2 * limit)
        try:
            return _dumps(message, ensure_ascii=True)
        finally:
            sys.setrecursionlimit(limit)


def error_object(code: int, message: str, data: Any = None) -> JsonObject:
    error: JsonObject = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return error


def error_response(request_id: RequestId, code: int, message: str, data: Any = None) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "error": error_object(code, message, data)}


def result_response(request_id: RequestId, result: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def request(request_id: RequestId, method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def notification(method: str, params: Any) -> JsonObject:
    return {"jsonrpc": "2.0", "method": method, "params": params}
