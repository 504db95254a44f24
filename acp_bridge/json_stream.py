"""Validating one JSON line as it arrives, without holding or building it: sans-IO.

A line too long to hold whole is passed on while it is still arriving (see
:mod:`acp_bridge.framing` and ``Router.stream_from_client``). It must still be valid JSON
and a JSON-RPC message before its end goes out, so :class:`LineValidator` reads it piece
by piece and keeps only the text it has not judged yet and a stack of open containers:

- a string is skipped with ``str.find`` (quotes, backslashes) and checked for control
  characters only where the raw bytes had any (they are rare and never inside a UTF-8
  sequence);
- a value that is complete within the text held is checked at once by json's own C
  scanner (it builds the value, but only of what is held, at most one read);
- a container that does not end within the text held is entered token by token.

It accepts exactly the JSON that :func:`acp_bridge.jsonrpc.parse` accepts (strict UTF-8,
no byte order mark, no ``NaN``/``Infinity``, no control characters in strings), except that
it has no nesting limit (its stack is a list, not recursion) and refuses a number longer
than 64 KiB (held until it ends, it would cost time quadratic in its length). Of the
top-level object it remembers the small members (``jsonrpc``, ``id``, ``method``) and the
type of the large ones, which is what routing needs (:class:`Envelope`).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from json import decoder
from json.scanner import make_scanner
from typing import Any, Final

from acp_bridge import jsonrpc
from acp_bridge.jsonrpc import FrameError, Kind

# Raw bytes that may appear in a valid line only outside strings (JSON whitespace): any
# other control byte makes the line invalid wherever it is.
_WHITESPACE_CONTROLS: Final = b"\t\r"
_NOT_CONTROL: Final = bytes(range(0x20, 0x100))
_WS: Final = re.compile(r"[ \t\n\r]*")
# A string body with escapes, up to its closing quote (or an escape it cannot judge yet).
_CONTROL_IN_STRING: Final = re.compile(r"[\x00-\x1f]")
# What may follow a number at the end of the text held and still belong to it.
# Array items that are short scalars, each followed by a comma: matched many at a time
# (one regular-expression call instead of a Python step per item). Integers longer than
# json reads (4,300 digits) are left to the scanner, which refuses them.
_WS_CLASS: Final = r"[ \t\r]*"
_SCALAR: Final = (
    r"(?:-?(?:0|[1-9][0-9]{0,4299})(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
    r'|true|false|null|"[^"\\\x00-\x1f]*")'
)
_FLAT_MEMBER: Final = rf'{_WS_CLASS}"[^"\\\x00-\x1f]*"{_WS_CLASS}:{_WS_CLASS}{_SCALAR}{_WS_CLASS}'
# Array items that are short scalars or flat objects of them, each followed by a comma.
_SCALAR_RUN: Final = re.compile(
    rf"(?:{_WS_CLASS}(?:{_SCALAR}|\{{(?:{_FLAT_MEMBER},)*{_FLAT_MEMBER}\}}|\{{{_WS_CLASS}\}}"
    rf"|\[{_WS_CLASS}\]){_WS_CLASS},)+"
)
_WHOLE_AT_ONCE: Final = 64 * 1024  # a container is judged by json's scanner up to this size
_SCAN_WINDOWS: Final = (2 * 1024, _WHOLE_AT_ONCE)  # most are small: a short look first
_RUN_WINDOW: Final = 16 * 1024  # longer matches slow the engine down and cost it memory
_LONGEST_NUMBER: Final = 64 * 1024
_NUMBER_REST: Final = re.compile(r"[0-9.eE+-]*")
# A top-level member value kept for routing: an id, a method name.
_SMALL: Final = 1024
# json's C string scanner (typeshed does not declare it): (text, index after the opening
# quote, strict) -> (the string, index after the closing quote).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = decoder.scanstring  # type: ignore[attr-defined]
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = make_scanner(jsonrpc._DECODER)  # type: ignore[arg-type]

# What the validator expects next.
_VALUE, _FIRST_VALUE, _FIRST_KEY, _KEY, _COLON, _AFTER_VALUE, _STRING, _DONE = range(8)
_UNKNOWN: Final = object()


@dataclass(frozen=True, slots=True)
class Large:
    """A top-level member too large to keep: only its JSON type is known."""

    type: type


@dataclass(slots=True)
class Envelope:
    """What routing needs of a line: its top-level members, the large ones as :class:`Large`."""

    members: dict[str, Any] = field(default_factory=dict)
    is_object: bool = False
    open_member: str | None = None
    """The top-level member whose value is still arriving (None: between members)."""

    def skeleton(self) -> dict[str, Any]:
        """The members, large ones replaced by an empty value of their type."""
        return {
            key: value.type() if isinstance(value, Large) else value
            for key, value in self.members.items()
        }

    def kind(self) -> Kind:
        """The message's kind by :func:`jsonrpc.classify_message`; raises FrameError."""
        if not self.is_object:
            raise FrameError(jsonrpc.INVALID_REQUEST, "A streamed line must be one object.")
        return jsonrpc.classify_message(self.skeleton(), b"").kind


class LineValidator:
    """Feed a line's bytes in pieces; :meth:`feed` and :meth:`finish` raise
    :class:`FrameError` (a parse error) as soon as the line cannot be valid JSON."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._text = ""  # decoded text not judged yet
        self._stack: list[bool] = []  # True: an object, False: an array
        self._expect = _VALUE
        self._in_key = False  # the string being skipped is an object key
        self._key_text: list[str] | None = None  # a top-level key being skipped, so far
        self._key: str | None = None  # the top-level key whose value comes next
        self._controls = False  # tabs or carriage returns arrived (checked inside strings)
        self._started = False
        self.envelope = Envelope()

    # ------------------------------------------------------------------ input

    def feed(self, data: bytes) -> None:
        controls = data.translate(None, _NOT_CONTROL)
        if controls:
            if controls.strip(_WHITESPACE_CONTROLS):
                raise _invalid("a control character outside the JSON grammar")
            self._controls = True
        elif self._expect == _STRING and not self._in_key and not self._text:
            data = self._skip_string_bytes(data)
            if not data:
                return
        try:
            text = self._decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise _invalid(f"not UTF-8 ({exc.reason})") from None
        if not self._started and text:
            self._started = True
            if text.startswith("\ufeff"):
                raise _invalid("a byte order mark")
        self._text = self._text + text if self._text else text
        self._run(final=False)

    def _skip_string_bytes(self, data: bytes) -> bytes:
        """Inside a string value, with no control byte in ``data``: skip the string's text
        without decoding it (the bulk of a long line); what follows its end, if it ends."""
        if self._decoder.getstate()[0]:
            return data  # a character split across pieces: the decoder has its start
        quote = data.find(b'"')
        stop = quote if quote >= 0 else len(data)
        if data.find(b"\\", 0, stop) >= 0:
            return data  # escapes: judged on the decoded text
        span = data if quote < 0 else data[:quote]
        if not span.isascii():
            try:
                self._decoder.decode(span)  # judged, not kept; a split character waits
            except UnicodeDecodeError as exc:
                raise _invalid(f"not UTF-8 ({exc.reason})") from None
            if quote >= 0 and self._decoder.getstate()[0]:
                raise _invalid("not UTF-8 (a character cut by a quote)")
        self._started = True
        if quote < 0:
            return b""
        self._value_done(_UNKNOWN)
        return data[quote + 1 :]

    def finish(self) -> Envelope:
        """The line is complete: its envelope, if it is one valid JSON value."""
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise _invalid(f"not UTF-8 ({exc.reason})") from None
        self._run(final=True)
        if self._expect != _DONE:
            raise _invalid("the line ends inside a value")
        return self.envelope

    # ---------------------------------------------------------------- the walk

    def _run(self, *, final: bool) -> None:
        text = self._text
        pos = 0
        end = len(text)
        while True:
            expect = self._expect
            if expect == _STRING:
                after = self._string(text, pos, final)
                if after < 0:
                    pos = -after - 1
                    break
                self._string_done(text, pos, after)
                pos = after
                continue
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]  # always matches
            if pos >= end:
                break
            char = text[pos]
            if expect in (_VALUE, _FIRST_VALUE):
                if char == "]" and expect == _FIRST_VALUE:
                    self._close()
                    pos += 1
                    continue
                if self._stack and not self._stack[-1]:
                    # Array items that are short scalars, many at a time.
                    run = _SCALAR_RUN.match(text, pos, min(end, pos + _RUN_WINDOW))
                    if run is not None:
                        self._expect = _VALUE
                        pos = run.end()
                        continue
                after = self._value(text, pos, final)
                if after < 0:
                    break
                pos = after
            else:
                self._punctuation(expect, char)
                pos += 1
        self._text = text[pos:]

    def _punctuation(self, expect: int, char: str) -> None:
        """Take the one character ``char`` between values."""
        if expect == _AFTER_VALUE:
            if char == ",":
                self._expect = _KEY if self._stack[-1] else _VALUE
            elif char == ("}" if self._stack[-1] else "]"):
                self._close()
            else:
                raise _invalid(f"expected ',' or a closing bracket, got {char!r}")
        elif expect in (_FIRST_KEY, _KEY):
            if char == "}" and expect == _FIRST_KEY:
                self._close()
            elif char == '"':
                self._in_key = True
                self._key_text = [] if len(self._stack) == 1 else None
                self._expect = _STRING
            else:
                raise _invalid(f"expected a property name, got {char!r}")
        elif expect == _COLON:
            if char != ":":
                raise _invalid(f"expected ':', got {char!r}")
            self._expect = _VALUE
        else:  # _DONE: only whitespace may follow
            raise _invalid("more after the value")

    def _value(self, text: str, pos: int, final: bool) -> int:
        """Read a value at ``pos``: the position after it (or after its opening, for one
        that does not end within the text held), or -1 to wait for more text."""
        char = text[pos]
        if char == '"':
            after = self._string(text, pos + 1, final)
            if after >= 0 and after - pos <= _SMALL:
                value, after = _scan_once(text, pos)
                self._value_done(value)
                return after
            if after >= 0:
                self._value_done(Large(str))
                return after
            self._open(Large(str))
            self._in_key = False
            self._expect = _STRING
            return -after - 1  # where the string's text stops (it is judged up to there)
        if char in {"{", "["}:
            try:
                value, after = _scan_small(text, pos)
            except (ValueError, StopIteration, RecursionError):
                # Not complete within the text held (or invalid further on, or deep):
                # enter it and judge it token by token.
                is_object = char == "{"
                if not self._stack:
                    self.envelope.is_object = is_object
                self._open(Large(dict if is_object else list))
                self._stack.append(is_object)
                self._expect = _FIRST_KEY if is_object else _FIRST_VALUE
                return pos + 1
            self._value_done(value)
            return after
        try:
            value, after = _scan_once(text, pos)
        except StopIteration:
            if not final and len(text) - pos < 6:
                return -1  # a literal or number cut short
            raise _invalid(f"expected a value, got {text[pos : pos + 10]!r}") from None
        except ValueError as exc:  # NaN, Infinity, an integer too long
            raise _invalid(str(exc)) from None
        if (
            not final
            and type(value) in (int, float)
            and (after == len(text) or _number_goes_on(text, after))
        ):
            if after - pos > _LONGEST_NUMBER:
                # Held whole until it ends, a longer one would cost time quadratic in its
                # length; json's own reader refuses integers of more than 4,300 digits.
                raise _invalid("a number longer than 64 KiB")
            return -1  # the number may go on in the next piece
        self._value_done(value)
        return after

    def _string(self, text: str, pos: int, final: bool) -> int:
        """Skip string text from ``pos``: the position after the closing quote, or
        ``-(resume + 1)`` when the text held ends first."""
        quote = text.find('"', pos)
        stop = quote if quote >= 0 else len(text)
        if text.find("\\", pos, stop) < 0:
            if self._controls and _CONTROL_IN_STRING.search(text, pos, stop):
                raise _invalid("a control character in a string")
            if quote < 0:
                return self._string_cut(text, pos, len(text))
            return quote + 1
        # Escapes: json's C string scanner judges the text up to a point that splits no
        # escape, closed with a quote of our own; it stops at the string's real end if
        # that comes first.
        cut = len(text) if final else _escape_safe_cut(text, pos)
        try:
            after = _scanstring(text[pos:cut] + '"', 0, True)[1] + pos
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        if after <= cut:
            return after
        return self._string_cut(text, pos, cut)

    def _string_cut(self, text: str, pos: int, resume: int) -> int:
        if self._key_text is not None:
            self._key_text.append(text[pos:resume])
            if sum(map(len, self._key_text)) > _SMALL:
                self._key_text = None  # no key routing looks at is this long
        return -(resume + 1)

    def _string_done(self, text: str, pos: int, after: int) -> None:
        """A string skipped in :meth:`_string` has ended at ``after``."""
        if not self._in_key:
            self._value_done(_UNKNOWN)
            return
        self._in_key = False
        self._expect = _COLON
        if len(self._stack) != 1:
            return
        if self._key_text is not None:
            raw = "".join(self._key_text) + text[pos : after - 1]
            self._key = _scan_once('"' + raw + '"', 0)[0]
            self._key_text = None
        else:
            self._key = None  # too long to be one routing reads

    def _open(self, large: Large) -> None:
        """A value that does not end within the text held starts here."""
        if len(self._stack) == 1 and self._key is not None:
            self.envelope.members[self._key] = large
            self.envelope.open_member = self._key

    def _close(self) -> None:
        self._stack.pop()
        self._value_done(_UNKNOWN)

    def _value_done(self, value: Any) -> None:
        depth = len(self._stack)
        if depth == 0 and type(value) is dict:  # the whole line was held: read at once
            self.envelope.is_object = True
            self.envelope.members = {key: _kept(item) for key, item in value.items()}
        if depth == 1:
            key = self._key
            if key is not None:
                if self.envelope.open_member == key:
                    self.envelope.open_member = None
                elif value is not _UNKNOWN:
                    self.envelope.members[key] = _kept(value)
            self._key = None
        self._expect = _DONE if depth == 0 else _AFTER_VALUE


def _scan_small(text: str, pos: int) -> tuple[Any, int]:
    """json's C scanner on the value at ``pos`` if it is small: only a small value is worth
    building, so a larger one fails after a bounded look (and is entered instead)."""
    if len(text) - pos <= _WHOLE_AT_ONCE:
        return _scan_once(text, pos)
    for window in _SCAN_WINDOWS:
        try:
            value, after = _scan_once(text[pos : pos + window], 0)
        except (ValueError, StopIteration):
            if window == _WHOLE_AT_ONCE:
                raise
            continue
        return value, after + pos
    raise AssertionError("unreachable")  # pragma: no cover


def _escape_safe_cut(text: str, pos: int) -> int:
    """The last position from ``pos`` at which string text can be cut without splitting
    an escape (``\\x`` or ``\\uXXXX``) that may still be completed by the next piece."""
    cut = len(text)
    # Only an escape begun in the last five characters can be incomplete.
    backslash = text.rfind("\\", max(pos, cut - 6), cut)
    if backslash < 0:
        return cut
    run_start = backslash
    while run_start > pos and text[run_start - 1] == "\\":
        run_start -= 1
    if (backslash - run_start) % 2:
        return cut  # it is the escaped character of the backslash before it
    length = 6 if backslash + 1 < cut and text[backslash + 1] == "u" else 2
    return backslash if backslash + length > cut else cut


def _number_goes_on(text: str, after: int) -> bool:
    """Whether a number that ends at ``after`` may go on in the next piece."""
    rest = _NUMBER_REST.match(text, after)
    return rest is not None and rest.end() == len(text)


def _kept(value: Any) -> Any:
    """A top-level member as the envelope keeps it: scalars as they are, else its type."""
    if isinstance(value, str) and len(value) > _SMALL:
        return Large(str)
    if value is None or isinstance(value, (str, int, float, bool, Large)):
        return value
    return Large(type(value))


def _invalid(reason: str) -> FrameError:
    return FrameError(jsonrpc.PARSE_ERROR, f"The line is not valid JSON: {reason}.")
