"""Envelope reading for the relay's hot path, sans-IO: what routing needs from one line.

Routing needs a frame's kind, ``id``, ``method`` and at most ``params.sessionId``, and the
whole line must be valid JSON: a frame that is not is answered or dropped, never forwarded.
The line is therefore checked whole, and json's C scanner is the fastest validator the
standard library has (a pattern for the JSON grammar is slower in ``re`` and grows
exponentially with the nesting it allows). :func:`scan` calls that scanner directly,
without the Python-level wrapper of ``json.loads``, and classifies the message in place
instead of building a :class:`~acp_bridge.jsonrpc.Frame`: 1.3 to 2 times the rate of
:func:`~acp_bridge.jsonrpc.parse` on small frames (``bench/envelope_bench.py``).

The answer is exact or absent. An :class:`Envelope` is returned only for a line that
:func:`acp_bridge.jsonrpc.parse` reads as a single message, with the same kind, ``id``,
``method`` and decoded message; for anything else (batches, leading whitespace or a byte
order mark, invalid JSON or UTF-8, lines that are not JSON-RPC) it returns ``None`` and the
caller parses the line in full, which also gives the right error.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from json.scanner import make_scanner
from typing import Any, Final

from acp_bridge.jsonrpc import _DECODER, CANCEL_REQUEST, Frame, Kind, RequestId

# json's C scanner itself (what JSONDecoder.decode calls after two regular-expression
# matches for surrounding whitespace), made from jsonrpc's decoder so that it rejects NaN
# and Infinity as jsonrpc.parse does.
# (typeshed declares the context argument as a scanner, where it is any JSONDecoder.)
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = make_scanner(_DECODER)  # type: ignore[arg-type]
_TRAILING_WHITESPACE: Final = " \t\n\r"


class Envelope:
    """One JSON-RPC message as :func:`acp_bridge.jsonrpc.parse` reads it, without the copy.

    ``id`` is the id of a request or response (``None`` for a ``null`` id) and ``None``
    for a notification; ``method`` is ``None`` for a response. ``session_id`` is
    ``params.sessionId`` when ``params`` is an object with a string there, else ``None``.
    ``message`` is the decoded message (the relay forwards ``raw`` unless it changes it).
    """

    __slots__ = ("id", "kind", "message", "method", "raw")

    def __init__(
        self, raw: bytes, message: dict[str, Any], kind: Kind, id: RequestId, method: str | None
    ) -> None:
        self.raw = raw
        self.message = message
        self.kind = kind
        self.id = id
        self.method = method

    @property
    def params(self) -> Any:
        return self.message.get("params")

    @property
    def session_id(self) -> str | None:
        params = self.message.get("params")
        if type(params) is dict:
            session_id = params.get("sessionId")
            if type(session_id) is str:
                return session_id
        return None

    def needs_handling(self, intercepted: Container[str]) -> bool:
        """Whether the frame may have to be handled or changed rather than only forwarded:
        its method is one the caller intercepts, or it is a ``$/cancel_request`` whose
        ``requestId`` may need translating. (An ``id`` to translate is the caller's to see
        in its own tables.)"""
        method = self.method
        return method is not None and (method == CANCEL_REQUEST or method in intercepted)

    def frame(self) -> Frame:
        """The same message as the :class:`Frame` ``jsonrpc.parse`` would have made, for code
        that works on frames (interception, batches), without parsing the line again."""
        return Frame(self.raw, self.message, self.kind)

    def __repr__(self) -> str:
        return f"Envelope({self.kind.name}, id={self.id!r}, method={self.method!r})"


def scan(raw: bytes) -> Envelope | None:
    """The envelope of one line, or ``None`` if only :func:`jsonrpc.parse` can tell."""
    try:
        text = raw.decode()  # strict UTF-8, as jsonrpc.parse
        message, end = _scan_once(text, 0)
    except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
        return None
    if end != len(text) and text[end:].strip(_TRAILING_WHITESPACE):
        return None  # extra data after the value
    # Exact types: json builds only dict, list, str, int, float, bool and None.
    if type(message) is not dict:
        return None
    method = message.get("method")
    if method is not None:
        if type(method) is not str:
            return None
        if "params" in message and type(message["params"]) not in (dict, list):
            return None
        if "id" not in message:
            return Envelope(raw, message, Kind.NOTIFICATION, None, method)
        request_id = message["id"]
        if not _is_request_id(request_id):
            return None
        return Envelope(raw, message, Kind.REQUEST, request_id, method)
    if "id" in message and ("result" in message or "error" in message):
        request_id = message["id"]
        if not _is_request_id(request_id):
            return None
        return Envelope(raw, message, Kind.RESPONSE, request_id, None)
    return None


def _is_request_id(value: object) -> bool:
    kind = type(value)
    return kind is str or kind is int or value is None
